"""BlocksView: scores, latency and promotion cost totalled per block (a namespace cut at a chosen depth: a
transformer layer, an attention block), sortable, with a block's tensors selected or promoted in one click."""

from __future__ import annotations

import pandas as pd
import panel as pn
import param
from bokeh.models.widgets.tables import NumberFormatter

from ..loop.blocks import BLOCK_COLUMNS, ROOT, block_tensors, block_totals, default_depth
from .base import View, shows_errors

TITLES = {"block": "block", "tensors": "tensors", "sixteen_bit": "16-bit", "min_snr_db": "min SNR dB",
          "mean_snr_db": "mean SNR dB", "gain_db": "\u03a3 isolation gain dB", "estimate_ms": "estimate ms",
          "share": "share", "added_ms": "added ms", "promote_ms": "promote ms", "gain_per_ms": "gain dB/ms"}


class BlocksView(View):
    """Per-block totals of the current plan; `latency` is the studio's NodeLatencyView (its per-node times)."""

    state = param.Parameter()
    latency = param.Parameter()
    depth = param.Integer(2, bounds=(1, 8), doc="How many namespace levels make a block")

    def __init__(self, **params):
        super().__init__(**params)
        self._on_study()
        number = NumberFormatter(format="0.000")
        self.table = pn.widgets.Tabulator(pd.DataFrame(columns=BLOCK_COLUMNS), show_index=False, disabled=True,
                                          selectable=1, sizing_mode="stretch_both", min_height=220,
                                          layout="fit_data_table", titles=TITLES,
                                          formatters={c: number for c in ("estimate_ms", "added_ms", "promote_ms")} |
                                          {c: NumberFormatter(format="0.0") for c in ("min_snr_db", "mean_snr_db",
                                                                                      "gain_db", "gain_per_ms")} |
                                          {"share": NumberFormatter(format="0.0%")})
        self._depth = pn.widgets.IntInput.from_param(self.param.depth, name="block depth", width=100)
        self._select = pn.widgets.Button(name="Select block", button_type="light", width=110, height=32,
                                         margin=(22, 4))
        self._promote = pn.widgets.Button(name="Promote block to 16-bit", button_type="primary", width=180,
                                          height=32, margin=(22, 4))
        self._select.on_click(self._on_select)
        self._promote.on_click(self._on_promote)
        self._note = pn.pane.HTML("", sizing_mode="stretch_width", margin=(2, 8))
        self.state.param.watch(self._on_study, ["study"])
        self.state.param.watch(self._refresh, ["tensors"])
        self.latency.param.watch(self._refresh, ["result", "promotion"])
        self.param.watch(self._refresh, ["depth"])
        self._refresh()

    def __panel__(self):
        return pn.Column(pn.Row(self._depth, self._select, self._promote), self._note, self.table,
                         sizing_mode="stretch_both", min_height=300)

    def _on_study(self, *_):
        if self.state.study is not None:  # blocks of a size to read: the deepest cut with a few dozen at most
            self.depth = default_depth([n.namespace for n in self.state.study.graph.nodes.values()])

    def frame(self) -> pd.DataFrame:
        times = self.latency.result
        return block_totals(self.state.tensors, times.frame if times is not None else None, self.depth,
                            self.latency.promotion)

    def _refresh(self, *_):
        if self.state.study is None or self.state.tensors.empty:
            return
        frame = self.table.value = self.frame()
        times = self.latency.result
        source = times.estimate_label if times is not None else "latency not estimated yet"
        self._note.object = (f"<span style='font-size:12px;color:#555'>blocks: namespaces cut at depth {self.depth}; "
                             f"scores from the sensitivity analysis; ms: {source}; promote ms: each 8-bit tensor "
                             f"promoted alone, summed (estimate)</span>{flat_note(frame)}")

    def _chosen(self) -> list[str]:
        rows = self.table.selection
        if not rows:
            self.state.show_error("select a block first (click its row)")
            return []
        block = self.table.value.iloc[rows[0]]["block"]
        return block_tensors(self.state.tensors, block, self.depth)

    @shows_errors
    def _on_select(self, event):
        self.state.select(self._chosen())

    @shows_errors
    def _on_promote(self, event):
        tensors = self._chosen()
        if tensors:
            self.state.select(tensors)
            self.state.promote_selected()


def flat_note(frame: pd.DataFrame) -> str:
    """A word when most tensors are outside any namespace (a model exported with flat node names): its blocks
    say little, and the graph's regions and the ranking are the better guide."""
    total = frame["tensors"].sum() if len(frame) else 0
    root = frame.loc[frame["block"] == ROOT, "tensors"].sum() if len(frame) else 0
    if not total or root < 0.8 * total:
        return ""
    return (f"<br><span class='mpstudio-flat-blocks' style='font-size:12px;color:#9a6700'>{root} of {total} tensors "
            f"are outside any namespace: this model's node names are flat, so its blocks say little (use the "
            f"ranking and the graph's regions)</span>")
