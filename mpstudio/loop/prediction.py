"""A plan's accuracy and latency predicted before any run: its 16-bit activations' isolation scores, mapped onto
the study's metric by the plans evaluated so far, and the cost model's all-8-bit estimate plus each promotion's
cost (no QDQ model made)."""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from ..errors import MpstudioError
from ..graph import ModelGraph
from ..metrics import OUTPUT_SNR, MetricSpec
from ..plan import PrecisionPlan
from ..quantize import Quantizer
from ..sources import ESTIMATE, Latency
from ..value_text import value_text
from .cost_model import CostModel


@dataclass(frozen=True)
class PlanPrediction:
    """A plan's accuracy predicted from isolation scores and its latency from the cost model, before any run.

    `value` is in the study's metric (NaN when there is nothing to predict it from yet); `snr_db` the predicted
    output SNR on the evaluation set; `latency` the cost model's estimate (None when it cannot read the model);
    `basis` says how the value was made.
    """

    plan_hash: str
    metric: str
    value: float
    snr_db: float
    latency: Latency | None
    basis: str

    @property
    def placed(self) -> bool:
        """Whether the prediction can be drawn (a value and a latency)."""
        return math.isfinite(self.value) and self.latency is not None

    def describe(self) -> str:
        lat = f"{self.latency.ms:.3f} ms ({self.latency.label})" if self.latency is not None else "no latency estimate"
        value = f"{value_text(self.value)}" if math.isfinite(self.value) else "unknown"
        return f"predicted {self.metric} {value}, {lat}; {self.basis}"


def monotone_fit(x: Sequence[float], y: Sequence[float], increasing: bool) -> tuple[np.ndarray, np.ndarray]:
    """Points (x, y) sorted by x with y made monotone (pool-adjacent-violators), for `np.interp`."""
    order = np.argsort(np.asarray(x, np.float64), kind="stable")
    xs, ys = np.asarray(x, np.float64)[order], np.asarray(y, np.float64)[order]
    sign = 1.0 if increasing else -1.0
    blocks: list[list[float]] = []  # [mean, weight]
    for value in sign * ys:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    fitted = np.concatenate([np.full(int(w), m) for m, w in blocks])
    return xs, sign * fitted


_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # cost model -> (arch, all-8-bit Latency, costs)
_COSTS_LOCK = threading.Lock()


def promotion_basis(cost_model: CostModel, quantizer: Quantizer, graph: ModelGraph):
    """(the all-8-bit plan's estimated Latency, the cost model's ms added by promoting each activation tensor
    alone), computed once per cost model and calibration."""
    from ..latency import promotion_costs

    with _COSTS_LOCK:
        arch = cost_model.arch
        known = _COSTS.get(cost_model)
        if known is not None and known[0] == arch:
            return known[1], known[2]
        path = quantizer.generate(PrecisionPlan.a8w8())
        base = cost_model.estimate(path)
        costs = promotion_costs(path, graph.activations(), arch, graph=graph).fillna(0.0)
        _COSTS[cost_model] = (arch, base, costs)
        return base, costs


def basis_ready(cost_model: CostModel) -> bool:
    """Whether `promotion_basis` is computed for `cost_model` (a prediction then takes milliseconds)."""
    known = _COSTS.get(cost_model)
    return known is not None and known[0] == cost_model.arch


def summed_latency(plan: PrecisionPlan, basis, graph: ModelGraph, evaluated: pd.DataFrame) -> Latency | None:
    """The cost model's latency of `plan` without making its QDQ model, from `basis` (`promotion_basis`): the
    all-8-bit estimate plus each 16-bit activation's promotion cost (alone), at most the all-16-bit estimate
    unless one of its promotions alone costs more (its converts: on a small model one 16-bit tensor can cost
    more than all of them). Close for one tensor; adjacent promotions share converts, so it is high for many.
    None when the cost model cannot read the model. `evaluated`: the study's evaluations (`Study.evaluations`
    columns)."""
    base, costs = basis
    if base is None:
        return None
    sixteen = [t for t in plan.sixteen_bit_activations(graph) if t in costs.index]
    ms = base.ms + float(costs[sixteen].sum())
    dearest = base.ms + (float(costs[sixteen].max()) if sixteen else 0.0)
    if len(evaluated):
        top = evaluated.loc[evaluated["plan_hash"] == PrecisionPlan.a16w8().hash, "estimate_ms"].dropna()
        if len(top):
            ms = min(ms, max(float(top.iloc[0]), dearest))
    return Latency(ms, ESTIMATE, base.where, "the all-8-bit estimate plus each promoted tensor's cost; approximate "
                   "until the plan's QDQ model is made", base.includes)


def predict_plan(plan: PrecisionPlan, report, *, graph: ModelGraph, spec: MetricSpec, evaluated: pd.DataFrame,
                 latency: Latency | None, accuracy_source: str | None = None) -> PlanPrediction:
    """Predict `plan`'s accuracy in the metric `spec` names; `latency` is its predicted latency (`summed_latency`).

    The sensitivity `report` predicts the output SNR of the plan's 16-bit activations from isolation scores (on
    the calibration samples it scored); that is moved onto the evaluation set by the all-8-bit plan's measured
    SNR, and turned into the study's metric by a monotone fit of metric against output SNR over the plans
    `evaluated` so far (`Study.evaluations` or `Study.front` columns; from `accuracy_source`, default the one
    with the most plans). Weights' precision is not predicted.
    """
    metric, nan = spec.name, float("nan")
    iso = report.isolation if report is not None else None
    if iso is None:
        return PlanPrediction(plan.hash, metric, nan, nan, latency,
                              "no prediction yet: the sensitivity analysis has not finished")
    # Tensors without an isolation score (no quantizer of their own, e.g. a Conv output ORT fuses with its Relu)
    # add nothing to the prediction.
    scored = set(iso.per_tensor().index)
    sixteen = [t for t in plan.sixteen_bit_activations(graph) if t in scored]
    try:
        predicted = report.predict(sixteen)
    except MpstudioError as exc:
        return PlanPrediction(plan.hash, metric, nan, nan, latency, f"no prediction: {exc}")
    if iso.metric == metric and iso.metric != OUTPUT_SNR:
        return PlanPrediction(plan.hash, metric, predicted.predicted, nan, latency,
                              f"isolation scores ({predicted.method}) on {iso.samples} calibration samples")
    frame = _evaluated(evaluated, accuracy_source)
    a8w8 = frame[frame["plan_hash"] == PrecisionPlan.a8w8().hash]
    snr = predicted.predicted
    shifted = len(a8w8) and np.isfinite(a8w8["snr_db"].iloc[0])
    if shifted:
        snr = float(a8w8["snr_db"].iloc[0]) + (snr - iso.all_8)
    if metric == OUTPUT_SNR:
        return PlanPrediction(plan.hash, metric, snr, snr, latency,
                              f"isolation scores ({predicted.method}){', moved by the all-8-bit plan' if shifted else ''}")
    points = frame.dropna(subset=["snr_db", "value"])
    if len(points) < 2:
        return PlanPrediction(plan.hash, metric, nan, snr, latency,
                              f"predicted output SNR {snr:.2f} dB; {metric} needs two evaluated plans "
                              "(the baselines) to map it")
    xs, ys = monotone_fit(points["snr_db"], points["value"], spec.higher_is_better)
    value = float(np.interp(snr, xs, ys))
    return PlanPrediction(plan.hash, metric, value, snr, latency,
                          f"isolation scores' output SNR {snr:.2f} dB, mapped to {metric} over "
                          f"{len(points)} evaluated plans")


def _evaluated(frame: pd.DataFrame, accuracy_source: str | None) -> pd.DataFrame:
    """One row per evaluated plan from one accuracy source: plan_hash, value, snr_db."""
    if frame.empty:
        return frame
    if accuracy_source is None or accuracy_source not in set(frame["accuracy_source"]):
        accuracy_source = frame.drop_duplicates("plan_id")["accuracy_source"].value_counts().index[0]
    return frame[frame["accuracy_source"] == accuracy_source].drop_duplicates("plan_id")


__all__ = ["PlanPrediction", "monotone_fit", "promotion_basis", "basis_ready", "summed_latency", "predict_plan"]
