"""The HTP confirmation of a search: the walk's pick evaluated on the HTP, then its neighbours (cheaper plans of
the walk's front when the pick reaches the target there, every dearer plan the walk evaluated when it clearly
misses, the dearer partial promotions the walk does not put clearly under the target when it is within noise of
it, then an all-16-bit plan that costs
little more; whatever it costs, one past the budget, when no confirmed plan meets the target by its value), a
pick within noise reported as such, and the recommendation made on the HTP's numbers."""

from __future__ import annotations

from dataclasses import replace

from ..errors import MpstudioError
from ..store import Evaluation
from ..loop.build_failures import BuildFailed, BuildFailure
from ..loop.front import pareto_mask
from ..value_text import value_text
from .choice import choose, stored_evaluations
from .evidence import MISSES, REACHES, WITHIN_NOISE
from .recommend import LITTLE_MORE, better_for_little_more, estimate_ms
from .result import Confirmation, SearchResult
from .targets import meets
from .walk import Walk


def confirm(walk: Walk, result: SearchResult, backend: str, max_plans: int) -> SearchResult:
    """`result` with its pick and the plans around it evaluated on `backend` too, and recommended on its numbers.

    The candidates are `confirmation_order`'s: the cheaper plans of the walk's front, the pick, then every dearer
    plan the walk's source holds by estimated latency (mixed plans the front leaves out included, all-16-bit
    last). When the pick reaches the target on `backend`, the next cheaper plans while they reach it too (the
    walk's backend may have been pessimistic); when it clearly misses, the next dearer ones until one reaches it
    or is within noise of it; when it is within noise (it meets or misses the threshold by less than the metric's
    resolution, or the threshold lies inside its interval: `evidence.TargetEvidence`), the dearer partial
    promotions until one clearly reaches it (passing over those the walk's own numbers put clearly under the
    target), then the all-16-bit plans estimated at most `LITTLE_MORE` (10 %) above
    the pick (a clear answer for little more); when none does, the result says so. At most `max_plans` evaluations,
    and one more when no confirmed plan reaches the target or meets it by its value: the cheapest all-16-bit plan
    whatever its cost (the upper end: whether the target can be met there at all; `_confirm_along`). A plan the
    backend cannot build is infeasible there: it is stored as such (`loop.build_failures`), passed over for the next
    candidate, and listed in the result.
    The recommendation is then chosen over every plan the study holds from `backend` (`choice.choose`, so only
    plans that built): the cheapest that clearly reaches the target, else the cheapest within noise of it, else
    the most accurate, never dominated.
    """
    if walk.runner is None and backend == "htp":
        from ..runtime import register_qnn

        try:
            register_qnn()
        except MpstudioError as exc:
            return replace(result, confirm_note=f"not confirmed on the HTP: {exc} (search with --backend htp "
                                                "or an --agent, or pass confirm=None to skip this step)")
    front, at = _candidates(walk, result.recommended)
    done: list[Confirmation] = []
    unbuilt: list[BuildFailure] = []
    tried: set[int] = set()

    def check(i: int):
        e = front[i]
        tried.add(i)
        walk.check_cancel()
        job = walk.study.submit(walk.study.plan(e.plan_id), backend, origin=f"search {walk.search_id} confirm",
                                search_id=walk.search_id)
        try:
            confirmed = walk.study.run_job(job, walk.runner, progress=walk.progress, cancel=walk.cancel)
        except BuildFailed as exc:  # infeasible there: the next candidate is tried
            unbuilt.append(exc.failure)
            if walk.progress:
                walk.progress(len(done), max_plans, f"search: {e.name} cannot be built on {exc.failure.where}; "
                                                    "trying the next candidate")
            return None
        verdict = walk.evidence.verdict(confirmed)
        done.append(Confirmation(e, confirmed, walk.evidence.verdict(e), verdict))
        if walk.progress:
            walk.progress(len(done), max(max_plans, len(done)),  # the upper end can go one past the budget
                          f"search: confirmed {e.name} on {confirmed.accuracy_source}: "
                          f"{confirmed.metric} {value_text(confirmed.value)} (walk {value_text(e.value)}), {verdict}")
        return {REACHES: True, MISSES: False}.get(verdict, WITHIN_NOISE)

    failure = ""
    try:
        _confirm_along(walk, front, at, check, done, tried, max_plans)
    except MpstudioError as exc:  # the walk's result stands; what was confirmed before the failure counts
        failure = (f"the confirmation on the HTP stopped after {len(done)} plan(s): {exc} (rerun the search to "
                   "continue it; --no-confirm skips it)")
    if not done:
        if unbuilt and not failure:
            failure = (f"no plan of the front could be built on {unbuilt[0].where} ({len(unbuilt)} tried): the "
                       "recommendation stands on the walk's numbers alone and may not build there either")
        return replace(result, confirm_note=failure, unbuildable=(*result.unbuildable, *unbuilt))
    return _recommend(walk, result, done, failure or _untried_note(done, front, at, tried, max_plans),
                      tuple(unbuilt))


def _confirm_along(walk: Walk, front: list[Evaluation], at: int, check, done: list[Confirmation], tried: set[int],
                   max_plans: int) -> None:
    """`walk_front` over `front` from the pick at `at`, at most `max_plans` confirmations (`done`); then, when the
    plans it confirmed within noise of the target all fall short of it by their value and none reaches it, one
    more: the cheapest all-16-bit plan (the upper end), so the pick can be one that meets the target there."""
    # The all-16-bit plans are the dearest candidates (`confirmation_order`): the first of them ends the rest.
    mixed = next((i for i in range(at + 1, len(front)) if _all_sixteen(walk, front[i])), len(front))
    near = mixed + sum(1 for e in front[mixed:] if estimate_ms(e) <= estimate_ms(front[at]) * (1 + LITTLE_MORE))

    def upper_end_wanted() -> bool:
        return (mixed < len(front) and mixed not in tried and any(c.verdict == WITHIN_NOISE for c in done)
                and not any(c.verdict == REACHES or meets(c.confirmed.value, walk.threshold, walk.hib)
                            for c in done))

    # A dearer plan the walk's own numbers put clearly under the target is no candidate for clearly reaching it.
    hopeless = frozenset(i for i in range(at + 1, len(front)) if walk.evidence.verdict(front[i]) == MISSES)
    walk_front(len(front), at, check, lambda: len(done) >= max_plans, mixed, near, hopeless)
    if upper_end_wanted():
        check(mixed)


def walk_front(n: int, at: int, check, full, mixed: int | None = None, near: int | None = None,
               hopeless: frozenset[int] = frozenset()) -> None:
    """Confirm along `n` candidate plans (cheapest first: `confirmation_order`) from the pick at `at`: `check(i)`
    says whether plan i reaches the target on the confirming backend (True), clearly misses it (False), is within
    noise of it (`WITHIN_NOISE`) or cannot be built there (None); `full()` whether the budget is spent; the
    candidates from `mixed` on (default none) are all-16-bit plans, those before `near` (default `mixed`) costing
    little more than the pick. The first plan that builds, from the pick on
    (dearer ones first, then cheaper), sets the direction: when it reaches the target, cheaper plans follow while
    they reach it too (the walk's backend may have been pessimistic); when it clearly misses, dearer ones until one
    reaches it or is within noise of it; when it is within noise, the dearer partial promotions while the budget
    lasts, until one clearly reaches it (a plan the samples can tell from the target, at a small step in cost),
    then the all-16-bit plans that cost little more (before `near`), never a dearer one (a difference the samples
    cannot tell calls for no jump to it), passing over the `hopeless` ones (the walk's backend says they clearly
    miss the target: a confirmation that looks for a clear reach does not spend the budget on them). Plans that
    cannot be built
    are passed over; when no dearer plan that builds reaches the target and some dearer ones could not be built,
    the cheaper ones follow (while they reach it, once one does): they are what is left to recommend from."""
    tried: set[int] = set()
    unbuilt: set[int] = set()
    mixed = n if mixed is None else mixed
    near = mixed if near is None else near

    def verdict(i: int):
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
    if reaches == WITHIN_NOISE:
        for i in range(anchor + 1, near):
            if full():
                return
            if i not in tried and i not in hopeless and verdict(i) is True:
                return
        return
    step = -1 if reaches is True else 1
    i = anchor + step
    while 0 <= i < n and not full():
        if i not in tried:
            found = verdict(i)
            if found is not None and found is not (step == -1):
                return  # a cheaper one misses, or a dearer one reaches it (or is within noise): the edge is found
        i += step
    if step == 1 and any(i > anchor for i in unbuilt):
        reached = False
        for i in range(anchor - 1, -1, -1):
            if full():
                return
            if i not in tried:
                found = verdict(i)
                if found == WITHIN_NOISE or (reached and found is False):
                    return
                reached = reached or found is True


def confirmation_order(stored, pick: Evaluation, higher_is_better: bool, all_sixteen,
                       latency_budget_ms: float | None = None) -> tuple[list[Evaluation], int]:
    """The plans a confirmation may try, in the order `walk_front` reads them, and the pick's place among them.
    Before the pick: the plans of the front of `stored` (one accuracy source; value against estimated latency)
    cheaper than it, cheapest first. After it: every other stored plan at least as dear and within the latency
    budget, by estimated latency (at one latency, the better value first), the ones the front leaves out included
    (the confirming backend can order two plans differently from the walk's), with the plans `all_sixteen(e)`
    says keep every activation at 16 bits last, so that a partial promotion is tried before all-16-bit."""
    unique = list({e.plan_id: e for e in stored}.values())
    if all(e.plan_id != pick.plan_id for e in unique):
        unique.append(pick)

    def key(e):
        return estimate_ms(e), e.plan_id
    on_front = pareto_mask([e.value for e in unique], [estimate_ms(e) for e in unique], higher_is_better)
    cheaper = sorted((e for e, keep in zip(unique, on_front) if keep and key(e) < key(pick)), key=key)
    taken = {e.plan_id for e in cheaper} | {pick.plan_id}
    dearer = [e for e in unique if e.plan_id not in taken and estimate_ms(e) >= estimate_ms(pick)
              and (latency_budget_ms is None or estimate_ms(e) <= latency_budget_ms)]
    # At one estimated latency the better value first: a16w8-pc before a16w8 when per-channel weights won.
    better_first = -1.0 if higher_is_better else 1.0
    dearer.sort(key=lambda e: (bool(all_sixteen(e)), estimate_ms(e), better_first * e.value, e.plan_id))
    return [*cheaper, pick, *dearer], len(cheaper)


def _all_sixteen(walk: Walk, e: Evaluation) -> bool:
    return walk.study.plan(e.plan_id).activation_type == "uint16"


def _candidates(walk: Walk, pick: Evaluation) -> tuple[list[Evaluation], int]:
    """`confirmation_order` over every plan of the study on the walk's source."""
    return confirmation_order(walk.stored(), pick, walk.hib, lambda e: _all_sixteen(walk, e),
                              walk.latency_budget_ms)


def _untried_note(done: list[Confirmation], front: list[Evaluation], at: int, tried: set[int], max_plans: int) -> str:
    """What the budget left out when no confirmed plan reaches the target or is within noise of it: the dearer
    candidates not confirmed ("" when there are none, or a confirmed plan answers)."""
    if any(c.verdict in (REACHES, WITHIN_NOISE) for c in done):
        return ""
    left = [front[i] for i in range(at + 1, len(front)) if i not in tried]
    if not left:
        return ""
    names = ", ".join(f"plan {e.plan_id} {e.name}" for e in left[:4]) + (", ..." if len(left) > 4 else "")
    return (f"no confirmed plan reaches the target on {done[0].confirmed.accuracy_source}; {len(left)} dearer plan(s) "
            f"the walk evaluated were not confirmed within --confirm-plans {max_plans} ({names}): raise it to "
            "confirm them")


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
