"""A float16 model made float32 before anything else reads it: ORT's calibrator and quantizer work on float32
models (on a float16 one, ORT's own optimizer inserts casts the quantizer then trips over), and the QDQ model
computes in 8 or 16 bits on the HTP whatever float type its source had. Every float16 value, type and cast
target becomes float32, in the main graph and in every subgraph; the values are the same (float16 to float32 is
exact)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

FLOAT16 = TensorProto.FLOAT16
FLOAT = TensorProto.FLOAT
# Attributes that name an element type.
_TYPE_ATTRIBUTES = {"to", "dtype"}


def float16_to_float32(model: onnx.ModelProto) -> list[str]:
    """Convert `model` in place when it holds float16 tensors; returns the preparation step it took (or none)."""
    counts = {"initializers": 0, "inputs": 0, "outputs": 0}
    _convert_graph(model.graph, counts, top=True)
    if not any(counts.values()):
        return []
    parts = [f"{n} {what if n > 1 else what[:-1]}" for what, n in counts.items() if n]
    io = " Its float16 inputs and outputs are float32 now: give it float32 data." if counts["inputs"] else ""
    return [f"converted the float16 model to float32 ({', '.join(parts)}): ORT's quantizer works on float32 "
            f"models, and the QDQ model computes in 8 or 16 bits on the HTP either way.{io}"]


def _convert_graph(graph: onnx.GraphProto, counts: dict, top: bool = False) -> None:
    for init in graph.initializer:
        if init.data_type == FLOAT16:
            _to_float32(init)
            counts["initializers"] += 1
    for init in graph.sparse_initializer:
        if init.values.data_type == FLOAT16:
            _to_float32(init.values)
            counts["initializers"] += 1
    for where, infos in (("inputs", graph.input), ("outputs", graph.output), (None, graph.value_info)):
        for info in infos:
            if info.type.tensor_type.elem_type == FLOAT16:
                info.type.tensor_type.elem_type = FLOAT
                if top and where:
                    counts[where] += 1
    for node in graph.node:
        for attribute in node.attribute:
            _convert_attribute(attribute, counts)


def _convert_attribute(attribute: onnx.AttributeProto, counts: dict) -> None:
    if attribute.type == onnx.AttributeProto.INT and attribute.name in _TYPE_ATTRIBUTES and attribute.i == FLOAT16:
        attribute.i = FLOAT
    elif attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == FLOAT16:
        _to_float32(attribute.t)
    elif attribute.type == onnx.AttributeProto.TENSORS:
        for tensor in attribute.tensors:
            if tensor.data_type == FLOAT16:
                _to_float32(tensor)
    elif attribute.type == onnx.AttributeProto.GRAPH:
        _convert_graph(attribute.g, counts)
    elif attribute.type == onnx.AttributeProto.GRAPHS:
        for graph in attribute.graphs:
            _convert_graph(graph, counts)


def _to_float32(tensor: onnx.TensorProto) -> None:
    """`tensor` as float32, in place (external data is read by the loader before preparation)."""
    converted = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)
    tensor.CopyFrom(converted)
