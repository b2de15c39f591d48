"""Latency with its source: measured on a device, estimated by an HTP cost model, or emulator host time.

`estimate_latency` reads a QDQ model (or a float model, estimated as fp16) and prices every op on a
roofline of the target Hexagon tensor processor; `promotion_costs` prices promoting single activation
tensors to 16 bits from the same formulas. The constants, their sources and the model's known errors are in
docs/latency.md. An estimate is never a measurement: everything it returns says `estimate`.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import onnx
import pandas as pd
from onnx import TensorProto, helper

from .errors import MpstudioError
from .model import load_model
from .qdq import GRAPH_OUTPUT_SUFFIX
from .sources import LATENCY_SOURCES, Latency  # noqa: F401 (Latency: its home for callers of the cost model)

# ---- per-architecture constants -----------------------------------------------------------------------------
@dataclass(frozen=True)
class HtpArch:
    """Constants of one Hexagon tensor processor generation, as the cost model uses them.

    Sources and which numbers are assumptions: docs/latency.md, "Per-architecture constants".
    """

    arch: str  # "75"
    reference_soc: str  # the phone SoC whose figures the constants follow
    int8_tops: float  # peak dense 8x8 throughput of the matrix unit (HMX), 2 ops per MAC
    clock_ghz: float  # effective HTP clock: sets vector (HVX) throughput and the per-op fixed cost
    rate_16x8: float  # HMX slowdown for 16-bit activations x 8-bit weights (or the reverse)
    rate_16x16: float  # HMX slowdown for 16x16
    rate_fp16: float  # HMX slowdown for fp16 x fp16
    hvx_units: int  # HVX contexts working on one op, each 128 bytes wide
    hvx_fp16_factor: float  # HVX instructions per fp16 vector relative to a 16-bit integer vector
    ddr_gbs: float  # effective DDR bandwidth the NPU sees (GB/s)
    vtcm_mb: float  # on-chip tightly coupled memory
    vtcm_gbs: float  # VTCM bandwidth (GB/s)
    hmx_efficiency: float  # achieved fraction of the HMX peak on dense layers
    op_overhead_us: float  # fixed cost of every op on the HTP (scheduling, synchronisation, DMA set-up)
    graph_overhead_us: float  # fixed cost of one graph execution (the call into the NPU and back)
    convert_instr: float  # HVX instructions per 128-byte vector for an 8<->16-bit convert (requantize)
    cpu_io_gbs: float  # CPU bytes/s for graph-input quantize and graph-output dequantize (offloaded to CPU)

    @property
    def name(self) -> str:
        return f"v{self.arch}"

    @property
    def where(self) -> str:
        return f"HTP v{self.arch} (cost model)"

    @property
    def hmx_macs_per_cycle(self) -> float:
        return self.int8_tops * 1e12 / 2 / (self.clock_ghz * 1e9)

    def hmx_divisor(self, act_bits: int, weight_bits: int, float16: bool) -> float:
        if float16:
            return self.rate_fp16
        wide = (act_bits > 8) + (weight_bits > 8)
        return (1.0, self.rate_16x8, self.rate_16x16)[wide]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _arch(arch, reference_soc, int8_tops, clock_ghz, ddr_gbs, vtcm_mb) -> HtpArch:
    # Shared by every generation; the first three from the sources in docs/latency.md, the rest assumptions
    # calibrated once on published w8a8 latencies of MobileNet-v2 and ResNet50 (docs/latency.md).
    return HtpArch(
        arch=arch, reference_soc=reference_soc, int8_tops=int8_tops, clock_ghz=clock_ghz,
        rate_16x8=2.0,  # the guide's 8 Gen 3 figures: 36 TOPS INT8, 18 TOPS INT16
        rate_16x16=4.0,  # assumption: a 16x16 product is four 8x8 partial products
        rate_fp16=2.0,  # assumption: fp16 on HMX at the 16x8 rate
        hvx_units=2,  # assumption: two 128-byte vector instructions per cycle on one op
        hvx_fp16_factor=1.0,  # assumption: fp16 vectors as fast as 16-bit integer ones (HVX IEEE/qfloat)
        ddr_gbs=ddr_gbs, vtcm_mb=vtcm_mb,
        vtcm_gbs=3 * ddr_gbs,  # assumption (calibrated): activations that fit VTCM move at 3x DDR speed
        hmx_efficiency=0.6,  # calibrated on ResNet50 w8a8
        op_overhead_us=1.5 / clock_ghz,  # 1500 cycles per op, calibrated on MobileNet-v2 w8a8
        graph_overhead_us=20.0,  # assumption: one call into the NPU and back
        convert_instr=2.0,  # assumption: scale and shift per vector
        cpu_io_gbs=8.0,  # assumption: ORT's vectorized (de)quantize on a phone CPU core
    )


# int8_tops: v75 from the practitioner guide's Snapdragon 8 Gen 3 figure (36 TOPS INT8); the other generations
# scaled by published AI Hub w8a8 ResNet50 latencies relative to the 8 Gen 3 (a compute-bound model).
# clock_ghz: an effective clock (real HTP clocks are unpublished) scaled like AI Hub's MobileNet-v2 w8a8
# latencies, so per-op fixed and vector costs follow the generations. ddr_gbs: the SoC's LPDDR peak.
# vtcm_mb: ExecuTorch's Qualcomm SoC table.
HTP_ARCHS: dict[str, HtpArch] = {
    a.arch: a
    for a in (
        _arch("68", "Snapdragon 888 (SM8350)", int8_tops=17.1, clock_ghz=0.40, ddr_gbs=51.2, vtcm_mb=4),
        _arch("69", "Snapdragon 8 Gen 1 (SM8450)", int8_tops=20.6, clock_ghz=0.55, ddr_gbs=51.2, vtcm_mb=8),
        _arch("73", "Snapdragon 8 Gen 2 (SM8550)", int8_tops=27.4, clock_ghz=0.70, ddr_gbs=67.0, vtcm_mb=8),
        _arch("75", "Snapdragon 8 Gen 3 (SM8650)", int8_tops=36.0, clock_ghz=1.00, ddr_gbs=76.8, vtcm_mb=8),
        _arch("79", "Snapdragon 8 Elite (SM8750)", int8_tops=46.5, clock_ghz=1.45, ddr_gbs=84.8, vtcm_mb=8),
    )
}


def htp_arch(arch: str | int | HtpArch = "75") -> HtpArch:
    """The constants of `arch` ("75", "v75", 75 or an HtpArch)."""
    if isinstance(arch, HtpArch):
        return arch
    key = str(arch).strip().lower().removeprefix("v")
    if key not in HTP_ARCHS:
        raise MpstudioError(
            f"unknown HTP architecture {arch!r}; the cost model knows {', '.join('v' + a for a in HTP_ARCHS)} "
            f"(pass e.g. htp_arch=\"75\")"
        )
    return HTP_ARCHS[key]


_resolve_arch = htp_arch  # the functions below take a parameter of the same name


# ---- op classes ---------------------------------------------------------------------------------------------
# Matrix ops run on HMX; a depthwise convolution runs on HVX (HMX needs depth).
_MATRIX_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
# Metadata only on HTP: no data moves.
_LAYOUT_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}
# Data movers: cost is the bytes they read and write.
_MOVER_OPS = {"Transpose", "Concat", "Slice", "Split", "Gather", "GatherElements", "GatherND", "Pad", "Tile",
              "Expand", "DepthToSpace", "SpaceToDepth", "Cast", "ScatterND", "ScatterElements"}
# HVX instructions per 128-byte output vector (integer); an assumption per class, see docs/latency.md.
_HVX_INSTR = {
    **dict.fromkeys(("Relu", "Clip", "Max", "Min", "Abs", "Neg", "LeakyRelu", "Floor", "Ceil", "Round",
                     "Sign", "Not", "And", "Or", "Xor", "Equal", "Greater", "Less", "GreaterOrEqual",
                     "LessOrEqual", "Where"), 1.0),
    **dict.fromkeys(("Add", "Sub", "Mul", "Sum", "PRelu", "BatchNormalization", "Mean"), 2.0),
    **dict.fromkeys(("Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Exp", "Log", "Sqrt", "Reciprocal", "Erf",
                     "Gelu", "Elu", "Selu", "Softplus", "Softsign", "Mish", "Sin", "Cos", "Resize",
                     "Upsample"), 4.0),
    **dict.fromkeys(("Div", "Pow"), 6.0),
    **dict.fromkeys(("Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization",
                     "GroupNormalization", "LpNormalization"), 8.0),
}
_DEFAULT_HVX_INSTR = 2.0
# Reductions and global pools: one instruction per input vector.
_REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSumExp", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
               "ArgMax", "ArgMin"}
# Windowed pools: one instruction per output vector and kernel tap.
_POOL_OPS = {"AveragePool", "MaxPool", "LpPool"}

_TYPE_BITS = {"uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "float16": 16, "int32": 32, "float32": 32,
              "uint4": 4, "int4": 4}
_HMX_DEPTH = 32  # HTP stores activations in channel blocks of 32; HMX works on whole blocks


def _bytes(dtype: str) -> float:
    return _TYPE_BITS.get(dtype, 32) / 8


def _pad(n: int, to: int = _HMX_DEPTH) -> int:
    return int(math.ceil(max(n, 1) / to) * to)


# ---- reading a QDQ model --------------------------------------------------------------------------------
@dataclass
class _Op:
    """One op as the HTP runs it, with what the cost formulas need."""

    node: str
    op_type: str
    engine: str  # "hmx", "hvx", "dma" (data mover), "none" (layout), "cpu" (graph I/O), "graph"
    inputs: list  # [(activation id, received dtype, elements)]
    outputs: list  # [(activation id, produced dtype, elements)]
    weight_bytes: float = 0.0
    weight_type: str = ""
    macs: int = 0  # logical multiply-accumulates
    hmx_macs: int = 0  # MACs with channels padded to HMX blocks
    hvx_work: float = 0.0  # integer HVX instructions x 128-byte vectors, at 8-bit width
    kind: str = "compute"  # "compute", "convert", "io", "graph"


@dataclass
class _Parsed:
    ops: list[_Op]
    quantized: bool  # the model has QDQ activations
    unknown_shapes: int
    graph_inputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]


def _parsed(model) -> _Parsed:
    """The ops of `model`, cached for a path while the file is unchanged."""
    if isinstance(model, (str, os.PathLike)) and Path(model).is_file():
        path = Path(model).resolve()
        stat = path.stat()
        return _parsed_file(str(path), stat.st_mtime_ns, stat.st_size)
    return _parse(load_model(model))


@lru_cache(maxsize=16)
def _parsed_file(path: str, mtime_ns: int, size: int) -> _Parsed:
    return _parse(load_model(path))


def _shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    """Tensor shapes from ONNX shape inference on a light copy: Q/DQ become Identity (ORT writes 16-bit
    ones in the com.microsoft domain, which onnx cannot infer) and large initializers become typed inputs."""
    graph = model.graph
    keep_data = {TensorProto.INT64, TensorProto.INT32}
    inputs = list(graph.input)
    known = {i.name for i in inputs}
    inits = []
    for init in graph.initializer:
        if init.data_type in keep_data and np.prod(init.dims, dtype=np.int64) <= 4096:
            inits.append(init)
        elif init.name not in known:
            inputs.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    nodes = []
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            nodes.append(helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name))
        else:
            nodes.append(node)
    light = helper.make_graph(nodes, graph.name, inputs, list(graph.output), initializer=inits,
                              value_info=list(graph.value_info))
    copy = helper.make_model(light, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(copy)
    except Exception:
        inferred = copy  # partial knowledge beats none: ops with unknown shapes are counted and reported
    shapes: dict[str, tuple] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def _elements(shape) -> int | None:
    if shape is None or any(d is None for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _qtype(node: onnx.NodeProto, inits: dict) -> str:
    """The quantized type a QuantizeLinear writes or a DequantizeLinear reads."""
    if len(node.input) > 2 and node.input[2] in inits:
        return helper.tensor_dtype_to_np_dtype(inits[node.input[2]].data_type).name
    if node.op_type == "DequantizeLinear" and node.input[0] in inits:
        return helper.tensor_dtype_to_np_dtype(inits[node.input[0]].data_type).name
    for attr in node.attribute:
        if attr.name == "output_dtype" and attr.i:
            return helper.tensor_dtype_to_np_dtype(attr.i).name
    return "uint8"


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _parse(model: onnx.ModelProto) -> _Parsed:
    graph = model.graph
    if not len(graph.node):
        raise MpstudioError("the model has no nodes; give the QDQ model (or float model) to estimate")
    inits = {i.name: i for i in graph.initializer}
    graph_inputs = tuple(i.name for i in graph.input if i.name not in inits)
    graph_outputs = tuple(o.name for o in graph.output)
    producer: dict[str, onnx.NodeProto] = {}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.output:
            producer[name] = node
        for name in node.input:
            if name:
                consumers[name].append(node)
    shapes = _shapes(model)
    unknown = 0

    def elements(name: str) -> int:
        nonlocal unknown
        n = _elements(shapes.get(name))
        if n is None:
            unknown += 1
            return 1
        return n

    def is_q(node):
        return node is not None and node.op_type == "QuantizeLinear"

    def is_dq(node):
        return node is not None and node.op_type == "DequantizeLinear"

    def origin(tensor: str) -> str:
        """The compute tensor (or graph input) a quantized value came from, through any converts."""
        q = producer.get(tensor)
        while is_q(q):
            src = q.input[0]
            dq = producer.get(src)
            if is_dq(dq) and dq.input[0] not in inits:
                q = producer.get(dq.input[0])
                continue
            return src
        return tensor

    quantized = any(is_q(n) for n in graph.node)
    float_dtype = {}
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        float_dtype[vi.name] = vi.type.tensor_type.elem_type

    ops: list[_Op] = []
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if node.op_type == "QuantizeLinear":
            src = node.input[0]
            dq = producer.get(src)
            if is_dq(dq) and dq.input[0] not in inits:  # a convert at a precision boundary
                tensor = origin(dq.input[0])
                n = elements(src)
                in_type, out_type = _qtype(dq, inits), _qtype(node, inits)
                ops.append(_Op(name, "Convert", "hvx", [(tensor, in_type, n)], [(tensor, out_type, n)],
                               hvx_work=n / 128, kind="convert"))
            elif src in graph_inputs:  # graph-input quantize: ORT's QNN EP leaves it to the CPU
                n = elements(src)
                ops.append(_Op(name, "QuantizeLinear", "cpu", [(src, "float32", n)],
                               [(src, _qtype(node, inits), n)], kind="io"))
            continue
        if node.op_type == "DequantizeLinear":
            if node.output[0] in graph_outputs:  # graph-output dequantize, on the CPU
                tensor = origin(node.input[0])
                n = elements(node.output[0])
                ops.append(_Op(name, "DequantizeLinear", "cpu", [(tensor, _qtype(node, inits), n)],
                               [(node.output[0], "float32", n)], kind="io"))
            continue
        if node.op_type in ("Shape", "Constant", "ConstantOfShape", "Range", "Size"):
            continue  # shape arithmetic: constant-folded before the graph reaches the HTP

        op = _Op(name, node.op_type, "hvx", [], [])
        weights: list[tuple[str, str]] = []  # (initializer, dtype) read by this op
        for pos, inp in enumerate(node.input):
            if not inp:
                continue
            src = producer.get(inp)
            if is_dq(src):
                q_in = src.input[0]
                if q_in in inits:
                    weights.append((q_in, _qtype(src, inits)))
                else:
                    op.inputs.append((origin(q_in), _qtype(src, inits), elements(inp)))
            elif inp in inits:
                init = inits[inp]
                if init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
                    weights.append((inp, "float16"))  # the HTP holds float constants in fp16
                # integer initializers are op parameters (shapes, axes, indices)
            elif src is None and inp not in graph_inputs:
                continue
            else:
                dtype = float_dtype.get(inp, TensorProto.FLOAT)
                if dtype in (TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL):
                    continue  # computed shapes and indices
                op.inputs.append((inp, "float16", elements(inp)))
        for out in node.output:
            if not out:
                continue
            q = next((c for c in consumers.get(out, []) if is_q(c)), None)
            dtype = _qtype(q, inits) if q is not None else "float16"
            op.outputs.append((out, dtype, elements(out)))
        if not op.outputs:
            continue
        op.weight_bytes = float(sum((_elements(shapes.get(w)) or 0) * _bytes(t) for w, t in weights))
        op.weight_type = next((t for _, t in weights if t != "int32"), "")  # int32 is a bias
        _shape_work(op, node, shapes, weights)
        ops.append(op)
    _fuse_activations(ops)
    ops.append(_Op("graph execute", "Graph", "graph", [], [], kind="graph"))
    return _Parsed(ops, quantized, unknown, graph_inputs, graph_outputs)


# Activations the HTP fuses into the matrix op before them, in every precision (QNN HTP guidelines).
_FUSABLE = {"Relu", "Clip", "LeakyRelu", "PRelu", "HardSwish"}


def _fuse_activations(ops: list[_Op]) -> None:
    """Mark an activation that reads only a matrix op's sole output as fused: it costs nothing of its own."""
    readers: dict[str, int] = defaultdict(int)
    for op in ops:
        for name, _, _ in op.inputs:
            readers[name] += 1
    producers = {name: (op, dtype) for op in ops if op.kind == "compute" for name, dtype, _ in op.outputs}
    for op in ops:
        if op.op_type not in _FUSABLE or len(op.inputs) != 1:
            continue
        name, received, _ = op.inputs[0]
        src, produced = producers.get(name, (None, None))
        # A convert between the two (a precision boundary) keeps them apart.
        if src is not None and src.engine == "hmx" and readers[name] == 1 and received == produced:
            op.engine = "fused"


def _shape_work(op: _Op, node: onnx.NodeProto, shapes: dict, weights) -> None:
    """MACs and HVX work of `op` from its shapes."""
    out_shape = shapes.get(node.output[0])
    out_n = op.outputs[0][2]
    t = node.op_type
    if t in _LAYOUT_OPS:
        op.engine = "none"
        return
    if t in _MOVER_OPS:
        op.engine = "dma"
        return
    if t in ("Conv", "ConvTranspose") and len(node.input) > 1:
        w = shapes.get(node.input[1])
        group = int(_attr(node, "group", 1))
        if not w or not out_shape or any(d is None for d in out_shape):
            op.engine = "hmx"
            return
        kernel = int(np.prod(w[2:], dtype=np.int64)) if len(w) > 2 else 1
        if t == "Conv":
            cout, cin_g = int(w[0]), int(w[1])
            spatial = int(np.prod(out_shape[2:], dtype=np.int64)) if len(out_shape) > 2 else 1
            batch = int(out_shape[0] or 1)
            op.macs = batch * cout * spatial * cin_g * kernel
            cout_g = cout // max(group, 1)
            if group > 1 and cin_g == 1:
                # depthwise (or channel-multiplier) convolution: HVX multiply-accumulate
                op.engine = "hvx"
                op.hvx_work = op.macs / 128
                return
            op.engine = "hmx"
            op.hmx_macs = batch * group * _pad(cout_g) * spatial * _pad(cin_g) * kernel
        else:
            in_shape = shapes.get(node.input[0])
            cin, cout_g = int(w[0]), int(w[1])
            spatial_in = int(np.prod(in_shape[2:], dtype=np.int64)) if in_shape and len(in_shape) > 2 else 1
            batch = int(in_shape[0] or 1) if in_shape else 1
            op.macs = batch * cin * spatial_in * cout_g * kernel
            op.engine = "hmx"
            op.hmx_macs = batch * group * _pad(cin // max(group, 1)) * spatial_in * _pad(cout_g) * kernel
        return
    if t in ("Gemm", "MatMul"):
        a = shapes.get(node.input[0])
        if not a or out_n is None:
            op.engine = "hmx"
            return
        k = a[-2] if (t == "Gemm" and _attr(node, "transA", 0)) else a[-1]
        k = int(k or 1)
        n = int(out_shape[-1] or 1) if out_shape else 1
        op.macs = int(out_n) * k
        op.engine = "hmx"
        op.hmx_macs = int(out_n // max(n, 1)) * _pad(n) * _pad(k)
        return
    instr = _HVX_INSTR.get(t, _DEFAULT_HVX_INSTR)
    if t in _REDUCE_OPS:
        in_n = op.inputs[0][2] if op.inputs else out_n
        op.hvx_work = in_n / 128
        return
    if t in _POOL_OPS:
        kernel = int(np.prod(_attr(node, "kernel_shape", [1]), dtype=np.int64))
        op.hvx_work = out_n * kernel / 128
        return
    op.hvx_work = out_n * instr / 128


# ---- cost formulas --------------------------------------------------------------------------------------------
def _act_type(types: Iterable[str]) -> str:
    """The type an op computes in: fp16 if any activation is float, else the widest quantized type."""
    types = [t for t in types if t]
    if not types or any(t.startswith("float") for t in types):
        return "float16"
    return "uint16" if max(_TYPE_BITS.get(t, 8) for t in types) > 8 else "uint8"


def _cost(op: _Op, arch: HtpArch, in_types=None, out_types=None) -> tuple[float, float, float, str]:
    """(compute ms, memory ms, overhead ms, compute type) of `op`; `in_types`/`out_types` override its types."""
    ins = [(n, t if in_types is None else in_types) for _, t, n in op.inputs]
    outs = [(n, t if out_types is None else out_types) for _, t, n in op.outputs]
    if op.kind == "graph":
        return 0.0, 0.0, arch.graph_overhead_us / 1e3, ""
    if op.kind == "io":
        moved = sum(n * _bytes(t) for n, t in ins) + sum(n * _bytes(t) for n, t in outs)
        quantized = outs[0][1] if op.op_type == "QuantizeLinear" else ins[0][1]
        return 0.0, moved / (arch.cpu_io_gbs * 1e9) * 1e3, 0.0, quantized
    act = _act_type([t for _, t in ins] + [t for _, t in outs])
    fp16 = act == "float16"
    act_bits = 16 if fp16 else _TYPE_BITS[act]
    act_bytes = sum(n * _bytes(t) for n, t in ins) + sum(n * _bytes(t) for n, t in outs)
    if op.engine == "fused":
        return 0.0, 0.0, 0.0, act
    if op.engine == "none":
        return 0.0, 0.0, arch.op_overhead_us / 1e3, act
    clock = arch.clock_ghz * 1e9
    compute_s = 0.0
    if op.engine == "hmx":
        weight_bits = 16 if fp16 else _TYPE_BITS.get(op.weight_type or act, 8)
        if op.op_type == "MatMul" and len(op.inputs) > 1:  # two activations: the second plays the weight
            weight_bits = _TYPE_BITS.get(op.inputs[1][1], 8) if not fp16 else 16
        divisor = arch.hmx_divisor(act_bits, weight_bits, fp16)
        compute_s = op.hmx_macs * divisor / (arch.hmx_macs_per_cycle * arch.hmx_efficiency * clock)
    elif op.engine == "hvx":
        width = (arch.hvx_fp16_factor * 2) if fp16 else act_bits / 8  # vectors per 128 8-bit elements
        instr = arch.convert_instr if op.kind == "convert" else 1.0
        compute_s = op.hvx_work * instr * width / (arch.hvx_units * clock)
    working_set = act_bytes + op.weight_bytes
    act_bw = arch.vtcm_gbs if working_set <= arch.vtcm_mb * 2**20 / 2 else arch.ddr_gbs
    memory_s = act_bytes / (act_bw * 1e9) + op.weight_bytes / (arch.ddr_gbs * 1e9)
    return compute_s * 1e3, memory_s * 1e3, arch.op_overhead_us / 1e3, act


def _bound(compute: float, memory: float, overhead: float) -> str:
    if overhead >= max(compute, memory):
        return "overhead"
    return "compute" if compute >= memory else "memory"


# ---- the estimate ----------------------------------------------------------------------------------------------
OP_COLUMNS = ("node", "op_type", "kind", "engine", "tensor", "macs", "elements", "act_type", "act_bits",
              "weight_type", "weight_bits", "act_bytes", "weight_bytes", "compute_ms", "memory_ms",
              "overhead_ms", "ms", "bound", "share")


@dataclass(frozen=True, eq=False)
class LatencyEstimate:
    """The cost model's latency of one model on one HTP architecture, with its per-op breakdown.

    `ops` has one row per op the HTP (or, for graph I/O, the CPU) runs, columns:
      node: the ONNX node (a convert is named by its quantize node; "graph execute" is the per-call cost)
      op_type: ONNX op type, "Convert" for an 8<->16-bit convert, "Graph" for the per-call cost
      kind: "compute", "convert" (at a precision boundary), "io" (graph-input quantize / output dequantize,
            on the CPU) or "graph"
      engine: "hmx" (matrix unit), "hvx" (vector unit), "dma" (data mover), "none" (metadata-only reshape),
              "fused" (an activation fused into the matrix op before it), "cpu", "graph"
      tensor: the op's (first) output, as named in the model
      macs: logical multiply-accumulates (0 for element-wise ops)
      elements: elements of the (first) output
      act_type / act_bits: the type the op computes in (uint8, uint16 or float16)
      weight_type / weight_bits: the type of its weight or constant operand ("" / 0 if none)
      act_bytes / weight_bytes: bytes read and written
      compute_ms, memory_ms, overhead_ms: the roofline terms; ms = max(compute, memory) + overhead
      bound: "compute", "memory" or "overhead" (the largest term)
      share: ms / total
    """

    latency: Latency
    ops: pd.DataFrame
    arch: HtpArch

    @property
    def ms(self) -> float:
        return self.latency.ms

    @property
    def compute_ms(self) -> float:
        return float(self.ops["compute_ms"].sum())

    @property
    def memory_ms(self) -> float:
        return float(self.ops["memory_ms"].sum())

    @property
    def overhead_ms(self) -> float:
        return float(self.ops["overhead_ms"].sum())

    @property
    def convert_ms(self) -> float:
        return float(self.ops.loc[self.ops["kind"] == "convert", "ms"].sum())

    @property
    def converts(self) -> int:
        return int((self.ops["kind"] == "convert").sum())

    @property
    def io_ms(self) -> float:
        return float(self.ops.loc[self.ops["kind"] == "io", "ms"].sum())

    @property
    def macs(self) -> int:
        return int(self.ops["macs"].sum())

    def by_op_type(self) -> pd.DataFrame:
        """Time per op type: count, ms, share, sorted by ms."""
        grouped = self.ops.groupby("op_type").agg(count=("ms", "size"), macs=("macs", "sum"), ms=("ms", "sum"))
        grouped["share"] = grouped["ms"] / max(self.ms, 1e-12)
        return grouped.sort_values("ms", ascending=False)

    def summary(self) -> str:
        return (f"{self.ms:.3f} ms ({self.latency.label}): {len(self.ops) - 1} ops, {self.macs / 1e9:.3f} GMAC, "
                f"compute {self.compute_ms:.3f} / memory {self.memory_ms:.3f} / overhead {self.overhead_ms:.3f} ms, "
                f"{self.converts} converts {self.convert_ms:.3f} ms, graph I/O {self.io_ms:.3f} ms")

    def to_dict(self) -> dict[str, Any]:
        return {"latency": self.latency.to_dict(), "arch": self.arch.name,
                "ops": self.ops.to_dict(orient="records")}


def estimate_latency(qdq_model, htp_arch: str | int | HtpArch = "75") -> LatencyEstimate:
    """Estimate the latency of `qdq_model` (a path or ModelProto) on HTP `htp_arch` with the cost model.

    A QDQ model (QuantizeLinear/DequantizeLinear around float ops, as ORT's quantize_static makes for QNN) is
    priced with the types its Q/DQ nodes give each op; a float model (no QDQ) as fp16 on the HTP. The result's
    latency has source "estimate"; it is not a measurement.
    """
    arch = _resolve_arch(htp_arch)
    parsed = _parsed(qdq_model)
    rows = []
    for op in parsed.ops:
        compute, memory, overhead, act = _cost(op, arch)
        first = (op.outputs or op.inputs or [("", "", 0)])[0]
        rows.append({
            "node": op.node, "op_type": op.op_type, "kind": op.kind, "engine": op.engine, "tensor": first[0],
            "macs": int(op.macs), "elements": int(first[2]), "act_type": act,
            "act_bits": _TYPE_BITS.get(act, 0),
            "weight_type": op.weight_type, "weight_bits": _TYPE_BITS.get(op.weight_type, 0),
            "act_bytes": float(sum(n * _bytes(t) for _, t, n in op.inputs + op.outputs)) if op.kind != "graph" else 0.0,
            "weight_bytes": float(op.weight_bytes),
            "compute_ms": compute, "memory_ms": memory, "overhead_ms": overhead,
            "ms": max(compute, memory) + overhead, "bound": _bound(compute, memory, overhead),
        })
    # A float model's I/O: the HTP casts fp32 graph inputs to fp16 and outputs back.
    if not parsed.quantized:
        rows.extend(_float_io_rows(parsed, arch))
    ops = pd.DataFrame(rows)
    total = float(ops["ms"].sum())
    ops["share"] = ops["ms"] / total if total > 0 else 0.0
    ops = ops[list(OP_COLUMNS)]
    detail = (f"{'QDQ' if parsed.quantized else 'float model as fp16'}; {arch.reference_soc} constants; "
              f"{len(ops) - 1} ops")
    if parsed.unknown_shapes:
        detail += f"; {parsed.unknown_shapes} tensors of unknown shape counted as 1 element"
    return LatencyEstimate(latency=Latency(total, "estimate", arch.where, detail), ops=ops, arch=arch)


def _float_io_rows(parsed: _Parsed, arch: HtpArch) -> list[dict]:
    rows = []
    for op in parsed.ops:
        for name, dtype, n in op.inputs:
            if name in parsed.graph_inputs:
                rows.append(_cast_row(f"{name} cast fp32->fp16", name, n, arch))
        for name, dtype, n in op.outputs:
            if name in parsed.graph_outputs:
                rows.append(_cast_row(f"{name} cast fp16->fp32", name, n, arch))
    # One cast per graph input even if several ops read it.
    return list({row["node"]: row for row in rows}.values())


def _cast_row(node: str, tensor: str, n: int, arch: HtpArch) -> dict:
    cast = _Op(node, "Cast", "hvx", [(tensor, "float32", n)], [(tensor, "float16", n)], hvx_work=n / 128,
               kind="convert")
    compute, memory, overhead, _ = _cost(cast, arch)
    return {"node": node, "op_type": "Cast", "kind": "convert", "engine": "hvx", "tensor": tensor, "macs": 0,
            "elements": int(n), "act_type": "float16", "act_bits": 16, "weight_type": "", "weight_bits": 0,
            "act_bytes": float(n * 6), "weight_bytes": 0.0, "compute_ms": compute, "memory_ms": memory,
            "overhead_ms": overhead, "ms": max(compute, memory) + overhead,
            "bound": _bound(compute, memory, overhead)}




# ---- promotion costs ---------------------------------------------------------------------------------------------


def promotion_costs(qdq_model_8bit, tensors: Iterable[str], htp_arch: str | int | HtpArch = "75",
                    graph=None) -> pd.Series:
    """Estimated ms added by promoting each tensor in `tensors`, alone, to 16 bits in `qdq_model_8bit`'s plan.

    `tensors` are float-model activation names. Promotion follows ORT's QNN mixed-precision rule: the tensor's
    producer and all its consumers compute at 16 bits (16x8 instead of 8x8 on the matrix unit, wider vectors,
    twice the bytes for their activations), and converts appear where a 16-bit op meets an 8-bit one. Computed
    from the same per-op formulas as `estimate_latency`, without regenerating the model.

    ORT folds a Relu or Clip into the quantization of the op before it, so that op's own output has no
    counterpart in the QDQ model. With `graph` (the float model's `ModelGraph`, e.g. `Quantizer.graph`) such a
    tensor is priced as its producer at 16 bits plus the activation, which then runs as an op of its own;
    without it, and for names the model does not have at all, the cost is NaN.
    Returns a Series indexed by tensor name (in the order given), named "promotion_ms".
    """
    arch = _resolve_arch(htp_arch)
    analysis = _PromotionAnalysis(_parsed(qdq_model_8bit), arch)
    names = list(dict.fromkeys(tensors))
    values = [analysis.cost(name, graph) for name in names]
    return pd.Series(values, index=pd.Index(names, name="tensor"), name="promotion_ms", dtype=float)


class _PromotionAnalysis:
    """The 8/16-bit state of a QDQ model's ops, and the cost deltas of promoting one tensor."""

    def __init__(self, parsed: _Parsed, arch: HtpArch):
        self.arch = arch
        compute_ops = [i for i, op in enumerate(parsed.ops) if op.kind == "compute"]
        self.ops = parsed.ops
        self.bits: dict[int, int] = {}
        self.cost8: dict[int, float] = {}
        self.cost16: dict[int, float] = {}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, set[int]] = defaultdict(set)
        self.elements: dict[str, int] = {}
        self.by_node = {parsed.ops[i].node: i for i in compute_ops}
        for i in compute_ops:
            op = parsed.ops[i]
            c, m, o, act = _cost(op, arch)
            if act == "float16":
                continue  # a float op is already wide; promotion does not concern it
            self.bits[i] = _TYPE_BITS[act]
            c8, m8, o8, _ = _cost(op, arch, "uint8", "uint8")
            c16, m16, o16, _ = _cost(op, arch, "uint16", "uint16")
            self.cost8[i] = max(c8, m8) + o8
            self.cost16[i] = max(c16, m16) + o16
            for name, _, n in op.inputs:
                self.consumers[name].add(i)
                self.elements[name] = n
            for name, _, n in op.outputs:
                self.producer[name] = i
                self.elements[name] = n
        # Graph inputs: their quantize (on the CPU) is the producer; the type is the model's.
        self.input_bits: dict[str, int] = {}
        self.io: dict[str, _Op] = {}
        for op in parsed.ops:
            if op.kind == "io" and op.op_type == "QuantizeLinear":
                name, dtype, n = op.outputs[0]
                self.input_bits[name] = _TYPE_BITS.get(dtype, 8)
                self.io[name] = op
                self.elements[name] = n
            elif op.kind == "io":
                self.io[op.inputs[0][0]] = op

    def _producer_bits(self, tensor: str, state) -> int | None:
        op_bits, input_bits, produced = state
        if tensor in produced:
            return produced[tensor]
        if tensor in self.producer:
            return op_bits.get(self.producer[tensor])
        return input_bits.get(tensor)

    def _converts(self, tensor: str, state) -> int:
        """Converts ORT inserts for `tensor`: one per consumer type that differs from the produced type."""
        produced = self._producer_bits(tensor, state)
        if produced is None:
            return 0
        op_bits = state[0]
        received = {op_bits[c] for c in self.consumers.get(tensor, ()) if c in op_bits}
        return len(received - {produced})

    def _convert_cost(self, tensor: str) -> float:
        n = self.elements.get(tensor, 1)
        convert = _Op("", "Convert", "hvx", [(tensor, "uint8", n)], [(tensor, "uint16", n)], hvx_work=n / 128,
                      kind="convert")
        c, m, o, _ = _cost(convert, self.arch)
        return max(c, m) + o

    def _io_cost(self, tensor: str, bits: int) -> float:
        op = self.io[tensor]
        dtype = "uint16" if bits > 8 else "uint8"
        if op.op_type == "QuantizeLinear":
            c, m, o, _ = _cost(op, self.arch, out_types=dtype)
        else:
            c, m, o, _ = _cost(op, self.arch, in_types=dtype)
        return max(c, m) + o

    def resolve(self, name: str) -> str | None:
        for candidate in (name, name + GRAPH_OUTPUT_SUFFIX):
            if candidate in self.producer or candidate in self.input_bits:
                return candidate
        return None

    def cost(self, name: str, graph=None) -> float:
        tensor = self.resolve(name)
        extra = 0.0
        if tensor is not None:
            group = set(self.consumers.get(tensor, ()))
            if tensor in self.producer:
                group.add(self.producer[tensor])
        else:
            folded = self._folded(name, graph)
            if folded is None:
                return float("nan")
            index, activation = folded
            tensor = self.ops[index].outputs[0][0]
            group = {index}
            extra = activation
        group = {i for i in group if i in self.bits}
        # An 8-bit Relu/Clip that ORT had folded into a now 16-bit op comes back as an op of its own, behind a
        # convert, and the op's visible output stays 8-bit.
        produced: dict[str, int] = {}
        for i in group:
            if (self.bits[i] <= 8 and not extra and self.ops[i].outputs[0][0] != tensor
                    and self._has_folded_activation(i, graph)):
                out = self.ops[i].outputs[0][0]
                produced[out] = 8
                extra += self._convert_cost(out) + self._activation_cost(out, "uint8")
        old = (self.bits, self.input_bits, {})
        new = (_Overlay(self.bits, {i: 16 for i in group}),
               _Overlay(self.input_bits, {tensor: 16} if tensor in self.input_bits else {}), produced)
        delta = sum(self.cost16[i] - self.cost8[i] for i in group if self.bits[i] <= 8)
        touched = {tensor}
        for i in group:
            touched.update(name for name, _, _ in self.ops[i].inputs)
            touched.update(name for name, _, _ in self.ops[i].outputs)
        for t in touched:
            change = self._converts(t, new) - self._converts(t, old)
            if change:
                delta += change * self._convert_cost(t)
            if t in self.io:
                delta += (self._io_cost(t, self._producer_bits(t, new) or 8)
                          - self._io_cost(t, self._producer_bits(t, old) or 8))
        return float(delta + extra)

    def _folded(self, name: str, graph) -> tuple[int, float] | None:
        """(op index, ms of the re-appearing activation) for a float tensor whose activation ORT folded."""
        if graph is None or name not in getattr(graph, "tensors", {}):
            return None
        info = graph.tensors[name]
        index = self.by_node.get(info.producer or "")
        if index is None or index not in self.bits:
            return None
        if self.ops[index].engine == "hmx":
            return index, 0.0  # the activation fuses into the matrix op (same type, no convert between)
        return index, self._activation_cost(self.ops[index].outputs[0][0], "uint16")

    def _activation_cost(self, tensor: str, dtype: str) -> float:
        n = self.elements.get(tensor, 1)
        activation = _Op("", "Clip", "hvx", [(tensor, dtype, n)], [(tensor, dtype, n)], hvx_work=n / 128)
        c, m, o, _ = _cost(activation, self.arch)
        return max(c, m) + o

    def _has_folded_activation(self, index: int, graph) -> bool:
        """Whether the float op behind op `index` wrote a tensor that only a folded Relu/Clip read."""
        if graph is None:
            return False
        node = getattr(graph, "nodes", {}).get(self.ops[index].node)
        if node is None or not node.outputs:
            return False
        out = graph.tensors.get(node.outputs[0])
        if out is None or self.resolve(out.name) is not None or len(out.consumers) != 1:
            return False
        return graph.nodes[out.consumers[0]].op_type in ("Relu", "Clip")


class _Overlay(Mapping):
    """`base` with `changes` on top, without copying `base`."""

    def __init__(self, base: Mapping, changes: Mapping):
        self.base, self.changes = base, changes

    def __getitem__(self, key):
        return self.changes[key] if key in self.changes else self.base[key]

    def __contains__(self, key):
        return key in self.changes or key in self.base

    def __iter__(self):
        return iter(set(self.base) | set(self.changes))

    def __len__(self):
        return len(set(self.base) | set(self.changes))

    def get(self, key, default=None):
        return self[key] if key in self else default
