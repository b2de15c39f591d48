"""Which evaluated plan to recommend: the closest one when none reaches the target, and the plans of the front
that are much better for little more latency."""

from __future__ import annotations

import math

from ..errors import MpstudioError
from ..store import Evaluation
from ..loop.front import pareto_mask

# "Much better for little more" (see `better_for_little_more`): at most this much more estimated latency than
# the recommended plan (relative), for at most this fraction of its distance from the float model's value.
LITTLE_MORE = 0.10
MUCH_BETTER = 0.5


def estimate_ms(evaluation: Evaluation) -> float:
    """An evaluated plan's estimated latency in ms (infinite when the cost model has none)."""
    latency = evaluation.latency("estimate")
    return latency.ms if latency is not None else math.inf


def closest_plan(evaluations, higher_is_better: bool, sixteen_bit: dict | None = None,
                 latency_budget_ms: float | None = None) -> Evaluation:
    """The plan to recommend when none reaches the target: the most accurate of `evaluations` (of those within
    the latency budget, when any is); equal values go to fewer 16-bit activation tensors (`sixteen_bit`:
    plan_id -> count), then lower estimated latency, then the earlier evaluation. No evaluated plan is more
    accurate, so none (a baseline such as all-16-bit included) dominates it."""
    pool = list(evaluations)
    if not pool:
        raise MpstudioError("no evaluated plan to recommend")
    if latency_budget_ms is not None:
        pool = [e for e in pool if estimate_ms(e) <= latency_budget_ms] or pool
    sign = 1.0 if higher_is_better else -1.0
    best = max(sign * e.value for e in pool)
    tied = [e for e in pool if math.isclose(sign * e.value, best, rel_tol=1e-9, abs_tol=1e-12)]
    counts = sixteen_bit or {}
    return min(tied, key=lambda e: (counts.get(e.plan_id, math.inf), estimate_ms(e)))


def better_for_little_more(recommended: Evaluation, evaluations, higher_is_better: bool,
                           float_value: float | None, *, snr_metric: bool = False,
                           latency_budget_ms: float | None = None) -> list[Evaluation]:
    """Plans on the front of `evaluations` (metric against estimated latency) that are much better than
    `recommended` for little more: an estimated latency no lower than its and at most `LITTLE_MORE` (10 %)
    above it (and within the budget), and a metric value at most `MUCH_BETTER` (half) as far from the float
    model's value as its (a value better than float counts as no distance). For output SNR, which has no
    float value, much better is at least 3 dB more (half the noise power). By estimated latency."""
    base_ms = estimate_ms(recommended)
    if not math.isfinite(base_ms):
        return []
    unique = list({e.plan_id: e for e in evaluations}.values())
    on_front = pareto_mask([e.value for e in unique], [estimate_ms(e) for e in unique], higher_is_better)

    def distance(value: float) -> float:
        return max(0.0, (float_value - value) if higher_is_better else (value - float_value))

    out = []
    for e, front in zip(unique, on_front):
        ms = estimate_ms(e)
        if not front or e.plan_id == recommended.plan_id or not base_ms <= ms <= base_ms * (1 + LITTLE_MORE):
            continue
        if latency_budget_ms is not None and ms > latency_budget_ms:
            continue
        if snr_metric:
            much = e.value - recommended.value >= 10 * math.log10(1 / MUCH_BETTER)
        elif float_value is not None:
            gap = distance(recommended.value)
            much = gap > 0 and distance(e.value) <= MUCH_BETTER * gap and e.value != recommended.value
        else:
            much = False
        if much:
            out.append(e)
    return sorted(out, key=estimate_ms)
