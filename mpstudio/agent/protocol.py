"""What travels between the agent, its worker and its clients: result dataclasses, ids, and safe `.npz`.

Every result that carries a latency says where the number came from (`LatencyStats.source`), so an
emulator's host time can never be mistaken for device latency.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
import re
import struct
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MpstudioError
from ..sources import RUN_LATENCY_SOURCES, Latency

API_PREFIX = "/v1"
TOKEN_ENV = "MPSTUDIO_AGENT_TOKEN"
# Members of the binary run form's .npz that carry the run's JSON (request) and the result's (response).
RUN_MEMBER = "__run__"
RESULT_MEMBER = "__result__"

# Model ids are sha256 hex digests and run ids uuid4 hex: ids are checked against these, and file names
# on the agent are built only from checked ids, never from a path a client sends.
_MODEL_ID = re.compile(r"[0-9a-f]{64}")
_RUN_ID = re.compile(r"[0-9a-f]{32}")



class AgentError(MpstudioError):
    """An agent request failed; `status` is the HTTP status that reports it (422 for a bad request)."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


class AgentRunTimeout(AgentError):
    """The agent answered 504: the run overran its --run-timeout (its worker was replaced; the agent is fine)."""

    def __init__(self, message: str):
        super().__init__(message, 504)


def is_model_id(text) -> bool:
    return isinstance(text, str) and _MODEL_ID.fullmatch(text) is not None


def check_model_id(model_id: str) -> str:
    if not is_model_id(model_id):
        raise MpstudioError(f"invalid model id {str(model_id)[:80]!r}: expected a lowercase sha256 hex digest")
    return model_id


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise MpstudioError(f"invalid run id {str(run_id)[:80]!r}: expected 32 lowercase hex digits")
    return run_id


def sha256_file(path: str | Path) -> str:
    """The sha256 hex digest of a file (a model's id), read in 1 MB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------- arrays

def encode_npz(arrays: dict[str, np.ndarray]) -> bytes:
    """Arrays as an uncompressed `.npz` (object arrays are refused: they would need pickle)."""
    buffer = io.BytesIO()
    clean = {}
    for name, value in arrays.items():
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise MpstudioError(f"array {name!r} has dtype object, which cannot travel without pickle")
        clean[name] = array
    np.savez(buffer, **clean)
    return buffer.getvalue()


# A run's .npz holds a few arrays: more members than this is an attack on the zip parser, not inputs.
MAX_NPZ_MEMBERS = 1024


def decode_npz(data: bytes, max_bytes: int | None = None, members=None) -> dict[str, np.ndarray]:
    """Arrays from `.npz` bytes, read without trusting the archive.

    A pickled member is refused (pickles can run code when loaded), and so is any member that is not an
    `.npy` array. With `max_bytes`, the arrays' total size is bounded *before* anything is decompressed or
    allocated: the zip's declared sizes and each `.npy` header's shape and dtype are checked first, so a
    small compressed archive (a "zip bomb") or a header declaring a huge shape is refused at once.
    `members`, when given, is a predicate on member names (without `.npy`): only those are read.
    """
    try:
        with _checked_archive(data, max_bytes) as archive:
            arrays = {}
            budget = max_bytes
            for entry in archive.infolist():
                if members is not None and not members(entry.filename[: -len(".npy")]):
                    continue
                name, array = _read_member(archive, entry, budget)
                arrays[name] = array
                if budget is not None:
                    budget -= array.nbytes
            return arrays
    except MpstudioError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise MpstudioError(
                "the inputs .npz holds a pickled (object) array, which the agent refuses; "
                "send numeric arrays only"
            ) from None
        raise MpstudioError(f"the inputs are not a valid .npz archive: {_first_line(exc)}") from None
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, RuntimeError) as exc:
        raise MpstudioError(f"the inputs are not a valid .npz archive: {_first_line(exc)}") from None


def check_npz(data: bytes, max_bytes: int | None = None) -> None:
    """Refuse an .npz by its directory and its members' .npy headers (member count and names, declared sizes,
    pickled or oversized arrays) without decompressing any array: what can be said about a run's inputs
    before it waits for the device."""
    try:
        with _checked_archive(data, max_bytes) as archive:
            for entry in archive.infolist():
                _check_member_header(archive, entry, max_bytes)
    except MpstudioError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise MpstudioError("the inputs .npz holds a pickled (object) array, which the agent refuses; "
                                "send numeric arrays only") from None
        raise MpstudioError(f"the inputs are not a valid .npz archive: {_first_line(exc)}") from None
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, RuntimeError) as exc:
        raise MpstudioError(f"the inputs are not a valid .npz archive: {_first_line(exc)}") from None


def _checked_archive(data: bytes, max_bytes: int | None) -> zipfile.ZipFile:
    if not bytes(data[:4]) == b"PK\x03\x04":  # np.load would take anything else for a pickle or .npy
        raise MpstudioError("the inputs are not a valid .npz archive (make them with numpy.savez)")
    members = _zip_member_count(data)
    if members > MAX_NPZ_MEMBERS:
        raise MpstudioError(f"the .npz has {members} members; at most {MAX_NPZ_MEMBERS} arrays are accepted")
    archive = zipfile.ZipFile(io.BytesIO(data))
    try:
        _check_declared_sizes(archive.infolist(), max_bytes)
    except BaseException:
        archive.close()
        raise
    return archive


def npz_declared_bytes(data: bytes) -> int:
    """What an .npz's members add up to once decompressed, by its zip directory alone (no decompression);
    for deciding where to decode it. Anything unreadable counts as huge."""
    try:
        if _zip_member_count(data) > MAX_NPZ_MEMBERS:
            return 1 << 62
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return sum(entry.file_size for entry in archive.infolist())
    except (MpstudioError, zipfile.BadZipFile, OSError, ValueError, EOFError):
        return 1 << 62


def _zip_member_count(data: bytes) -> int:
    """How many members a zip's central directory really holds, counted from its entries (at most
    `MAX_NPZ_MEMBERS + 1` of them are walked) before zipfile builds an index of every member: an archive of
    millions of empty members would cost gigabytes of Python objects, and the end record's count may lie."""
    tail = bytes(data[-(22 + 0xFFFF):])
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        raise MpstudioError("the inputs are not a valid .npz archive (no end of central directory)")
    count, directory_size = struct.unpack_from("<HI", tail, at + 10)
    if count == 0xFFFF or directory_size == 0xFFFFFFFF:
        return MAX_NPZ_MEMBERS + 1  # a zip64 directory: far too many members for inputs anyway
    # zipfile finds the directory just before the end record, `directory_size` bytes long: walk the same.
    end = len(data) - len(tail) + at
    position, found = end - directory_size, 0
    if position < 0:
        raise MpstudioError("the inputs are not a valid .npz archive (bad central directory size)")
    view = memoryview(data)
    while position + 46 <= end and found <= MAX_NPZ_MEMBERS:
        if bytes(view[position:position + 4]) != b"PK\x01\x02":
            break
        name, extra, comment = struct.unpack_from("<HHH", data, position + 28)
        position += 46 + name + extra + comment
        found += 1
    return found


def _check_declared_sizes(entries: list[zipfile.ZipInfo], max_bytes: int | None) -> None:
    for entry in entries:
        if not entry.filename.endswith(".npy"):
            raise MpstudioError(f"the .npz member {entry.filename[:80]!r} is not an .npy array; "
                                "send arrays made with numpy.savez only")
    if max_bytes is None:
        return
    # zipfile never inflates a member past its declared size, so the declared sizes bound the work.
    declared = sum(entry.file_size for entry in entries)
    if declared > max_bytes + _NPY_HEADER_ALLOWANCE * len(entries):
        raise AgentError(
            f"the .npz holds {declared / 2**20:.1f} MB of arrays once decompressed, more than the limit of "
            f"{max_bytes / 2**20:g} MB (send smaller inputs, or start the agent with a larger --max-inputs-mb)", 413)


# Room per member for the .npy header, on top of the array data counted against the limit.
_NPY_HEADER_ALLOWANCE = 64 * 1024


def _read_member(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, budget: int | None) -> tuple[str, np.ndarray]:
    """One member's array: its .npy header is parsed and its declared size checked before allocation."""
    from numpy.lib import format as npy

    _check_member_header(archive, entry, budget)
    with archive.open(entry) as member:
        array = npy.read_array(member, allow_pickle=False)
    return entry.filename[: -len(".npy")], array


def _check_member_header(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, budget: int | None) -> None:
    """Refuse a member by its .npy header alone: its version, an object (pickled) dtype, a shape larger than
    the member or than `budget`."""
    from numpy.lib import format as npy

    with archive.open(entry) as member:
        version = npy.read_magic(member)
        if version not in ((1, 0), (2, 0)):  # 3.0 only adds utf-8 field names of structured dtypes
            raise MpstudioError(f"the .npz member {entry.filename[:80]!r} has .npy version {version}; "
                                "send plain numeric arrays (numpy.savez)")
        read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read_header(member)
    if dtype.hasobject:
        raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow for absurd shapes
    if nbytes > entry.file_size:
        raise MpstudioError(f"the .npz member {entry.filename[:80]!r} declares shape {list(shape)} of {dtype} "
                            f"but holds only {entry.file_size} bytes")
    if budget is not None and nbytes > budget:
        raise AgentError(
            f"the .npz member {entry.filename[:80]!r} holds {nbytes / 2**20:.1f} MB once decompressed "
            f"(shape {list(shape)} of {dtype}), more than the {budget / 2**20:.1f} MB left under the inputs "
            "limit (send smaller inputs, or start the agent with a larger --max-inputs-mb)", 413)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise MpstudioError(f"{what} is not valid base64") from None


# --------------------------------------------------------------------------------------------- results

def _from_dict(cls, data: dict[str, Any]):
    """Build a dataclass from a JSON object, ignoring keys a newer agent may add."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class LatencyStats:
    """Latency of one run request in milliseconds over `n` timed iterations (warm-up excluded).

    `source` is "measured" (time on `device`, a real device or the agent host's CPU for the cpu backend)
    or "emulator" (host time of the x86_64 HTP emulator: a relative cost only, never device latency).
    """

    min_ms: float
    median_ms: float
    p90_ms: float
    mean_ms: float
    std_ms: float
    n: int
    source: str
    device: str
    backend: str

    def __post_init__(self):
        if self.source not in RUN_LATENCY_SOURCES:
            raise ValueError(f"latency source must be one of {RUN_LATENCY_SOURCES}, not {self.source!r}")

    @property
    def latency(self) -> Latency:
        """The median, labelled with its source: the one latency type every part of mpstudio shows."""
        return Latency.from_stats(self)

    @property
    def is_device_latency(self) -> bool:
        return self.latency.is_device_latency

    @property
    def label(self) -> str:
        return self.latency.label

    @classmethod
    def from_times(cls, times_ns: list[int], *, source: str, device: str, backend: str) -> "LatencyStats":
        ms = np.asarray(times_ns, dtype=np.float64) / 1e6
        return cls(
            min_ms=float(ms.min()),
            median_ms=float(np.median(ms)),
            p90_ms=float(np.percentile(ms, 90)),
            mean_ms=float(ms.mean()),
            std_ms=float(ms.std()),
            n=int(ms.size),
            source=source,
            device=device,
            backend=backend,
        )


@dataclass(frozen=True)
class NodeFallback:
    """An ONNX node that did not go to the HTP, and the reason QNN gave (from ORT's verbose log)."""

    node: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class Placement:
    """Where the nodes of a model run: on the HTP (inside QNN partitions) or on ORT's CPU EP."""

    backend: str
    on_htp: tuple[str, ...]
    on_cpu: tuple[NodeFallback, ...]
    htp_partitions: int

    @property
    def fully_on_htp(self) -> bool:
        """True when every node but graph-I/O (de)quantization, which QNN leaves to CPU by design, is on HTP."""
        return self.backend == "htp" and all(_is_io_quantization(f) for f in self.on_cpu)

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "on_htp": list(self.on_htp),
            "on_cpu": [asdict(f) for f in self.on_cpu],
            "htp_partitions": self.htp_partitions,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Placement":
        return cls(
            backend=data["backend"],
            on_htp=tuple(data["on_htp"]),
            on_cpu=tuple(_from_dict(NodeFallback, f) for f in data["on_cpu"]),
            htp_partitions=int(data["htp_partitions"]),
        )


IO_QUANTIZATION_REASON = "graph input/output (de)quantization is left to CPU"


def _is_io_quantization(fallback: NodeFallback) -> bool:
    return fallback.op_type in ("QuantizeLinear", "DequantizeLinear") and fallback.reason.startswith(
        IO_QUANTIZATION_REASON
    )


@dataclass(frozen=True)
class OpCost:
    """One op of a per-op profile, mapped back to the ONNX nodes it came from.

    `cost` is the mean per timed run in `unit` ("cycles" for QNN ops, "us" for ORT CPU kernels).
    """

    op: str
    node: str
    op_type: str
    onnx_nodes: tuple[str, ...]
    cost: float
    unit: str


@dataclass(frozen=True)
class OpProfile:
    """A per-op profile of a model; on the emulator its numbers are emulator cost, not device time."""

    ops: tuple[OpCost, ...]
    unit: str
    source: str
    device: str
    backend: str
    runs: int

    def to_frame(self):
        """A DataFrame with columns op, node, op_type, onnx_nodes, cost, unit, share (of the total cost)."""
        import pandas as pd

        frame = pd.DataFrame([asdict(op) for op in self.ops], columns=[f.name for f in fields(OpCost)])
        total = frame["cost"].sum() if len(frame) else 0.0
        frame["share"] = frame["cost"] / total if total else 0.0
        return frame

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ops"] = list(data["ops"])
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "OpProfile":
        ops = tuple(OpCost(**{**op, "onnx_nodes": tuple(op["onnx_nodes"])}) for op in data["ops"])
        return _from_dict(cls, {**data, "ops": ops})


@dataclass(frozen=True)
class RunResult:
    """What one run request returned. `outputs` maps output names to arrays (empty when not asked for)."""

    run_id: str
    model_id: str
    backend: str
    provider_options: dict[str, str]
    device: str
    emulated: bool
    agent: str
    outputs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    latency: LatencyStats | None = None
    placement: Placement | None = None
    profile: OpProfile | None = None
    session_reused: bool = False
    session_retried: bool = False
    session_create_ms: float = 0.0

    @classmethod
    def from_wire(cls, data: dict, agent: str, outputs: dict[str, np.ndarray] | None = None) -> "RunResult":
        if outputs is None:
            outputs = decode_npz(b64decode(data["outputs_npz"], "outputs")) if data.get("outputs_npz") else {}
        return cls(
            run_id=data["run_id"],
            model_id=data["model_id"],
            backend=data["backend"],
            provider_options=dict(data.get("provider_options") or {}),
            device=data["device"],
            emulated=bool(data["emulated"]),
            agent=agent,
            outputs=outputs,
            latency=_from_dict(LatencyStats, data["latency"]) if data.get("latency") else None,
            placement=Placement.from_dict(data["placement"]) if data.get("placement") else None,
            profile=OpProfile.from_dict(data["profile"]) if data.get("profile") else None,
            session_reused=bool(data.get("session_reused")),
            session_retried=bool(data.get("session_retried")),
            session_create_ms=float(data.get("session_create_ms") or 0.0),
        )


@dataclass(frozen=True)
class AgentInfo:
    """What an agent runs on: its platform, ORT and QNN versions, and what its HTP backend really is.

    `htp_kind` is "npu" on a Snapdragon device, "emulator" on x86_64 (timings are host time), or None
    when the agent has no usable HTP backend.
    """

    device: str
    os: str
    os_release: str
    arch: str
    python: str
    onnxruntime: str
    onnxruntime_qnn: str | None
    backends: tuple[str, ...]
    htp_kind: str | None
    htp_arch: str
    soc_model: str | None
    agent_version: str
    worker_pid: int | None
    max_upload_mb: float
    run_timeout_s: float
    htp_error: str | None = None

    @property
    def htp_emulated(self) -> bool:
        return self.htp_kind == "emulator"

    @classmethod
    def from_wire(cls, data: dict) -> "AgentInfo":
        return _from_dict(cls, {**data, "backends": tuple(data["backends"])})


@dataclass(frozen=True)
class ContextBinary:
    """An EPContext model built on an agent: a model of its own (`model_id`) made from `source_model_id`."""

    model_id: str
    source_model_id: str
    provider_options: dict[str, str]
    size_bytes: int
    build_ms: float
