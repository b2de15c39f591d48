"""What a plan looks like before its full evaluation: a prediction from the sensitivity report and the cost
model, and the accuracy on the first part of the evaluation set with an interval (a streamed evaluation).

Neither is stored: the study keeps only full evaluations as a plan's result.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from .data import Feed
from .errors import MpstudioError
from .metrics import OUTPUT_SNR, SNR_CAP_DB, ErrorAccumulator, ctc_charset, ctc_greedy_decode, edit_distance
from .sources import ESTIMATE, Latency

LEVEL = 0.95  # the intervals' coverage
BOOTSTRAP_ROUNDS = 2000
FIRST_SAMPLES = 12  # the streamed evaluation's first value is on this many samples


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
        value = f"{self.value:.4f}" if math.isfinite(self.value) else "unknown"
        return f"predicted {self.metric} {value}, {lat}; {self.basis}"


@dataclass(frozen=True)
class PartialAccuracy:
    """A plan's accuracy on `samples` of the `total` evaluation samples, with a `LEVEL` interval for the value
    on all of them (bootstrap over samples, narrowed by the finite-population correction)."""

    plan_hash: str
    metric: str
    value: float
    low: float
    high: float
    samples: int
    total: int
    accuracy_source: str
    latency: Latency | None  # the cost model's estimate of the plan

    def describe(self) -> str:
        return (f"{self.metric} {self.value:.4f} on {self.samples} of {self.total} samples "
                f"({100 * LEVEL:.0f} % interval {self.low:.4f}-{self.high:.4f}) [{self.accuracy_source}]")


class SampleTerms:
    """A metric written as `combine(sum of numerators, sum of denominators)` over samples, so any subset of
    samples gives a value, and resampling them an interval. CER: edit errors over reference characters per
    line; output SNR: signal over noise power per sample."""

    def __init__(self, name: str, terms: Callable[[Sequence[Feed], Sequence[int]], tuple[np.ndarray, np.ndarray]],
                 combine: Callable[[np.ndarray, np.ndarray], np.ndarray]):
        self.name, self.terms, self.combine = name, terms, combine

    def partial(self, outputs: Sequence[Feed], indices: Sequence[int], total: int, *, seed: int = 0
                ) -> tuple[float, float, float]:
        """(value, low, high) of the metric on the samples `indices` (whose outputs are `outputs`), the interval
        being for the value on all `total` samples."""
        num, den = self.terms(outputs, indices)
        num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
        value = float(self.combine(np.array([num.sum()]), np.array([den.sum()]))[0])
        n = len(num)
        if n < 2 or n >= total:
            return value, value, value
        rng = np.random.default_rng(seed)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=BOOTSTRAP_ROUNDS).astype(np.float64)
        values = self.combine(counts @ num, counts @ den)
        values = values[np.isfinite(values)]
        if not len(values):
            return value, value, value
        tail = (1 - LEVEL) / 2
        low, high = np.quantile(values, [tail, 1 - tail])
        # Percentile bootstrap intervals are too narrow on few samples: widen them as Student's t widens the
        # normal interval. The samples are drawn without replacement from a finite set: the interval shrinks to
        # nothing as they cover it.
        shrink = _small_sample_factor(n) * math.sqrt((total - n) / (total - 1))
        return value, value - (value - float(low)) * shrink, value + (float(high) - value) * shrink


def _small_sample_factor(n: int) -> float:
    """t(LEVEL, n-1) / z(LEVEL), by the Cornish-Fisher expansion of Student's t (4 % low on 4 samples,
    within 0.5 % from 8)."""
    z = 1.959963984540054  # the normal quantile of LEVEL
    df = max(n - 1, 1)
    t = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    return t / z


def cer_terms(references: Sequence[str], charset: list[str]) -> SampleTerms:
    """CER as per-line edit errors over per-line reference lengths (as `metrics.cer_metric` scores it)."""
    def terms(outputs, indices):
        errors, lengths = [], []
        for out, i in zip(outputs, indices):
            text = ctc_greedy_decode(next(iter(out.values()))[0], charset).strip()
            errors.append(edit_distance(text, references[i]))
            lengths.append(len(references[i]))
        return np.array(errors), np.array(lengths)

    def combine(errors, lengths):
        return errors / np.maximum(lengths, 1)
    return SampleTerms("CER", terms, combine)


def snr_terms(references: Sequence[Feed]) -> SampleTerms:
    """Output SNR against the float model as per-sample signal power over noise power (`output_agreement`)."""
    def terms(outputs, indices):
        signal, noise = [], []
        for out, i in zip(outputs, indices):
            acc = ErrorAccumulator(np.float64)
            for name, value in references[i].items():
                acc.add(value, out[name])
            signal.append(acc.signal)
            noise.append(acc.noise)
        return np.array(signal), np.array(noise)

    def combine(signal, noise):
        eps = float(np.finfo(np.float64).eps) ** 2
        return np.minimum(10.0 * np.log10(np.maximum(signal, eps) / np.maximum(noise, eps)), SNR_CAP_DB)
    return SampleTerms(OUTPUT_SNR, terms, combine)


def sample_terms(spec, model, references: Sequence[Feed]) -> SampleTerms | None:
    """The per-sample form of a study's metric (`metrics.MetricSpec`), or None when it has none (a metric given
    in Python is a function of the whole set)."""
    if spec.kind == "output":
        return snr_terms(references)
    if spec.kind == "ctc_cer":
        return cer_terms(tuple(spec.args["references"]), ctc_charset(model))
    return None


def stream_order(total: int, first: int = FIRST_SAMPLES, seed: int = 0) -> list[list[int]]:
    """Sample indices in the chunks a streamed evaluation runs them: a seeded random `first` (the same for every
    plan, so first values compare on the same samples), then chunks doubling in size over the rest."""
    order = np.random.default_rng(seed).permutation(total).tolist()
    chunks, start, size = [], 0, max(1, first)
    while start < total:
        chunks.append(sorted(order[start:start + size]))
        start += size
        size = start  # each chunk doubles what has run
    return chunks


# ---- prediction ------------------------------------------------------------------------------------------------
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


_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # study -> (arch, all-8-bit Latency, costs)
_COSTS_LOCK = threading.Lock()


def promotion_basis(study):
    """(the all-8-bit plan's estimated Latency, the cost model's ms added by promoting each activation tensor
    alone), computed once per study and cost-model calibration."""
    from .latency import promotion_costs
    from .plan import PrecisionPlan

    with _COSTS_LOCK:
        arch = study.cost_arch
        known = _COSTS.get(study)
        if known is not None and known[0] == arch:
            return known[1], known[2]
        path = study.quantizer.generate(PrecisionPlan.a8w8())
        base = study._estimate(path)
        costs = promotion_costs(path, study.graph.activations(), arch, graph=study.graph).fillna(0.0)
        _COSTS[study] = (arch, base, costs)
        return base, costs


def basis_ready(study) -> bool:
    """Whether `promotion_basis` is computed for `study` (a prediction then takes milliseconds)."""
    known = _COSTS.get(study)
    return known is not None and known[0] == study.cost_arch


def summed_latency(study, plan, evaluated: pd.DataFrame | None = None) -> Latency | None:
    """The cost model's latency of `plan` without making its QDQ model: the all-8-bit estimate plus each 16-bit
    activation's promotion cost (alone), at most the all-16-bit estimate unless one of its promotions alone
    costs more (its converts: on a small model one 16-bit tensor can cost more than all of them). Close for
    one tensor; adjacent promotions share converts, so it is high for many. None when the cost model cannot
    read the model.
    `evaluated`: the study's evaluations (`Study.evaluations` columns), when the caller has them."""
    from .plan import PrecisionPlan

    base, costs = promotion_basis(study)
    if base is None:
        return None
    sixteen = [t for t in plan.sixteen_bit_activations(study.graph) if t in costs.index]
    ms = base.ms + float(costs[sixteen].sum())
    dearest = base.ms + (float(costs[sixteen].max()) if sixteen else 0.0)
    stored = study.evaluations() if evaluated is None else evaluated
    if len(stored):
        top = stored.loc[stored["plan_hash"] == PrecisionPlan.a16w8().hash, "estimate_ms"].dropna()
        if len(top):
            ms = min(ms, max(float(top.iloc[0]), dearest))
    return Latency(ms, ESTIMATE, base.where, "the all-8-bit estimate plus each promoted tensor's cost; approximate "
                   "until the plan's QDQ model is made", base.includes)


def predict_plan(study, plan, report, accuracy_source: str | None = None, latency: Latency | None = None,
                 evaluated: pd.DataFrame | None = None) -> PlanPrediction:
    """Predict `plan`'s accuracy in `study`'s metric and its latency from the cost model, without making its
    QDQ model (`summed_latency`).

    The sensitivity report predicts the output SNR of the plan's 16-bit activations from isolation scores (on
    the calibration samples it scored); that is moved onto the evaluation set by the all-8-bit plan's measured
    SNR, and turned into the study's metric by a monotone fit of metric against output SNR over the plans
    evaluated so far (from `accuracy_source`, default the one with the most plans). Weights' precision is not
    predicted. `evaluated`: the study's evaluations (`Study.evaluations` or `Study.front` columns), when the
    caller has them (it saves reading the store).
    """
    from .plan import PrecisionPlan

    evaluated = study.evaluations() if evaluated is None else evaluated
    if latency is None:
        latency = summed_latency(study, plan, evaluated)
    nan = float("nan")
    iso = report.isolation if report is not None else None
    if iso is None:
        return PlanPrediction(plan.hash, study.metric_name, nan, nan, latency,
                              "no prediction yet: the sensitivity analysis has not finished")
    # Tensors without an isolation score (no quantizer of their own, e.g. a Conv output ORT fuses with its Relu)
    # add nothing to the prediction.
    scored = set(iso.per_tensor().index)
    sixteen = [t for t in plan.sixteen_bit_activations(study.graph) if t in scored]
    try:
        predicted = report.predict(sixteen)
    except MpstudioError as exc:
        return PlanPrediction(plan.hash, study.metric_name, nan, nan, latency, f"no prediction: {exc}")
    if iso.metric == study.metric_name and iso.metric != OUTPUT_SNR:
        return PlanPrediction(plan.hash, study.metric_name, predicted.predicted, nan, latency,
                              f"isolation scores ({predicted.method}) on {iso.samples} calibration samples")
    frame = _evaluated(evaluated, accuracy_source)
    a8w8 = frame[frame["plan_hash"] == PrecisionPlan.a8w8().hash]
    snr = predicted.predicted
    shifted = len(a8w8) and np.isfinite(a8w8["snr_db"].iloc[0])
    if shifted:
        snr = float(a8w8["snr_db"].iloc[0]) + (snr - iso.all_8)
    if study.metric_name == OUTPUT_SNR:
        return PlanPrediction(plan.hash, study.metric_name, snr, snr, latency,
                              f"isolation scores ({predicted.method}){', moved by the all-8-bit plan' if shifted else ''}")
    points = frame.dropna(subset=["snr_db", "value"])
    if len(points) < 2:
        return PlanPrediction(plan.hash, study.metric_name, nan, snr, latency,
                              f"predicted output SNR {snr:.2f} dB; {study.metric_name} needs two evaluated plans "
                              "(the baselines) to map it")
    xs, ys = monotone_fit(points["snr_db"], points["value"], study.higher_is_better)
    value = float(np.interp(snr, xs, ys))
    return PlanPrediction(plan.hash, study.metric_name, value, snr, latency,
                          f"isolation scores' output SNR {snr:.2f} dB, mapped to {study.metric_name} over "
                          f"{len(points)} evaluated plans")


def _evaluated(frame: pd.DataFrame, accuracy_source: str | None) -> pd.DataFrame:
    """One row per evaluated plan from one accuracy source: plan_hash, value, snr_db."""
    if frame.empty:
        return frame
    if accuracy_source is None or accuracy_source not in set(frame["accuracy_source"]):
        accuracy_source = frame.drop_duplicates("plan_id")["accuracy_source"].value_counts().index[0]
    return frame[frame["accuracy_source"] == accuracy_source].drop_duplicates("plan_id")


__all__ = ["PlanPrediction", "promotion_basis", "basis_ready", "summed_latency", "PartialAccuracy", "SampleTerms", "cer_terms", "snr_terms", "sample_terms",
           "stream_order", "predict_plan", "monotone_fit", "FIRST_SAMPLES", "LEVEL"]
