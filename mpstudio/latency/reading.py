"""Reading a model into the ops the HTP runs: each op through the one QDQ reader (mpstudio.qdq), with the types
its Q/DQ nodes give it, its shapes from ONNX shape inference, its work, and QNN's fusions applied."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..constant_codes import quantized_constants
from ..model import load_model
from ..qdq import read as read_qdq
from .depth import blocked_elements, image_tensors
from .fusion import concat_requantizations, fuse, split_batchnorms
from .ops import MECHANISMS, HtpOp, type_bytes
from .shallow import shallow_inputs
from .units import built_units, float_units
from .work import shape_work


@dataclass
class ParsedModel:
    """The ops of one model as the HTP runs them, and what the estimate says about the model."""

    ops: list[HtpOp]
    quantized: bool  # the model has QDQ activations
    unknown_shapes: int
    graph_inputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]


def parsed_model(model, build=None) -> ParsedModel:
    """The ops of `model`, cached for a path while the file is unchanged. `build` (mpstudio.htp_build.HtpBuild):
    the graph the HTP prepared of this model, which settles which ops compute in float (else the rule of
    latency.units does)."""
    if isinstance(model, (str, os.PathLike)) and Path(model).is_file():
        path = Path(model).resolve()
        stat = path.stat()
        return _parsed_file(str(path), stat.st_mtime_ns, stat.st_size, tuple(sorted(MECHANISMS.items())), build)
    return _parse(load_model(model), build)


@lru_cache(maxsize=64)  # a study re-estimates every plan when it recalibrates on a device
def _parsed_file(path: str, mtime_ns: int, size: int, mechanisms: tuple, build=None) -> ParsedModel:
    """The parse reads the mechanisms switched on (fusions, image-like tensors): they are part of the key."""
    return _parse(load_model(path), build)


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


# Shape arithmetic: constant-folded before the graph reaches the HTP.
_SHAPE_OPS = {"Shape", "Constant", "ConstantOfShape", "Range", "Size"}


def _parse(model: onnx.ModelProto, build=None) -> ParsedModel:
    """The ops the HTP runs, read through the one QDQ reader (mpstudio.qdq), with their shapes and work. Weights
    written as a QuantizeLinear of a float constant are read as the integer codes the device prepares from them.
    A node unit the HTP does not run quantized (latency.units) computes in fp16 beside its own Q/DQ ops."""
    model = quantized_constants(model)
    qdq = read_qdq(model)
    units = built_units(qdq, build) if build is not None else float_units(qdq)
    shapes = _shapes(model)
    # Image-like tensors: read by the channel blocks and the channels-last transposes only, when either is on.
    wanted = MECHANISMS["channel_blocks"] or MECHANISMS["channels_last_transpose"]
    images = image_tensors(qdq.ops, shapes, qdq.graph_inputs) if wanted else set()
    counter = _ElementCounter(shapes, images if MECHANISMS["channel_blocks"] else set())
    ops = [_io_op(io, counter) for io in qdq.graph_io if io.op_type == "QuantizeLinear"]
    ops += [_convert_op(c, counter) for c in qdq.converts]
    ops += [_standalone_op(node, qdq.quantized_type(node), counter) for node in model.graph.node
            if (node.name or node.output[0]) in units.standalone]
    computed = [op for op in (_compute_op(o, counter, images, o.node.name in units.float_ops) for o in qdq.ops
                              if o.op_type not in _SHAPE_OPS) if op]
    ops += shallow_inputs(computed, qdq.ops, shapes, qdq.graph_inputs) + computed
    ops += concat_requantizations(ops)
    split_batchnorms(ops)
    ops += [_io_op(io, counter) for io in qdq.graph_io if io.op_type == "DequantizeLinear"]
    fuse(ops)
    ops.append(HtpOp("graph execute", "Graph", "graph", [], [], kind="graph"))
    return ParsedModel(ops, qdq.quantized, counter.unknown, qdq.graph_inputs, qdq.graph_outputs)


class _ElementCounter:
    """Elements of a tensor from the inferred shapes; unknown shapes count as one element and are counted. A tensor
    of `blocked` (its float-model name) counts its channels padded to whole blocks (mechanism `channel_blocks`)."""

    def __init__(self, shapes: dict[str, tuple], blocked: set[str] = frozenset()):
        self.shapes, self.unknown, self.blocked = shapes, 0, blocked

    def __call__(self, name: str, tensor: str = "", lanes: bool = False) -> int:
        """Elements of `name` as memory holds them; `lanes`: as the vector unit processes them (padded only with
        mechanism `channel_block_lanes`)."""
        shape = self.shapes.get(name)
        padded = tensor in self.blocked and (not lanes or MECHANISMS["channel_block_lanes"])
        n = blocked_elements(shape) if tensor and padded else _elements(shape)
        if n is None:
            self.unknown += 1
            return 1
        return n


def _io_op(io, elements: _ElementCounter) -> HtpOp:
    """A graph-input quantize or output dequantize: ORT's QNN EP leaves it to the CPU."""
    n = elements(io.value)
    if io.op_type == "QuantizeLinear":
        return HtpOp(io.name, io.op_type, "cpu", [(io.tensor, "float32", n)], [(io.tensor, io.dtype, n)], kind="io")
    return HtpOp(io.name, io.op_type, "cpu", [(io.tensor, io.dtype, n)], [(io.value, "float32", n)], kind="io")


def _convert_op(convert, elements: _ElementCounter) -> HtpOp:
    """A re-quantization at a precision boundary, priced as an HVX op of its own."""
    n = elements(convert.value, convert.tensor)
    return HtpOp(convert.name, "Convert", "hvx", [(convert.tensor, convert.source, n)],
                 [(convert.tensor, convert.target, n)], work=elements(convert.value, convert.tensor, lanes=True),
                 cls="convert", kind="convert")


def _standalone_op(node, dtype: str, elements: _ElementCounter) -> HtpOp:
    """A QuantizeLinear or DequantizeLinear of `dtype` that the HTP runs as an op of its own (beside an op
    computing in float), priced as a convert."""
    value = node.input[0] if node.op_type == "QuantizeLinear" else node.output[0]
    n = elements(value)
    ins, outs = ("float16", dtype) if node.op_type == "QuantizeLinear" else (dtype, "float16")
    return HtpOp(node.name or node.output[0], node.op_type, "hvx", [(value, ins, n)], [(value, outs, n)], work=n,
                 cls="convert", kind="convert")


def _htp_type(dtype: str) -> str:
    return "float16" if dtype.startswith("float") else dtype  # the HTP computes float in fp16


def _compute_op(qop, elements: _ElementCounter, images: set[str] = frozenset(), in_float: bool = False
                ) -> HtpOp | None:
    """`in_float`: the HTP computes the op in fp16 although its Q/DQ nodes quantize it (latency.units)."""
    op = HtpOp(qop.name, qop.op_type, "hvx", [], [])
    def counted(operands, lanes: bool = False) -> list:
        return [(o.tensor, "float16" if in_float else _htp_type(o.dtype), elements(o.value, o.tensor, lanes))
                for o in operands]

    op.inputs, op.outputs = counted(qop.activations, lanes=True), counted(qop.outputs, lanes=True)
    if not op.outputs:
        return None
    weights = [(o.value, "float16" if in_float and o.dtype != "int32" else _htp_type(o.dtype)) for o in qop.weights]
    shapes = elements.shapes
    op.weights = [(o.tensor, t, _elements(shapes.get(o.value)) or 0) for o, (_, t) in zip(qop.weights, weights)]
    op.weight_bytes = float(sum((_elements(shapes.get(w)) or 0) * type_bytes(t) for w, t in weights))
    if qop.op_type == "Gather" and weights:  # a table lookup reads only the rows it gathers
        op.weight_bytes = float(op.outputs[0][2] * type_bytes(weights[0][1]))
    op.weight_type = next((t for _, t in weights if t != "int32"), "")  # int32 is a bias
    image_like = any(o.tensor in images for o in list(qop.activations) + list(qop.outputs))
    shape_work(op, qop.node, shapes, weights, image_like)  # vector work from the elements the lanes process
    op.inputs, op.outputs = counted(qop.activations), counted(qop.outputs)  # bytes from those memory holds
    return op


def float_io_ops(parsed: ParsedModel) -> list[HtpOp]:
    """The casts the HTP makes of a float model's fp32 graph inputs to fp16 and of its outputs back."""
    ops: dict[str, HtpOp] = {}  # one cast per graph input even if several ops read it
    for op in parsed.ops:
        for name, _, n in op.inputs:
            if name in parsed.graph_inputs:
                node = f"{name} cast fp32->fp16"
                # the first reader's count: a convolution may read the input padded (mechanism shallow_input)
                ops.setdefault(node, HtpOp(node, "Cast", "hvx", [(name, "float32", n)], [(name, "float16", n)],
                                           work=n, cls="convert", kind="convert"))
        for name, _, n in op.outputs:
            if name in parsed.graph_outputs:
                node = f"{name} cast fp16->fp32"
                ops[node] = HtpOp(node, "Cast", "hvx", [(name, "float16", n)], [(name, "float32", n)], work=n,
                                  cls="convert", kind="convert")
    return list(ops.values())
