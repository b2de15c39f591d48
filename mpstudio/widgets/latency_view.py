"""NodeLatencyView: where the current plan's time goes, node by node (the cost model's estimate, what its
promotions add over its base, a kept per-op profile where a device or the emulator ran the plan), as a sortable
table and as the graph's colouring by latency share; each number's source named above the table."""

from __future__ import annotations

import html

import pandas as pd
import panel as pn
import param
from bokeh.models.widgets.tables import NumberFormatter

from ..latency import estimate_latency
from ..latency.promotion import promotion_costs
from ..loop.node_latency import kept_profile, node_latency
from ..search.opening import analysis_base
from .base import View, shows_errors
from .constants import writable

# The table's columns, in order: what a reader sorts by first (in view beside the node in a narrow window), then
# what the node is and where.
SHOWN = ["node", "estimate_ms", "share", "added_ms", "measured_ms", "op_type", "base_ms", "bits", "kind",
         "namespace"]
TITLES = {"node": "node", "op_type": "op", "namespace": "namespace", "kind": "kind", "bits": "bits",
          "estimate_ms": "estimate ms", "share": "share", "base_ms": "base ms", "added_ms": "added ms",
          "measured_ms": "measured ms"}


def plan_times(study, plan, plan_id, progress=None, cancel=None):
    """(NodeLatency of `plan`, the estimate, tensor -> ms of promoting each 8-bit tensor alone from the plan's base)."""
    base = analysis_base(plan)
    arch = study.cost_arch
    base_model = study.quantizer.generate(base, progress, cancel)
    estimate = estimate_latency(study.quantizer.generate(plan, progress, cancel), arch)
    base_estimate = estimate_latency(base_model, arch)
    times = node_latency(estimate, base_estimate, study.graph, base.name, kept_profile(study.folder, plan_id))
    eight = [t for t in study.graph.activations() if study.graph.tensors[t].quantizable]
    promotion = promotion_costs(base_model, eight, arch, study.graph)
    return times, estimate, promotion


class NodeLatencyView(View):
    """The current plan's per-node latency; recomputed (a quick job) whenever the plan changes."""

    state = param.Parameter()
    result = param.Parameter(None, doc="The current plan's loop.node_latency.NodeLatency")
    promotion = param.Parameter(None, doc="tensor -> estimated ms of promoting it alone from the plan's base")

    def __init__(self, **params):
        super().__init__(**params)
        self._header = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["mpstudio-latency-source"],
                                    styles={"overflow-wrap": "anywhere"})
        number = NumberFormatter(format="0.0000")
        self.table = pn.widgets.Tabulator(pd.DataFrame(columns=SHOWN), show_index=False, disabled=True,
                                          sizing_mode="stretch_both", min_height=220, layout="fit_data_table",
                                          titles=TITLES, pagination="local", page_size=200,
                                          # the node stays in view while the table scrolls sideways
                                          widths={"node": 200, "namespace": 200}, frozen_columns=["node"],
                                          formatters={c: number for c in ("estimate_ms", "base_ms", "added_ms",
                                                                          "measured_ms")} |
                                          {"share": NumberFormatter(format="0.0%")},
                                          header_filters={"node": {"type": "input", "func": "like",
                                                                   "placeholder": "filter"},
                                                          "kind": {"type": "input", "func": "like"}},
                                          sorters=[{"field": "estimate_ms", "dir": "desc"}])
        self._colour = pn.widgets.Button(name="Colour the graph by latency share", button_type="light",
                                         width=260, height=30)
        self._colour.on_click(self._on_colour)
        self.state.param.watch(self._on_plan, ["plan", "study"])
        self.param.watch(self._show, "result")
        if self.state.study is not None:
            self.refresh()

    def __panel__(self):
        return pn.Column(self._header, self._colour, self.table, sizing_mode="stretch_both", min_height=300)

    def refresh(self):
        """Recompute for the current plan (a quick job)."""
        state = self.state
        study, plan, plan_id = state.study, state.plan, state.plan_id
        if study is None:
            return None

        def done(result):
            times, estimate, promotion = result
            if plan.hash != state.plan.hash:
                return
            self.param.update(result=times, promotion=promotion)
            with writable(state):  # the ranking's latency-share column and the graph's colouring
                state.latency_ops = estimate.ops
            state.refresh_tensors()
        return state.submit("latency", f"where the time goes in {plan.short_name}",
                            lambda progress, cancel: plan_times(study, plan, plan_id, progress, cancel), done)

    def _on_plan(self, *events):
        self.refresh()

    def _show(self, event):
        times = event.new
        if times is None:
            return
        frame = times.frame
        self.table.value = frame[SHOWN]
        measured = (f"measured column: <b>{html.escape(times.measured_label)}</b>" if times.measured_label else
                    "measured column: empty (no per-op profile of this plan yet: evaluate it on an agent's HTP)")
        self._header.object = (
            f"<div style='font-size:12px'>estimate column: <b>{html.escape(times.estimate_label)}</b>, "
            f"{frame['estimate_ms'].sum():.3f} ms over {len(frame)} ops; added over {html.escape(times.base_name)}: "
            f"{times.added_ms:+.3f} ms, of which {times.converts} 8\u219416-bit convert(s) {times.convert_ms:.3f} ms"
            f"<br>{measured}</div>")

    @shows_errors
    def _on_colour(self, event):
        self.state.color_by = "latency_share"
