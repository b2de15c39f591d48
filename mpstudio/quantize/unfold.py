"""A post-pass on the QDQ models of imported plans: the quantizer an imported encoding puts between an op and the
Relu/Clip ORT folded into it.

ORT's QDQ graph folds a Relu/Clip into the op before it (a Conv's or an Add's output is not quantized, only the
activation's). AIMET's HTP configurations give some of those ops (an Add before a Clip, a Conv before a Clip)
an encoding of their own, so AIMET's sim rounds twice there: at the op's output with its encoding, then at the
activation's output. Where an imported encoding for such an op's output differs from the activation output's,
this pass restores the activation and puts a Q/DQ pair with the imported encoding on the op's output, so the
plan's model computes what the source computed.

It also gives the plan's model the weight codes the source computes with where ORT's quantizer rounds a weight
otherwise at the same scale (a value on a rounding tie, which two tools round differently).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..folding import folded_activation
from ..graph import ModelGraph, producers_and_consumers
from ..qdq import QUANTIZED_INITIALIZER_SUFFIX, Encoding

_NUMPY = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16}


def unfold_imported(path: str | Path, float_model: onnx.ModelProto, graph: ModelGraph,
                    pinned: Mapping[str, Encoding]) -> list[str]:
    """Put back, in the QDQ model at `path` (rewritten in place), a quantizer for every pinned per-tensor
    activation encoding the model folded into the Relu/Clip after it, where that encoding differs from the one
    the model gives the activation's output. Returns the tensors given their quantizer."""
    model = onnx.load(str(path))
    producer, consumers = producers_and_consumers(model.graph)
    inits = {i.name: i for i in model.graph.initializer}
    float_inits = {i.name: i for i in float_model.graph.initializer}
    float_nodes = {n.name: n for n in float_model.graph.node}
    restored = []
    for name, encoding in sorted(pinned.items()):
        plan = _unfolding(name, encoding, graph, producer, consumers, inits)
        if plan is None:
            continue
        op, activation, output = plan
        _restore(model, op, float_nodes[activation.name], name, output, encoding, float_inits, inits)
        restored.append(name)
    if restored:
        _sort(model)
        onnx.save(model, str(path))
    return restored


def _unfolding(name, encoding, graph, producer, consumers, inits):
    """(the op node in the QDQ model, the float activation node, its output) when `name` was folded away and its
    imported encoding differs from the activation output's; else None."""
    info = graph.tensors.get(name)
    if encoding.axis is not None or encoding.dtype not in _NUMPY or info is None or not info.is_activation:
        return None
    if name in producer or name in consumers:  # the model has the tensor: ORT pinned it itself
        return None
    activation = folded_activation(graph, name)
    if activation is None or not activation.outputs:
        return None
    op = next((n for n in producer.values() if n.name == info.producer), None)
    index = list(graph.nodes[info.producer].outputs).index(name) if op is not None else -1
    if op is None or index >= len(op.output):
        return None
    # The activation's output as the model writes it: its float name, or `<name>_QuantizeLinear_Input` when it
    # is a graph output (the last DequantizeLinear writes the float name then).
    output = op.output[index]
    if output not in (activation.outputs[0], f"{activation.outputs[0]}_QuantizeLinear_Input"):
        return None  # not folded the way this pass undoes
    quantizers = [n for n in consumers.get(output, []) if n.op_type == "QuantizeLinear"]
    if quantizers and all(_encoding_of(q, inits) == _key(encoding) for q in quantizers):
        return None  # the activation's output has the imported encoding already: nothing differs
    return op, activation, output


def _key(encoding: Encoding) -> tuple[float, int]:
    return float(np.float32(encoding.scale[0])), int(encoding.zero_point[0])


def _encoding_of(q: onnx.NodeProto, inits) -> tuple[float, int] | None:
    if len(q.input) < 3 or q.input[1] not in inits or q.input[2] not in inits:
        return None
    scale, zero = numpy_helper.to_array(inits[q.input[1]]), numpy_helper.to_array(inits[q.input[2]])
    return (float(scale.reshape(-1)[0]), int(zero.reshape(-1)[0])) if scale.size == 1 else None


def _restore(model, op, float_activation, name, output, encoding, float_inits, inits) -> None:
    """op -> name -> Q -> DQ -> activation -> output, the activation's constant bounds copied from the float
    model."""
    op.output[list(op.output).index(output)] = name
    scale, zero = f"{name}_scale", f"{name}_zero_point"
    model.graph.initializer.extend([
        numpy_helper.from_array(np.array(encoding.scale[0], np.float32), scale),
        numpy_helper.from_array(np.array(encoding.zero_point[0], _NUMPY[encoding.dtype]), zero)])
    quantized, dequantized = f"{name}_QuantizeLinear_Output", f"{name}_DequantizeLinear_Output"
    activation = copy.deepcopy(float_activation)
    activation.input[0] = dequantized
    activation.output[0] = output
    for bound in activation.input[1:]:
        if bound and bound not in inits and bound in float_inits:
            model.graph.initializer.append(copy.deepcopy(float_inits[bound]))
            inits[bound] = float_inits[bound]
    model.graph.node.extend([
        helper.make_node("QuantizeLinear", [name, scale, zero], [quantized], name=f"{name}_QuantizeLinear"),
        helper.make_node("DequantizeLinear", [quantized, scale, zero], [dequantized],
                         name=f"{name}_DequantizeLinear"),
        activation])


def set_weight_codes(path: str | Path, codes: Mapping[str, tuple[list[int], list[int]]]) -> list[str]:
    """Set, in the QDQ model at `path` (rewritten in place), each weight's stored codes at the given flat indices
    (weight -> (indices, codes)). Returns the weights changed; a weight the model does not store quantized is
    left as it is."""
    if not codes:
        return []
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    changed = []
    for name, (indices, values) in sorted(codes.items()):
        stored = inits.get(name + QUANTIZED_INITIALIZER_SUFFIX)
        if stored is None:
            continue
        array = numpy_helper.to_array(stored).copy()
        flat = array.reshape(-1)
        flat[np.asarray(indices, np.int64)] = np.asarray(values, np.int64).astype(array.dtype)
        stored.CopyFrom(numpy_helper.from_array(flat.reshape(array.shape), stored.name))
        changed.append(name)
    if changed:
        onnx.save(model, str(path))
    return changed


def _sort(model: onnx.ModelProto) -> None:
    """Topological order again after appending nodes (ONNX requires it)."""
    nodes = list(model.graph.node)
    known = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    ordered, waiting = [], nodes
    while waiting:
        ready = [n for n in waiting if all(i in known for i in n.input)]
        if not ready:
            raise ValueError("the QDQ model has a cycle or a missing input after unfolding")
        ids = {id(n) for n in ready}
        ordered += ready
        known.update(o for n in ready for o in n.output)
        waiting = [n for n in waiting if id(n) not in ids]
    del model.graph.node[:]
    model.graph.node.extend(ordered)
