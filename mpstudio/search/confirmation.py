"""The HTP confirmation of a search: the plans of the walk's front around its pick evaluated on the HTP too,
and the recommendation made on the HTP's numbers."""

from __future__ import annotations

from dataclasses import replace

from ..errors import MpstudioError
from ..store import Evaluation
from ..loop.build_failures import BuildFailed, BuildFailure
from ..loop.front import pareto_mask
from .choice import choose, stored_evaluations
from .recommend import better_for_little_more, estimate_ms
from .result import Confirmation, SearchResult
from .walk import Walk


def confirm(walk: Walk, result: SearchResult, backend: str, max_plans: int) -> SearchResult:
    """`result` with the front around its pick evaluated on `backend` too, and recommended on its numbers.

    From the walk's pick along the front of the walk's evaluations (value against estimated latency):
    when the pick reaches the target on `backend`, the next cheaper plans while they reach it too (the
    walk's backend may have been pessimistic); when it misses, the next dearer ones until one reaches it;
    at most `max_plans` evaluations (`walk_front`). A plan the backend cannot build is infeasible there: it is
    stored as such (`loop.build_failures`), passed over for the next plan of the front, and listed in the result.
    The recommendation is then chosen over every plan the study holds from `backend` (`choice.choose`, so only
    plans that built): the cheapest that reaches the target, else the most accurate, never dominated.
    """
    if walk.runner is None and backend == "htp":
        from ..runtime import register_qnn

        try:
            register_qnn()
        except MpstudioError as exc:
            return replace(result, confirm_note=f"not confirmed on the HTP: {exc} (search with --backend htp "
                                                "or an --agent, or pass confirm=None to skip this step)")
    front = _front(walk, result.recommended)
    at = next(i for i, e in enumerate(front) if e.plan_id == result.recommended.plan_id)
    done: list[Confirmation] = []
    unbuilt: list[BuildFailure] = []

    def check(i: int) -> bool | None:
        e = front[i]
        walk.check_cancel()
        job = walk.study.submit(walk.study.plan(e.plan_id), backend, origin=f"search {walk.search_id} confirm",
                                search_id=walk.search_id)
        try:
            confirmed = walk.study.run_job(job, walk.runner, progress=walk.progress, cancel=walk.cancel)
        except BuildFailed as exc:  # infeasible there: the next candidate is tried
            unbuilt.append(exc.failure)
            if walk.progress:
                walk.progress(len(done), max_plans, f"search: {e.name} cannot be built on {exc.failure.where}; "
                                                    "trying the next plan of the front")
            return None
        done.append(Confirmation(e, confirmed))
        if walk.progress:
            walk.progress(len(done), max_plans, f"search: confirmed {e.name} on {confirmed.accuracy_source}: "
                                                f"{confirmed.metric} {confirmed.value:.4f} (walk {e.value:.4f})")
        return walk.reaches(confirmed)

    failure = ""
    try:
        walk_front(len(front), at, check, lambda: len(done) >= max_plans)
    except MpstudioError as exc:  # the walk's result stands; what was confirmed before the failure counts
        failure = (f"the confirmation on the HTP stopped after {len(done)} plan(s): {exc} (rerun the search to "
                   "continue it; --no-confirm skips it)")
    if not done:
        if unbuilt and not failure:
            failure = (f"no plan of the front could be built on {unbuilt[0].where} ({len(unbuilt)} tried): the "
                       "recommendation stands on the walk's numbers alone and may not build there either")
        return replace(result, confirm_note=failure, unbuildable=(*result.unbuildable, *unbuilt))
    return _recommend(walk, result, done, failure, tuple(unbuilt))


def walk_front(n: int, at: int, check, full) -> None:
    """Confirm along a front of `n` plans (cheapest first) from the pick at `at`: `check(i)` says whether plan i
    reaches the target on the confirming backend (None: it cannot be built there), `full()` whether the budget is
    spent. The first plan that builds, from the pick on (dearer ones first, then cheaper), sets the direction:
    when it reaches the target, cheaper plans follow while they reach it too (the walk's backend may have been
    pessimistic); when it misses, dearer ones until one reaches it. Plans that cannot be built are passed over;
    when no dearer plan that builds reaches the target and some dearer ones could not be built, the cheaper ones
    follow (while they reach it, once one does): they are what is left to recommend from."""
    tried: set[int] = set()
    unbuilt: set[int] = set()

    def verdict(i: int) -> bool | None:
        tried.add(i)
        found = check(i)
        if found is None:
            unbuilt.add(i)
        return found

    anchor, reaches = None, None
    for i in (at, *range(at + 1, n), *range(at - 1, -1, -1)):
        if full():
            return
        reaches = verdict(i)
        if reaches is not None:
            anchor = i
            break
    if anchor is None:
        return
    step = -1 if reaches else 1
    i = anchor + step
    while 0 <= i < n and not full():
        if i not in tried:
            found = verdict(i)
            if found is not None and found != (step == -1):
                return  # a cheaper one misses, or a dearer one reaches it: the edge is found
        i += step
    if step == 1 and any(i > anchor for i in unbuilt):
        reached = False
        for i in range(anchor - 1, -1, -1):
            if full():
                return
            if i not in tried:
                found = verdict(i)
                if reached and found is False:
                    return
                reached = reached or bool(found)


def _front(walk: Walk, recommended: Evaluation) -> list[Evaluation]:
    """The front of the study's plans on the walk's source (value against estimated latency) with its pick,
    cheapest first."""
    unique = list({e.plan_id: e for e in walk.stored()}.values())
    on_front = pareto_mask([e.value for e in unique], [estimate_ms(e) for e in unique], walk.hib)
    front = [e for e, keep in zip(unique, on_front) if keep]
    if all(e.plan_id != recommended.plan_id for e in front):
        front.append(recommended)
    front.sort(key=lambda e: (estimate_ms(e), e.plan_id))
    return front


def _recommend(walk: Walk, result: SearchResult, done: list[Confirmation], failure: str,
               unbuilt: tuple = ()) -> SearchResult:
    """`result` recommended on the confirming backend's numbers: the choice (`choice.choose`) over every plan the
    study holds from that source, the ones just confirmed included."""
    source = done[0].confirmed.accuracy_source
    stored = stored_evaluations(walk.study, source, [c.confirmed for c in done])
    choice = choose(stored, walk.threshold, walk.hib, walk.latency_budget_ms, walk.evidence.verdicts(stored))
    pick = choice.pick
    changed = pick.plan_id != result.recommended.plan_id
    reason = result.stop_reason + ("; the HTP confirmation moved the pick" if changed else "")
    if any(f.plan_id == result.recommended.plan_id for f in unbuilt):
        reason += " (the walk's pick cannot be built there)"
    alternatives = tuple(better_for_little_more(
        pick, stored, walk.hib, result.float_value, snr_metric=walk.study.metric_spec.kind == "output",
        latency_budget_ms=walk.latency_budget_ms))
    return replace(result, recommended=pick, reached=walk.reaches(pick), stop_reason=reason,
                   alternatives=alternatives, confirm_note=failure,
                   promoted=walk.promoted(pick, result.order) if changed else result.promoted,
                   confirmations=tuple(done), walk_pick=result.recommended if changed else None,
                   considered=choice.considered, choice=choice.why,
                   unbuildable=(*result.unbuildable, *unbuilt), verdict=walk.evidence.verdict(pick))
