"""The recommendation chosen over every plan a study holds for one accuracy source (not only the plans a walk
evaluated): the cheapest plan that clearly reaches the target, else the cheapest within noise of it (those whose
value meets it first), else the most accurate within the latency budget, never a plan another stored plan
dominates; and whether a plan is worth evaluating at all. Estimated latencies closer than the cost model resolves
are a tie (`latency.resolution`), and a tie goes to the better value, here as in the walk's pruning."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
from dataclasses import dataclass

from ..errors import MpstudioError
from ..latency.resolution import TIE_FLOOR_MS, TIE_SHARE, clearly_cheaper, no_dearer
from ..store import Evaluation
from ..value_text import value_text
from .recommend import estimate_ms
from .targets import meets

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study


@dataclass(frozen=True)
class Considered:
    """One stored plan the recommendation looked at, and what it made of it. `verdict` is one of "picked",
    "reaches (dearer)", "within noise", "misses", "dominated by plan N", "dominated by plan N (a latency tie,
    better value)", "over the latency budget"; `evidence`
    is what its value says of the target: "reaches", "misses" or "within noise" (`evidence.TargetEvidence`)."""

    plan_id: int
    name: str
    value: float
    estimate_ms: float
    reaches: bool
    verdict: str
    evidence: str = ""
    low: float | None = None  # the value's 95 % interval (None: not known)
    high: float | None = None

    def to_json(self) -> dict:
        return {"plan_id": self.plan_id, "name": self.name, "value": self.value,
                "estimate_ms": self.estimate_ms if math.isfinite(self.estimate_ms) else None,
                "reaches": self.reaches, "verdict": self.verdict, "evidence": self.evidence, "low": self.low,
                "high": self.high}


@dataclass(frozen=True)
class Choice:
    """The pick over a study's stored plans of one accuracy source, every plan considered, and why."""

    pick: Evaluation
    considered: tuple  # of Considered, by estimated latency
    why: str
    accuracy_source: str


def stored_evaluations(study: Study, accuracy_source: str, extra=()) -> list[Evaluation]:
    """Every plan the study holds an evaluation of from `accuracy_source` (one per plan), with `extra` (e.g. a
    walk's evaluations not yet read back) in front."""
    frame = study.evaluations()
    ids = dict.fromkeys(int(i) for i in frame.loc[frame["accuracy_source"] == accuracy_source, "plan_id"])
    found = {e.plan_id: e for e in extra if e.accuracy_source == accuracy_source}
    for plan_id in ids:
        if plan_id not in found:
            e = study.store.evaluation(plan_id, accuracy_source)
            if e is not None:
                found[plan_id] = e
    return list(found.values())


def dominates(a: Evaluation, b: Evaluation, higher_is_better: bool) -> bool:
    """True when `a` is at least as good as `b` at no more estimated latency, as far as the cost model resolves
    (`latency.resolution.no_dearer`: a tie counts as no more), and strictly better in one: a better value (a tie
    goes to the better value), or an equal value for less (an exact tie goes to the lower plan id, so that one of
    two identical points is kept)."""
    sign = 1.0 if higher_is_better else -1.0
    va, vb, ma, mb = sign * a.value, sign * b.value, estimate_ms(a), estimate_ms(b)
    if va < vb:
        return False
    if va > vb:
        return no_dearer(ma, mb)
    return ma < mb or (ma == mb and a.plan_id < b.plan_id)


def by_tie(a: Evaluation, b: Evaluation, higher_is_better: bool) -> bool:
    """Whether `a` dominates `b` only through a latency tie: `a` is priced above `b`, within the resolution."""
    return dominates(a, b, higher_is_better) and estimate_ms(a) > estimate_ms(b)


TIE_WORDS = (f"priced within the cost model's resolution ({TIE_SHARE:.0%} of the dearer estimate, at least "
             f"{TIE_FLOOR_MS * 1000:.1f} us): a tie, which goes to the better value")


def _within_noise_words(noisy: int, meeting: int) -> tuple[str, str]:
    """How many plans are within noise ("1 is", "3 are") and which of them is picked, in words."""
    counted = "1 is" if noisy == 1 else f"{noisy} are"
    if meeting == 1:
        return counted, "the one whose value meets it"
    if meeting:
        return counted, f"the cheapest of {meeting} whose value meets it"
    return counted, "none meets it by its value" + (f"; the cheapest of those {noisy}" if noisy > 1 else "")


def choose(evaluations, threshold: float, higher_is_better: bool,
           latency_budget_ms: float | None = None, verdicts: dict | None = None) -> Choice:
    """The plan to recommend among `evaluations` (one accuracy source): the cheapest (estimated latency) of those
    that clearly reach `threshold` within the budget; when none does, the cheapest within noise of it whose value
    meets the threshold, else the cheapest within noise; when none is, the most accurate within the budget (any
    plan when none fits it). A plan another one dominates (`dominates`: a better value priced within the cost
    model's resolution of it dominates it too) is never picked, so of two plans that reach the target at tied
    latencies the better value is. `verdicts` (plan id: "reaches", "misses" or "within noise", from
    `evidence.TargetEvidence`) say which plans clearly reach; without them, a value that meets the threshold does."""
    unique = list({e.plan_id: e for e in evaluations}.values())
    if not unique:
        raise MpstudioError("no evaluated plan to recommend")
    sign = 1.0 if higher_is_better else -1.0
    fits = {e.plan_id: latency_budget_ms is None or estimate_ms(e) <= latency_budget_ms for e in unique}
    # The budget is a bound, not an estimate to resolve: a plan over it never ties a plan within it out.
    dominated = {e.plan_id: _dominator(e, [o for o in unique if fits[o.plan_id] or not fits[e.plan_id]],
                                       higher_is_better) for e in unique}
    evidence = {e.plan_id: (verdicts or {}).get(e.plan_id) or
                ("reaches" if meets(e.value, threshold, higher_is_better) else "misses") for e in unique}
    open_ = [e for e in unique if dominated[e.plan_id] is None]
    reaching = [e for e in open_ if fits[e.plan_id] and evidence[e.plan_id] == "reaches"]
    noisy = [e for e in open_ if fits[e.plan_id] and evidence[e.plan_id] == "within noise"]
    budget = f" within the latency budget of {latency_budget_ms} ms" if latency_budget_ms is not None else ""
    cheapest = (lambda e: (estimate_ms(e), -sign * e.value, e.plan_id))
    if reaching:
        pick = min(reaching, key=cheapest)
        why = (f"the cheapest by estimated latency of {len(reaching)} stored plan(s) that "
               f"{'clearly ' if verdicts is not None else ''}reach the target{budget}, among {len(unique)} considered")
        why += _tie_note(pick, unique, dominated, fits, evidence, higher_is_better)
        cheaper = [e for e in noisy if clearly_cheaper(estimate_ms(e), estimate_ms(pick))]
        if cheaper:
            why += f"; {len(cheaper)} cheaper plan(s) are within noise of the target (not clearly reaching it)"
    elif noisy:
        # Within noise either way, a value that meets the threshold is the better bet: the cheapest of those, and
        # only when none meets it the cheapest of the rest.
        meeting = [e for e in noisy if meets(e.value, threshold, higher_is_better)]
        pick = min(meeting or noisy, key=cheapest)
        counted, which = _within_noise_words(len(noisy), len(meeting))
        why = (f"no stored plan clearly reaches the target{budget}; {counted} within noise of it (value and "
               f"target differ by less than the metric's resolution or the interval), {which}, among {len(unique)} "
               "considered") + _tie_note(pick, unique, dominated, fits, evidence, higher_is_better, "within noise")
        cheaper = [e for e in noisy if e not in meeting and clearly_cheaper(estimate_ms(e), estimate_ms(pick))]
        if meeting and cheaper:
            why += f"; {len(cheaper)} cheaper plan(s) within noise fall short of it by their value"
    else:
        pool = [e for e in open_ if fits[e.plan_id]]
        why = f"no stored plan reaches the target{budget}; the most accurate of {len(unique)} considered"
        if not pool:
            pool = open_
            why = f"no stored plan fits the latency budget of {latency_budget_ms} ms; the most accurate of all"
        pick = max(pool, key=lambda e: (sign * e.value, -estimate_ms(e), -e.plan_id))
    rows = []
    for e in sorted(unique, key=lambda e: (estimate_ms(e), e.plan_id)):
        ok = meets(e.value, threshold, higher_is_better)
        if e.plan_id == pick.plan_id:
            verdict = "picked"
        elif dominated[e.plan_id] is not None:
            other = dominated[e.plan_id]
            verdict = f"dominated by plan {other.plan_id}" + (
                " (a latency tie, better value)" if by_tie(other, e, higher_is_better) else "")
        elif not fits[e.plan_id]:
            verdict = "over the latency budget"
        else:
            verdict = {"reaches": "reaches (dearer)"}.get(evidence[e.plan_id], evidence[e.plan_id])
        rows.append(Considered(e.plan_id, e.name, e.value, estimate_ms(e), ok, verdict, evidence[e.plan_id],
                               getattr(e, "low", None), getattr(e, "high", None)))
    return Choice(pick, tuple(rows), why, pick.accuracy_source)


def _dominator(e: Evaluation, unique, higher_is_better: bool) -> Evaluation | None:
    """A stored plan that dominates `e`, or None: one that does so outright when any does (only a plan dominated
    through a latency tie alone is said to be), else the best value of those it ties with."""
    sign = 1.0 if higher_is_better else -1.0
    found = [o for o in unique if o.plan_id != e.plan_id and dominates(o, e, higher_is_better)]
    return min(found, key=lambda o: (by_tie(o, e, higher_is_better), -sign * o.value, estimate_ms(o), o.plan_id),
               default=None)


def _tie_note(pick: Evaluation, unique, dominated: dict, fits: dict, evidence: dict, higher_is_better: bool,
              kind: str = "reaches") -> str:
    """When a tie decided the pick: the plans of `kind` evidence priced under it that a better plan ties with."""
    tied_out = [e for e in unique if estimate_ms(e) < estimate_ms(pick) and fits[e.plan_id]
                and evidence[e.plan_id] == kind and dominated[e.plan_id] is not None
                and by_tie(dominated[e.plan_id], e, higher_is_better)]
    if not tied_out:
        return ""
    named = "; ".join(f"plan {e.plan_id} {e.name} ({value_text(e.value)}, {estimate_ms(e):.3f} ms) against plan "
                      f"{dominated[e.plan_id].plan_id} {dominated[e.plan_id].name} "
                      f"({value_text(dominated[e.plan_id].value)}, "
                      f"{estimate_ms(dominated[e.plan_id]):.3f} ms)" for e in tied_out[:3])
    more = f" and {len(tied_out) - 3} more" if len(tied_out) > 3 else ""
    what = "reach the target" if kind == "reaches" else "are within noise of it"
    return (f"; a tie decided it: {len(tied_out)} cheaper plan(s) that {what} are {TIE_WORDS} ({named}{more})")


def pointless_because(estimate: float, stored, threshold: float, higher_is_better: bool,
                      ceiling: float | None, reaches=None) -> Evaluation | None:
    """The stored evaluation that makes a plan of estimated latency `estimate` not worth evaluating, or None: one
    priced no dearer than it as far as the cost model resolves (`latency.resolution.no_dearer`: cheaper, equal or a
    tie) that reaches the threshold (the plan cannot be resolvably cheaper than a plan that does), or whose value
    is at least `ceiling` (the best all-16-bit value: a partial promotion is predicted no better, so it would lose
    a tie to it). `reaches(e)`: whether a stored plan clearly reaches the target (default: its value meets the
    threshold)."""
    sign = 1.0 if higher_is_better else -1.0
    reaches = reaches or (lambda e: meets(e.value, threshold, higher_is_better))
    for e in sorted(stored, key=estimate_ms):
        if not no_dearer(estimate_ms(e), estimate):
            break
        if reaches(e) or (ceiling is not None and sign * e.value >= sign * ceiling):
            return e
    return None
