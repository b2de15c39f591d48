"""A post-pass on generated QDQ models: no Q/DQ pair between an op and the Relu/Clip HTP fuses into it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..graph import producers_and_consumers
from ..folding import FOLDED_ACTIVATIONS, FUSING_OPS


def fuse_activations(path: str | Path) -> int:
    """Remove the Q/DQ pair ORT leaves between an op and the Relu/Clip after it, and the activation itself,
    where that changes no value: the pair has the activation output's encoding and that encoding's range lies
    inside the activation's bounds (so saturating to it is the activation). ORT folds such activations itself
    unless a convert touches their input or output (mixed plans); this finishes the job. Rewrites the model
    at `path` in place when anything changes; returns how many activations were removed."""
    model = onnx.load(str(path))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer, consumers = producers_and_consumers(graph)
    outputs = {o.name for o in graph.output}
    removed, dropped = 0, set()
    for act in list(graph.node):
        if act.op_type not in FOLDED_ACTIVATIONS or not act.input:
            continue
        dq = producer.get(act.input[0])
        q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        op = producer.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
        after = consumers.get(act.output[0], [])
        if op is None or op.op_type not in FUSING_OPS or act.output[0] in outputs or not after:
            continue
        if len(consumers.get(q.output[0], [])) != 1 or len(consumers.get(dq.output[0], [])) != 1 \
                or len(consumers.get(q.input[0], [])) != 1 or q.input[0] in outputs:
            continue
        mine = _encoding(q, inits)
        if mine is None or any(n.op_type != "QuantizeLinear" or _encoding(n, inits) != mine for n in after):
            continue
        if not _saturation_is_the_activation(act, mine, inits):
            continue
        op.output[list(op.output).index(q.input[0])] = act.output[0]
        producer[act.output[0]] = op
        dropped.update(id(n) for n in (q, dq, act))
        removed += 1
    if not removed:
        return 0
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for n in graph.node for name in n.input}
    unused = [i for i in graph.initializer if i.name not in used]
    for init in unused:
        graph.initializer.remove(init)
    onnx.save(model, str(path))
    return removed


def _constant(name: str, inits) -> np.ndarray | None:
    return numpy_helper.to_array(inits[name]) if name in inits else None


def _encoding(q: onnx.NodeProto, inits) -> tuple[float, int, np.dtype] | None:
    """A per-tensor QuantizeLinear's (scale, zero point, zero point's dtype), or None."""
    scale, zero = _constant(q.input[1], inits), _constant(q.input[2], inits) if len(q.input) > 2 else None
    if scale is None or zero is None or scale.size != 1:
        return None
    return float(scale.reshape(())), int(zero.reshape(())), zero.dtype


def _saturation_is_the_activation(act: onnx.NodeProto, encoding, inits) -> bool:
    """Whether the range of `encoding` lies inside the bounds of the Relu/Clip `act` (constant bounds only)."""
    scale, zero, dtype = encoding
    info = np.iinfo(dtype)
    low, high = (info.min - zero) * scale, (info.max - zero) * scale
    if act.op_type == "Relu":
        bounds = (0.0, np.inf)
    else:
        values = [_constant(name, inits) if name else None for name in list(act.input[1:3]) + [None] * 2][:2]
        attrs = {a.name: a.f for a in act.attribute}
        bounds = (float(values[0]) if values[0] is not None else attrs.get("min", -np.inf),
                  float(values[1]) if values[1] is not None else attrs.get("max", np.inf))
        if any(name and name not in inits for name in act.input[1:3]):
            return False
    return not (low < bounds[0] - 1e-6 * max(1.0, abs(bounds[0]))
                or high > bounds[1] + 1e-6 * max(1.0, abs(bounds[1])))
