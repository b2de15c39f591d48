"""The walk goes on when the confirming backend reads its pick short.

The walk scores plans on the CPU reference; the HTP confirms the pick. When the HTP reads the walk's pick, which
the CPU said reaches the target, as within noise of it or as missing it, the gap between the two readings of
that plan is the best measure of how far the CPU's numbers flatter the HTP's near the pick. With evaluations
left, the bottom-up walk goes on against a target tightened by that gap (`tightened`: what the CPU must read for
a plan to be expected to reach the target on the HTP), over its prefixes clearly cheaper than any plan the HTP
says reaches the target (when the confirmation settled on a dearer plan, all-16-bit say, the walk looks between
the two); nothing it evaluated is evaluated again. The HTP then confirms the new pick with the confirmations
left, and the recommendation is chosen, as always, over every plan the HTP holds (`choice.choose`) against the
search's own target: the tightened one only steers where the walk looks.

At most `ROUNDS` such rounds; none when the walk's pick was not read short (the HTP agrees, or the CPU did not
say it reaches, so the gap says nothing), or when no walk over prefixes ran (a baseline answered the target
before any analysis).
"""

from __future__ import annotations

from dataclasses import replace

from ..latency.resolution import clearly_cheaper
from ..value_text import value_text
from .evidence import REACHES, TargetEvidence
from .grid import largest
from .recommend import estimate_ms
from .result import SearchResult

# Rounds of walking on after a short HTP reading, at most: each costs walk evaluations and an HTP confirmation.
ROUNDS = 2


def _read_short(result: SearchResult):
    """The confirmation of the walk's pick when the confirming backend read it short of the target while the walk's
    backend said it reaches it, else None."""
    pick = (result.walk_pick or result.recommended).plan_id
    return next((c for c in result.confirmations
                 if c.walk.plan_id == pick and c.walk_verdict == REACHES and c.verdict != REACHES), None)


def short_gap(result: SearchResult) -> float:
    """How much worse the confirming backend read the walk's pick, which the walk's backend said reaches the
    target (in the metric's units, positive = worse there); 0 when it was not read short, or not confirmed."""
    short = _read_short(result)
    if short is None:
        return 0.0
    sign = 1.0 if result.higher_is_better else -1.0
    return max(0.0, sign * (short.walk.value - short.confirmed.value))


def tightened(threshold: float, gap: float, higher_is_better: bool) -> float:
    """The walk's backend's threshold that leaves room for `gap` (see `short_gap`)."""
    return threshold + gap if higher_is_better else threshold - gap


def go_on(walk, result: SearchResult, confirm, backend: str, confirm_plans: int) -> SearchResult:
    """`result` (confirmed on `backend`) followed, while the confirming backend reads the picks short, by walks
    against a tightened target and their picks' confirmation (`confirm(walk, result, backend, max_plans)`,
    `confirmation.confirm`); returns the last result, with every round's confirmations."""
    for _ in range(ROUNDS):
        gap = short_gap(result)
        left = confirm_plans - len(result.confirmations)
        grid = getattr(walk, "grid", None)
        if gap <= 0 or left <= 0 or walk.left() <= 0 or grid is None:
            return result
        # A pick that reaches the target on the HTP bounds the walk: only a plan clearly cheaper can replace it.
        bound = estimate_ms(result.recommended) if result.verdict == REACHES else None
        confirmed = {c.walk.plan_id for c in result.confirmations}
        steer = tightened(walk.threshold, gap, walk.hib)
        again = _walk_to(walk, grid, steer, result, bound)
        if again.recommended.plan_id in confirmed:  # the walk found nothing new to ask the HTP
            return replace(result, path=again.path, new_evaluations=again.new_evaluations, skipped=again.skipped,
                           stop_reason=result.stop_reason + f"; {_why(result, gap, steer)}: "
                                                             f"{again.stop_reason} (no new plan to confirm)")
        reason = f"{result.stop_reason}; {_why(result, gap, steer)}: {again.stop_reason}"
        # Judged, from here on, against the search's own target (the walk's result carries the tightened one).
        again = replace(again, threshold=walk.threshold, stop_reason=reason,
                        verdict=walk.evidence.verdict(again.recommended), reached=walk.reaches(again.recommended))
        following = confirm(walk, again, backend, left)
        result = _merged(result, following)
    return result


def _walk_to(walk, grid, steer: float, result: SearchResult, bound: float | None) -> SearchResult:
    """The bottom-up walk over prefixes (`grid`) run on against threshold `steer`, over the prefixes clearly
    cheaper than `bound` (ms; None: no bound), and the walk's pick over every stored plan against it; the walk's
    own threshold and evidence are restored after."""
    kept = walk.threshold, walk.evidence
    walk.threshold = steer
    walk.evidence = TargetEvidence(walk.study, walk.goal, steer, walk.hib, kept[1].references)
    try:
        # What a stored plan made pointless against the old threshold may not be against this one.
        grid.skipped.clear()
        cap = walk.fitting(grid.plan_k, grid.full)
        if bound is not None:
            cap = largest(lambda k: clearly_cheaper(walk.estimate_ms(grid.plan_k(k)), bound), cap)
        grid.cap = walk.worth_evaluating(grid.plan_k, cap)
        reason = grid.run() if grid.cap > 0 else "every further promotion is priced at or above a stored plan as good"
        return walk._result(reason, result.order)
    finally:
        walk.threshold, walk.evidence = kept


def _why(result: SearchResult, gap: float, steer: float) -> str:
    short = _read_short(result)
    sign = "<=" if not result.higher_is_better else ">="
    return (f"the {short.confirmed.backend.upper()} read {short.walk.name} {value_text(gap)} worse than the "
            f"{short.walk.backend.upper()}, so the walk went on to {result.metric} {sign} {value_text(steer)} on the "
            f"{short.walk.backend.upper()} (the target with room for that gap)")


def _merged(before: SearchResult, after: SearchResult) -> SearchResult:
    """`after` with `before`'s confirmations first (a plan confirmed twice listed once); `after`'s note says what
    its confirmation left out (the earlier one's may no longer hold)."""
    seen = {c.walk.plan_id for c in before.confirmations}
    confirmations = (*before.confirmations, *(c for c in after.confirmations if c.walk.plan_id not in seen))
    return replace(after, confirmations=confirmations,
                   unbuildable=tuple({(f.plan_id, f.target): f for f in (*before.unbuildable,
                                                                         *after.unbuildable)}.values()))


__all__ = ["go_on", "short_gap", "tightened", "ROUNDS"]
