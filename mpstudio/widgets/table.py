"""SensitivityTable: the ranking of activation tensors (Tabulator: sort, filter), selection shared with the graph."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import panel as pn
import param
from bokeh.models.widgets.tables import NumberFormatter

from .base import View, laid_out_once, shows_errors
from .state import StudioState

# Shown columns, in order, with their titles.
COLUMNS = {"rank": "rank", "tensor": "tensor", "op": "op", "bits": "bits", "snr_db": "SNR dB", "cosine": "cosine",
           "local_snr_8": "local SNR 8b", "local_snr_16": "local SNR 16b", "isolation_gain": "isolation gain",
           "latency_share": "latency share", "namespace": "namespace"}

# The ranking table's least height: its header filters, a few rows and the pager.
TABLE_MIN_HEIGHT = 280
# Each column's type whatever the rows, the empty table's included: Panel rebuilds a Tabulator in the browser when a
# column's type changes, asynchronously, and an update meanwhile (its page count) reaches the half-built table.
COLUMN_TYPES = {"rank": "Int64", "tensor": str, "op": str, "bits": "Int64", "snr_db": float, "cosine": float,
                "local_snr_8": float, "local_snr_16": float, "isolation_gain": float, "latency_share": float,
                "namespace": str}


def ranking_frame(tensors: pd.DataFrame) -> pd.DataFrame:
    """The table's rows: ranked tensors first (rank 1 on top), then the unranked in graph order."""
    frame = tensors.copy()
    frame["_order"] = np.arange(len(frame))
    frame = frame.sort_values(["rank", "_order"], na_position="last", kind="stable")
    return frame[list(COLUMNS)].reset_index(drop=True).astype(COLUMN_TYPES)


def ranking_status(report) -> str:
    """The caption's note on how far the analysis behind the ranking got (partial rankings update live)."""
    if report is None:
        return "<span style='color:#666;font-size:12px'>no scores yet</span>"
    status = report.status()
    if not status:
        return ""
    color = "#b26b00" if report.partial or "warning:" in status else "#666"
    label = "partial: " if report.partial else ""
    return f"<span style='color:{color};font-size:12px'>{label}{html.escape(status)}</span>"


class SensitivityTable(View):
    """Click, shift-click or ctrl-click rows to select tensors; the graph selects them too, and back."""

    state = param.ClassSelector(class_=StudioState)

    def __init__(self, **params):
        super().__init__(**params)
        self._syncing = False
        number = NumberFormatter(format="0.00")
        self.table = pn.widgets.Tabulator(
            ranking_frame(self.state.tensors), show_index=False, selectable=True, disabled=True,
            sizing_mode="stretch_both", min_height=TABLE_MIN_HEIGHT, layout="fit_data_table", titles=COLUMNS,
            header_filters={"tensor": {"type": "input", "func": "like", "placeholder": "filter"},
                            "op": {"type": "input", "func": "like", "placeholder": "op"},
                            "bits": {"type": "number", "func": "=", "placeholder": "bits"},
                            "namespace": {"type": "input", "func": "like", "placeholder": "namespace"}},
            formatters={"snr_db": number, "cosine": NumberFormatter(format="0.0000"), "local_snr_8": number,
                        "local_snr_16": number, "isolation_gain": NumberFormatter(format="0.0000"),
                        "latency_share": NumberFormatter(format="0.0%")},
            frozen_columns=["rank", "tensor"], pagination="local", page_size=20,
        )
        self.status = pn.pane.HTML(ranking_status(self.state.report), margin=(0, 10), name="sensitivity-status",
                                   sizing_mode="stretch_width", min_height=36,
                                   css_classes=["mpstudio-ranking-status"])
        self.table.param.watch(self._on_table_selection, "selection")
        self.state.param.watch(self._on_tensors, "tensors")
        self.state.param.watch(self._on_selection, "selection")
        self.state.param.watch(self._on_report, "report")

    @laid_out_once
    def __panel__(self):
        caption = pn.pane.HTML("<b>Sensitivity ranking</b> <span style='color:#666;font-size:12px'>(promote from the "
                               "top; click a header to sort, type in it to filter)</span>", margin=(4, 10, 0, 10),
                               sizing_mode="stretch_width", min_height=40,
                               css_classes=["mpstudio-ranking-caption"])
        # The caption and the analysis' status are full-width lines that wrap, never cut at the right edge; the
        # column keeps room for them and a page of rows, so nothing above is drawn over them.
        return pn.Column(caption, self.status, self.table, sizing_mode="stretch_both")

    def _on_report(self, *_):
        self.status.object = ranking_status(self.state.report)

    # ---- state -> table ----
    def _on_tensors(self, *_):
        new = ranking_frame(self.state.tensors)
        old = self.table.value
        if len(old) == len(new) and old["tensor"].tolist() == new["tensor"].tolist():
            changed = [c for c in new.columns if not new[c].equals(old[c])]
            if changed:  # same rows (a new plan): patch the columns that moved, keep sort, filters and scroll
                self.table.patch(new[changed].astype(object).where(new[changed].notna(), None))
        else:
            self._syncing = True
            try:
                self.table.value = new
            finally:
                self._syncing = False
        self._on_selection()

    def _on_selection(self, *_):
        frame = self.table.value
        wanted = set(self.state.selection)
        rows = [i for i, t in enumerate(frame["tensor"]) if t in wanted] if wanted else []
        if sorted(self.table.selection) != rows:
            self._syncing = True
            try:
                self.table.selection = rows
            finally:
                self._syncing = False

    # ---- table -> state ----
    @shows_errors
    def _on_table_selection(self, event):
        if self._syncing:
            return
        frame = self.table.value
        self.state.select([frame["tensor"].iat[i] for i in event.new if i < len(frame)])
