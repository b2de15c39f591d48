"""The HTP confirmation of a search: the plans of the walk's front around its pick evaluated on the HTP too,
and the recommendation made on the HTP's numbers."""

from __future__ import annotations

from dataclasses import replace

from ..errors import MpstudioError
from ..store import Evaluation
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
    at most `max_plans` evaluations. The recommendation is then chosen over every plan the study holds from
    `backend` (`choice.choose`): the cheapest that reaches the target, else the most accurate, never dominated.
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

    def check(e: Evaluation) -> bool:
        walk.check_cancel()
        job = walk.study.submit(walk.study.plan(e.plan_id), backend, origin=f"search {walk.search_id} confirm",
                                search_id=walk.search_id)
        confirmed = walk.study.run_job(job, walk.runner, progress=walk.progress, cancel=walk.cancel)
        done.append(Confirmation(e, confirmed))
        if walk.progress:
            walk.progress(len(done), max_plans, f"search: confirmed {e.name} on {confirmed.accuracy_source}: "
                                                f"{confirmed.metric} {confirmed.value:.4f} (walk {e.value:.4f})")
        return walk.reaches(confirmed)

    failure = ""
    try:
        step = -1 if check(front[at]) else 1
        i = at + step
        while 0 <= i < len(front) and len(done) < max_plans:
            if check(front[i]) != (step == -1):
                break  # a cheaper one misses, or a dearer one reaches it: the edge is found
            i += step
    except MpstudioError as exc:  # the walk's result stands; what was confirmed before the failure counts
        failure = (f"the confirmation on the HTP stopped after {len(done)} plan(s): {exc} (rerun the search to "
                   "continue it; --no-confirm skips it)")
    if not done:
        return replace(result, confirm_note=failure)
    return _recommend(walk, result, done, failure)


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


def _recommend(walk: Walk, result: SearchResult, done: list[Confirmation], failure: str) -> SearchResult:
    """`result` recommended on the confirming backend's numbers: the choice (`choice.choose`) over every plan the
    study holds from that source, the ones just confirmed included."""
    source = done[0].confirmed.accuracy_source
    stored = stored_evaluations(walk.study, source, [c.confirmed for c in done])
    choice = choose(stored, walk.threshold, walk.hib, walk.latency_budget_ms, walk.evidence.verdicts(stored))
    pick = choice.pick
    changed = pick.plan_id != result.recommended.plan_id
    reason = result.stop_reason + ("; the HTP confirmation moved the pick" if changed else "")
    alternatives = tuple(better_for_little_more(
        pick, stored, walk.hib, result.float_value, snr_metric=walk.study.metric_spec.kind == "output",
        latency_budget_ms=walk.latency_budget_ms))
    return replace(result, recommended=pick, reached=walk.reaches(pick), stop_reason=reason,
                   alternatives=alternatives, confirm_note=failure,
                   promoted=walk.promoted(pick, result.order) if changed else result.promoted,
                   confirmations=tuple(done), walk_pick=result.recommended if changed else None,
                   considered=choice.considered, choice=choice.why, verdict=walk.evidence.verdict(pick))
