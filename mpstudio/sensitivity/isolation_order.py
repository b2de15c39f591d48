"""Which tensors a progressive analysis isolates, in which order, and when it may stop: the decision orders by
screened value interleaved with random picks, and the test that no tensor left can enter the top of either."""

from __future__ import annotations

import math
import random
from typing import Sequence

import pandas as pd

EXPLORE = 4  # every 4th tensor isolated is a random one
WITNESSES = 5  # isolated tensors screened at most as high as the best remaining one, before stopping


def interleaved_order(tensors: Sequence[str], orders: dict[str, pd.Series]) -> list[str]:
    """Every tensor in the order to isolate: the decision orders (tensor -> screened value, highest first),
    interleaved, and every `EXPLORE`-th a tensor drawn at random from the rest (seeded), so that how far a full
    value lies from its screened one is also measured away from the top of the screening."""
    ranked = [list(s.sort_values(ascending=False, kind="stable").index) for s in orders.values()]
    interleaved = list(dict.fromkeys(t for rank in range(len(tensors)) for t in (o[rank] for o in ranked)))
    rng = random.Random(0)
    merged: list[str] = []
    placed: set[str] = set()
    ahead = iter(interleaved)
    while len(merged) < len(interleaved):
        if len(merged) % EXPLORE == EXPLORE - 1:
            t = rng.choice([t for t in interleaved if t not in placed])
        else:
            t = next(t for t in ahead if t not in placed)
        placed.add(t)
        merged.append(t)
    return merged


def cannot_enter_top(screen_orders: dict[str, pd.Series], full_orders: dict[str, pd.Series],
                     remaining: Sequence[str], keep: int) -> bool:
    """Whether no tensor of `remaining` (not isolated yet) can enter the top `keep` of a decision order.

    An order's threshold is its `keep`-th best full value among the isolated tensors (`full_orders`). Let v be
    the best screened value among the remaining tensors: one of them could pass the threshold if v plus the
    most that the full value of an isolated tensor screened no higher than v lay above its screened value
    exceeds it (the random picks among the isolated tensors are what measures this low in the screening).
    Nothing is decided on fewer than `WITNESSES` such isolated tensors."""
    for name, screened in screen_orders.items():
        known = full_orders[name].dropna()
        if len(known) < keep:
            return False
        threshold = float(known.nlargest(keep).iloc[-1])
        best = float(screened.reindex(list(remaining)).max())
        if not math.isfinite(best):
            return False
        known_screened = screened.reindex(known.index)
        below = known_screened <= best
        if int(below.sum()) < WITNESSES:
            return False
        reach = max(0.0, float((known[below] - known_screened[below]).max()))
        if best + reach > threshold:
            return False
    return True


def cost_floor(costs: pd.Series, tensors: Sequence[str]) -> pd.Series:
    """The tensors' estimated promotion costs, missing ones at the median, floored at the least positive one."""
    costs = costs.reindex(tensors)
    costs = costs.fillna(costs.median() if costs.notna().any() else 1.0)
    positive = costs[costs > 0]
    floor = max(float(positive.min()) if len(positive) else 1e-6, 1e-6)
    return costs.clip(lower=floor)
