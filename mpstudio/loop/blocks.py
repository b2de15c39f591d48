"""Scores, latency and promotion cost totalled per block: a namespace of the graph cut at one depth (a
transformer layer, an attention block), so that a real model's hundreds of tensors read as a few dozen rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

# Columns of `block_totals`, one row per block:
#   block (the namespace prefix; "(root)" for nodes outside any namespace), tensors, sixteen_bit (of them in the
#   plan), min_snr_db / mean_snr_db (8-bit scores of its tensors), gain_db (sum of their isolation gains: each
#   alone, an upper bound of the block's), estimate_ms (its nodes' estimated latency in the plan), share,
#   added_ms (what the plan's promotions add there over its base), promote_ms (the estimated cost of promoting
#   its 8-bit tensors, each alone, summed), gain_per_ms
BLOCK_COLUMNS = ["block", "tensors", "sixteen_bit", "min_snr_db", "mean_snr_db", "gain_db", "estimate_ms", "share",
                 "added_ms", "promote_ms", "gain_per_ms"]
ROOT = "(root)"


def block_of(namespace: str, depth: int) -> str:
    """`namespace` cut to its first `depth` parts ("encoder/layer.0/attention" at 2 is "encoder/layer.0")."""
    parts = [p for p in str(namespace).split("/") if p]
    return "/".join(parts[:depth]) or ROOT


def default_depth(namespaces, most: int = 40) -> int:
    """The deepest cut with at most `most` blocks and more than one (1 when no cut has more than one)."""
    names = [n for n in set(namespaces) if n]
    deepest = max((len(n.split("/")) for n in names), default=1)
    best = 1
    for depth in range(1, deepest + 1):
        count = len({block_of(n, depth) for n in namespaces})
        if count > most:
            break
        if count > 1:
            best = depth
    return best


def block_totals(tensors: pd.DataFrame, nodes: pd.DataFrame | None, depth: int,
                 promotion_ms: pd.Series | None = None) -> pd.DataFrame:
    """BLOCK_COLUMNS of `tensors` (the studio's per-tensor frame: tensor, namespace, bits, snr_db,
    isolation_gain) and `nodes` (`loop.node_latency.NODE_COLUMNS`, or None) cut at `depth`; `promotion_ms`:
    tensor -> ms of promoting it alone. Sorted by gain per ms."""
    frame = tensors.assign(block=[block_of(n, depth) for n in tensors["namespace"]])
    if promotion_ms is not None:
        frame["promote_ms"] = frame["tensor"].map(promotion_ms).where(frame["bits"] == 8, 0.0)
    else:
        frame["promote_ms"] = np.nan
    grouped = frame.groupby("block", sort=False).agg(
        tensors=("tensor", "size"), sixteen_bit=("bits", lambda b: int((b == 16).sum())),
        min_snr_db=("snr_db", "min"), mean_snr_db=("snr_db", "mean"),
        gain_db=("isolation_gain", lambda g: float(g.clip(lower=0).sum()) if g.notna().any() else np.nan),
        promote_ms=("promote_ms", lambda c: float(c.sum()) if c.notna().any() else np.nan))
    if nodes is not None and len(nodes):
        timed = nodes.assign(block=[block_of(n, depth) for n in nodes["namespace"]])
        times = timed.groupby("block")[["estimate_ms", "share", "added_ms"]].sum()
        grouped = grouped.join(times, how="outer")
    else:
        grouped[["estimate_ms", "share", "added_ms"]] = np.nan
    grouped["tensors"] = grouped["tensors"].fillna(0).astype(int)
    grouped["sixteen_bit"] = grouped["sixteen_bit"].fillna(0).astype(int)
    with np.errstate(divide="ignore", invalid="ignore"):
        grouped["gain_per_ms"] = grouped["gain_db"] / grouped["promote_ms"].where(grouped["promote_ms"] > 0)
    out = grouped.reset_index().rename(columns={"index": "block"})
    return out.sort_values(["gain_per_ms", "estimate_ms"], ascending=False, na_position="last")[
        BLOCK_COLUMNS].reset_index(drop=True)


def block_tensors(tensors: pd.DataFrame, block: str, depth: int) -> list[str]:
    """The activation tensors of `block` at `depth`."""
    return [t for t, n in zip(tensors["tensor"], tensors["namespace"]) if block_of(n, depth) == block]
