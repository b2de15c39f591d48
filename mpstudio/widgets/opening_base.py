"""Where a studio starts: the best known base plan of the study (per-channel weights when they help, decided as
the search decides, `search.opening`), the sensitivity ranking of that base (promotions are ranked against the
plan they start from), and a hint when a stored base beats the current plan (BaseHint)."""

from __future__ import annotations

import html

import panel as pn
import param

from ..errors import MpstudioError
from ..plan import PrecisionPlan
from ..search.opening import BaseChoice, analysis_base, beating_bases, opening_base
from ..search.targets import named_baselines
from .analyses import analyze
from .base import View, shows_errors
from .constants import writable


class BaseOpening:
    """A StudioState's start: the base plan chosen (a job), made current, then its analysis."""

    def __init__(self, state):
        self.state = state
        self.choice: BaseChoice | None = None

    def start(self, adopted: bool):
        """The analysis's job: the current plan's base analysed, after choosing the base (unless another tab's plan
        was adopted: then its analysis, running or finished, is shown, and None returned when it has finished)."""
        state = self.state
        if adopted:
            return state.analyze() if state.report is None else None
        study = state.require_study()
        frame = state.evaluations
        source = frame["accuracy_source"].iloc[0] if len(frame) else study.accuracy_source(state.backend)

        def choose(cancel) -> BaseChoice:
            try:
                return opening_base(study, source, cancel)
            except MpstudioError as exc:  # no decision: the all-8-bit plan, and why
                return BaseChoice(PrecisionPlan.a8w8(), f"per-tensor uint8 weights ({exc})")

        return analyze(state, choose)

    def chosen(self, choice: BaseChoice) -> None:
        """Show the chosen base: current (unless the user has moved on from the opening plan) and said so."""
        state = self.state
        self.choice = choice
        if choice.plan.hash != state.plan.hash and state.plan.hash == PrecisionPlan.a8w8().hash:
            state.set_plan(choice.plan)
        with writable(state):
            state.message = (f"opened on {choice.plan.name}: {choice.reason}; promotions are ranked against "
                             f"{analysis_base(state.plan).name}")
        # Served, the per-channel baselines are measured in the background (they settle the choice and feed the
        # hint); a notebook's user calls measure_per_channel() when they want them.
        if choice.measure and state._membership.shared:
            self.measure_per_channel()

    def measure_per_channel(self):
        """The per-channel baselines (a8w8-pc, a16w8-pc) evaluated in the background, for the hint."""
        state = self.state
        study, backend = state.require_study(), state.backend
        named = named_baselines()

        def work(progress, cancel):
            runner = state.runner_client()
            return [study.evaluate(named[name], backend, runner, origin="baseline", progress=progress, cancel=cancel)
                    for name in ("a8w8-pc", "a16w8-pc")]
        return state.submit("baselines", f"evaluating the per-channel baselines (a8w8-pc, a16w8-pc) on {backend}",
                            work, lambda result: state.refresh_evaluations())


def distinct_values(a: float, b: float, digits: int = 4) -> tuple[str, str]:
    """`a` and `b` written with `digits` significant digits, or as many more (up to 8) as tell them apart: a
    hint that one plan beats another must not show the same number twice."""
    for n in range(digits, 9):
        left, right = f"{a:.{n}g}", f"{b:.{n}g}"
        if left != right:
            break
    return left, right


class BaseHint(View):
    """One line over the views when a stored base beats the current plan, with a button that loads it."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        self._text = pn.pane.HTML("", sizing_mode="stretch_width", margin=(4, 10), css_classes=["mpstudio-base-hint"])
        self._load = pn.widgets.Button(name="Load it", button_type="warning", width=90, height=30, margin=(4, 6))
        self._load.on_click(self._on_load)
        self._row = pn.Row(self._text, self._load, visible=False, sizing_mode="stretch_width", min_height=40,
                           styles={"background": "#fff7e0", "border": "1px solid #f0d48a", "border-radius": "6px"})
        self._best: int | None = None
        self.state.param.watch(self._refresh, ["evaluations", "plan"])
        self._refresh()

    def __panel__(self):
        return self._row

    def _refresh(self, *_):
        state = self.state
        study = state.study
        wins = beating_bases(state.evaluations, state.plan.hash, study.higher_is_better) if study else None
        if wins is None or wins.empty:
            self._best = None
            self._row.visible = False
            return
        best = wins.iloc[0]
        current = state.evaluations[state.evaluations["plan_hash"] == state.plan.hash].iloc[0]
        self._best = int(best["plan_id"])
        ours, theirs = distinct_values(float(best["value"]), float(current["value"]))
        self._text.object = (
            f"<span style='font-size:13px'>\u2191 <b>{html.escape(str(best['name']))}</b> beats the current plan: "
            f"{html.escape(study.metric_name)} {ours} at {best['latency_ms']:.3g} ms against "
            f"{theirs} at {current['latency_ms']:.3g} ms "
            f"({html.escape(str(best['latency_label']))}). Promotions from it may pay more.</span>")
        self._row.visible = True

    @shows_errors
    def _on_load(self, event):
        if self._best is not None:
            self.state.load_plan(self._best)
            self.state.analyze()  # the ranking of the loaded plan's base
