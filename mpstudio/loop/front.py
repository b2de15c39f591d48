"""The accuracy/latency front of a study's evaluations, and the plans on it another accuracy source scored too:
plain functions over the store's evaluations frame (`store.EVALUATION_COLUMNS`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

CROSS_CHECK_COLUMNS = ["plan_id", "name", "latency_ms", "value", "other_value", "other_source"]


def pareto_mask(accuracy: Sequence[float], latency: Sequence[float], higher_is_better: bool) -> np.ndarray:
    """True for the points no other point dominates (as accurate or better and as fast or faster, and
    strictly better in one). Equal points are all kept; NaNs are never on the front."""
    acc = np.asarray(accuracy, dtype=np.float64)
    lat = np.asarray(latency, dtype=np.float64)
    if not higher_is_better:
        acc = -acc
    valid = np.isfinite(acc) & np.isfinite(lat)
    mask = np.zeros(len(acc), dtype=bool)
    # Sweep by latency (then accuracy, best first); a point is on the front when it beats the best accuracy
    # seen at strictly lower latency, or ties the front point at the same latency.
    order = sorted(np.flatnonzero(valid), key=lambda i: (lat[i], -acc[i]))
    best = -np.inf
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and lat[order[j]] == lat[order[i]]:
            j += 1
        group = order[i:j]
        top = acc[group[0]]
        if top > best:
            for k in group:
                if acc[k] == top:
                    mask[k] = True
            best = top
        i = j
    return mask


def front(evaluations: pd.DataFrame, latency_source: str, accuracy_source: str | None,
          higher_is_better: bool, superseded=lambda source: False) -> pd.DataFrame:
    """`evaluations` of one latency source and one accuracy source with a `pareto` column, sorted by latency.

    CPU and HTP accuracies are never mixed on one front. By default the accuracy source is the one with the most
    plans, sources `superseded(source)` (CPU results of an earlier mpstudio's numerics, `sources.superseded_source`)
    only when there is nothing else; for measured and emulator
    latency, which only HTP runs give, the HTP accuracy of those same runs when there is one. Measured latencies of
    several devices: the device with the most (each device is its own axis).
    """
    frame = evaluations[evaluations["latency_source"] == latency_source]
    if accuracy_source is None and len(frame):
        counts = frame["accuracy_source"].value_counts()
        current = [s for s in counts.index if not superseded(s)]
        counts = counts[current] if current else counts
        on_htp = [s for s in counts.index if s.startswith("HTP")]
        accuracy_source = on_htp[0] if on_htp and latency_source != "estimate" else counts.index[0]
    frame = frame[frame["accuracy_source"] == accuracy_source].copy()
    if latency_source == "measured" and frame["latency_where"].nunique() > 1:
        frame = frame[frame["latency_where"] == frame["latency_where"].value_counts().index[0]]
    frame["pareto"] = pareto_mask(frame["value"], frame["latency_ms"], higher_is_better)
    return frame.sort_values(["latency_ms", "value"]).reset_index(drop=True)


def cross_checks(front: pd.DataFrame, evaluations: pd.DataFrame, latency_source: str,
                 superseded=lambda source: False) -> pd.DataFrame:
    """Plans of `front` (of `latency_source`) that another accuracy source scored too in `evaluations` (e.g. a
    search's HTP confirmation of plans the front has from the CPU; never a source `superseded(source)`).
    Columns: `CROSS_CHECK_COLUMNS`."""
    if front.empty:
        return pd.DataFrame(columns=CROSS_CHECK_COLUMNS)
    others = evaluations[(evaluations["latency_source"] == latency_source)
                         & (evaluations["accuracy_source"] != front["accuracy_source"].iloc[0])
                         & ~evaluations["accuracy_source"].map(superseded).astype(bool)]
    merged = front[["plan_id", "name", "latency_ms", "value"]].merge(
        others[["plan_id", "value", "accuracy_source"]].rename(
            columns={"value": "other_value", "accuracy_source": "other_source"}), on="plan_id")
    return merged.drop_duplicates(["plan_id", "other_source"])[CROSS_CHECK_COLUMNS].reset_index(drop=True)


__all__ = ["pareto_mask", "front", "cross_checks", "CROSS_CHECK_COLUMNS"]
