"""Latency with its source: measured on a device, estimated by an HTP cost model, or emulator host time.

`estimate_latency` reads a QDQ model (or a float model, estimated as fp16) and prices every op the Hexagon
tensor processor runs, after the fusions QNN makes (Conv+activation, SiLU, GELU, LayerNorm and Softmax as
single ops), with per-op-type costs for 8-bit, 16-bit and fp16 whose free constants are fitted to Qualcomm
AI Hub's published device latencies (benchmarks/latency_fit.py). Every estimate carries an interval from the
fit's residuals and says what it includes (HTP only, or with the CPU's graph-input quantize and output
dequantize). `calibrate` refits the per-op-type costs to a device's per-op profile; `promotion_costs`
prices promoting single activation tensors to 16 bits from the same formulas. Constants, sources and known
errors: docs/latency.md. An estimate is never a measurement: everything it returns says `estimate`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
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
from .qdq import read as read_qdq

# Latency's home is sources.py; imported here for callers of the cost model.
from .sources import (  # noqa: F401
    HTP_ONLY,
    LATENCY_SCOPES,
    LATENCY_SOURCES,
    SESSION_RUN,
    WITH_CPU_IO,
    Latency,
    milliseconds,
)


# ---- constants -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostConstants:
    """Per-op-type costs shared by every HTP generation. Sources: docs/latency.md, "Constants".

    Fitted (benchmarks/latency_fit.py): rate_16x8, rate_fp16, hvx_16bit, hvx_fp16, transcendental,
    transcendental_16, transcendental_fp16, normalize, op_cycles, overlap, memory_efficiency. The others are stated
    assumptions.
    """

    rate_16x8: float  # HMX time of 16-bit activations x 8-bit weights relative to 8x8
    rate_fp16: float  # HMX time of fp16 x fp16 relative to 8x8
    hvx_16bit: float  # HVX time of a 16-bit element-wise op relative to 8-bit (vectors hold half as many)
    hvx_fp16: float  # HVX time of an fp16 element-wise op relative to 8-bit
    transcendental: float  # HVX instructions per vector of Sigmoid, SiLU, Exp, Erf, GELU, Div at 8 bits (a LUT)
    transcendental_16: float  # extra factor for them at 16 bits (no LUT: polynomial evaluation)
    transcendental_fp16: float  # extra factor for them in fp16
    normalize: float  # HVX instructions per vector of Softmax / LayerNorm at 8 bits (x the factors above when wide)
    op_cycles: float  # fixed cycles per op (scheduling, synchronisation, DMA set-up)
    overlap: float  # fraction of an activation's HVX time hidden behind the matrix op that feeds it
    memory_efficiency: float  # achieved fraction of the SoC's LPDDR peak
    rate_16x16_factor: float = 2.0  # assumption: 16x16 on HMX takes twice the time of 16x8
    hvx_vectors_per_cycle: float = 2.0  # assumption: two 128-byte vector instructions per cycle on one op
    vtcm_factor: float = 3.0  # assumption: activations that fit VTCM move at 3x the DDR rate
    convert_instr: float = 2.0  # assumption: scale and shift per vector for an 8<->16-bit convert
    graph_overhead_us: float = 20.0  # assumption: one call into the NPU and back
    cpu_io_gbs: float = 8.0  # assumption: ORT's vectorized (de)quantize of graph I/O on one phone CPU core


@dataclass(frozen=True)
class Spread:
    """Log-scale spread of the fit's residuals (90 % two-sided: 1.645 x RMS), per quantity.

    `absolute`: an all-8-bit model's ms; `wide16`: an all-16-bit model's ms; `fp16`: a float model's ms.
    An estimate's interval is ms x exp(-s) .. ms x exp(s), s interpolated by the share of 16-bit (or fp16) time.
    """

    absolute: float
    wide16: float
    fp16: float

    def factor(self, share16: float = 0.0, share_fp16: float = 0.0) -> float:
        share8 = max(0.0, 1.0 - share16 - share_fp16)
        return math.exp(share8 * self.absolute + share16 * self.wide16 + share_fp16 * self.fp16)


@dataclass(frozen=True)
class HtpArch:
    """Constants of one Hexagon tensor processor generation, as the cost model uses them.

    `hmx_gmacs` and `clock_ghz` are effective rates fitted to published latencies (real HTP clocks are not
    published); `ddr_gbs` and `vtcm_mb` are the reference SoC's. `scales` multiply the time of each cost class
    (see OP_CLASSES) after a calibration on a device (`calibrate`); `calibrated_on` names that device.
    """

    arch: str  # "75"
    reference_soc: str  # the phone SoC whose figures the constants follow
    hmx_gmacs: float  # effective 8x8 multiply-accumulates per second of the matrix unit (HMX), in G
    clock_ghz: float  # effective HTP clock: sets vector (HVX) throughput and the per-op fixed cost
    fp16_factor: float  # this generation's fp16 time (matrix and vector) relative to the shared costs
    ddr_gbs: float  # LPDDR peak of the SoC (GB/s)
    vtcm_mb: float  # on-chip tightly coupled memory
    fitted_on: tuple[str, ...]  # the devices whose published figures fitted hmx_gmacs / clock_ghz
    costs: CostConstants
    spread: Spread
    scales: Mapping[str, float] = field(default_factory=dict)
    calibrated_on: str = ""

    @property
    def name(self) -> str:
        return f"v{self.arch}"

    @property
    def where(self) -> str:
        if self.calibrated_on:
            return f"HTP v{self.arch} (cost model, calibrated on {self.calibrated_on})"
        return f"HTP v{self.arch} (cost model)"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["scales"] = dict(self.scales)
        return data


# BEGIN FITTED CONSTANTS (written by benchmarks/latency_fit.py --write; do not edit by hand)
FIT_SOURCE = "fitted 2026-11-23 by benchmarks/latency_fit.py on aihub_published_latency.csv"
_FITTED_COSTS = dict(rate_16x8=1.102, rate_fp16=3.088, hvx_16bit=2.991, hvx_fp16=1.85, transcendental=4.313,
    transcendental_16=1.122, transcendental_fp16=2.526, normalize=5.544, op_cycles=1300.0, overlap=1.0,
    memory_efficiency=1.0)
_FITTED_ARCHS = {"73": dict(hmx_gmacs=11950.0, clock_ghz=0.4261, fp16_factor=1.012), "75": dict(hmx_gmacs=18420.0,
    clock_ghz=0.6925, fp16_factor=1.143), "79": dict(hmx_gmacs=25320.0, clock_ghz=1.118, fp16_factor=1.131)}
_FITTED_SPREAD = dict(absolute=0.1438, wide16=0.1347, fp16=0.1645)
# END FITTED CONSTANTS

COSTS = CostConstants(**_FITTED_COSTS)
SPREAD = Spread(**_FITTED_SPREAD)
# Generations without published figures in the fit data follow v73 by the ratios of their SoC's published
# AI Hub w8a8 ResNet50 (matrix rate) and MobileNet-v2 (vector rate, per-op cost) latencies (docs/latency.md).
_UNFITTED = {"68": (17.1 / 27.4, 0.40 / 0.70), "69": (20.6 / 27.4, 0.55 / 0.70)}
_SOCS = {  # reference SoC, LPDDR peak GB/s, VTCM MB, devices of the fit data
    "68": ("Snapdragon 888 (SM8350)", 51.2, 4, ()),
    "69": ("Snapdragon 8 Gen 1 (SM8450)", 51.2, 8, ()),
    "73": ("Snapdragon 8 Gen 2 (SM8550)", 67.0, 8, ("QCS8550 (Proxy)", "Snapdragon X Elite CRD")),
    "75": ("Snapdragon 8 Gen 3 (SM8650)", 76.8, 8, ("Samsung Galaxy S24",)),
    "79": ("Snapdragon 8 Elite (SM8750)", 84.8, 8, ("Samsung Galaxy S25",)),
}


def make_archs(costs: CostConstants, fitted: Mapping[str, Mapping[str, float]], spread: Spread) -> dict[str, HtpArch]:
    """Every generation's HtpArch from the shared costs and the fitted per-generation rates."""
    archs = {}
    for arch, (soc, ddr, vtcm, devices) in _SOCS.items():
        if arch in fitted:
            rates = dict(fitted[arch])
        else:
            hmx, clock = _UNFITTED[arch]
            rates = dict(hmx_gmacs=fitted["73"]["hmx_gmacs"] * hmx, clock_ghz=fitted["73"]["clock_ghz"] * clock,
                         fp16_factor=fitted["73"]["fp16_factor"])
        archs[arch] = HtpArch(arch=arch, reference_soc=soc, ddr_gbs=ddr, vtcm_mb=vtcm, fitted_on=devices,
                              costs=costs, spread=spread, **rates)
    return archs


HTP_ARCHS: dict[str, HtpArch] = make_archs(COSTS, _FITTED_ARCHS, SPREAD)


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
# HVX cost classes of element-wise ops (instructions per 128-byte vector: docs/latency.md).
_HVX_CLASS = {
    **dict.fromkeys(("Relu", "Clip", "Max", "Min", "Abs", "Neg", "LeakyRelu", "Floor", "Ceil", "Round",
                     "Sign", "Not", "And", "Or", "Xor", "Equal", "Greater", "Less", "GreaterOrEqual",
                     "LessOrEqual", "Where"), "simple"),
    **dict.fromkeys(("Add", "Sub", "Mul", "Sum", "PRelu", "BatchNormalization", "Mean", "HardSigmoid",
                     "HardSwish"), "arith"),
    **dict.fromkeys(("Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Gelu", "SiLU", "Elu",
                     "Selu", "Softplus", "Softsign", "Mish", "Sin", "Cos", "Div", "Pow"), "transcendental"),
    **dict.fromkeys(("Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization",
                     "GroupNormalization", "LpNormalization"), "normalize"),
    **dict.fromkeys(("Resize", "Upsample"), "resize"),
}
_DEFAULT_CLASS = "arith"
# Reductions and global pools: one instruction per input vector.
_REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSumExp", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
               "ArgMax", "ArgMin"}
# Windowed pools: one instruction per output vector and kernel tap.
_POOL_OPS = {"AveragePool", "MaxPool", "LpPool"}
# Every cost class an op can fall in (calibration scales these): "hmx", "depthwise", HVX element-wise classes,
# "reduce", "pool", "dma" (data movers), "layout" (metadata only), "convert".
OP_CLASSES = ("hmx", "depthwise", "simple", "arith", "transcendental", "normalize", "resize", "reduce", "pool",
              "dma", "layout", "convert")
_FIXED_INSTR = {"simple": 1.0, "arith": 2.0, "resize": 4.0, "reduce": 1.0, "pool": 1.0, "depthwise": 1.0}

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
    work: float = 0.0  # HVX elements processed (x the class's instructions per 128-byte vector)
    cls: str = ""  # cost class (OP_CLASSES)
    kind: str = "compute"  # "compute", "convert", "io", "graph"
    hidden_by: int = -1  # index of the matrix op whose time can hide this activation's HVX time
    absorbed: list = field(default_factory=list)  # tensors a fused pattern (SiLU, Gelu) now reads inside itself
    weights: list = field(default_factory=list)  # [(float-model name, dtype, elements)] of its constant operands


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


@lru_cache(maxsize=64)  # a study re-estimates every plan when it recalibrates on a device
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


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


# Shape arithmetic: constant-folded before the graph reaches the HTP.
_SHAPE_OPS = {"Shape", "Constant", "ConstantOfShape", "Range", "Size"}


def _parse(model: onnx.ModelProto) -> _Parsed:
    """The ops the HTP runs, read through the one QDQ reader (mpstudio.qdq), with their shapes and work."""
    qdq = read_qdq(model)
    counter = _ElementCounter(_shapes(model))
    ops = [_io_op(io, counter) for io in qdq.graph_io if io.op_type == "QuantizeLinear"]
    ops += [_convert_op(c, counter) for c in qdq.converts]
    ops += [op for op in (_compute_op(o, counter) for o in qdq.ops if o.op_type not in _SHAPE_OPS) if op]
    ops += [_io_op(io, counter) for io in qdq.graph_io if io.op_type == "DequantizeLinear"]
    _fuse(ops)
    ops.append(_Op("graph execute", "Graph", "graph", [], [], kind="graph"))
    return _Parsed(ops, qdq.quantized, counter.unknown, qdq.graph_inputs, qdq.graph_outputs)


class _ElementCounter:
    """Elements of a tensor from the inferred shapes; unknown shapes count as one element and are counted."""

    def __init__(self, shapes: dict[str, tuple]):
        self.shapes, self.unknown = shapes, 0

    def __call__(self, name: str) -> int:
        n = _elements(self.shapes.get(name))
        if n is None:
            self.unknown += 1
            return 1
        return n


def _io_op(io, elements: _ElementCounter) -> _Op:
    """A graph-input quantize or output dequantize: ORT's QNN EP leaves it to the CPU."""
    n = elements(io.value)
    if io.op_type == "QuantizeLinear":
        return _Op(io.name, io.op_type, "cpu", [(io.tensor, "float32", n)], [(io.tensor, io.dtype, n)], kind="io")
    return _Op(io.name, io.op_type, "cpu", [(io.tensor, io.dtype, n)], [(io.value, "float32", n)], kind="io")


def _convert_op(convert, elements: _ElementCounter) -> _Op:
    """A re-quantization at a precision boundary, priced as an HVX op of its own."""
    n = elements(convert.value)
    return _Op(convert.name, "Convert", "hvx", [(convert.tensor, convert.source, n)],
               [(convert.tensor, convert.target, n)], work=n, cls="convert", kind="convert")


def _htp_type(dtype: str) -> str:
    return "float16" if dtype.startswith("float") else dtype  # the HTP computes float in fp16


def _compute_op(qop, elements: _ElementCounter) -> _Op | None:
    op = _Op(qop.name, qop.op_type, "hvx", [], [])
    op.inputs = [(o.tensor, _htp_type(o.dtype), elements(o.value)) for o in qop.activations]
    op.outputs = [(o.tensor, _htp_type(o.dtype), elements(o.value)) for o in qop.outputs]
    if not op.outputs:
        return None
    weights = [(o.value, _htp_type(o.dtype)) for o in qop.weights]
    shapes = elements.shapes
    op.weights = [(o.tensor, _htp_type(o.dtype), _elements(shapes.get(o.value)) or 0) for o in qop.weights]
    op.weight_bytes = float(sum((_elements(shapes.get(w)) or 0) * _bytes(t) for w, t in weights))
    if qop.op_type == "Gather" and weights:  # a table lookup reads only the rows it gathers
        op.weight_bytes = float(op.outputs[0][2] * _bytes(weights[0][1]))
    op.weight_type = next((t for _, t in weights if t != "int32"), "")  # int32 is a bias
    _shape_work(op, qop.node, shapes, weights)
    return op


# Activations the HTP fuses into the matrix op before them, in every precision (QNN HTP guidelines).
_FUSABLE = {"Relu", "Clip", "LeakyRelu", "PRelu", "HardSwish"}
# Element-wise activations that run on HVX after a matrix op and can overlap with it.
_OVERLAPPING = {"SiLU", "Gelu", "Sigmoid", "Tanh", "HardSigmoid", "Elu", "Add", "Mul"}


def _fuse(ops: list[_Op]) -> None:
    """Rewrite `ops` as the HTP runs them: SiLU, hard-swish and GELU patterns become one op, activations after
    matrix ops fuse into them (or overlap with them)."""
    graph = _OpGraph(ops)
    for op in ops:
        if op.op_type == "Sigmoid":
            _fuse_gated(graph, op, "SiLU")
        elif op.op_type == "HardSigmoid":
            _fuse_gated(graph, op, "HardSwish")
        elif op.op_type == "Erf":
            _fuse_gelu(graph, op)
    _fuse_activations(ops, _OpGraph(ops))


class _OpGraph:
    """Who produces and who reads each activation of a list of ops."""

    def __init__(self, ops: list[_Op]):
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = defaultdict(list)
        self.index = {id(op): i for i, op in enumerate(ops)}
        self.ops = ops
        for i, op in enumerate(ops):
            if op.kind != "compute" or op.engine == "fused":
                continue
            for name, _, _ in op.outputs:
                self.producer[name] = i
            for name, _, _ in op.inputs:
                self.readers[name].append(i)

    def sole_reader(self, op: _Op) -> _Op | None:
        readers = self.readers.get(op.outputs[0][0], []) if op.outputs else []
        return self.ops[readers[0]] if len(readers) == 1 else None

    def source(self, op: _Op, skip: str) -> str | None:
        """The activation `op` reads other than `skip` (None when it reads two others or none)."""
        others = {name for name, _, _ in op.inputs if name != skip}
        return others.pop() if len(others) == 1 else None


def _fuse_gated(graph: _OpGraph, gate: _Op, fused: str) -> None:
    """x * Sigmoid(x) -> SiLU(x), x * HardSigmoid(x) -> HardSwish(x): one HVX op (QNN's op set has both)."""
    if len(gate.inputs) != 1:
        return
    x = gate.inputs[0][0]
    mul = graph.sole_reader(gate)
    if mul is None or mul.op_type != "Mul" or {name for name, _, _ in mul.inputs} != {x, gate.outputs[0][0]}:
        return
    gate.engine = "fused"
    mul.absorbed = [gate.outputs[0][0]]
    mul.op_type, mul.cls = fused, _HVX_CLASS[fused]
    mul.inputs = [i for i in mul.inputs if i[0] == x][:1]


def _fuse_gelu(graph: _OpGraph, erf: _Op) -> None:
    """The exporters' GELU, x * 0.5 * (1 + erf(x / sqrt 2)) in any order of its Muls, -> one Gelu op."""
    pre = graph.ops[graph.producer[erf.inputs[0][0]]] if erf.inputs and erf.inputs[0][0] in graph.producer else None
    if pre is None or pre.op_type not in ("Div", "Mul") or len(pre.inputs) != 1:
        return
    x = pre.inputs[0][0]
    add = graph.sole_reader(erf)
    mul = graph.sole_reader(add) if add is not None and add.op_type == "Add" and len(add.inputs) == 1 else None
    if mul is None or mul.op_type != "Mul":
        return
    group = [pre, erf, add, mul]
    other = graph.source(mul, add.outputs[0][0])
    if other != x:  # x * 0.5 computed first: (x * 0.5) * (1 + erf)
        half = graph.ops[graph.producer[other]] if other in graph.producer else None
        if half is None or half.op_type != "Mul" or [i[0] for i in half.inputs] != [x]:
            return
        group.append(half)
    last = mul
    after = graph.sole_reader(mul)
    if after is not None and after.op_type == "Mul" and len(after.inputs) == 1 and other == x:
        last = after  # ... * 0.5 last
        group.append(after)
    for op in group:
        if op is not last:
            op.engine = "fused"
            last.absorbed += [name for name, _, _ in op.outputs]
    last.op_type, last.cls, last.engine = "Gelu", "transcendental", "hvx"
    last.inputs = [(x, pre.inputs[0][1], pre.inputs[0][2])]


def _fuse_activations(ops: list[_Op], graph: _OpGraph) -> None:
    """What follows a matrix op alone, in the same type: a bias Add or a Relu/Clip... fuses into it (no cost of
    its own); SiLU, GELU... run on HVX while the matrix unit works (`hidden_by`)."""
    producer = dict(graph.producer)
    for op in ops:
        if op.engine == "fused" or len(op.inputs) != 1 or op.kind != "compute":
            continue
        name, received, _ = op.inputs[0]
        index = producer.get(name)
        src = ops[index] if index is not None else None
        # A convert between the two (a precision boundary) keeps them apart.
        if src is None or src.engine != "hmx" or len(graph.readers[name]) != 1 or received != src.outputs[0][1]:
            continue
        # A bias, or a scale by a constant, folds into the matrix op's output requantization.
        folds = (op.op_type == "Add" and op.weight_bytes > 0 and src.op_type in ("MatMul", "Gemm")
                 or op.op_type in ("Mul", "Div") and 0 < op.weight_bytes <= 4)
        if op.op_type in _FUSABLE or folds:
            op.engine = "fused"
            for out, _, _ in op.outputs:
                producer[out] = index
        elif op.op_type in _OVERLAPPING and op.engine == "hvx":
            op.hidden_by = index


def _shape_work(op: _Op, node: onnx.NodeProto, shapes: dict, weights) -> None:
    """MACs and HVX work of `op` from its shapes."""
    out_shape = shapes.get(node.output[0])
    out_n = op.outputs[0][2]
    t = node.op_type
    if t in _LAYOUT_OPS:
        op.engine, op.cls = "none", "layout"
        return
    if t in _MOVER_OPS:
        op.engine, op.cls = "dma", "dma"
        return
    if t in ("Conv", "ConvTranspose") and len(node.input) > 1:
        w = shapes.get(node.input[1])
        group = int(_attr(node, "group", 1))
        if not w or not out_shape or any(d is None for d in out_shape):
            op.engine, op.cls = "hmx", "hmx"
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
                op.engine, op.cls, op.work = "hvx", "depthwise", op.macs
                return
            op.engine, op.cls = "hmx", "hmx"
            op.hmx_macs = batch * group * _pad(cout_g) * spatial * _pad(cin_g) * kernel
        else:
            in_shape = shapes.get(node.input[0])
            cin, cout_g = int(w[0]), int(w[1])
            spatial_in = int(np.prod(in_shape[2:], dtype=np.int64)) if in_shape and len(in_shape) > 2 else 1
            batch = int(in_shape[0] or 1) if in_shape else 1
            op.macs = batch * cin * spatial_in * cout_g * kernel
            op.engine, op.cls = "hmx", "hmx"
            op.hmx_macs = batch * group * _pad(cin // max(group, 1)) * spatial_in * _pad(cout_g) * kernel
        return
    if t in ("Gemm", "MatMul"):
        a = shapes.get(node.input[0])
        if not a or out_n is None:
            op.engine, op.cls = "hmx", "hmx"
            return
        k = a[-2] if (t == "Gemm" and _attr(node, "transA", 0)) else a[-1]
        k = int(k or 1)
        n = int(out_shape[-1] or 1) if out_shape else 1
        op.macs = int(out_n) * k
        op.engine, op.cls = "hmx", "hmx"
        op.hmx_macs = int(out_n // max(n, 1)) * _pad(n) * _pad(k)
        return
    if t in _REDUCE_OPS:
        op.cls, op.work = "reduce", op.inputs[0][2] if op.inputs else out_n
        return
    if t in _POOL_OPS:
        kernel = int(np.prod(_attr(node, "kernel_shape", [1]), dtype=np.int64))
        op.cls, op.work = "pool", out_n * kernel
        return
    op.cls, op.work = _HVX_CLASS.get(t, _DEFAULT_CLASS), out_n
    if t in ("Div", "Pow") and len(op.inputs) == 1 and weights:
        op.cls = "arith"  # by a constant: a multiply by its reciprocal, a square


# ---- cost formulas --------------------------------------------------------------------------------------------
def _act_type(types: Iterable[str]) -> str:
    """The type an op computes in: fp16 if any activation is float, else the widest quantized type."""
    types = [t for t in types if t]
    if not types or any(t.startswith("float") for t in types):
        return "float16"
    return "uint16" if max(_TYPE_BITS.get(t, 8) for t in types) > 8 else "uint8"


_PRECISION = {"uint8": 0, "uint16": 1, "float16": 2}
_KINDS = ("compute", "convert", "io", "graph")


@dataclass(frozen=True)
class OpFeatures:
    """What the cost formulas read of each op, as arrays (one entry per op); `costs(arch)` prices them.

    Separate from the constants so that a fit (benchmarks/latency_fit.py) or a calibration can price the same
    model under many constants quickly.
    """

    kind: np.ndarray  # index into ("compute", "convert", "io", "graph")
    engine: np.ndarray  # "hmx", "hvx", "dma", "none", "fused", "cpu", "graph"
    cls: np.ndarray  # cost class (OP_CLASSES), "" for io / graph / fused
    act_type: np.ndarray  # "uint8", "uint16", "float16" (what the op computes in)
    wide_weights: np.ndarray  # bool: the matrix op's weight (or second operand) is 16-bit
    hmx_macs: np.ndarray
    work: np.ndarray  # HVX elements of work
    act_bytes: np.ndarray
    weight_bytes: np.ndarray
    hidden_by: np.ndarray  # index of the matrix op that can hide this op's HVX time, -1 if none

    def costs(self, arch: HtpArch) -> dict[str, np.ndarray]:
        """compute_ms, memory_ms, overhead_ms, hidden_ms and ms of every op on `arch`."""
        c = arch.costs
        prec = np.array([_PRECISION.get(t, 0) for t in self.act_type])
        is_hmx, is_hvx = self.engine == "hmx", self.engine == "hvx"
        rate_16x16 = c.rate_16x8 * c.rate_16x16_factor
        rate = np.select([prec == 2, prec == 1], [c.rate_fp16 * arch.fp16_factor, np.where(self.wide_weights, rate_16x16, c.rate_16x8)],
                         1.0)
        rate = np.where((prec == 0) & self.wide_weights, c.rate_16x8, rate)
        hmx_s = np.where(is_hmx, self.hmx_macs * rate / (arch.hmx_gmacs * 1e9), 0.0)
        wide = np.select([prec == 2, prec == 1], [c.transcendental_fp16, c.transcendental_16], 1.0)
        instr = np.select(
            [self.cls == "transcendental", self.cls == "normalize", self.cls == "convert"],
            [c.transcendental * wide, c.normalize * wide, c.convert_instr],
            np.array([_FIXED_INSTR.get(k, 2.0) for k in self.cls]))
        width = np.select([prec == 2, prec == 1], [c.hvx_fp16 * arch.fp16_factor, c.hvx_16bit], 1.0)
        hvx_s = np.where(is_hvx, self.work / 128 * instr * width / (c.hvx_vectors_per_cycle * arch.clock_ghz * 1e9),
                         0.0)
        ddr = arch.ddr_gbs * c.memory_efficiency * 1e9
        fits = self.act_bytes + self.weight_bytes <= arch.vtcm_mb * 2**20 / 2
        memory_s = self.act_bytes / np.where(fits, c.vtcm_factor * ddr, ddr) + self.weight_bytes / ddr
        runs = np.isin(self.engine, ("hmx", "hvx", "dma", "none"))
        memory_s = np.where(runs & (self.engine != "none"), memory_s, 0.0)
        overhead_s = np.where(runs, c.op_cycles / (arch.clock_ghz * 1e9), 0.0)
        io = self.kind == _KINDS.index("io")
        memory_s = np.where(io, self.act_bytes / (c.cpu_io_gbs * 1e9), memory_s)
        overhead_s = np.where(self.kind == _KINDS.index("graph"), c.graph_overhead_us * 1e-6, overhead_s)
        compute_s = hmx_s + hvx_s
        busy = np.maximum(compute_s, memory_s)
        hidden_s = np.zeros_like(busy)
        has = self.hidden_by >= 0
        if has.any():
            partner = busy[self.hidden_by[has]]
            hidden_s[has] = c.overlap * np.minimum(busy[has], partner)
        ms = (busy + overhead_s - hidden_s) * 1e3
        if arch.scales:
            ms = ms * np.array([arch.scales.get(k, 1.0) for k in self._scale_keys()])
        return {"compute_ms": compute_s * 1e3, "memory_ms": memory_s * 1e3, "overhead_ms": overhead_s * 1e3,
                "hidden_ms": hidden_s * 1e3, "ms": ms}

    def htp_ms(self, arch: HtpArch) -> float:
        """Total ms of the ops the HTP runs (the graph-input quantize and output dequantize left out)."""
        return float(self.costs(arch)["ms"][self.kind != _KINDS.index("io")].sum())

    def _scale_keys(self) -> list[str]:
        return [k if k else e for k, e in zip(self.cls, self.engine)]


def _op_types(op: _Op, in_types=None, out_types=None) -> tuple[list, list]:
    ins = [(n, t if in_types is None else in_types) for _, t, n in op.inputs]
    outs = [(n, t if out_types is None else out_types) for _, t, n in op.outputs]
    return ins, outs


def _features(ops: list[_Op], in_types=None, out_types=None) -> OpFeatures:
    """OpFeatures of `ops`; `in_types`/`out_types` override every op's activation types (e.g. "uint16")."""
    rows = []
    for op in ops:
        ins, outs = _op_types(op, in_types, out_types)
        act = _act_type([t for _, t in ins] + [t for _, t in outs]) if op.kind != "io" else (
            outs[0][1] if op.op_type == "QuantizeLinear" else ins[0][1])
        moved = 0.0 if op.kind == "graph" else sum(n * _bytes(t) for n, t in ins + outs)
        wide_weights = False
        if op.engine == "hmx" and act != "float16":
            if op.op_type == "MatMul" and len(op.inputs) > 1:  # two activations: the second plays the weight
                wide_weights = _TYPE_BITS.get(ins[1][1], 8) > 8
            else:
                wide_weights = _TYPE_BITS.get(op.weight_type or "uint8", 8) > 8
        rows.append((_KINDS.index(op.kind), op.engine, op.cls if op.engine != "fused" else "", act, wide_weights,
                     float(op.hmx_macs), float(op.work), float(moved), float(op.weight_bytes), op.hidden_by))
    cols = list(zip(*rows)) if rows else [()] * 10
    return OpFeatures(
        kind=np.array(cols[0], dtype=int), engine=np.array(cols[1], dtype=object), cls=np.array(cols[2], dtype=object),
        act_type=np.array(cols[3], dtype=object), wide_weights=np.array(cols[4], dtype=bool),
        hmx_macs=np.array(cols[5], dtype=float), work=np.array(cols[6], dtype=float),
        act_bytes=np.array(cols[7], dtype=float), weight_bytes=np.array(cols[8], dtype=float),
        hidden_by=np.array(cols[9], dtype=int))


def _op_ms(op: _Op, arch: HtpArch, in_types=None, out_types=None) -> float:
    """The time of one op alone (no overlap), with its types optionally overridden."""
    single = dataclasses.replace(op, hidden_by=-1)
    return float(_features([single], in_types, out_types).costs(arch)["ms"][0])


def _bound(compute: np.ndarray, memory: np.ndarray, overhead: np.ndarray) -> list[str]:
    return ["overhead" if o >= max(c, m) else "compute" if c >= m else "memory"
            for c, m, o in zip(compute, memory, overhead)]


# ---- the estimate ----------------------------------------------------------------------------------------------
OP_COLUMNS = ("node", "op_type", "kind", "engine", "op_class", "tensor", "macs", "elements", "act_type",
              "act_bits", "weight_type", "weight_bits", "act_bytes", "weight_bytes", "compute_ms", "memory_ms",
              "overhead_ms", "hidden_ms", "ms", "bound", "share")


@dataclass(frozen=True, eq=False)
class LatencyEstimate:
    """The cost model's latency of one model on one HTP architecture, with its per-op breakdown.

    `latency` includes the CPU's graph-input quantize and output dequantize (what an application running the
    QDQ model through ORT's QNN EP waits for); `htp` is the HTP's graph alone (how AI Hub publishes its figures).
    Both carry the interval from the fit's residuals (or the calibration's).

    `ops` has one row per op the HTP (or, for graph I/O, the CPU) runs, columns:
      node: the ONNX node (a convert is named by its quantize node; "graph execute" is the per-call cost)
      op_type: ONNX op type; "Convert" for an 8<->16-bit convert, "Graph" for the per-call cost, and the fused
               op for a pattern QNN runs as one (SiLU, HardSwish, Gelu)
      kind: "compute", "convert" (at a precision boundary), "io" (graph-input quantize / output dequantize,
            on the CPU) or "graph"
      engine: "hmx" (matrix unit), "hvx" (vector unit), "dma" (data mover), "none" (metadata-only reshape),
              "fused" (part of the op before it, or of a fused pattern), "cpu", "graph"
      op_class: cost class (OP_CLASSES; "" for fused, io and graph rows)
      tensor: the op's (first) output, as named in the model
      macs: logical multiply-accumulates (0 for element-wise ops)
      elements: elements of the (first) output
      act_type / act_bits: the type the op computes in (uint8, uint16 or float16)
      weight_type / weight_bits: the type of its weight or constant operand ("" / 0 if none)
      act_bytes / weight_bytes: bytes read and written
      compute_ms, memory_ms, overhead_ms: the roofline terms; hidden_ms: time hidden behind the matrix op
        before it; ms = (max(compute, memory) + overhead - hidden) x the calibration scale of its class
      bound: "compute", "memory" or "overhead" (the largest term)
      share: ms / total
    """

    latency: Latency
    htp: Latency
    ops: pd.DataFrame
    arch: HtpArch

    @property
    def ms(self) -> float:
        return self.latency.ms

    @property
    def htp_ms(self) -> float:
        return self.htp.ms

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
        ran = self.ops[(self.ops["kind"] != "graph") & (self.ops["engine"] != "fused")]
        return (f"{self.latency} and {self.htp.ms:.3f} ms [{self.htp.interval}] {HTP_ONLY}: {len(ran)} ops, "
                f"{self.macs / 1e9:.3f} GMAC, compute {self.compute_ms:.3f} / memory {self.memory_ms:.3f} / "
                f"overhead {self.overhead_ms:.3f} ms, {self.converts} converts {self.convert_ms:.3f} ms, "
                f"graph I/O {self.io_ms:.3f} ms")

    def to_dict(self) -> dict[str, Any]:
        return {"latency": self.latency.to_dict(), "htp": self.htp.to_dict(), "arch": self.arch.name,
                "ops": self.ops.to_dict(orient="records")}


def estimate_latency(qdq_model, htp_arch: str | int | HtpArch = "75") -> LatencyEstimate:
    """Estimate the latency of `qdq_model` (a path or ModelProto) on HTP `htp_arch` with the cost model.

    A QDQ model (QuantizeLinear/DequantizeLinear around float ops, as ORT's quantize_static makes for QNN) is
    priced with the types its Q/DQ nodes give each op; a float model (no QDQ) as fp16 on the HTP. `htp_arch`
    may be a calibrated HtpArch (`calibrate`). The result's latencies have source "estimate"; they are not
    measurements.
    """
    arch = _resolve_arch(htp_arch)
    parsed = _parsed(qdq_model)
    ops_list = list(parsed.ops)
    if not parsed.quantized:
        ops_list += _float_io_ops(parsed)  # the HTP casts fp32 graph inputs to fp16 and outputs back
    ops = _op_frame(ops_list, arch)
    detail = (f"{'QDQ' if parsed.quantized else 'float model as fp16'}; {arch.reference_soc} constants; "
              f"{int((ops['engine'] != 'fused').sum()) - 1} ops; {FIT_SOURCE}")
    if parsed.unknown_shapes:
        detail += f"; {parsed.unknown_shapes} tensors of unknown shape counted as 1 element"
    on_htp = ops["kind"] != "io"
    htp_ms = float(ops.loc[on_htp, "ms"].sum())
    factor = _interval_factor(ops[on_htp], arch)
    io_ms = float(ops.loc[~on_htp, "ms"].sum())
    total = htp_ms + io_ms
    htp = Latency(htp_ms, "estimate", arch.where, detail, HTP_ONLY, htp_ms / factor, htp_ms * factor)
    # The CPU's part is priced by an assumption, not fitted: the interval covers the HTP's part.
    latency = Latency(total, "estimate", arch.where, detail, WITH_CPU_IO, htp_ms / factor + io_ms,
                      htp_ms * factor + io_ms)
    return LatencyEstimate(latency=latency, htp=htp, ops=ops, arch=arch)


def op_features(model) -> OpFeatures:
    """The ops of `model` as OpFeatures: `op_features(m).htp_ms(arch)` is `estimate_latency(m, arch).htp_ms`.
    For fitting constants without re-reading the model."""
    parsed = _parsed(model)
    ops_list = list(parsed.ops)
    if not parsed.quantized:
        ops_list += _float_io_ops(parsed)
    return _features(ops_list)


def _op_frame(ops_list: list[_Op], arch: HtpArch) -> pd.DataFrame:
    features = _features(ops_list)
    costs = features.costs(arch)
    first = [(op.outputs or op.inputs or [("", "", 0)])[0] for op in ops_list]
    ops = pd.DataFrame({
        "node": [op.node for op in ops_list], "op_type": [op.op_type for op in ops_list],
        "kind": [op.kind for op in ops_list], "engine": features.engine, "op_class": features.cls,
        "tensor": [f[0] for f in first], "macs": [int(op.macs) for op in ops_list],
        "elements": [int(f[2]) for f in first], "act_type": features.act_type,
        "act_bits": [_TYPE_BITS.get(t, 0) for t in features.act_type],
        "weight_type": [op.weight_type for op in ops_list],
        "weight_bits": [_TYPE_BITS.get(op.weight_type, 0) for op in ops_list],
        "act_bytes": features.act_bytes, "weight_bytes": features.weight_bytes, **costs,
        "bound": _bound(costs["compute_ms"], costs["memory_ms"], costs["overhead_ms"]),
    })
    ops.loc[ops["kind"].isin(["graph"]), "act_type"] = ""
    ops.loc[ops["kind"].isin(["graph"]), "act_bits"] = 0
    total = float(ops["ms"].sum())
    ops["share"] = ops["ms"] / total if total > 0 else 0.0
    return ops[list(OP_COLUMNS)]


def _interval_factor(htp_ops: pd.DataFrame, arch: HtpArch) -> float:
    """The multiplicative half-width of the interval: the fit's spread, by the share of 16-bit and fp16 time."""
    total = float(htp_ops["ms"].sum())
    if total <= 0:
        return 1.0
    share16 = float(htp_ops.loc[htp_ops["act_type"] == "uint16", "ms"].sum()) / total
    share_fp16 = float(htp_ops.loc[htp_ops["act_type"] == "float16", "ms"].sum()) / total
    return arch.spread.factor(share16, share_fp16)


def _float_io_ops(parsed: _Parsed) -> list[_Op]:
    ops: dict[str, _Op] = {}  # one cast per graph input even if several ops read it
    for op in parsed.ops:
        for name, _, n in op.inputs:
            if name in parsed.graph_inputs:
                node = f"{name} cast fp32->fp16"
                ops[node] = _Op(node, "Cast", "hvx", [(name, "float32", n)], [(name, "float16", n)], work=n,
                                cls="convert", kind="convert")
        for name, _, n in op.outputs:
            if name in parsed.graph_outputs:
                node = f"{name} cast fp16->fp32"
                ops[node] = _Op(node, "Cast", "hvx", [(name, "float16", n)], [(name, "float32", n)], work=n,
                                cls="convert", kind="convert")
    return list(ops.values())


# ---- recalibration on a device ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Calibration:
    """The cost model refitted to one device's per-op profiles.

    `arch` is the calibrated HtpArch (pass it as `htp_arch` to `estimate_latency` or `promotion_costs`; its
    estimates say "calibrated on <device>"). `classes` has one row per cost class: estimated_ms (before),
    measured_ms (the profiled ops' time, shared out by their estimated classes), scale, ops.
    `unmatched_share` is the part of the profiled time whose ops map to no op of the model (left out).
    """

    arch: HtpArch
    device: str
    plans: int
    classes: pd.DataFrame
    unmatched_share: float

    def describe(self) -> str:
        scales = ", ".join(f"{k} x{v:.2f}" for k, v in sorted(self.arch.scales.items()))
        return (f"{self.arch.where}: {self.plans} profiled plan(s), scales {scales}; "
                f"{self.unmatched_share:.1%} of the profiled time unmatched")


def calibrate(profiles: Iterable[tuple], htp_arch: str | int | HtpArch = "75", *,
              allow_emulator: bool = False, ridge: float = 0.05) -> Calibration:
    """Refit the per-class costs of `htp_arch` to measured per-op profiles of one device.

    `profiles`: (model, profile, total_ms) per profiled plan: the QDQ model (path or ModelProto) that ran, its
    `OpProfile` (`AgentClient.run(..., profile=True).profile`, ops mapped back to ONNX nodes) and the measured
    latency of one run in ms (the run's `LatencyStats.median_ms`, or a `Latency`). A profile in cycles is
    shared out over that latency less the estimated CPU graph I/O; one in microseconds is taken as is.
    Least squares: one scale per cost class (OP_CLASSES) so that each profiled op's estimated time, summed by
    class and scaled, matches its measured time; `ridge` pulls classes with little time in the profiles
    toward 1. Emulator profiles are host time, not device latency: refused unless `allow_emulator`, and then
    the label says so.
    """
    base = _resolve_arch(htp_arch)
    base = dataclasses.replace(base, scales={}, calibrated_on="")
    rows, measured, plans, unmatched, total = [], [], 0, 0.0, 0.0
    device = None
    for model, profile, total_ms in profiles:
        device = _profile_device(profile, device, allow_emulator)
        estimate = estimate_latency(model, base)
        by_class, times, left = _profile_rows(estimate, profile, milliseconds(getattr(total_ms, "ms", total_ms),
                                                                                "a profiled latency"))
        rows += by_class
        measured += times
        unmatched += left
        total += sum(times) + left
        plans += 1
    if not plans:
        raise MpstudioError("calibrate needs at least one (model, profile, latency) of a device run")
    if not rows:
        raise MpstudioError("no profiled op maps to an op of the models: profile with ONNX source ops (the agent's "
                            "profile=True does) and pass the models that ran")
    frame = pd.DataFrame(rows).fillna(0.0)
    classes = [k for k in OP_CLASSES if k in frame.columns and frame[k].sum() > 0]
    scales, fitted = _class_scales(frame[classes].to_numpy(), np.array(measured), ridge)
    arch = dataclasses.replace(base, scales=dict(zip(classes, scales)), calibrated_on=device,
                               spread=_calibration_spread(fitted, np.array(measured)))
    table = pd.DataFrame({"op_class": classes, "estimated_ms": frame[classes].sum().to_numpy() / plans,
                          "measured_ms": [float(np.sum(np.array(measured) * frame[k] / frame[classes].sum(axis=1)
                                                       .clip(lower=1e-12))) / plans for k in classes],
                          "scale": scales, "ops": [int((frame[k] > 0).sum()) for k in classes]})
    return Calibration(arch, device, plans, table, unmatched / total if total else 0.0)


def _profile_device(profile, device: str | None, allow_emulator: bool) -> str:
    if profile is None:
        raise MpstudioError("a run without a profile cannot calibrate: run it with profile=True")
    if profile.source != "measured":
        if not allow_emulator:
            raise MpstudioError(
                f"the profile from {profile.device} is {profile.source} time, not device latency: calibrate on a "
                "device agent's profiles (or pass allow_emulator=True to calibrate on the emulator's costs)")
        name = f"{profile.device} (HTP emulator host time, not device latency)"
    else:
        name = profile.device
    if device is not None and name != device:
        raise MpstudioError(f"calibrate on one device at a time: got profiles from {device} and {name}")
    return name


def _profile_rows(estimate: LatencyEstimate, profile, total_ms: float) -> tuple[list[dict], list[float], float]:
    """Per profiled op: estimated ms by class (of the model's ops it maps to) and its measured ms."""
    ops = estimate.ops[estimate.ops["kind"].isin(["compute", "convert"]) & (estimate.ops["engine"] != "fused")]
    by_node = {node: group for node, group in ops.groupby("node")}
    costs = np.array([op.cost for op in profile.ops], dtype=float)
    if profile.unit == "us":
        to_ms = np.full(len(costs), 1e-3)
    else:  # cycles: shared out over the measured run, less what the CPU does around the graph
        htp_ms = max(total_ms - estimate.io_ms - estimate.arch.costs.graph_overhead_us / 1e3, 1e-9)
        to_ms = np.full(len(costs), htp_ms / max(costs.sum(), 1e-12))
    rows, measured, left = [], [], 0.0
    for op, ms in zip(profile.ops, costs * to_ms):
        groups = [by_node[n] for n in op.onnx_nodes if n in by_node]
        if not groups:
            left += ms
            continue
        both = pd.concat(groups).drop_duplicates("node")
        rows.append(both.groupby("op_class")["ms"].sum().to_dict())
        measured.append(float(ms))
    return rows, measured, left


def _class_scales(estimated: np.ndarray, measured: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """Least squares for class scales s: estimated @ s ~ measured, with a ridge toward s = 1 in units of each
    class's estimated time; scales kept within 1/20..20."""
    weight = ridge * estimated.sum(axis=0)
    a = np.vstack([estimated, np.diag(weight)])
    b = np.concatenate([measured, weight])
    scales, *_ = np.linalg.lstsq(a, b, rcond=None)
    scales = np.clip(scales, 0.05, 20.0)
    return scales, estimated @ scales


def _calibration_spread(fitted: np.ndarray, measured: np.ndarray) -> Spread:
    """The interval of a calibrated estimate: 1.645 x the time-weighted RMS of the per-op log residuals."""
    ok = (fitted > 0) & (measured > 0)
    if not ok.any():
        return SPREAD
    log = np.log(fitted[ok] / measured[ok])
    s = 1.645 * float(np.sqrt(np.sum(measured[ok] * log**2) / np.sum(measured[ok])))
    return Spread(absolute=s, wide16=s, fp16=s)


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


def weight_costs(qdq_model, types: Mapping[str, str], htp_arch: str | int | HtpArch = "75",
                 activation_type: str | None = None) -> pd.Series:
    """Estimated ms added by giving each weight in `types` (float-model name -> "int4", "int8", "int16" ...),
    alone, that type in `qdq_model`: the op that reads it moves more or fewer weight bytes (int4 half of int8,
    int16 twice), and a 16-bit weight runs the matrix unit at the 16-bit rate. Negative when cheaper.

    The op keeps its activation types, or computes in `activation_type` ("uint16") when given: HTP takes a
    16-bit weight only on an op that computes at 16 bits, whose own promotion (and its converts) is
    `promotion_costs`' part. int4 is priced by its bytes only (assumption: the matrix unit expands 4-bit
    weights to 8 bits; no int4 model is in the fit data). A name no op reads as a weight costs NaN.
    Returns a Series indexed by weight name (in the order given), named "weight_ms".
    """
    arch = _resolve_arch(htp_arch)
    parsed = _parsed(qdq_model)
    readers: dict[str, _Op] = {}
    for op in parsed.ops:
        if op.kind == "compute":
            for name, _, _ in op.weights:
                readers.setdefault(name, op)
    values = []
    for name, new_type in types.items():
        op = readers.get(name)
        if op is None or new_type not in _TYPE_BITS:
            values.append(float("nan"))
            continue
        changed = [(w, new_type if w == name else t, n) for w, t, n in op.weights]
        after = dataclasses.replace(op, weights=changed, weight_bytes=float(sum(n * _bytes(t) for _, t, n in changed)),
                                    weight_type=next((t for _, t, _ in changed if t != "int32"), ""))
        values.append(_op_ms(after, arch, activation_type, activation_type)
                      - _op_ms(op, arch, activation_type, activation_type))
    return pd.Series(values, index=pd.Index(list(types), name="tensor"), name="weight_ms", dtype=float)


class _PromotionAnalysis:
    """The 8/16-bit state of a QDQ model's ops, and the cost deltas of promoting one tensor."""

    def __init__(self, parsed: _Parsed, arch: HtpArch):
        self.arch = arch
        compute_ops = [i for i, op in enumerate(parsed.ops) if op.kind == "compute"]
        self.ops = parsed.ops
        actual = _features(parsed.ops).act_type
        ms8 = _features(parsed.ops, "uint8", "uint8").costs(arch)["ms"]
        ms16 = _features(parsed.ops, "uint16", "uint16").costs(arch)["ms"]
        self.bits: dict[int, int] = {}
        self.cost8: dict[int, float] = {}
        self.cost16: dict[int, float] = {}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, set[int]] = defaultdict(set)
        self.elements: dict[str, int] = {}
        self.by_node = {parsed.ops[i].node: i for i in compute_ops}
        for i in compute_ops:
            op = parsed.ops[i]
            if actual[i] == "float16":
                continue  # a float op is already wide; promotion does not concern it
            self.bits[i] = _TYPE_BITS[actual[i]]
            self.cost8[i], self.cost16[i] = float(ms8[i]), float(ms16[i])
            for name, _, n in op.inputs:
                self.consumers[name].add(i)
                self.elements[name] = n
            for name in op.absorbed:  # a fused pattern still reads its inner tensors in the QDQ model
                self.consumers[name].add(i)
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
        convert = _Op("", "Convert", "hvx", [(tensor, "uint8", n)], [(tensor, "uint16", n)], work=n, cls="convert",
                      kind="convert")
        return _op_ms(convert, self.arch)

    def _io_cost(self, tensor: str, bits: int) -> float:
        op = self.io[tensor]
        dtype = "uint16" if bits > 8 else "uint8"
        if op.op_type == "QuantizeLinear":
            return _op_ms(op, self.arch, out_types=dtype)
        return _op_ms(op, self.arch, in_types=dtype)

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
        activation = _Op("", "Clip", "hvx", [(tensor, dtype, n)], [(tensor, dtype, n)], work=n, cls="simple")
        return _op_ms(activation, self.arch)

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
