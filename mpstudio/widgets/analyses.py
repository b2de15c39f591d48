"""The analyses a studio session runs on its open study, as jobs that report back to its StudioState: the
sensitivity ranking, the search for a plan, and the current plan's latency estimate and HTP/CPU divergence (two
of the scores the graph can be coloured by)."""

from __future__ import annotations

import time


from ..plan import PrecisionPlan
from ..search.opening import analysis_base
from ..sensitivity import SensitivityReport
from .lanes import Job
from .constants import writable


def analyze(state, choose=None) -> Job:
    """The sensitivity analysis of the current plan's base (a8w8, or a8w8-pc for per-channel weights), its partial
    rankings shown as they come. `choose(cancel)`: a `search.opening.BaseChoice` made first, in the same job (the
    study's opening), whose plan becomes current and whose base is analysed."""
    study = state.require_study()
    base = [analysis_base(state.plan)]  # promotions are ranked against the plan they start from
    shown = [0.0, ""]

    def partial(report: SensitivityReport) -> None:
        # Partial rankings reach the table as they come (at most one a second, and each new stage).
        now, stage = time.perf_counter(), report.meta.get("stage", "")
        if now - shown[0] >= 1.0 or stage != shown[1]:
            shown[:] = [now, stage]
            # A tab that has gone is shown none (its views would slow the analysis that runs on for the tabs to
            # come); the study's other tabs, and a tab that came back, are.
            if not state._lanes.gone:
                state.post(lambda: state.show_report(report) if state.study is study else None)
            state._membership.share_partial(report)

    def work(progress, cancel):
        if choose is not None:
            choice = choose(cancel)
            base[0] = analysis_base(choice.plan)
            state.post(lambda: state.opening.chosen(choice) if state.study is study else None)
        plan = None if base[0].hash == PrecisionPlan.a8w8().hash else base[0]
        return study.sensitivity(progress=progress, cancel=cancel, on_partial=partial, plan=plan)

    named = base[0].name if base[0].hash != PrecisionPlan.a8w8().hash else ""
    title = "sensitivity analysis" + (f" of {named}" if named else "")
    return state.submit("analyze", title, work, state.show_report)


def start_search(state, target: str | None, max_evaluations: int) -> Job:
    """The search for the cheapest plan that reaches `target`; each evaluation is plotted as it lands."""
    from ..search import search

    study = state.require_study()
    target = target or state.target
    backend, confirm, weights = state.backend, state.confirm_search, state.search_weights
    confirm_on = "htp" if confirm and backend != "htp" else None

    def refresh():
        if state.study is study:
            state.refresh_evaluations()

    def work(progress, cancel):
        phases = SearchPhases(progress, backend, confirm_on)

        def step(done, total, message):
            phases(done, total, message)
            if message.startswith("search: "):  # an evaluation has landed in the study: plot it now
                state.post(refresh)
        try:
            return search(study, target, backend=backend, runner=state.runner_client(), weights=weights,
                          max_evaluations=max_evaluations, confirm="htp" if confirm else None, progress=step,
                          cancel=cancel)
        finally:  # cancelled or failed too: what was evaluated stays on the plot
            state.post(refresh)

    def done(result):
        state.refresh_evaluations()
        state.set_plan(study.plan(result.recommended.plan_id))
        r = result.recommended
        verdict = "within noise of" if result.within_noise else "reaches" if result.reached else "misses"
        with writable(state):  # the whole answer is in the search card
            state.param.update(search_result=result, message=f"search: plan {r.plan_id} {r.name} recommended "
                                                             f"({verdict} {target}); see the search result card")
    return state.submit("search", search_title(target, backend, confirm_on, weights), work, done)


def search_title(target: str, backend: str, confirm_on: str | None, weights: str = "auto") -> str:
    """The search job's title: where its phases run, and its weights when not automatic."""
    return (f"searching for {target}: walk on {backend}" + (f", {weights} weights" if weights != "auto" else "") +
            (f", confirmed on {confirm_on}" if confirm_on else ""))


class SearchPhases:
    """The search job's progress in named phases, one counter each (plans walked, plans confirmed), whatever
    the inner steps (samples, tensors) report: they go to the message, not the counter."""

    def __init__(self, progress, backend: str, confirm_on: str | None):
        self.progress, self.backend, self.confirm_on = progress, backend, confirm_on
        self.name, self.done, self.total = "preparing (baselines and analysis)", 0, 0

    def __call__(self, done, total, message: str) -> None:
        if message.startswith("search: confirmed"):
            self.name, self.done, self.total = f"confirming on {self.confirm_on or 'htp'}: plans", done, total
        elif message.startswith("search: "):
            self.name, self.done, self.total = f"walk on {self.backend}: plans evaluated", done, total
        detail = message[len("search: "):] if message.startswith("search: ") else message
        self.progress(self.done, self.total, f"{self.name} \u00b7 {detail}")


def estimate_latency(state) -> Job:
    """The HTP cost model's per-op latency of the current plan (`state.latency_ops`)."""
    from ..latency import estimate_latency as estimate

    study = state.require_study()
    plan = state.plan

    def work(progress, cancel):
        return estimate(study.quantizer.generate(plan, progress, cancel), study.htp_arch)

    def done(estimate):
        if plan.hash != state.plan.hash:
            return  # the plan changed meanwhile; its own estimate is on its way
        with writable(state):
            state.param.update(latency_ops=estimate.ops,
                               message=f"estimated latency {estimate.ms:.3f} ms ({estimate.latency.label})")
        state.refresh_tensors()
    return state.submit("latency", f"estimating the latency of {plan.short_name}", work, done)


def find_divergence(state, samples: int) -> Job:
    """The current plan's HTP/CPU divergence table (`state.divergence`): the study's saved one, else a run."""
    from ..diverge import diverge, load_report

    study = state.require_study()
    plan = state.plan

    def work(progress, cancel):
        plan_id = study.plan_id(plan)
        saved = load_report(study, plan_id) if plan_id is not None else None
        if saved is not None:
            return saved
        return diverge(study, plan, samples=samples, runner=state.runner_client(), progress=progress,
                       cancel=cancel).frame

    def done(frame):
        if plan.hash != state.plan.hash:
            return
        first = frame.loc[frame["first"].astype(bool), "tensor"].tolist()
        with writable(state):
            state.param.update(divergence=frame, plan_id=study.plan_id(plan),
                               message=f"first HTP/CPU divergence: {', '.join(first[:5])}" if first else
                               "HTP and CPU agree within quantization noise on every tensor")
        state.refresh_tensors()
        if first:
            with writable(state):
                state.focus = first[0]
    return state.submit("diverge", f"comparing {plan.short_name} on HTP and CPU", work, done)
