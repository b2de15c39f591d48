"""A prepare-time rewrite: drop the NaN guard torch's exporters write after an attention Softmax.

torch's attention replaces the NaN rows a fully masked Softmax would give by a constant, and both exporters
write it as `Where(IsNaN(p), c, p)` with `p` the Softmax's output. QNN HTP fails to finalize any graph in which
an IsNaN feeds a Where (`QNN_COMMON_ERROR_MEM_ALLOC`, at 8 and 16 bits, down to a [1, 1, 8, 8] tensor; see
docs/htp-limits.md), so no plan of such an encoder builds. In a quantized graph the guard does nothing: a
dequantized tensor is never NaN. In the float model it does nothing either once the mask sentinels are clamped
(`rewrites.clamp_mask_constants`): a Softmax row is NaN only when its scores are NaN or all minus infinity.
The guard is replaced by the Softmax's output itself.
"""

from __future__ import annotations

import onnx
from onnx import helper

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
    shown = ", ".join(dropped[:3]) + (" ..." if len(dropped) > 3 else "")
    return RewriteResult(
        "softmax-nan-guard", tuple(dropped),
        f"removed {len(dropped)} NaN guard(s) Where(IsNaN(p), c, p) after a Softmax (QNN HTP fails to finalize a "
        f"graph where IsNaN feeds a Where; a quantized tensor is never NaN, and masks are clamped): {shown}")
