"""Verify on the QNN HTP backend the nodes whose support the documentation does not settle.

`qnn_support` checks a model against the documented operator list; some nodes it can only warn about (an op the
list omits though the EP has a builder for it, a documented op on values outside its note). Each such node is
probed: a one-node model with the node's own input types and shapes (the constants it reads kept), at the
precisions a plan can give it (8- and 16-bit QDQ around its float tensors, or the node as it is when none of its
tensors is quantized), is handed to the HTP backend with CPU fallback disabled. The verdict and QNN's own words
(from ORT's verbose log) are cached under `cache_root()/qnn-probe`, keyed by the node's signature and the
ONNX Runtime / onnxruntime-qnn versions, so a node is probed once per toolchain. Probes run in a spawned process
with a timeout: QNN can hang, and a session must never be made in a forked one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .cache import cache_root
from .qnn_support import FALLBACK, VERIFIED, WARNING, SupportIssue, describe_node

REJECTED = "rejected by QNN HTP when probed"  # reason category of a probed node QNN refused
UNVERIFIED = "unverified"  # reason category of a warned node that could not be probed here
PROBE_TIMEOUT = 60.0  # seconds one probe session may take before the prober is stopped
# A node the QNN EP takes and whose graph then fails to finalize (an LSTM with onnxruntime-qnn 2.7) is not left
# to the CPU: with CPU fallback allowed the session fails the same way, so allow_fallback cannot run it.
_FINALIZE_FAILED = "Failed to finalize QNN graph"
UNMOVABLE = "the QNN EP takes it and its graph then fails to build, so ORT cannot run it on the CPU instead"

# A probe's precisions: the node as QNN sees it in a plan's QDQ model.
FLOAT, A8, A16 = "float", "8-bit", "16-bit"
_QTYPES = {A8: (TensorProto.UINT8, 128), A16: (TensorProto.UINT16, 32768)}
_MS = "com.microsoft"
_QNN_LINE = re.compile(r"(Unsupported nodes in QNN EP: .*|backendValidateOpConfig\(\) failed .*|REASON : .*)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Toolchain:
    """The software whose verdict a probe records: a verdict is reused only by the same toolchain."""

    onnxruntime: str
    onnxruntime_qnn: str
    htp_arch: str

    @classmethod
    def installed(cls, htp_arch: str | None = None) -> "Toolchain | None":
        """The installed toolchain, or None where the QNN HTP backend is not available."""
        from importlib.metadata import PackageNotFoundError, version

        from .runtime import DEFAULT_HTP_ARCH, qnn_library_path

        if qnn_library_path() is None:
            return None
        try:
            qnn = version("onnxruntime-qnn")
        except PackageNotFoundError:
            qnn = "unknown"
        import onnxruntime

        return cls(onnxruntime.__version__, qnn, str(htp_arch or DEFAULT_HTP_ARCH))


@dataclass(frozen=True)
class Probe:
    """One node at one precision, as a model the HTP is asked to build."""

    node: str
    op_type: str
    precision: str
    key: str  # names the cached verdict
    model: bytes = b""


@dataclass(frozen=True)
class Verdict:
    """What the HTP said of one probe: accepted, or rejected with QNN's reason."""

    accepted: bool
    reason: str = ""
    cached: bool = False


# ---- building probes -----------------------------------------------------------------------------------------

def _value_info(types: dict, name: str) -> onnx.ValueInfoProto | None:
    t = types.get(name)
    if t is None or not t.HasField("tensor_type"):
        return None
    vi = onnx.ValueInfoProto()
    vi.name = name
    vi.type.CopyFrom(t)
    return vi


def _signature(node: onnx.NodeProto, inputs, outputs, constants: dict, opsets) -> dict:
    def described(vi, name):
        if name in constants:
            t = constants[name]
            return [t.data_type, list(t.dims), hashlib.sha256(t.SerializeToString()).hexdigest()[:16]]
        tt = vi.type.tensor_type
        return [tt.elem_type, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim]]

    return {
        "op": f"{node.domain or 'ai.onnx'}:{node.op_type}",
        "inputs": [described(vi, n) if n else None for n, vi in inputs],
        "outputs": [described(vi, n) for n, vi in outputs],
        "attributes": sorted(hashlib.sha256(a.SerializeToString()).hexdigest()[:16] for a in node.attribute),
        "opset": {o.domain or "ai.onnx": o.version for o in opsets},
    }


def probe_key(signature: dict, precision: str, toolchain: Toolchain) -> str:
    """The cache key of one probe: the node's signature, its precision and the toolchain."""
    text = json.dumps({"node": signature, "precision": precision, "toolchain": toolchain.__dict__}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def node_probes(model: onnx.ModelProto, node: onnx.NodeProto, toolchain: Toolchain) -> list[Probe] | None:
    """The probes of `node` (one per precision a plan can give it); None when its tensors lack types/shapes."""
    graph = model.graph
    types = {vi.name: vi.type for vi in (*graph.input, *graph.value_info, *graph.output)}
    constants = {t.name: t for t in graph.initializer}
    inputs, outputs = [], []
    for name in node.input:
        if not name or name in constants:
            inputs.append((name, None))
            continue
        vi = _value_info(types, name)
        if vi is None:
            return None
        inputs.append((name, vi))
    for name in node.output:
        vi = _value_info(types, name) if name else None
        if vi is None:
            return None
        outputs.append((name, vi))
    signature = _signature(node, inputs, outputs, constants, model.opset_import)
    quantized = [n for n, vi in (*inputs, *outputs) if vi is not None and vi.type.tensor_type.elem_type == TensorProto.FLOAT]
    precisions = (A8, A16) if quantized else (FLOAT,)
    name = describe_node(node)
    return [Probe(name, node.op_type, p, probe_key(signature, p, toolchain),
                  _probe_model(model, node, inputs, outputs, constants, p).SerializeToString()) for p in precisions]


def _probe_model(model, node, inputs, outputs, constants, precision) -> onnx.ModelProto:
    """A model of `node` alone: its activations are graph inputs/outputs, with Q/DQ pairs at `precision`."""
    nodes, inits, graph_inputs, graph_outputs = [], [], [], []
    probed = onnx.NodeProto()
    probed.CopyFrom(node)
    qtype = _QTYPES.get(precision)
    for i, (name, vi) in enumerate(inputs):
        if not name:
            continue
        if vi is None:  # a constant the node reads: kept (weights get an 8-bit DequantizeLinear in a plan)
            tensor = constants[name]
            if qtype and tensor.data_type == TensorProto.FLOAT:
                inits += _quantized_weight(tensor, f"probe_w{i}")
                nodes.append(helper.make_node("DequantizeLinear", [f"probe_w{i}", f"probe_w{i}_s", f"probe_w{i}_z"],
                                              [name], domain=_MS))
            else:
                inits.append(tensor)
            continue
        graph_inputs.append(vi)
        if qtype and vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            nodes += _qdq(name, f"probe_in{i}", qtype, inits)
            probed.input[i] = f"probe_in{i}"
    nodes.append(probed)
    for i, (name, vi) in enumerate(outputs):
        if qtype and vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            probed.output[i] = f"probe_out{i}"
            nodes += _qdq(f"probe_out{i}", name, qtype, inits)
        graph_outputs.append(vi)
    graph = helper.make_graph(nodes, f"probe_{node.op_type}", graph_inputs, graph_outputs, inits)
    opsets = [o for o in model.opset_import if o.domain != _MS] + [helper.make_opsetid(_MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=model.ir_version)


def _qdq(source: str, target: str, qtype: tuple[int, int], inits: list) -> list[onnx.NodeProto]:
    elem, zero = qtype
    s, z, q = f"{target}_s", f"{target}_z", f"{target}_q"
    inits += [numpy_helper.from_array(np.array(0.01, np.float32), s),
              helper.make_tensor(z, elem, [], [zero])]
    return [helper.make_node("QuantizeLinear", [source, s, z], [q], domain=_MS),
            helper.make_node("DequantizeLinear", [q, s, z], [target], domain=_MS)]


def _quantized_weight(tensor: onnx.TensorProto, name: str) -> list[onnx.TensorProto]:
    values = numpy_helper.to_array(tensor).astype(np.float32)
    low, high = min(float(values.min(initial=0.0)), 0.0), max(float(values.max(initial=0.0)), 0.0)
    scale = (high - low) / 255 or 1.0
    zero = int(round(-low / scale))
    q = np.clip(np.round(values / scale) + zero, 0, 255).astype(np.uint8)
    return [numpy_helper.from_array(q, name), numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
            numpy_helper.from_array(np.array(zero, np.uint8), f"{name}_z")]


# ---- running probes ------------------------------------------------------------------------------------------

def _probe_worker(conn, jobs: list[tuple[str, bytes]], htp_arch: str, workdir: str) -> None:
    """In a spawned process: build each probe on the HTP (fallback disabled) and send (key, accepted, reason).
    `workdir` is its parent's to remove: QNN leaves trace files in the working directory."""
    os.chdir(workdir)
    log = Path("ort.log")
    fd = os.open(log, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)  # ORT's verbose log, which alone holds QNN's reasons
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    from .runtime import create_session, first_line

    for key, model in jobs:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            create_session(model, "htp", {"htp_arch": htp_arch}, log_severity=0)
            conn.send((key, True, ""))
            continue
        except Exception as exc:
            error = first_line(exc.__cause__ or exc)
        os.fsync(fd)
        conn.send((key, False, qnn_reason(log.read_text(errors="replace"), error)))


def qnn_reason(log: str, error: str) -> str:
    """QNN's words for a rejected node: the EP's verbose-log lines naming it, else the exception's first line."""
    found: list[str] = []
    for line in _ANSI.sub("", log).splitlines():
        match = _QNN_LINE.search(line)
        text = match.group(1).strip().removeprefix("REASON : ") if match else ""
        if text and text not in found:
            found.append(text)
    found.sort(key=lambda text: not text.startswith("Unsupported nodes"))
    return "; ".join(found) if found else error


def run_probes(probes: list[Probe], htp_arch: str, timeout: float = PROBE_TIMEOUT) -> dict[str, Verdict]:
    """Verdicts of `probes` by key, from the HTP in spawned processes; a probe that hangs gets no verdict."""
    verdicts: dict[str, Verdict] = {}
    pending = list({p.key: p for p in probes}.values())
    with tempfile.TemporaryDirectory(prefix="mpstudio-probe-") as workdir:  # removed even when a probe is killed
        while pending:
            pending = _probe_process(pending, htp_arch, timeout, workdir, verdicts)
    return verdicts


def _probe_process(pending: list[Probe], htp_arch: str, timeout: float, workdir: str,
                   verdicts: dict[str, Verdict]) -> list[Probe]:
    """One spawned process answering probes in turn until one hangs or crashes it; the probes left."""
    from .runtime import spawn_context

    ctx = spawn_context()
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_probe_worker, daemon=True,
                          args=(child, [(p.key, p.model) for p in pending], htp_arch, workdir))
    process.start()
    child.close()
    first_wait = timeout + 30  # the first answer also waits for the process to start and load QNN
    while pending:
        if not parent.poll(first_wait):
            verdicts[pending.pop(0).key] = Verdict(False, f"no answer from the HTP within {timeout:.0f} s",
                                                  cached=False)
            break
        try:
            key, accepted, reason = parent.recv()
        except EOFError:  # the process died building this probe
            process.join(5)
            verdicts[pending.pop(0).key] = Verdict(False, f"QNN crashed building it (exit code {process.exitcode})")
            break
        verdicts[key] = Verdict(accepted, reason)
        pending = [p for p in pending if p.key != key]
        first_wait = timeout
    if process.is_alive():
        process.kill()
    process.join(5)
    parent.close()
    return pending


# ---- the cache and the report --------------------------------------------------------------------------------

def _cache_dir() -> Path:
    folder = cache_root() / "qnn-probe"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cached_verdict(key: str) -> Verdict | None:
    try:
        data = json.loads((_cache_dir() / f"{key}.json").read_text())
        return Verdict(bool(data["accepted"]), str(data.get("reason", "")), cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_verdict(probe: Probe, verdict: Verdict, toolchain: Toolchain) -> None:
    path = _cache_dir() / f"{probe.key}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"op": probe.op_type, "precision": probe.precision, "accepted": verdict.accepted,
                               "reason": verdict.reason, "toolchain": toolchain.__dict__}, indent=1))
    os.replace(tmp, path)


def needs_probe(issue: SupportIssue) -> bool:
    """True for what the static check can only warn about (nodes it would call fallbacks are not probed)."""
    return issue.severity == WARNING


def verify_support(model: onnx.ModelProto, issues: list[SupportIssue], *, verify: bool | None = None,
                   htp_arch: str | None = None, timeout: float = PROBE_TIMEOUT) -> list[SupportIssue]:
    """`issues` with each warned node probed on the HTP: rejected ones become fallbacks with QNN's reason, accepted
    ones are marked verified. Without the backend (or with `verify=False`) they are marked unverified."""
    targets = {i.node for i in issues if needs_probe(i)}
    if not targets:
        return issues
    toolchain = Toolchain.installed(htp_arch) if verify is not False else None
    if toolchain is None:
        why = "no QNN HTP backend here to probe it" if verify is not False else "probing was turned off"
        return [replace(i, reason=f"{UNVERIFIED}: {i.reason.split(': ', 1)[-1]} ({why})") if needs_probe(i) else i
                for i in issues]
    node_verdicts = _node_verdicts(model, targets, toolchain, timeout)
    result: list[SupportIssue] = []
    done: set[str] = set()  # one verdict per node replaces all its warnings
    for issue in issues:
        if not needs_probe(issue):
            result.append(issue)
        elif issue.node not in node_verdicts:
            result.append(replace(issue, reason=f"{UNVERIFIED}: {issue.reason.split(': ', 1)[-1]} (it could not be "
                                  "probed: its tensors lack static types)"))
        elif issue.node not in done:
            done.add(issue.node)
            result.append(_verdict_issue(issue, node_verdicts[issue.node], toolchain))
    return result


def _node_verdicts(model, targets: set[str], toolchain: Toolchain, timeout: float) -> dict[str, list]:
    probes: dict[str, list[Probe]] = {}
    for node in model.graph.node:
        name = describe_node(node)
        if name in targets:
            built = node_probes(model, node, toolchain)
            if built is not None:
                probes[name] = built
    verdicts = {p.key: v for ps in probes.values() for p in ps if (v := cached_verdict(p.key)) is not None}
    missing = [p for ps in probes.values() for p in ps if p.key not in verdicts]
    if missing:
        fresh = run_probes(missing, toolchain.htp_arch, timeout)
        for probe in missing:
            if probe.key in fresh and not fresh[probe.key].reason.startswith("no answer"):
                store_verdict(probe, fresh[probe.key], toolchain)
        verdicts.update(fresh)
    return {name: [(p.precision, verdicts.get(p.key)) for p in ps] for name, ps in probes.items()}


def _verdict_issue(issue: SupportIssue, found: list, toolchain: Toolchain) -> SupportIssue:
    where = f"onnxruntime-qnn {toolchain.onnxruntime_qnn}, v{toolchain.htp_arch}"
    unanswered = [p for p, v in found if v is None or v.reason.startswith("no answer")]
    rejected = [(p, v.reason) for p, v in found if v is not None and not v.accepted and p not in unanswered]
    if not rejected and unanswered:
        return replace(issue, reason=f"{UNVERIFIED}: {issue.op_type} did not answer when probed at "
                                     f"{', '.join(unanswered)} within the time limit ({where})")
    if not rejected:
        shown = ", ".join(p for p, _ in found)
        return replace(issue, severity=VERIFIED, reason=f"verified on HTP: {issue.op_type} built at {shown} "
                                                        f"({where})")
    reasons = list(dict.fromkeys(reason for _, reason in rejected))
    precisions = ", ".join(p for p, _ in rejected)
    words = reasons[0] if len(reasons) == 1 else "; ".join(f"{p}: {r}" for p, r in rejected)
    if len(rejected) == len(found):
        stuck = f"; {UNMOVABLE}" if all(_FINALIZE_FAILED in reason for reason in reasons) else ""
        return replace(issue, severity=FALLBACK, reason=f"{REJECTED}: {issue.op_type} at {precisions} ({where}): "
                                                        f"{words}{stuck}")
    return replace(issue, severity=WARNING, reason=f"{REJECTED}: {issue.op_type} at {precisions} only ({where}); "
                                                   f"plans that give it that precision will not build: {words}")
