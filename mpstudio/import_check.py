"""Which encodings of an imported quantization the plan's QDQ model really applies.

An import pins every encoding it reads, but ORT's QDQ graph decides where quantizers go: a Conv or Add whose only
consumer is a Relu or Clip is fused with it (only the activation's output is quantized), an entry for a tensor
ORT leaves in float applies nowhere, and where widths meet ORT may write a tensor at another width. AIMET gives
some fused ops encodings of their own; `quantize.unfold` puts those quantizers back in the plan's model, and
an op's encoding equal to its activation's output's is applied by that quantizer. What is still not applied
(constants ORT leaves in float, per-channel or unusual cases) is listed, with why, instead of counted as kept.

Two differences no encoding shows are listed too: biases the source computes in float (AIMET's HTP
configurations have no bias quantizers; the plan's model has ORT's int32 biases, as the HTP computes), and
weights whose integer codes differ from the source's at the same scale (two tools rounding a weight that sits
on a rounding tie differently, or a source that changed its weights, e.g. by AdaRound).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np
from onnx import numpy_helper

from .folding import FOLDED_ACTIVATIONS
from .graph import BIAS, ModelGraph
from .qdq import (PARAM, QUANTIZED_INITIALIZER_SUFFIX, Encoding, QdqModel, QuantizedTensor, quantize,
                  quantized_tensors, read)


def unapplied_encodings(qdq_model, graph: ModelGraph, tensors: Iterable) -> list[tuple[str, str]]:
    """(name, why) for every imported tensor (`importer.ImportedTensor`s) whose encoding `qdq_model`, the plan's
    generated model, does not apply: not quantized there, or quantized with other parameters."""
    model = quantized_tensors(qdq_model)
    out = []
    for tensor in tensors:
        why = _why_not_applied(tensor.name, tensor.encoding, model, graph)
        if why is not None:
            out.append((tensor.name, why))
    return out


def quantized_before_activation(qdq_model, graph: ModelGraph, names: Iterable[str]) -> list[str]:
    """The `names` that are an op's output ORT would fuse with the Relu/Clip after it, and that `qdq_model`
    quantizes all the same (`quantize.unfold` gave them the imported encoding)."""
    model = quantized_tensors(qdq_model)
    return [n for n in names if n in model and _fused_activation(n, graph) is not None]


def _why_not_applied(name: str, imported: Encoding, model: Mapping[str, QuantizedTensor],
                     graph: ModelGraph) -> str | None:
    found = model.get(name)
    if found is None:
        info = graph.tensors.get(name)
        if info is not None and not info.is_activation:
            return "a constant the plan's model leaves in float (ORT does not quantize it as an operand of this op)"
        fused = _fused_activation(name, graph)
        if fused is not None:
            after = model.get(fused.outputs[0]) if fused.outputs else None
            if after is not None and _same(imported, after.encoding):
                return None  # the activation's output has this encoding: the fused op computes the same
            return (f"fused with the {fused.op_type} after it: the plan's model quantizes only the "
                    f"{fused.op_type}'s output, so this encoding applies nowhere")
        return "not quantized in the plan's model (ORT leaves it in float)"
    candidates = (found.encoding,) + tuple(found.converts)
    if any(_same(imported, encoding) for encoding in candidates):
        return None
    written = found.encoding
    return (f"the plan's model quantizes it to {written.dtype} with scale {written.scale[0]:.6g}, zero point "
            f"{written.zero_point[0]} (imported: {imported.dtype}, {imported.scale[0]:.6g}, {imported.zero_point[0]})")


def _fused_activation(name: str, graph: ModelGraph):
    info = graph.tensors.get(name)
    if info is None or len(info.consumers) != 1:
        return None
    consumer = graph.nodes.get(next(iter(info.consumers)))
    return consumer if consumer is not None and consumer.op_type in FOLDED_ACTIVATIONS else None


def _same(a: Encoding, b: Encoding) -> bool:
    return (a.dtype == b.dtype and tuple(a.zero_point) == tuple(b.zero_point) and len(a.scale) == len(b.scale)
            and all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a.scale, b.scale)))


def float_biases(graph: ModelGraph, source: QdqModel | None, listed: Iterable[str]) -> list[str]:
    """The float model's biases the source leaves in float: read by their op without a DequantizeLinear in a QDQ
    `source`, or, for an encodings file (`source` None), not among its `listed` names."""
    listed = set(listed)
    nodes = {n.name: n for n in source.model.graph.node} if source is not None else {}
    out = []
    for name, info in graph.tensors.items():
        if info.kind != BIAS or name in listed:
            continue
        if source is None:
            out.append(name)
            continue
        for consumer in info.consumers:
            node = graph.nodes.get(consumer)
            theirs = nodes.get(consumer)
            if node is None or theirs is None or name not in node.inputs:
                continue
            position = list(node.inputs).index(name)
            value = theirs.input[position] if position < len(theirs.input) else ""
            producer = source.producer.get(value)
            if value and (producer is None or producer.op_type != "DequantizeLinear"):  # read as a float
                out.append(name)
                break
    return out


def weight_code_differences(source: QdqModel, names: Mapping[str, str], generated) -> list[tuple]:
    """(weight, flat indices, the source's codes there, codes in all) for every weight whose integers in the
    plan's `generated` model differ from the ones the QDQ `source` computes with: stored codes, or a float
    weight's QuantizeLinear at run time (round half to even, as ONNX defines it). `names`: the source's tensor
    name -> the float model's."""
    ours = read(generated)
    out = []
    for tensor in source.params().values():
        name = names.get(tensor.name)
        mine = ours.tensors.get(name) if name else None
        if mine is None or mine.kind != PARAM or mine.encoding != _with_axis(tensor.encoding, mine.encoding.axis):
            continue
        theirs, codes = _codes(source, tensor.name, tensor.encoding), _codes(ours, name, mine.encoding)
        if theirs is None or codes is None or theirs.shape != codes.shape:
            continue
        differing = np.flatnonzero(theirs.astype(np.int64) != codes.astype(np.int64))
        if differing.size:
            out.append((name, differing.tolist(), theirs.reshape(-1)[differing].astype(np.int64).tolist(),
                        int(codes.size)))
    return out


def _with_axis(encoding: Encoding, axis: int | None) -> Encoding:
    return Encoding(encoding.dtype, encoding.scale, encoding.zero_point, axis if encoding.per_channel else None)


def _codes(model: QdqModel, name: str, encoding: Encoding) -> np.ndarray | None:
    """The integers `model` computes weight `name` with: its stored codes, or its float value quantized."""
    stored = model.initializers.get(name + QUANTIZED_INITIALIZER_SUFFIX)
    if stored is not None:
        return numpy_helper.to_array(stored)
    value = model.initializers.get(name)
    if value is None:
        return None
    w = numpy_helper.to_array(value)
    if np.issubdtype(w.dtype, np.integer):  # stored codes under the tensor's own name (AIMET writes `W_q`)
        return w
    return quantize(w, encoding.scale, encoding.zero_point, encoding.qmin, encoding.qmax, encoding.axis)
