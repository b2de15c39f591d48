"""Mechanism `branch_overlap` (docs/latency.md, "Fit"): ops on independent branches of a graph, at the same depth,
are dispatched together and share one synchronisation, so each pays its fixed per-op cost divided by how many
share its depth; a chain of ops (each reading the one before) pays it in full at every op."""

from __future__ import annotations

from collections import Counter

import numpy as np

from .ops import MECHANISMS, HtpOp

_RUNS = ("hmx", "hvx", "dma")
# Ops the reader adds around the graph's own ops (converts, requantizations, layout conversions): not placed by
# depth (they keep their tensor's name, or read inputs that are not in graph order), width 1.
_ADDED = {"Convert", "Requantize", "LayoutConvert"}


def parallel_widths(ops: list[HtpOp]) -> np.ndarray:
    """Per op, how many running ops of the graph share its depth (the longest chain of running ops from the graph's
    inputs to it, metadata-only and fused ops passing their depth on); 1 for every op without the mechanism and for
    the ops the reader adds."""
    widths = np.ones(len(ops))
    if not MECHANISMS["branch_overlap"]:
        return widths
    depth_of: dict[str, int] = {}
    depths = []
    for op in ops:
        if op.kind != "compute" or op.op_type in _ADDED:
            depths.append(-1)
            continue
        depth = max((depth_of.get(name, 0) for name, _, _ in op.inputs), default=0)
        runs = op.engine in _RUNS
        depth += runs
        for name, _, _ in op.outputs:
            depth_of[name] = depth
        depths.append(depth if runs else -1)
    counts = Counter(d for d in depths if d >= 0)
    for i, d in enumerate(depths):
        if d >= 0:
            widths[i] = counts[d]
    return widths
