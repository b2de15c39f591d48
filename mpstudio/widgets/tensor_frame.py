"""The studio's per-tensor frame (StudioState.tensors): every activation tensor with its precision in the current
plan and the scores the graph can be coloured by."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..graph import ModelGraph
from ..plan import PrecisionPlan
from ..sensitivity import SensitivityReport

# What the graph can be coloured by: label -> column of StudioState.tensors. Each has a direction: for
# "low" scores low values need attention (drawn red), for "high" scores high values do.
SCORES = {"SNR (dB)": "snr_db", "cosine": "cosine", "isolation gain": "isolation_gain",
          "latency share": "latency_share", "rank": "rank", "HTP vs CPU (steps)": "divergence"}
SCORE_ATTENTION = {"snr_db": "low", "cosine": "low", "isolation_gain": "high", "latency_share": "high", "rank": "low",
                   "divergence": "high"}

# Columns of StudioState.tensors (one row per activation tensor, in topological order):
#   tensor, node (its producer; "" for a graph input), op, namespace, kind, bits (8 or 16 in the current plan),
#   rank, snr_db, cosine, local_snr_8, local_snr_16, isolation_gain (NaN until the sensitivity analysis ran),
#   latency_share (share of the estimated latency of the current plan spent in its producer; NaN if unknown),
#   divergence (RMS of HTP - CPU in quantization steps for the current plan, from mpstudio.diverge; NaN if unknown).
TENSOR_COLUMNS = ["tensor", "node", "op", "namespace", "kind", "bits", "rank", "snr_db", "cosine", "local_snr_8",
                  "local_snr_16", "isolation_gain", "latency_share", "divergence"]
_SCORE_COLUMNS = ["rank", "snr_db", "cosine", "local_snr_8", "local_snr_16", "isolation_gain"]


def tensor_frame(graph: ModelGraph, plan: PrecisionPlan, report: SensitivityReport | None,
                 latency_ops: pd.DataFrame | None, divergence: pd.DataFrame | None) -> pd.DataFrame:
    """The TENSOR_COLUMNS frame of `graph` under `plan`, with the scores `report` ranked, the producers'
    share of the estimated latency (`latency_ops`, with a `share` column) and the HTP/CPU `divergence`."""
    rows = []
    for name in graph.activations():
        info = graph.tensors[name]
        node = graph.nodes[info.producer] if info.producer else None
        rows.append((name, info.producer or "", node.op_type if node else "Input", node.namespace if node else "",
                     info.kind))
    frame = pd.DataFrame(rows, columns=["tensor", "node", "op", "namespace", "kind"])
    sixteen = set(plan.sixteen_bit_activations(graph))
    frame["bits"] = np.where(frame["tensor"].isin(sixteen), 16, 8)
    if report is not None:
        scores = report.ranking.set_index("tensor")
        for column in _SCORE_COLUMNS:
            frame[column] = frame["tensor"].map(scores[column]) if column in scores else np.nan
    else:
        for column in _SCORE_COLUMNS:
            frame[column] = np.nan
    frame["latency_share"] = np.nan
    if latency_ops is not None and "share" in latency_ops:
        share = latency_ops.groupby("node")["share"].sum()
        frame["latency_share"] = frame["node"].map(share)
    frame["divergence"] = np.nan
    if divergence is not None:
        frame["divergence"] = frame["tensor"].map(divergence.set_index("tensor")["rms_steps"])
    return frame[TENSOR_COLUMNS]
