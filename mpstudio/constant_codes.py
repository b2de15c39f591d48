"""QDQ models whose weights are written as a float constant and a QuantizeLinear of it (AIMET's `to_onnx_qdq`
writes them so, and keeps them after its mixed-precision flips): `quantized_constants` replaces each such
QuantizeLinear by the integer codes it computes, the form QNN takes weights in. The numbers are the same; the
device computes them once, at preparation, and reads integer weights at every inference, so the cost model and
the HTP see the model as the device runs it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .qdq import quantize


def constant_quantizers(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The QuantizeLinear nodes of `model` whose value, scale and zero point are all initializers (blocked
    quantization, which has a `block_size`, is left alone)."""
    return [model.graph.node[i] for i in _folding(model)]


def quantized_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each QuantizeLinear of a constant replaced by an initializer of its integer codes (`qdq.quantize`:
    ONNX Runtime's rounding and saturation); float constants only those nodes read are dropped. The same ModelProto
    when there is none, else a copy."""
    folding = _folding(model)
    if not folding:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    codes = [numpy_helper.from_array(_codes(graph.node[i], inits), graph.node[i].output[0]) for i in folding]
    dropped = set(folding)
    kept = [n for i, n in enumerate(graph.node) if i not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    read = _read_names(graph) | {o.name for o in graph.output}
    constants = [i for i in graph.initializer if i.name in read] + codes
    del graph.initializer[:]
    graph.initializer.extend(constants)
    return out


def _folding(model: onnx.ModelProto) -> list[int]:
    """The positions of `constant_quantizers` among `model`'s nodes."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i, n in enumerate(model.graph.node)
            if n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx") and n.input and n.input[0] in inits
            and all(x in inits for x in n.input if x) and not any(a.name == "block_size" and a.i for a in n.attribute)]


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every name the nodes of `graph` and of its subgraphs read."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                names |= _read_names(sub)
    return names


def _codes(node: onnx.NodeProto, inits: dict) -> np.ndarray:
    value = numpy_helper.to_array(inits[node.input[0]])
    scale = numpy_helper.to_array(inits[node.input[1]])
    if len(node.input) > 2 and node.input[2]:
        zero = numpy_helper.to_array(inits[node.input[2]])
    else:
        dtype = next((a.i for a in node.attribute if a.name == "output_dtype"), TensorProto.UINT8) or TensorProto.UINT8
        zero = np.zeros((), onnx.helper.tensor_dtype_to_np_dtype(dtype))
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1) if scale.size > 1 else None
    info = np.iinfo(zero.dtype)
    return quantize(value, scale, zero, info.min, info.max, axis).astype(zero.dtype)


__all__ = ["constant_quantizers", "quantized_constants"]
