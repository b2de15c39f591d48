"""Provisional points of the Pareto plot (StudioState.provisional): a plan's predicted point, then its partially
measured one, drawn until its full evaluation is stored."""

from __future__ import annotations

import pandas as pd
import param

from .constants import writable

# Columns of StudioState.provisional (points drawn before a plan's full evaluation is stored):
#   plan_hash, name, kind ("predicted": isolation scores and the cost model; "partial": measured on some of the
#   evaluation samples), value, low, high (the interval of a partial value; NaN for a prediction), latency_ms
#   (the cost model's estimate), samples, total, accuracy_source, detail (what the point is, for the hover),
#   paired (a partial value's difference from the plan it was promoted from, on the same samples, with its
#   interval, in words: `uncertainty.PairedDifference.describe`; "" when there is none), verdict (that
#   difference's: "better", "worse", "within noise", or "unpaired" with `paired` saying why there is none, or "").
PROVISIONAL_COLUMNS = ["plan_hash", "name", "kind", "value", "low", "high", "latency_ms", "samples", "total",
                       "accuracy_source", "detail", "paired", "verdict"]


class ProvisionalPoints:
    """Writes `state.provisional`, one row per plan, and knows which plans may still draw a point (an evaluation
    that ended, or was superseded, must not bring its point back)."""

    def __init__(self, state: param.Parameterized):
        self._state = state
        self._plans: set[str] = set()

    def track(self, plan_hash: str) -> None:
        self._plans.add(plan_hash)

    def tracked(self, plan_hash: str) -> bool:
        return plan_hash in self._plans

    def set(self, plan_hash: str, name: str, kind: str, value: float, low: float, high: float, latency_ms: float,
            samples: int, total: int, accuracy_source: str, detail: str, paired=None, unpaired: str = "") -> None:
        """Draw the plan's point (replacing the one it had); `paired`: its `PairedDifference` from the plan it was
        promoted from, when known; else `unpaired`: why it is not paired (verdict "unpaired")."""
        state = self._state
        frame = state.provisional
        words, verdict = ((paired.describe(), paired.verdict) if paired is not None else
                          (unpaired, "unpaired") if unpaired else ("", ""))
        row = pd.DataFrame([[plan_hash, name, kind, float(value), float(low), float(high), float(latency_ms),
                             int(samples), int(total), accuracy_source, detail, words, verdict]],
                           columns=PROVISIONAL_COLUMNS)
        kept = frame[frame["plan_hash"] != plan_hash]
        with writable(state):
            state.provisional = pd.concat([kept, row], ignore_index=True) if len(kept) else row

    def drop(self, plan_hash: str) -> None:
        """Remove the plan's point, and stop tracking it."""
        self._plans.discard(plan_hash)
        state = self._state
        frame = state.provisional
        if (frame["plan_hash"] == plan_hash).any():
            with writable(state):
                state.provisional = frame[frame["plan_hash"] != plan_hash].reset_index(drop=True)
