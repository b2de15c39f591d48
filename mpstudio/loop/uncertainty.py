"""How sure a result is: a plan's value with a bootstrap interval over its evaluation samples, two plans compared
on the samples both ran (a paired bootstrap: the same resampled samples for both, so what they share cancels),
and whether a target is reached, missed, or within noise (by less than the metric's resolution, or inside the
interval). Seeded, so the same terms always give the same interval.

Two kinds of interval: on every evaluation sample, for the value on data like them (`interval`,
`paired_difference`); on some of them while an evaluation streams, for the value on all of them (`total` given:
widened as Student's t widens the normal interval on few samples, narrowed by the finite-population correction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..metric_terms import MetricTerms
from ..value_text import value_text

LEVEL = 0.95  # every interval's coverage
ROUNDS = 2000  # bootstrap resamples
SEED = 0
_CELLS = 2_000_000  # resample counts held at once (rounds x samples), so memory stays bounded


@dataclass(frozen=True)
class Interval:
    """A plan's value with its `LEVEL` interval, on `samples` units (samples, or queries for recall@k), and the
    metric's `resolution` (one count's weight; None for a continuous metric)."""

    value: float
    low: float
    high: float
    samples: int
    resolution: float | None = None

    def describe(self, digits: int = 4) -> str:
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_json(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "level": LEVEL, "samples": self.samples,
                "resolution": self.resolution, "anchor": self.anchor}


@dataclass(frozen=True)
class PairedDifference:
    """`plan`'s value minus `versus`'s on the same `samples`, with its `LEVEL` interval (paired bootstrap)."""

    metric: str
    plan: str
    versus: str
    plan_value: float
    versus_value: float
    difference: float
    low: float
    high: float
    samples: int
    total: int
    higher_is_better: bool
    resolution: float | None = None
    # `versus`'s value on every sample when the difference is on part of them: anchored there, the difference
    # estimates `plan`'s value on every sample far more tightly than `plan`'s own part does.
    anchor: float | None = None

    def estimate(self) -> tuple[float, float, float] | None:
        """(value, low, high): `plan`'s value on every sample estimated as `anchor` plus the difference, or None."""
        if self.anchor is None:
            return None
        return self.anchor + self.difference, self.anchor + self.low, self.anchor + self.high

    @property
    def verdict(self) -> str:
        """"better", "worse" or "within noise" (`difference_verdict`)."""
        return difference_verdict(self.difference, self.low, self.high, self.higher_is_better, self.resolution)

    def describe(self) -> str:
        """E.g. "CER -0.0040 [-0.0090, +0.0010] vs current plan, 16 samples: within noise"."""
        of = f"{self.samples} samples" if self.samples >= self.total else f"{self.samples} of {self.total} samples"
        return (f"{self.metric} {value_text(self.difference, sign=True)} [{value_text(self.low, sign=True)}, "
                f"{value_text(self.high, sign=True)}] vs {self.versus}, {of}: "
                f"{self.verdict}")

    def to_json(self) -> dict:
        return {"metric": self.metric, "plan": self.plan, "versus": self.versus, "plan_value": self.plan_value,
                "versus_value": self.versus_value, "difference": self.difference, "low": self.low, "high": self.high,
                "level": LEVEL, "samples": self.samples, "total": self.total, "verdict": self.verdict,
                "resolution": self.resolution, "anchor": self.anchor}


def _resampled(columns: Sequence[np.ndarray], seed: int, rounds: int) -> list[np.ndarray]:
    """For each of `columns` (units x terms, the same units), its term sums over `rounds` resamples of the units
    (the same resamples for every one of them)."""
    n = len(columns[0])
    rng = np.random.default_rng(seed)
    sums = [[] for _ in columns]
    batch = max(1, _CELLS // max(n, 1))
    done = 0
    while done < rounds:
        size = min(batch, rounds - done)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=size).astype(np.float64)
        for out, column in zip(sums, columns):
            out.append(counts @ column)
        done += size
    return [np.concatenate(s) for s in sums]


def _quantiles(values: np.ndarray) -> tuple[float, float] | None:
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def _widened(value: float, low: float, high: float, n: int, total: int | None) -> tuple[float, float]:
    """The interval for the value on all `total` samples from one on `n` of them (unchanged when `total` is None)."""
    if total is None:
        return low, high
    shrink = small_sample_factor(n) * math.sqrt(max(total - n, 0) / max(total - 1, 1))
    return value - (value - low) * shrink, value + (high - value) * shrink


def interval(terms: MetricTerms, indices: Sequence[int] | None = None, total: int | None = None, *,
             seed: int = SEED, rounds: int = ROUNDS) -> Interval:
    """The metric on `terms`' units (or on `indices` of them) with its bootstrap interval; with `total`, the
    interval is for the value on `total` units of which these are a random part."""
    columns = terms.columns if indices is None else terms.columns[np.asarray(indices, int)]
    n = len(columns)
    value = float(terms.combine(columns.sum(axis=0)))
    if n < 2 or (total is not None and n >= total):
        return Interval(value, value, value, n, terms.resolution)
    bounds = _quantiles(terms.combine(_resampled([columns], seed, rounds)[0]))
    if bounds is None:
        return Interval(value, value, value, n, terms.resolution)
    low, high = _widened(value, *bounds, n, total)
    return Interval(value, min(low, value), max(high, value), n, terms.resolution)


def paired_difference(plan: MetricTerms, versus: MetricTerms, *, metric: str, higher_is_better: bool,
                      plan_name: str = "plan", versus_name: str = "current plan", indices: Sequence[int] | None = None,
                      total: int | None = None, seed: int = SEED, rounds: int = ROUNDS) -> PairedDifference:
    """`plan` minus `versus` on the units both have (`indices` of them when given: `plan`'s terms may then hold
    only those units, in that order), with the paired bootstrap's interval; with `total`, for the difference on
    `total` units of which these are a random part."""
    picked = np.arange(versus.units) if indices is None else np.asarray(indices, int)
    a = plan.columns if len(plan.columns) == len(picked) else plan.columns[picked]
    b = versus.columns[picked]
    if len(a) != len(b) or plan.form != versus.form:
        raise ValueError(f"plans compared on different samples ({len(a)} and {len(b)}) or metrics")
    value_a, value_b = float(plan.combine(a.sum(axis=0))), float(versus.combine(b.sum(axis=0)))
    difference, n = value_a - value_b, len(a)
    resolution = plan.resolution if plan.form != "ratio" else 1.0 / max(float(b[:, 1].sum()), 1e-300)
    low = high = difference
    if n >= 2 and not (total is not None and n >= total):
        sums_a, sums_b = _resampled([a, b], seed, rounds)
        bounds = _quantiles(plan.combine(sums_a) - versus.combine(sums_b))
        if bounds is not None:
            low, high = _widened(difference, *bounds, n, total)
            low, high = min(low, difference), max(high, difference)
    anchor = float(versus.combine(versus.columns.sum(axis=0))) if indices is not None and n < versus.units else None
    return PairedDifference(metric, plan_name, versus_name, value_a, value_b, difference, low, high, n,
                            total or n, higher_is_better, resolution, anchor)


def against_reference(plan: MetricTerms, reference: MetricTerms, margin: float, higher_is_better: bool, *,
                      seed: int = SEED, rounds: int = ROUNDS) -> tuple[float, float]:
    """The `LEVEL` interval of `plan`'s value minus a threshold `margin` (relative) worse than `reference`'s value,
    both on the same samples (a paired bootstrap): the threshold moves with its reference in every resample."""
    worse = -1.0 if higher_is_better else 1.0

    def threshold(values):
        return values + worse * margin * np.abs(values)
    a, b = plan.columns, reference.columns
    centre = float(plan.combine(a.sum(axis=0)) - threshold(reference.combine(b.sum(axis=0))))
    if len(a) < 2:
        return centre, centre
    sums_a, sums_b = _resampled([a, b], seed, rounds)
    bounds = _quantiles(plan.combine(sums_a) - threshold(reference.combine(sums_b)))
    return (min(bounds[0], centre), max(bounds[1], centre)) if bounds is not None else (centre, centre)


def lower_bounds(units: np.ndarray, *, seed: int = SEED, rounds: int = ROUNDS) -> np.ndarray:
    """For each column of `units` (units x quantities, e.g. samples x what each tensor's promotion removes on that
    sample), the lower end of the `LEVEL` bootstrap interval of its sum over the units; every column resampled
    alike (the same units drawn for all), each bound at most the column's own sum."""
    units = np.asarray(units, np.float64)
    if units.ndim != 2:
        raise ValueError(f"units x quantities expected, got shape {units.shape}")
    sums = units.sum(axis=0)
    if len(units) < 2 or not units.shape[1]:
        return sums
    resampled = _resampled([units], seed, rounds)[0]
    return np.minimum(np.quantile(resampled, (1 - LEVEL) / 2, axis=0), sums)


def difference_verdict(difference: float, low: float, high: float, higher_is_better: bool,
                       resolution: float | None = None) -> str:
    """"better", "worse" or "within noise" for a paired difference with interval [`low`, `high`]: within noise when
    the interval holds 0 or the difference is under one step of the metric (`resolution`)."""
    if low <= 0.0 <= high or (resolution is not None and abs(difference) < resolution):
        return "within noise"
    return "better" if (difference > 0) == higher_is_better else "worse"


def target_verdict(value: float, threshold: float, higher_is_better: bool, low: float | None = None,
                   high: float | None = None, resolution: float | None = None) -> str:
    """"reaches", "misses" or "within noise": a value that meets or misses `threshold` by less than the metric's
    `resolution`, or whose interval [`low`, `high`] holds the threshold, is within noise."""
    margin = (value - threshold) if higher_is_better else (threshold - value)
    if resolution is not None and abs(margin) < resolution:
        return "within noise"
    if low is not None and high is not None and low <= threshold <= high:
        return "within noise"
    return "reaches" if margin >= 0 else "misses"


def small_sample_factor(n: int) -> float:
    """t(LEVEL, n-1) / z(LEVEL), by the Cornish-Fisher expansion of Student's t (4 % low on 4 samples,
    within 0.5 % from 8)."""
    z = 1.959963984540054  # the normal quantile of LEVEL
    df = max(n - 1, 1)
    t = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    return t / z


__all__ = ["Interval", "PairedDifference", "interval", "paired_difference", "against_reference", "lower_bounds",
           "target_verdict", "small_sample_factor", "LEVEL", "ROUNDS", "SEED"]
