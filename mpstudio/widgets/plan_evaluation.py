"""Evaluating plans from the studio: a plan's predicted point at once, values on more and more samples as its
evaluation streams, its stored result at the end; and the baselines, in the background."""

from __future__ import annotations

import numpy as np

from ..loop.build_failures import BuildFailed
from ..errors import MpstudioError
from ..plan import PrecisionPlan
from ..preview import basis_ready
from ..study import Study
from ..value_text import value_text
from .lanes import Job
from .provisional import ProvisionalPoints
from .constants import writable


def has_baselines(study: Study, backend: str, runner) -> bool:
    """Whether `study` holds the a8w8 and a16w8 evaluations of `backend` on `runner`'s accuracy source."""
    source = study.accuracy_source(backend, runner)
    ids = [study.plan_id(PrecisionPlan.a8w8()), study.plan_id(PrecisionPlan.a16w8())]
    return all(pid is not None and study.store.evaluation(pid, source) is not None for pid in ids)


def evaluated_id(frame, plan: PrecisionPlan) -> int | None:
    """The id of `plan` in `frame` (StudioState.evaluations) when it has an evaluation there, else None: a new study
    opens on a8w8 before the background baselines evaluate it, and the current plan is stored from then on."""
    rows = frame[frame["plan_hash"] == plan.hash] if len(frame) else frame
    return int(rows["plan_id"].iloc[0]) if len(rows) else None


def paired_on_every_sample(study: Study, evaluation, versus: PrecisionPlan | None):
    """`evaluation` minus `versus` on every sample (`Study.compare`), or None when `versus` has no comparable
    result on the same accuracy source."""
    versus_id = study.plan_id(versus) if versus is not None else None
    if versus_id is None or versus_id == evaluation.plan_id:
        return None
    try:
        return study.compare(evaluation.plan_id, versus_id, evaluation.accuracy_source)
    except MpstudioError:
        return None


def stored_name(study: Study, plan: PrecisionPlan | None) -> str:
    """The name the study stores `plan` under ("" when it is not stored)."""
    plan_id = study.plan_id(plan) if plan is not None else None
    return study.store.plan_row(plan_id)[1] if plan_id is not None else ""


def first_words(evaluation, paired) -> str:
    """The message after an evaluation: its paired difference from the plan it came from first (a long message is
    cut at the window's edge), then the evaluation."""
    return (f"{evaluation.name}: {paired.describe()}; " if paired else "") + evaluation.describe()


def unpaired_reason(versus_name: str, point) -> str:
    """Why a promotion's partial value is its own value on a few samples, not a difference from the plan it was
    promoted from (that plan's stored result has no per-sample terms from this accuracy source)."""
    return (f"not paired with {versus_name}: its stored result has no per-sample terms from "
            f"{point.accuracy_source} (stored by an older mpstudio, or a metric of the whole set), so this is the "
            f"plan's own value on {point.samples} of {point.total} samples")


class PlanEvaluations:
    """The evaluation verbs of a StudioState (see its evaluate_plan, preview_plan and evaluate_baselines)."""

    def __init__(self, state):
        self._state = state
        self.points = ProvisionalPoints(state)

    def evaluate(self, plan: PrecisionPlan | None, streamed: bool, edit: bool, after: Job | None,
                 versus: PrecisionPlan | None = None) -> Job:
        state, points = self._state, self.points
        study = state.require_study()
        plan = plan or state.plan
        backend = state.backend
        if edit:
            for job in state.jobs:  # the plan it evaluates is no longer the one being edited
                if job.active and job.edit:
                    job.cancel()
                    if job.edit != plan.hash:
                        points.drop(job.edit)  # it may never start, and never clear its point

        def shown(point):
            def apply():
                if state.study is study and points.tracked(plan.hash):
                    paired = point.paired
                    anchored = paired.estimate() if paired is not None else None
                    # Paired with the plan it came from, the point is that plan's value on every sample plus the
                    # difference: a far tighter estimate than the plan's own value on a few samples.
                    value, low, high = anchored or (point.value, point.low, point.high)
                    detail = (f"measured on {point.samples} of {point.total} samples ({value_text(point.value)} there, "
                              f"interval {value_text(point.low)}-{value_text(point.high)})")
                    if anchored:
                        detail += (f"; drawn at {paired.versus}'s value on every sample plus the paired difference "
                                   f"{paired.describe()}")
                    unpaired = unpaired_reason(versus_name, point) if paired is None and versus_name else ""
                    points.set(plan.hash, plan_name, "partial", value, low, high,
                               point.latency.ms if point.latency is not None else np.nan, point.samples,
                               point.total, point.accuracy_source, detail + (f"; {unpaired}" if unpaired else ""),
                               paired, unpaired)
            state.post(apply)

        def work(progress, cancel):
            if after is not None:
                after.wait(5.0)  # quick: its predicted point shows before any measured one
            runner = state.runner_client()
            try:
                evaluation = study.evaluate(plan, backend, runner, progress=progress, cancel=cancel,
                                            partial=shown if streamed else None, first_samples=state.first_samples,
                                            versus=versus)
            except BaseException as exc:
                def drop():  # unless a newer evaluation of the same plan draws it now
                    if not any(other.active and other.edit == plan.hash and other is not job for other in state.jobs):
                        points.drop(plan.hash)
                state.post(drop)
                if isinstance(exc, BuildFailed):  # a result of the study: the plot marks it at once
                    state.post(state.refresh_evaluations)
                raise
            if not has_baselines(study, backend, runner):
                state.post(lambda: state.evaluate_baselines(backend))
            final.append(paired_on_every_sample(study, evaluation, versus))
            return evaluation
        final: list = []

        def done(evaluation):
            points.drop(plan.hash)
            if evaluation.plan_hash == state.plan.hash:
                with writable(state):
                    state.plan_id = evaluation.plan_id
            state.refresh_evaluations()
            with writable(state):
                state.message = first_words(evaluation, final[0] if final else None)
        plan_name = plan.short_name
        versus_name = stored_name(study, versus)
        points.track(plan.hash)
        job = state.submit("evaluate", f"evaluating {plan_name} on {backend}", work, done)
        job.edit = plan.hash if edit else ""
        return job

    def preview(self, plan: PrecisionPlan | None) -> tuple[Job | None, Job | None]:
        state, points = self._state, self.points
        study = state.require_study()
        plan = plan or state.plan
        report = state.report
        frame = state.evaluations
        # A promotion's first values are compared with the plan it was made from, on the same samples.
        versus = state.plan if state.plan.hash != plan.hash else None
        accuracy_source = frame["accuracy_source"].iloc[0] if len(frame) else None
        plan_name = plan.short_name

        # The plotted estimate-axis front has every column a prediction reads: no need to read the store.
        evaluated = frame if state.latency_source == "estimate" and len(frame) else None

        def work(progress, cancel):
            return study.predict(plan, report, accuracy_source, evaluated)

        def done(prediction):
            if not prediction.placed:
                with writable(state):
                    state.message = prediction.describe()
                return
            known = state.provisional
            if not points.tracked(plan.hash) or (known["plan_hash"] == plan.hash).any():
                return  # measured already (or its evaluation ended): a prediction has nothing to add
            points.set(plan.hash, plan_name, "predicted", prediction.value, np.nan, np.nan, prediction.latency.ms,
                       0, len(study.evaluation_data), "prediction", prediction.basis)
        points.track(plan.hash)
        if basis_ready(study):  # milliseconds: drawn in this very update
            done(work(None, None))
            predicting = None
        else:
            predicting = state.submit("predict", f"predicting {plan_name}", work, done)
        # Served, the evaluation (and its job's rows) start in the next update, so that this one, with the
        # predicted point, reaches the browser first.
        evaluating: list[Job] = []
        state.post(lambda: evaluating.append(state.evaluate_plan(plan, edit=True, after=predicting, versus=versus)))
        return predicting, (evaluating[0] if evaluating else None)

    def baselines(self, backend: str | None) -> Job:
        state = self._state
        study = state.require_study()
        backend = backend or state.backend

        def work(progress, cancel):
            runner = state.runner_client()
            return study.baselines(backend, runner, progress=progress, cancel=cancel)

        def done(result):
            state.refresh_evaluations()
        return state.submit("baselines", f"evaluating the baselines (a8w8, a16w8) on {backend}", work, done)
