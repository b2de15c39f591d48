"""Prepare-time rewrite of the rank-6 tensors a window attention moves through, which QNN HTP does not take.

Swin's window partition reshapes a [1, H, W, C] map to [1, H/w, w, W/w, w, C], transposes it with perm
(0, 1, 3, 2, 4, 5) and reshapes it to windows; the reverse does the same backwards. QNN HTP rejects a Reshape to
or from a rank-6 tensor (error 3110 in backendValidateOpConfig, at 8 and 16 bits), so each such Reshape fell back
to the CPU. A permutation moves the same elements at a lower rank when axes of size 1 are dropped and each run of
axes it keeps together, in order, becomes one axis: [4, 4, 4, 128] with perm (0, 2, 1, 3) here. Such a Transpose
is written as Reshape -> Transpose -> Reshape at that rank, and a Reshape whose high-rank output only feeds
another Reshape is skipped, so the rank-6 tensors between them are gone. Pure data movement: outputs are equal.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .attention_rewrites import _static_shapes
from .graph import producers_and_consumers
from .rewrites import RewriteResult

HTP_MAX_RANK = 5  # the highest tensor rank QNN HTP took when probed
_STANDARD = ("", "ai.onnx")


def lowered_transpose(shape: list[int], perm: list[int]) -> tuple[list[int], list[int]] | None:
    """The shape and permutation at the lowest rank that move the same elements as `perm` on `shape`: unit axes
    dropped, each run of input axes `perm` keeps adjacent and in order merged into one. None when that rank is
    still above HTP_MAX_RANK, or nothing is left to move."""
    moving = [axis for axis in range(len(shape)) if shape[axis] != 1]
    place = {axis: i for i, axis in enumerate(moving)}
    runs: list[list[int]] = []  # in output order
    for axis in (a for a in perm if shape[a] != 1):
        if runs and place[axis] == place[runs[-1][-1]] + 1:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    if not runs or len(runs) > HTP_MAX_RANK:
        return None
    by_input = sorted(runs, key=lambda run: run[0])
    return ([math.prod(shape[a] for a in run) for run in by_input], [by_input.index(run) for run in runs])


def _perm(node: onnx.NodeProto, rank: int) -> list[int]:
    attribute = next((a for a in node.attribute if a.name == "perm"), None)
    return list(attribute.ints) if attribute is not None else list(reversed(range(rank)))


def _shape_constant(graph: onnx.GraphProto, name: str, shape: list[int]) -> str:
    graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), name))
    return name


def lower_high_rank_transposes(model: onnx.ModelProto) -> RewriteResult | None:
    """Write each Transpose above HTP_MAX_RANK whose permutation allows it at a lower rank (see the module
    docstring), then skip the Reshapes left producing high-rank tensors only other Reshapes read."""
    graph = model.graph
    if not any(n.op_type == "Transpose" for n in graph.node):
        return None
    shapes = _static_shapes(model)
    written: list[str] = []
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        shape = shapes.get(node.input[0]) if node.op_type == "Transpose" and node.domain in _STANDARD else None
        lowered = lowered_transpose(shape, _perm(node, len(shape))) if shape and len(shape) > HTP_MAX_RANK else None
        if lowered is None:
            nodes.append(node)
            continue
        name = node.name or node.output[0]
        low_shape, low_perm = lowered
        out_shape = [shape[a] for a in _perm(node, len(shape))]
        nodes += [helper.make_node("Reshape", [node.input[0], _shape_constant(graph, f"{name}/low_shape", low_shape)],
                                   [f"{name}/low_input"], name=f"{name}/low_input"),
                  helper.make_node("Transpose", [f"{name}/low_input"], [f"{name}/low"], perm=low_perm, name=name),
                  helper.make_node("Reshape", [f"{name}/low", _shape_constant(graph, f"{name}/shape", out_shape)],
                                   [node.output[0]], name=f"{name}/restore")]
        written.append(name)
    if not written:
        return None
    del graph.node[:]
    graph.node.extend(nodes)
    skipped = _skip_high_rank_reshapes(model, shapes)
    return RewriteResult(
        "high-rank-transpose", tuple(written),
        f"wrote {len(written)} rank-6+ Transpose(s) at rank {HTP_MAX_RANK} or less, and skipped {skipped} Reshape(s) "
        f"to rank 6+ around them (QNN HTP rejects tensors above rank {HTP_MAX_RANK}; same elements moved): "
        + ", ".join(written[:3]) + (" ..." if len(written) > 3 else ""))


def _output_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """The graph outputs' static shapes, as declared."""
    shapes = {}
    for value in graph.output:
        dims = value.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes


def _skip_high_rank_reshapes(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> int:
    """Let each Reshape that reads a high-rank tensor only Reshapes read, from a Reshape, read that Reshape's
    input instead (with its own static output shape as its shape); drop the Reshapes it leaves unread."""
    graph = model.graph
    shapes = {**shapes, **_static_shapes(model), **_output_shapes(graph)}
    producer, consumers = producers_and_consumers(graph)
    outputs = {o.name for o in graph.output}
    skipped, sources, replaced = 0, {}, set()
    for node in graph.node:
        source = producer.get(node.input[0]) if node.op_type == "Reshape" and node.domain in _STANDARD else None
        if (source is None or source.op_type != "Reshape" or source.domain not in _STANDARD
                or len(shapes.get(node.input[0], [])) <= HTP_MAX_RANK or node.input[0] in outputs
                or any(user.op_type != "Reshape" for user in consumers.get(node.input[0], []))
                or node.output[0] not in shapes):
            continue
        sources[source.output[0]] = source
        replaced.add(node.input[1])
        node.input[0] = source.input[0]
        node.input[1] = _shape_constant(graph, f"{node.name or node.output[0]}/skip_shape", shapes[node.output[0]])
        skipped += 1
    read = {name for n in graph.node for name in n.input}
    dropped = [source for name, source in sources.items() if name not in read]
    replaced |= {source.input[1] for source in dropped}
    gone = {source.output[0] for source in dropped}
    kept = [n for n in graph.node if not (n.op_type == "Reshape" and n.output[0] in gone)]
    del graph.node[:]
    graph.node.extend(kept)
    read = {name for n in graph.node for name in n.input}
    initializers = [t for t in graph.initializer if t.name in read or t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    return skipped
