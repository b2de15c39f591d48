"""QDQ models whose weights are written as a float constant and a QuantizeLinear of it (AIMET's `to_onnx_qdq`
writes them so, and keeps them after its mixed-precision flips): `quantized_constants` replaces each such
QuantizeLinear by the integer codes it computes, the form QNN takes weights in. The numbers are the same; the
device computes them once, at preparation, and reads integer weights at every inference, so the cost model and
the HTP see the model as the device runs it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper


def constant_quantizers(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The QuantizeLinear nodes of `model` whose value, scale and zero point are all initializers (blocked
    quantization, which has a `block_size`, is left alone)."""
    inits = {i.name for i in model.graph.initializer}
    return [n for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx") and n.input and n.input[0] in inits
            and all(x in inits for x in n.input if x) and not any(a.name == "block_size" and a.i for a in n.attribute)]


def quantized_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each QuantizeLinear of a constant replaced by an initializer of its integer codes (ONNX's
    rounding: half to even, then saturation to the zero point's type); float constants only those nodes read are
    dropped. The same ModelProto when there is none, else a copy."""
    if not constant_quantizers(model):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    folding = constant_quantizers(out)
    codes = [numpy_helper.from_array(_codes(n, inits), n.output[0]) for n in folding]
    for node in folding:
        graph.node.remove(node)
    read = _read_names(graph) | {o.name for o in graph.output}
    for init in [i for i in graph.initializer if i.name not in read]:
        graph.initializer.remove(init)
    graph.initializer.extend(codes)
    return out


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
    # In float32, as ONNX Runtime divides: a value on a half step rounds as it does there.
    value = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
    scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
    if len(node.input) > 2 and node.input[2]:
        zero = numpy_helper.to_array(inits[node.input[2]])
    else:
        dtype = next((a.i for a in node.attribute if a.name == "output_dtype"), TensorProto.UINT8) or TensorProto.UINT8
        zero = np.zeros((), onnx.helper.tensor_dtype_to_np_dtype(dtype))
    if scale.size > 1:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % value.ndim
        shape = [1] * value.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    info = np.iinfo(zero.dtype)
    return np.clip(np.rint(value / scale).astype(np.int64) + zero.astype(np.int64), info.min,
                   info.max).astype(zero.dtype)


__all__ = ["constant_quantizers", "quantized_constants"]
