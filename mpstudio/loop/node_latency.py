"""Where a plan's time goes, node by node: the cost model's per-op estimate of the plan, what its promotions add
over its base (converts included), and the per-op profile a device (or the emulator) ran, mapped to ONNX nodes by
the agent. Every column names its source."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .recalibration import read_kept_profile, read_profiles

# Columns of `NodeLatency.frame`, one row per op the estimate prices (converts and graph I/O included):
#   node, op_type, namespace, kind ("compute", "convert", "io", "graph"), bits (the activation bits it computes in),
#   estimate_ms, share (of the plan's estimate), base_ms (the same node in the base plan; 0 for a convert the
#   base lacks), added_ms (estimate_ms - base_ms: what the plan's promotions add there), measured_ms (the node's
#   part of a kept per-op profile of this plan, NaN without one)
NODE_COLUMNS = ["node", "op_type", "namespace", "kind", "bits", "estimate_ms", "share", "base_ms", "added_ms",
                "measured_ms"]


@dataclass(frozen=True)
class NodeLatency:
    """One plan's per-node latency and where each number comes from."""

    frame: pd.DataFrame
    estimate_label: str
    measured_label: str  # "" without a kept profile
    base_name: str

    @property
    def converts(self) -> int:
        """8<->16-bit converts the plan runs that its base does not."""
        return int(((self.frame["kind"] == "convert") & (self.frame["base_ms"] == 0)).sum())

    @property
    def convert_ms(self) -> float:
        """What those converts cost (estimate)."""
        added = self.frame[(self.frame["kind"] == "convert") & (self.frame["base_ms"] == 0)]
        return float(added["estimate_ms"].sum())

    @property
    def added_ms(self) -> float:
        return float(self.frame["added_ms"].sum())


def measured_label(device: str, source: str) -> str:
    """A kept profile's source in words: a device's time, or the emulator's host time (relative only)."""
    if source == "emulator" or "emulator" in device.lower():
        return f"emulator host time ({device}; relative cost only, not device latency)"
    return f"measured on {device}"


def kept_profile(folder: Path, plan_id: int | None) -> tuple[pd.Series, str] | None:
    """The node -> ms of the newest kept per-op profile of plan `plan_id` (a device's before the emulator's), and
    its label; None without one. An op the agent maps to several ONNX nodes is split evenly among them."""
    if plan_id is None:
        return None
    profiles = read_profiles(folder)
    mine = profiles[profiles["plan_id"] == plan_id]
    if mine.empty:
        return None
    saved = [read_kept_profile(Path(path)) for path in mine["path"]]
    saved.sort(key=lambda s: s.get("source") == "emulator")  # a device's profile first
    chosen = saved[0]
    ops = chosen["profile"].to_frame()
    total = float(ops["cost"].sum())
    if not total:
        return None
    per_node: dict[str, float] = {}
    for nodes, cost in zip(ops["onnx_nodes"], ops["cost"]):
        nodes = list(nodes) or []
        for node in nodes:
            per_node[node] = per_node.get(node, 0.0) + cost / total * chosen["total_ms"] / len(nodes)
    return pd.Series(per_node, dtype=float), measured_label(chosen["device"], chosen.get("source", ""))


def node_latency(plan_estimate, base_estimate, graph, base_name: str,
                 profile: tuple[pd.Series, str] | None = None) -> NodeLatency:
    """`NodeLatency` of a plan from its `latency.LatencyEstimate`, its base's, the float model's `graph` (for
    namespaces) and a `kept_profile` of the plan."""
    ops = plan_estimate.ops
    frame = pd.DataFrame({"node": ops["node"], "op_type": ops["op_type"], "kind": ops["kind"],
                          "bits": ops["act_bits"], "estimate_ms": ops["ms"], "share": ops["share"]})
    frame = frame.groupby(["node", "op_type", "kind"], as_index=False, sort=False).agg(
        bits=("bits", "max"), estimate_ms=("estimate_ms", "sum"), share=("share", "sum"))
    base = base_estimate.ops.groupby("node")["ms"].sum()
    frame["base_ms"] = frame["node"].map(base).fillna(0.0)
    frame["added_ms"] = frame["estimate_ms"] - frame["base_ms"]
    frame["namespace"] = [graph.nodes[n].namespace if n in graph.nodes else "" for n in frame["node"]]
    measured, label = profile if profile is not None else (None, "")
    frame["measured_ms"] = frame["node"].map(measured) if measured is not None else np.nan
    return NodeLatency(frame[NODE_COLUMNS].reset_index(drop=True), plan_estimate.latency.label, label, base_name)
