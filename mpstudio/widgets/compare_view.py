"""CompareView: two plans side by side (any two stored plans, the current one by default): the tensors whose
precision differs, the 8<->16-bit converts each runs and their cost, and each plan's accuracy and latency with
their sources, and B minus A in accuracy on the same samples with its paired interval when both plans have
per-sample terms from one accuracy source."""

from __future__ import annotations

import html

import pandas as pd
import panel as pn
import param

from ..latency import estimate_latency
from ..loop.comparison import paired_from_store
from ..loop.plan_compare import DIFF_COLUMNS, compare_plans
from .base import View, shows_errors

CURRENT = "current plan"


class CompareView(View):
    """Pick plan A and plan B; Compare runs as a quick job."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        # The two choices share the row's width with the button, which stays in view in a narrow window.
        self._a = pn.widgets.Select(name="plan A", options=[CURRENT], value=CURRENT, sizing_mode="stretch_width",
                                    min_width=120, max_width=260)
        self._b = pn.widgets.Select(name="plan B", options=[CURRENT], value=CURRENT, sizing_mode="stretch_width",
                                    min_width=120, max_width=260)
        self._go = pn.widgets.Button(name="Compare", button_type="primary", width=100, height=32, margin=(22, 4))
        self._go.on_click(self._on_compare)
        # The row names whole ("converts ms (estimate)"); A and B side by side in the rest, a long source wrapped
        # in its cell (a narrow window would cut it).
        self._summary = pn.widgets.Tabulator(pd.DataFrame(), show_index=True, disabled=True, height=380,
                                             sizing_mode="stretch_width", layout="fit_columns",
                                             widths={"index": 170}, titles={"index": "", "a": "A", "b": "B"},
                                             formatters={"index": {"type": "textarea"}, "a": {"type": "textarea"},
                                                         "b": {"type": "textarea"}})
        self._diff = pn.widgets.Tabulator(pd.DataFrame(columns=DIFF_COLUMNS), show_index=False, disabled=True,
                                          sizing_mode="stretch_both", min_height=160, layout="fit_data_table",
                                          titles={"bits_a": "bits in A", "bits_b": "bits in B"})
        self._note = pn.pane.HTML("", sizing_mode="stretch_width", margin=(2, 8))
        self.state.param.watch(self._options, ["evaluations", "study", "plan_id"])
        self._options()

    def __panel__(self):
        return pn.Column(pn.Row(self._a, self._b, self._go, sizing_mode="stretch_width"), self._note, self._summary,
                         self._diff,
                         sizing_mode="stretch_both", min_height=300)

    def _options(self, *_):
        frame = self.state.evaluations
        options = [CURRENT]
        if len(frame):
            named = frame.drop_duplicates("plan_id").sort_values("plan_id")
            options += [f"{int(r.plan_id)}: {r.name}" for r in named.itertuples()]
        self._a.options, self._b.options = options, options
        # B: the most accurate other stored plan by default, again when the current plan becomes B's plan
        if (self._b.value == CURRENT or self._b.value.split(":", 1)[0] == str(self.state.plan_id)) and len(options) > 1:
            others = frame[(frame["plan_hash"] != self.state.plan.hash) & (frame["plan_id"] != self.state.plan_id)]
            if len(others) and self.state.study is not None:
                best = others.sort_values("value", ascending=not self.state.study.higher_is_better).iloc[0]
                self._b.value = f"{int(best.plan_id)}: {best['name']}"

    def _plan(self, choice: str):
        """The chosen plan, named as the study stores it (never by its hash when the study has a name for it)."""
        state = self.state
        study = state.require_study()
        plan_id = state.plan_id if choice == CURRENT else int(choice.split(":", 1)[0])
        return study.plan(plan_id) if plan_id is not None else state.plan

    def _paired(self, plan_a, plan_b):
        """(accuracy source, B minus A) from the study's stored per-sample terms, or None."""
        study = self.state.require_study()
        ids = [study.plan_id(plan) for plan in (plan_a, plan_b)]
        if None in ids or ids[0] == ids[1]:
            return None
        return paired_from_store(study.store, ids[1], ids[0], study.metric_name, study.higher_is_better)

    def compare(self, a: str | None = None, b: str | None = None):
        """Compare the chosen plans (or `a` and `b`: "current plan" or "ID: name") as a quick job."""
        state = self.state
        study = state.require_study()
        plan_a, plan_b = self._plan(a or self._a.value), self._plan(b or self._b.value)
        frame = state.evaluations

        def row(plan):
            hit = frame[frame["plan_hash"] == plan.hash] if len(frame) else frame
            return hit.iloc[0] if len(hit) else None

        def work(progress, cancel):
            arch = study.cost_arch
            estimates = [estimate_latency(study.quantizer.generate(p, progress, cancel), arch) for p in (plan_a, plan_b)]
            return compare_plans(study.graph, plan_a, plan_b, *estimates, row(plan_a), row(plan_b),
                                 study.metric_name, self._paired(plan_a, plan_b))

        def done(result):
            paired = (f"; <b>B \u2212 A: {html.escape(result.paired.describe())}</b> (paired, "
                      f"{html.escape(result.paired_source)})" if result.paired is not None else
                      "; A and B are the same plan" if plan_a.hash == plan_b.hash else
                      "; no paired difference: the two plans have no per-sample terms from one accuracy source")
            self._summary.value = result.summary
            self._diff.value = result.tensors
            self._note.object = (f"<span style='font-size:12px'><b>{len(result.tensors)}</b> activation tensor(s) "
                                 f"differ between A ({html.escape(plan_a.short_name)}) and B "
                                 f"({html.escape(plan_b.short_name)}); converts and estimate ms: the "
                                 f"cost model (HTP v{html.escape(str(study.htp_arch))}); "
                                 f"accuracy and latency: stored evaluations, sources named{paired}</span>")
        return state.submit("latency", f"comparing {plan_a.short_name} with "
                                       f"{plan_b.short_name}", work, done)

    @shows_errors
    def _on_compare(self, event):
        self.compare()
