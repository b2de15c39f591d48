"""Prepare-time rewrites of what torch's exporters write around attention, which QNN HTP cannot build.

The NaN guard after the Softmax (both exporters): torch's attention replaces the NaN rows a fully masked Softmax would give by a constant, and both exporters
write it as `Where(IsNaN(p), c, p)` with `p` the Softmax's output. QNN HTP fails to finalize any graph in which
an IsNaN feeds a Where (`QNN_COMMON_ERROR_MEM_ALLOC`, at 8 and 16 bits, down to a [1, 1, 8, 8] tensor; see
docs/htp-limits.md), so no plan of such an encoder builds. In a quantized graph the guard does nothing: a
dequantized tensor is never NaN. In the float model it does nothing either once the mask sentinels are clamped
(`rewrites.clamp_mask_constants`): a Softmax row is NaN only when its scores are NaN or all minus infinity.
The guard is replaced by the Softmax's output itself.

The GatherND that reads the attention mask (the dynamo exporter): its constant indices pick every element of
the mask in order ([[0, 0], [0, 1], ... [0, 63]] from a [1, 64] mask), which is a Reshape. QNN HTP rejects
GatherND on a bool tensor (error 3110), and with the node on ORT's CPU EP the QNN partitions around it failed
to finalize at 16 bits (QNN_COMMON_ERROR_MEM_ALLOC); a Reshape runs on the HTP. A GatherND with other indices
is left alone.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import producers_and_consumers
from .rewrites import RewriteResult

_STANDARD = ("", "ai.onnx")


def _guarded_softmax(where: onnx.NodeProto, producer: dict) -> str | None:
    """The Softmax output `where` guards (`Where(IsNaN(p), c, p)`), else None."""
    if where.op_type != "Where" or where.domain not in _STANDARD or len(where.input) != 3:
        return None
    isnan, guarded = producer.get(where.input[0]), where.input[2]
    if isnan is None or isnan.op_type != "IsNaN" or isnan.domain not in _STANDARD or isnan.input[0] != guarded:
        return None
    softmax = producer.get(guarded)
    return guarded if softmax is not None and softmax.op_type == "Softmax" and softmax.domain in _STANDARD else None


def drop_softmax_nan_guards(model: onnx.ModelProto) -> RewriteResult | None:
    """Replace each `Where(IsNaN(p), c, p)` after a Softmax by `p` (see the module docstring)."""
    graph = model.graph
    producer, consumers = producers_and_consumers(graph)
    outputs = {o.name for o in graph.output}
    renamed: dict[str, str] = {}
    dropped: list[str] = []
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        guarded = _guarded_softmax(node, producer)
        if guarded is None:
            kept.append(node)
            continue
        dropped.append(node.name or node.output[0])
        if node.output[0] in outputs:  # a graph output keeps its name
            kept.append(helper.make_node("Identity", [guarded], [node.output[0]], name=dropped[-1]))
        else:
            renamed[node.output[0]] = guarded
    if not dropped:
        return None
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
    # An IsNaN no node reads any more goes too.
    read = {name for node in kept for name in node.input} | outputs
    kept = [n for n in kept if not (n.op_type == "IsNaN" and n.output[0] not in read)]
    del graph.node[:]
    graph.node.extend(kept)
    return RewriteResult(
        "softmax-nan-guard", tuple(dropped),
        f"removed {len(dropped)} NaN guard(s) Where(IsNaN(p), c, p) after a Softmax (QNN HTP fails to finalize a "
        f"graph where IsNaN feeds a Where; a quantized tensor is never NaN, and masks are clamped): {_shown(dropped)}")


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _in_order_shape(node: onnx.NodeProto, inits: dict, shapes: dict) -> list[int] | None:
    """The output shape of `node` when it is a GatherND whose constant indices pick every element (or slice)
    of its data in order, so that it is a Reshape; else None."""
    if node.op_type != "GatherND" or node.domain not in _STANDARD or len(node.input) != 2:
        return None
    if any(a.name == "batch_dims" and a.i != 0 for a in node.attribute):
        return None
    data_shape, tensor = shapes.get(node.input[0]), inits.get(node.input[1])
    if data_shape is None or tensor is None:
        return None
    indices = numpy_helper.to_array(tensor)
    depth = indices.shape[-1] if indices.ndim else 0
    if indices.ndim == 0 or not 0 < depth <= len(data_shape):
        return None
    every = np.indices(data_shape[:depth]).reshape(depth, -1).T  # all index tuples, in order
    if indices.reshape(-1, depth).shape != every.shape or not (indices.reshape(-1, depth) == every).all():
        return None
    return [*indices.shape[:-1], *data_shape[depth:]]


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Tensor name -> static shape, where shape inference gives one."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return {}  # prepare_model's own shape inference reports the problem
    shapes = {}
    for value in (*inferred.graph.input, *inferred.graph.value_info):
        dims = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and dims and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes


def gather_nd_in_order_to_reshape(model: onnx.ModelProto) -> RewriteResult | None:
    """Write each GatherND whose constant indices pick all of its data in order as a Reshape (see the module
    docstring)."""
    graph = model.graph
    if not any(n.op_type == "GatherND" for n in graph.node):
        return None
    inits = {t.name: t for t in graph.initializer}
    shapes = _static_shapes(model)
    written: list[str] = []
    replaced: set[str] = set()  # the indices of the GatherNDs rewritten
    for i, node in enumerate(graph.node):
        shape = _in_order_shape(node, inits, shapes)
        if shape is None:
            continue
        name = node.name or node.output[0]
        target = f"{name}/shape"
        graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), target))
        graph.node[i].CopyFrom(helper.make_node("Reshape", [node.input[0], target], [node.output[0]], name=name))
        written.append(name)
        replaced.add(node.input[1])
    if not written:
        return None
    used = {name for n in graph.node for name in n.input}
    kept = [t for t in graph.initializer if t.name in used or t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return RewriteResult(
        "gather-nd-in-order", tuple(written),
        f"rewrote {len(written)} GatherND node(s) whose indices pick every element of their data in order as "
        f"Reshape (QNN HTP rejects GatherND on a bool mask; a Reshape runs on it): {_shown(written)}")
