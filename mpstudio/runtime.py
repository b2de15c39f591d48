"""ONNX Runtime sessions on mpstudio's two backends: `cpu` (ORT's QDQ reference) and `htp` (QNN EP).

QNN accepts unknown provider keys and invalid values with at most a warning, so every option is checked
here against a whitelist before a session is made.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import platform
import re
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from .errors import MpstudioError
from .htp_accumulator import follow_accumulator_rounding, graph_links, quantizers_after
from .htp_requantize import follow_requantize_rounding

BACKENDS = ("cpu", "htp")
QNN_PROVIDER = "QNNExecutionProvider"
DEFAULT_HTP_ARCH = "75"

# How ORT's CPU EP computes a QDQ model. "fused": ORT's defaults, which fuse 8-bit Q/DQ node groups into
# integer kernels (QLinearConv, ...) with their own requantization rounding and use the NCHWc layout
# kernels. "basic": basic graph optimizations only (constant folding, no QDQ fusion, no NCHWc).
# "fake-quant": quantization simulated in float exactly as the graph writes it (ORT's QDQ transformations
# off) and no NCHWc, whose blocked kernels sum in another order depending on the graph around each Conv;
# weights the HTP requantizes are taken on the HTP's grid (`htp_weight_grid`), float graph inputs are rounded
# to their codes as the HTP rounds them (`htp_input_rounding`), and Convs and Gemms round their accumulator as the
# HTP does (`htp_accumulator_rounding`: 16-bit sums shifted right by 8 bits, 8-bit requantization by a shifted
# accumulator and a 12-bit multiplier; 8-bit and 16-bit Adds by the HTP's integer multipliers).
# Which one predicts the HTP best is measured by benchmarks/fidelity.py (docs/benchmarks.md); DEFAULT_CPU_NUMERICS
# is its pick. fake-quant is also the sensitivity engine's numerics, and unlike the fused integer kernels it
# does not depend on the CPU's instruction set (ORT's int8 kernels round differently without VNNI).
CPU_NUMERICS = ("fused", "basic", "fake-quant")
DEFAULT_CPU_NUMERICS = "fake-quant"
# Whether fake-quant follows the HTP's requantization (`htp_requantize`). The sensitivity engine's switchable
# model reads it too (`sensitivity.isolation.requantize`), so that it computes what the regenerated plans compute.
FOLLOW_HTP_REQUANTIZATION = True


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def memory_status() -> tuple[int, int] | None:
    """(available, total) bytes of memory, within a container's (cgroup v2) limit where one applies; None when
    the platform does not say (psutil, where installed, or Linux's /proc/meminfo)."""
    try:
        import psutil  # optional

        memory = psutil.virtual_memory()
        available, total = int(memory.available), int(memory.total)
    except ImportError:
        try:
            fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
            available, total = (int(fields[key].split()[0]) * 1024 for key in ("MemAvailable", "MemTotal"))
        except (OSError, KeyError, ValueError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max" and int(limit) < total:
            total = int(limit)
            available = min(available, max(0, total - used))
    except (OSError, ValueError):
        pass
    return available, total


# ---- worker processes ------------------------------------------------------------------------------------------
# Workers are spawned (an ORT session used after a fork hangs). A spawned child imports the parent's main
# script first, so a user's script without an `if __name__ == "__main__":` guard would run again in every
# worker (and its study would find itself busy). mpstudio's workers need nothing from that script unless
# what they are sent refers to it (a metric function defined there): only then is it imported.
_main_lock = threading.Lock()


@contextlib.contextmanager
def _main_hidden():
    with _main_lock:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


class _OwnProcess(multiprocessing.context.SpawnProcess):
    """A spawned process that does not import the parent's main script."""

    @staticmethod
    def _Popen(process_obj):
        with _main_hidden():
            return multiprocessing.context.SpawnProcess._Popen(process_obj)


class _OwnContext(multiprocessing.context.SpawnContext):
    Process = _OwnProcess


def spawn_context(payload=None):
    """The multiprocessing context mpstudio's workers start from: spawn, without the parent's main script
    unless `payload` (what the workers will be sent) refers to objects defined in it."""
    if payload is not None:
        import pickle

        try:
            needs_main = b"__main__" in pickle.dumps(payload)
        except Exception:
            needs_main = False
        if needs_main:
            return multiprocessing.get_context("spawn")
    return _OwnContext()


def exit_with_parent(cleanup=None) -> None:
    """In a spawned worker: exit as soon as the process that started it dies (killed, crashed), after
    `cleanup()` if given, so no orphan keeps running, holding memory or a device. A parent that ends normally
    stops its workers itself; this is for the parent that cannot."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        try:
            if cleanup is not None:
                cleanup()
        finally:
            os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


_PERF_MODES = (
    "burst", "balanced", "default", "high_performance", "high_power_saver", "low_balanced",
    "extreme_power_saver", "low_power_saver", "power_saver", "sustained_high_performance",
)


@dataclass(frozen=True)
class OptionRule:
    """What values one provider option may take."""

    choices: tuple[str, ...] = ()
    pattern: str = ""
    help: str = ""

    def accepts(self, value: str) -> bool:
        if self.choices:
            return value in self.choices
        return re.fullmatch(self.pattern, value) is not None

    def describe(self) -> str:
        return ", ".join(self.choices) if self.choices else self.help


# The QNN EP options (seed 001) that mpstudio lets through; paths are never taken from a caller.
HTP_OPTION_RULES: dict[str, OptionRule] = {
    "htp_arch": OptionRule(choices=("0", "68", "69", "73", "75", "79", "81")),
    "soc_model": OptionRule(pattern=r"[0-9]{1,4}", help="a SoC model number such as 60"),
    "htp_performance_mode": OptionRule(choices=_PERF_MODES),
    "htp_graph_finalization_optimization_mode": OptionRule(choices=("0", "1", "2", "3")),
    "vtcm_mb": OptionRule(pattern=r"[0-9]{1,3}", help="an integer number of MB, 0 for the default"),
    "enable_htp_fp16_precision": OptionRule(choices=("0", "1")),
    "offload_graph_io_quantization": OptionRule(choices=("0", "1")),
    "profiling_level": OptionRule(choices=("off", "basic", "detailed")),
    "qnn_context_priority": OptionRule(choices=("low", "normal", "normal_high", "high")),
    "enable_htp_shared_memory_allocator": OptionRule(choices=("0", "1")),
    "device_id": OptionRule(pattern=r"[0-9]{1,2}", help="a small integer"),
}


def validate_provider_options(options: dict | None, backend: str = "htp") -> dict[str, str]:
    """Return the options as strings, or raise naming the first bad key or value and what is allowed."""
    if backend not in BACKENDS:
        raise MpstudioError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    options = dict(options or {})
    if backend == "cpu":
        if options:
            raise MpstudioError(
                f"provider options {sorted(options)} were given for the cpu backend, which takes none"
            )
        return {}
    checked: dict[str, str] = {}
    for key, value in options.items():
        rule = HTP_OPTION_RULES.get(key)
        if rule is None:
            raise MpstudioError(
                f"unknown provider option {key!r}; allowed options: {', '.join(sorted(HTP_OPTION_RULES))}"
            )
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        if not rule.accepts(text):
            raise MpstudioError(f"invalid value {value!r} for provider option {key!r}; allowed: {rule.describe()}")
        checked[key] = text
    checked.setdefault("htp_arch", DEFAULT_HTP_ARCH)
    return checked


_registered = threading.Lock()
_qnn_state: dict[str, object] = {}


def qnn_library_path() -> str | None:
    """Path of the QNN EP plugin library, or None when onnxruntime-qnn is not installed here."""
    try:
        import onnxruntime_qnn
    except ImportError:
        return None
    path = onnxruntime_qnn.get_library_path()
    return path if os.path.exists(path) else None


def register_qnn() -> list:
    """Register the QNN EP plugin once per process and return its EP devices."""
    with _registered:
        if "devices" in _qnn_state:
            return _qnn_state["devices"]  # type: ignore[return-value]
        path = qnn_library_path()
        if path is None:
            raise MpstudioError(
                "the htp backend needs the onnxruntime-qnn package (Linux x86_64 and Windows wheels): "
                "pip install onnxruntime-qnn"
            )
        try:
            ort.register_execution_provider_library(QNN_PROVIDER, path)
        except Exception as exc:  # a second registration raises; anything else is a real failure
            if "already" not in str(exc).lower():
                raise MpstudioError(f"could not load the QNN execution provider: {exc}") from exc
        devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_PROVIDER]
        if not devices:
            raise MpstudioError("the QNN execution provider loaded but reports no device")
        _qnn_state["devices"] = devices
        return devices


def htp_is_emulated() -> bool:
    """True where the HTP backend is the x86_64 emulator: its timings are host time, not NPU latency."""
    return platform.machine().lower() in ("x86_64", "amd64", "x64", "i686")


def create_session(
    model: str | Path | bytes,
    backend: str = "cpu",
    provider_options: dict | None = None,
    *,
    allow_cpu_fallback: bool = False,
    log_severity: int = 3,
    profiling_file: str | Path | None = None,
    intra_op_threads: int = 0,
    profile_ops: bool = False,
    session_config: dict[str, str] | None = None,
    numerics: str | None = None,
) -> ort.InferenceSession:
    """An inference session for `model` on `backend`.

    On htp, CPU fallback is disabled unless asked for, so a node QNN cannot take is an error rather than
    a silently slower model; and the session is checked to really use the QNN EP.

    `profiling_file`: on htp, the QNN profile CSV (`profile_ops` asks for per-op rows with their ONNX
    source nodes); on cpu, the prefix of ORT's own JSON profile (`session.end_profiling()` names it).
    `session_config`: extra session config entries, e.g. `ep.context_enable` to write a context binary.
    `numerics`: on cpu, one of CPU_NUMERICS (default DEFAULT_CPU_NUMERICS).
    """
    options = validate_provider_options(provider_options, backend)
    numerics = numerics or DEFAULT_CPU_NUMERICS
    if numerics not in CPU_NUMERICS:
        raise MpstudioError(f"unknown CPU numerics {numerics!r}; use one of {', '.join(CPU_NUMERICS)}")
    so = ort.SessionOptions()
    so.log_severity_level = log_severity
    if intra_op_threads:
        so.intra_op_num_threads = intra_op_threads
    for key, value in (session_config or {}).items():
        so.add_session_config_entry(key, str(value))
    if backend == "cpu" and profiling_file is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profiling_file)
    model_arg = bytes(model) if isinstance(model, (bytes, bytearray, memoryview)) else str(model)
    try:
        if backend == "cpu":
            disabled = []
            if numerics == "basic":
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            elif numerics == "fake-quant":
                so.add_session_config_entry("session.disable_quant_qdq", "1")
                disabled = ["NchwcTransformer"]
                model_arg = _fake_quant_model(model_arg)
            return ort.InferenceSession(model_arg, so, providers=["CPUExecutionProvider"],
                                        disabled_optimizers=disabled)
        devices = register_qnn()
        if not allow_cpu_fallback:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        qnn_options = {"backend_type": "htp", **options}
        if profiling_file is not None:
            qnn_options["profiling_file_path"] = str(profiling_file)
            qnn_options.setdefault("profiling_level", "basic")
            if profile_ops:
                # "detailed" gives one row per QNN op; the framework op trace adds its ONNX source nodes.
                qnn_options["profiling_level"] = "detailed"
                qnn_options["enable_framework_op_trace"] = "1"
        so.add_provider_for_devices(devices, qnn_options)
        with _quiet_stdout_once():
            session = ort.InferenceSession(model_arg, so)
    except MpstudioError:
        raise
    except Exception as exc:
        raise MpstudioError(f"ONNX Runtime could not create a {backend} session: {first_line(exc)}") from exc
    if QNN_PROVIDER not in session.get_providers():
        raise MpstudioError("the QNN execution provider was not used for this session; the model ran on CPU")
    return session


def quiet_native_logs(severity: int = 3) -> None:
    """Keep ONNX Runtime's default logger (environment creation, provider registration) to errors and worse
    (3) by default; sessions take their own level from `create_session(log_severity=...)`."""
    ort.set_default_logger_severity(severity)


_stdout_quieted = False


@contextlib.contextmanager
def _quiet_stdout_once():
    """libQnnHtp prints a `# LIBNATIVE` line on file descriptor 1 when it first loads in a process; keep it
    off a user's stdout (which may carry a table or a protocol). Only the first HTP session is wrapped."""
    global _stdout_quieted
    if _stdout_quieted:
        yield
        return
    _stdout_quieted = True
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real fd 1 (some notebook kernels): nothing to protect
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


# ---- the weights the HTP really multiplies by ------------------------------------------------------------
# The HTP multiplies by signed symmetric 8-bit weights. A uint8 asymmetric per-tensor weight (ORT's QNN
# default, a8w8's) whose w - zero point leaves [-128, 127] in some output channel is requantized by the HTP,
# per channel: that channel gets scale s * max(max(w - zp) / 127, -min(w - zp) / 128) and its values are
# rounded onto that grid; channels that fit keep their values exactly. Measured on the HTP emulator
# (onnxruntime-qnn, x86_64) with one-op models: PP-OCRv4 det's first depthwise Conv (zero point 109, one
# channel reaching w - zp = 146) has that channel 0.98 output steps off the exact result and 0.00 off this
# grid; over random Conv, depthwise Conv, MatMul and Gemm models at a8w8 and a16w8 the largest per-channel
# mean offset drops from up to 0.85 steps to at most 0.12 (a16w8: 0.01). It happens when the op's input and
# output activations have the same width (8/8 or 16/16), not for 8 -> 16 or 16 -> 8, and not for
# ConvTranspose; those keep the exact weights here too.
_HTP_REQUANTIZED_WEIGHTS = {"Conv": 0, "MatMul": -1, "Gemm": None}  # op -> its output-channel axis of input 1


def _proto(model: str | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """`model` as a ModelProto: itself, or read from its path or serialized bytes."""
    if isinstance(model, onnx.ModelProto):
        return model
    return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)


def _rewritten(model, proto: onnx.ModelProto, changed: bool):
    """A rewrite's answer: for a ModelProto (changed in place) the proto, or None when nothing changed; for a path
    or bytes, the changed model's bytes, or `model` itself."""
    if isinstance(model, onnx.ModelProto):
        return proto if changed else None
    return proto.SerializeToString() if changed else model


def _fake_quant_model(model: str | bytes) -> str | bytes:
    """The model the fake-quant numerics run: the HTP's weights, its graph input rounding, its 16-bit accumulator
    rounding and its 8-bit requantization (`FOLLOW_HTP_REQUANTIZATION`; read once)."""
    proto = _proto(model)
    grid = htp_weight_grid(proto)
    rounded = htp_input_rounding(proto)
    accumulated = htp_accumulator_rounding(proto, requantize=FOLLOW_HTP_REQUANTIZATION)
    return model if grid is None and rounded is None and accumulated is None else proto.SerializeToString()


def htp_accumulator_rounding(model: str | bytes | onnx.ModelProto,
                             requantize: bool = False) -> str | bytes | onnx.ModelProto | None:
    """`model` with each 16-bit Conv and Gemm computing its accumulator as the HTP rounds it (the product sum
    shifted right by 8 bits, the int32 bias' low 8 bits dropped: `htp_accumulator`); with `requantize`, also each
    8-bit one requantizing it as the HTP does (the accumulator shifted to about 1/16 output step, a 12-bit
    multiplier) and each 8-bit or 16-bit Add with the HTP's integer multipliers (`htp_requantize`; the fake-quant numerics
    ask for it as `FOLLOW_HTP_REQUANTIZATION` says); `model` itself when it has none. A ModelProto is changed in
    place; the answer is then the proto, or None when nothing changed."""
    proto = _proto(model)
    sixteen = follow_accumulator_rounding(proto)
    eight = follow_requantize_rounding(proto) if requantize else False
    return _rewritten(model, proto, sixteen or eight)


def htp_weight_grid(model: str | bytes | onnx.ModelProto) -> str | bytes | None:
    """`model` (a path or serialized bytes) with each uint8 asymmetric per-tensor weight the HTP requantizes
    replaced by what the HTP computes with (a per-channel int8 DequantizeLinear); `model` itself when it has
    none. A ModelProto is changed in place; the answer is then None when nothing changed."""
    proto = _proto(model)
    graph = proto.graph
    inits, producers, consumers = graph_links(graph)

    def zero_point_bits(dq_or_q) -> int | None:
        zp = inits.get(dq_or_q.input[2]) if len(dq_or_q.input) > 2 else None
        return None if zp is None else 8 * numpy_helper.to_array(zp).dtype.itemsize

    def output_bits(node) -> int | None:
        users = quantizers_after(node, consumers)
        if not users or any(u.op_type != "QuantizeLinear" for u in users):
            return None
        bits = {zero_point_bits(u) for u in users}
        return bits.pop() if len(bits) == 1 else None

    changed = False
    for index, node in enumerate(list(graph.node)):
        if node.op_type not in _HTP_REQUANTIZED_WEIGHTS or len(node.input) < 2:
            continue
        source, weight = producers.get(node.input[0]), producers.get(node.input[1])
        if (weight is None or weight.op_type != "DequantizeLinear" or len(weight.input) < 3
                or not all(name in inits for name in weight.input)):
            continue
        codes, scale, zero = (numpy_helper.to_array(inits[name]) for name in weight.input)
        if codes.dtype != np.uint8 or scale.size != 1 or codes.ndim < 2:
            continue
        # ORT's QNN configuration converts around an op so that its input and output share a width; a width
        # that cannot be read here (the isolation engine's switchable parameters) is taken to be shared.
        in_bits = zero_point_bits(source) if source is not None and source.op_type == "DequantizeLinear" else None
        out_bits = output_bits(node)
        if in_bits is not None and out_bits is not None and in_bits != out_bits:
            continue
        axis = _HTP_REQUANTIZED_WEIGHTS[node.op_type]
        if axis is None:  # Gemm: B is (K, N), or (N, K) with transB
            axis = 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
        axis %= codes.ndim
        centred = np.moveaxis(codes.astype(np.int64) - int(zero.reshape(-1)[0]), axis, 0)
        flat = centred.reshape(centred.shape[0], -1)
        high, low = np.maximum(flat.max(1), 0), np.maximum(-flat.min(1), 0)
        outside = (high > 127) | (low > 128)
        if not outside.any():
            continue
        step = np.where(outside, np.maximum(high / 127, low / 128), 1.0)
        signed = np.clip(np.round(centred / step.reshape(-1, *[1] * (centred.ndim - 1))), -128, 127)
        name = f"{weight.input[0]}_htp_grid_{index}"
        graph.initializer.extend([
            numpy_helper.from_array(np.moveaxis(signed.astype(np.int8), 0, axis), name),
            numpy_helper.from_array((float(scale.reshape(-1)[0]) * step).astype(np.float32), name + "_scale"),
            numpy_helper.from_array(np.zeros(len(step), np.int8), name + "_zero_point")])
        dq = helper.make_node("DequantizeLinear", [name, name + "_scale", name + "_zero_point"], [name + "_dq"],
                              name=name + "_DequantizeLinear", axis=axis)
        graph.node.insert(list(graph.node).index(node), dq)
        node.input[1] = name + "_dq"
        changed = True
    return _rewritten(model, proto, changed)


# ---- how the HTP rounds a float graph input ------------------------------------------------------------
# Measured on the HTP emulator with a Q -> DQ -> Transpose -> Q -> DQ model (its output carries the input's
# codes), over values spread across the range and values within 1e-3 steps of a rounding tie: a uint8 graph
# input gets round_half_away(float16(x / scale)) + zero point (no mismatch in 46,080 values; ORT's float32
# round-half-even differed at 26 % of them, all near ties); a uint16 graph input gets x / scale computed exactly
# and rounded to nearest, ties toward zero (no mismatch; ORT differed at 11 %, and 256 exact ties went toward
# zero on the HTP). The float16 step is 1/2048 of the value, so the 8-bit codes move only near ties; but inputs
# normalized as pixel / 127.5 - 1 with the calibrated scale 2/255 lie on ties everywhere (PP-OCRv4's
# recognizer: 67 % of its input codes differed, so the HTP and the CPU ran every plan on another image).
_EIGHT_BIT = (TensorProto.UINT8, TensorProto.INT8)
_SIXTEEN_BIT = (TensorProto.UINT16, TensorProto.INT16)


def htp_input_rounding(model: str | bytes | onnx.ModelProto) -> str | bytes | onnx.ModelProto | None:
    """`model` with each QuantizeLinear of a float graph input fed the value the HTP rounds that input to (a
    point of its grid, which ORT's QuantizeLinear then maps to the HTP's code); `model` itself when it has
    none. A path or bytes come back as bytes when changed; a ModelProto is changed in place, and the answer
    is then the proto, or None when nothing changed."""
    proto = _proto(model)
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    inputs = {i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT} - set(inits)
    changed = False
    for node in list(graph.node):
        if node.op_type != "QuantizeLinear" or node.input[0] not in inputs:
            continue
        zero = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zero is not None and zero.dims and int(np.prod(zero.dims)) != 1:
            continue  # per-axis input quantization: not what ORT's QNN configuration writes
        bits = TensorProto.UINT8 if zero is None else zero.data_type
        if bits not in _EIGHT_BIT + _SIXTEEN_BIT:
            continue
        name = f"{node.input[0]}_htp_rounded_{node.name or len(graph.node)}"
        added = (_eight_bit if bits in _EIGHT_BIT else _sixteen_bit)(node.input[0], node.input[1], name)
        at = list(graph.node).index(node)
        for offset, extra in enumerate(added):
            graph.node.insert(at + offset, extra)
        node.input[0] = name
        changed = True
    return _rewritten(model, proto, changed)


def _eight_bit(x: str, scale: str, out: str) -> list:
    """round_half_away(float16(x / scale)) * scale: Div, the float16 round trip, then sign * floor(|v| + 0.5)."""
    p = f"{out}/"
    return [
        helper.make_node("Div", [x, scale], [p + "ratio"], name=p + "Div"),
        helper.make_node("Cast", [p + "ratio"], [p + "half"], to=TensorProto.FLOAT16, name=p + "ToHalf"),
        helper.make_node("Cast", [p + "half"], [p + "value"], to=TensorProto.FLOAT, name=p + "ToFloat"),
        helper.make_node("Abs", [p + "value"], [p + "abs"], name=p + "Abs"),
        helper.make_node("Constant", [], [p + "half_step"], value=helper.make_tensor("", TensorProto.FLOAT, [], [0.5]),
                         name=p + "HalfStep"),
        helper.make_node("Add", [p + "abs", p + "half_step"], [p + "shifted"], name=p + "Add"),
        helper.make_node("Floor", [p + "shifted"], [p + "magnitude"], name=p + "Floor"),
        helper.make_node("Sign", [p + "value"], [p + "sign"], name=p + "Sign"),
        helper.make_node("Mul", [p + "sign", p + "magnitude"], [p + "code"], name=p + "Code"),
        helper.make_node("Mul", [p + "code", scale], [out], name=p + "Mul"),
    ]


def _sixteen_bit(x: str, scale: str, out: str) -> list:
    """round_half_toward_zero(x / scale) * scale in float64: sign * ceil(|v| - 0.5)."""
    p = f"{out}/"
    return [
        helper.make_node("Cast", [x], [p + "x64"], to=TensorProto.DOUBLE, name=p + "XToDouble"),
        helper.make_node("Cast", [scale], [p + "s64"], to=TensorProto.DOUBLE, name=p + "ScaleToDouble"),
        helper.make_node("Div", [p + "x64", p + "s64"], [p + "value"], name=p + "Div"),
        helper.make_node("Abs", [p + "value"], [p + "abs"], name=p + "Abs"),
        helper.make_node("Constant", [], [p + "half_step"], value=helper.make_tensor("", TensorProto.DOUBLE, [], [0.5]),
                         name=p + "HalfStep"),
        helper.make_node("Sub", [p + "abs", p + "half_step"], [p + "shifted"], name=p + "Sub"),
        helper.make_node("Ceil", [p + "shifted"], [p + "magnitude"], name=p + "Ceil"),
        helper.make_node("Sign", [p + "value"], [p + "sign"], name=p + "Sign"),
        helper.make_node("Mul", [p + "sign", p + "magnitude"], [p + "code"], name=p + "Code"),
        helper.make_node("Mul", [p + "code", p + "s64"], [p + "rounded"], name=p + "Mul"),
        helper.make_node("Cast", [p + "rounded"], [out], to=TensorProto.FLOAT, name=p + "ToFloat"),
    ]


def switchable_input_rounding(x: str, scale: str, lo: str, hi: str, out: str) -> list:
    """Nodes writing to `out` the graph input `x` rounded as the HTP rounds it onto the grid of `scale`, for a
    model whose quantization parameters are inputs (the sensitivity engine's switchable model): the width is
    read from the clip range [lo, hi] of that grid (255 steps: 8 bits; 65535: 16 bits)."""
    p = f"{out}/"
    eight, sixteen = _eight_bit(x, scale, p + "eight"), _sixteen_bit(x, scale, p + "sixteen")
    return eight + sixteen + [
        helper.make_node("Sub", [hi, lo], [p + "span"], name=p + "Span"),
        helper.make_node("Div", [p + "span", scale], [p + "steps"], name=p + "Steps"),
        helper.make_node("Constant", [], [p + "eight_bit_steps"],
                         value=helper.make_tensor("", TensorProto.FLOAT, [], [1024.0]), name=p + "EightBitSteps"),
        helper.make_node("Greater", [p + "steps", p + "eight_bit_steps"], [p + "wide"], name=p + "Wide"),
        helper.make_node("Where", [p + "wide", p + "sixteen", p + "eight"], [out], name=p + "Where"),
    ]


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (ORT's can run to pages), or its type when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
