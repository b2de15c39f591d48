"""The top-down walk: from the all-16-bit plan, demote to 8 bits the tensors whose demotion adds the least noise
per ms it saves, and take the cheapest prefix of demotions that still reaches the target (the shape of AIMET's
AMP Pareto curve, whose sensitivities are measured against the all-16-bit plan).

It complements the bottom-up walk (`grid`, over the promotion order ranked against the all-8-bit plan), which
sees a tensor through one promotion at a time: on a model whose error is the sum of many small contributions,
or comes from tensors that only help together (a normalization computed in several ops), no single promotion
helps against the all-8-bit base and the promotion order only recovers the accuracy near all-16-bit's cost.
Seen from the other end, every tensor's demotion has a cost of its own.

A tensor's demotion is scored by the noise its 8 bits add where the rest computes at 16 bits: the noise the
isolation measured at the outputs when that tensor alone is demoted from the all-16-bit plan, where it was
isolated, and otherwise its local quantization noise (its own 8-bit noise less its 16-bit noise, relative to
its power: what it passes on when the ops around it are near float), whichever is larger; divided by its
estimated promotion cost. The walk's plans are prefixes of the reverse order (the tensors whose demotion costs
most per ms promoted first), so they are the same plans of the bottom-up walk's shape (`PrefixGrid`) and
judged by the same rules; its first points are spread over estimated latency towards the all-16-bit end
(`latency_points`), where the cheap demotions are."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd

from ..noise import added_noise, noise_power

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..plan import PrecisionPlan
    from ..study import Study

# The walk's first points: these shares of the latency from the base plan to the all-16-bit plan (geometric
# towards the top, as the demotions that save most per noise come first).
LATENCY_SHARES = (0.5, 0.75, 0.875, 0.9375)
# The share of the evaluations left after the baselines that the bottom-up walk leaves for the top-down one,
# and the fewest worth reserving (the first points and one refinement).
RESERVE_SHARE = 1 / 3
RESERVE_MIN = 3


def demotion_scores(study: Study, report, base_plan: PrecisionPlan) -> pd.Series:
    """Noise power each activation tensor's demotion adds to the all-16-bit plan, per ms of its promotion cost
    (see the module docstring); tensors the base already overrides are left out. Indexed by tensor."""
    from ..latency import promotion_costs

    ranking = report.ranking.set_index("tensor")
    tensors = [t for t in ranking.index if t not in base_plan.overrides]
    if not tensors:
        return pd.Series(dtype=float)
    local = (noise_power(ranking.loc[tensors, "local_snr_8"].astype(float))
             - noise_power(ranking.loc[tensors, "local_snr_16"].astype(float))).fillna(0.0)
    noise = local.clip(lower=0.0)
    if report.isolation is not None and "demoted" in report.isolation.per_tensor():
        from ..noise import is_output_snr

        iso = report.isolation
        if is_output_snr(iso.metric):
            per = iso.per_tensor()
            measured = added_noise(per["demoted"].astype(float), iso.all_16).reindex(noise.index)
            noise = np.maximum(noise, measured.fillna(0.0))
    model = study.quantizer.generate(base_plan)
    costs = promotion_costs(model, tensors, study.htp_arch, graph=study.graph).reindex(noise.index)
    costs = costs.fillna(costs.median() if costs.notna().any() else 1.0)
    floor = max(float(costs[costs > 0].min()) if (costs > 0).any() else 1e-6, 1e-6)
    return (noise / costs.clip(lower=floor)).rename("demotion_noise_per_ms")


def top_down_order(study: Study, report, base_plan: PrecisionPlan, kept=()) -> list[str]:
    """The tensors the top-down walk promotes, those of `kept` (demoted last: the noise scores cannot judge them,
    see `walk`) and then those whose demotion costs most noise per ms: plan k of this order is the all-16-bit plan
    with the last len - k demoted (the cheapest demotions)."""
    scores = demotion_scores(study, report, base_plan)
    kept = [t for t in dict.fromkeys(kept) if t in scores.index]
    # A stable sort: equal scores keep the ranking's order.
    return kept + [t for t in scores.sort_values(ascending=False, kind="stable").index if t not in kept]


def latency_points(estimate_ms: Callable[[int], float | None], cap: int, low_ms: float, high_ms: float,
                   shares=LATENCY_SHARES) -> list[int]:
    """The largest k in [1, cap] estimated at most each share of the way from `low_ms` to `high_ms` (bisection on
    the estimates, which grow with k; no evaluation). Every estimate brackets the later shares' bisections (each
    one generates a plan's QDQ model: seconds on a large model)."""
    seen: dict[int, float] = {}

    def ms(k: int) -> float:
        if k not in seen:
            value = estimate_ms(k)
            seen[k] = float("inf") if value is None else value
        return seen[k]

    points = set()
    for share in sorted(shares):
        limit = low_ms + share * (high_ms - low_ms)
        lo = max((k for k, v in seen.items() if v <= limit), default=0)
        hi = min((k for k, v in seen.items() if v > limit), default=cap + 1)
        if hi == cap + 1:
            if ms(cap) <= limit:
                lo = cap
            hi = cap
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ms(mid) <= limit else (lo, mid)
        if lo > 0:
            points.add(lo)
    return sorted(points)


def reserve(left: int) -> int:
    """Evaluations the bottom-up walk leaves for the top-down one, of `left`."""
    share = int(round(left * RESERVE_SHARE))
    return share if share >= RESERVE_MIN and left - share >= RESERVE_MIN else 0


__all__ = ["demotion_scores", "top_down_order", "latency_points", "reserve", "LATENCY_SHARES"]
