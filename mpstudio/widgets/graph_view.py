"""GraphView: the model as a top-to-bottom DAG, coloured by a score, 8/16-bit visible, with a minimap.

The figures are built once; a new layout (collapse/expand) replaces the sources' data, anything else patches
the columns that changed. StudioState.selection is the one selection: the figure renders it and a box select or
tap sets it. State changes reach the figures on the session's event loop, holding the document lock.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import panel as pn
import param
from bokeh.models import (BoxSelectTool, ColorBar, ColumnDataSource, CustomJSHover, HoverTool, LinearColorMapper,
                          Range1d, RangeTool, TapTool, WheelZoomTool)
from bokeh.palettes import RdYlGn11, YlOrRd9
from bokeh.plotting import figure
from bokeh.transform import factor_cmap, factor_mark

from .base import View, laid_out_once, on_document_thread, on_model_change, shows_errors
from .graph_label_layer import NodeLabels
from .source_updates import same_values
from .state import StudioState
from .tensor_frame import SCORE_ATTENTION, SCORES

WINDOW_LAYERS = 36  # layers shown at first in a tall graph; the minimap shows them all
_LABELS = {v: k for k, v in SCORES.items()}
# How a namespace node summarises its members' scores.
_AGGREGATE = {"snr_db": np.nanmin, "cosine": np.nanmin, "isolation_gain": np.nanmax, "latency_share": np.nansum,
              "rank": np.nanmin, "local_snr_8": np.nanmin, "divergence": np.nanmax}
_MARKERS = {"8": "circle", "16": "square", "8+16": "diamond", "-": "triangle"}
_HOVER_COLUMNS = ["snr_db", "cosine", "isolation_gain", "latency_share", "rank", "local_snr_8", "divergence"]
_NUMERIC = {"score", "line_width", *_HOVER_COLUMNS}
# Columns that depend on scores and the plan (patched); the rest depend on the layout only (replaced).
_STYLE_COLUMNS = ["score", "bits", "line_width", "tensor", *_HOVER_COLUMNS]
_BITS = list(_MARKERS)
# A score in a node's tooltip, "$index{COLUMN DIGITS[%] [UNIT]}": the hovered row's value; one the node lacks (NaN:
# not analysed yet, no HTP run of the plan) reads "-", as in the ranking, never "NaN". (BokehJS writes "NaN" for a
# NaN field before any formatter of the field sees it; the row's index is never NaN.)
_SCORE_OR_DASH = """
    const [column, digits, ...unit] = format.split(" ");
    const values = source.get_column(column);
    const score = values == null ? null : values[value];
    if (score == null || Number.isNaN(score)) return "-";
    const percent = digits.endsWith("%");
    const text = (percent ? 100 * score : score).toFixed(parseInt(digits)) + (percent ? "%" : "");
    return unit.length ? text + " " + unit.join(" ") : text;
"""


class GraphView(View):
    """The graph: tap or box-select nodes, promote/demote them, find by name, collapse namespaces."""

    state = param.ClassSelector(class_=StudioState)

    def __init__(self, **params):
        super().__init__(**params)
        self._syncing = False
        self._node_tensors: list[list[str]] = []  # per drawn node (source row): its activation tensors
        self._row_of_tensor: dict[str, int] = {}
        self._labels: list[str] = []
        self.nodes = ColumnDataSource(data=self._empty())
        self._centred = False  # the view was moved to the top-ranked tensor since the last layout
        self._centred_view: tuple = ()  # (tensor, y start, y end) of that move
        # All edges as one polyline broken by NaNs: one binary array each way instead of thousands of lists.
        self.edges = ColumnDataSource(data={"x": np.zeros(0), "y": np.zeros(0)})
        # Nodes a study runs on ORT's CPU EP (allow_fallback): a red cross over them, "[CPU]" after their label.
        self.cpu_nodes = ColumnDataSource(data={"x": np.zeros(0), "y": np.zeros(0)})
        self.mapper = LinearColorMapper(palette=list(RdYlGn11)[::-1], low=0, high=1, nan_color="#d9d9d9")
        self.figure = self._main_figure()
        self.minimap = self._minimap()
        on_model_change(self.nodes.selected, "indices", self._on_figure_selection)

        state = self.state
        self._promote = pn.widgets.Button(name="Promote to 16-bit", button_type="primary", width=140)
        self._demote = pn.widgets.Button(name="Demote to 8-bit", button_type="default", width=130)
        self._expand = pn.widgets.Button(name="Expand all", button_type="light", width=90)
        self._promote.on_click(self._on_promote)
        self._demote.on_click(self._on_demote)
        self._expand.on_click(self._on_expand)
        # Labels are left out to keep the bar compact: placeholders and the colour bar's title say what each is.
        self._color = pn.widgets.Select.from_param(state.param.color_by, name="", width=140,
                                                   description="Colour the nodes by this score")
        self._find = pn.widgets.TextInput.from_param(state.param.query, name="", placeholder="find a name (or *pattern*)",
                                                     width=180)
        self._collapse = pn.widgets.MultiChoice.from_param(state.param.collapsed, name="", width=240,
                                                           placeholder="collapse namespaces")
        self._summary = pn.pane.HTML("", margin=(12, 10, 0, 10))

        state.param.watch(self._on_layout, "layout")
        state.param.watch(self._on_scores, ["tensors", "color_by"])
        state.param.watch(self._on_selection, "selection")
        state.param.watch(self._on_focus, "focus")
        self._draw()

    # ---- layout only ----
    @laid_out_once
    def __panel__(self):
        tools = pn.FlexBox(self._promote, self._demote, self._summary, pn.layout.HSpacer(), self._color, self._find,
                           self._collapse, self._expand, flex_wrap="wrap", align_items="center",
                           sizing_mode="stretch_width")
        legend = pn.pane.HTML(
            "<span style='font-size:12px;color:#444'>&#9679; 8-bit &nbsp; &#9632; 16-bit &nbsp; &#9670; mixed "
            "&nbsp; &#9650; not quantized &nbsp; <span style='color:#d62728'>&#10005;</span> runs on CPU (fallback) "
            "&nbsp;|&nbsp; drag a box to select, shift-click to add; the minimap "
            "box pans the view</span>", margin=(0, 10))
        return pn.Column(
            tools, legend,
            pn.Row(pn.pane.Bokeh(self.minimap, sizing_mode="fixed"),
                   pn.pane.Bokeh(self.figure, sizing_mode="stretch_both"), sizing_mode="stretch_both"),
            sizing_mode="stretch_both", min_height=520,
        )

    # ---- figures, built once ----
    @staticmethod
    def _empty() -> dict:
        columns = ["id", "x", "y", "op", "size", *_STYLE_COLUMNS]
        return {c: [] for c in columns}

    def _main_figure(self):
        fig = figure(x_range=Range1d(-3, 3), y_range=Range1d(-WINDOW_LAYERS, 1), tools="pan,reset",
                     sizing_mode="stretch_both", min_height=480, min_width=300, output_backend="canvas",
                     toolbar_location="above", name="graph")
        fig.axis.visible = False
        fig.grid.visible = False
        fig.outline_line_color = None
        fig.line("x", "y", source=self.edges, line_color="#9aa0a6", line_width=1, line_alpha=0.8)
        # Marker and outline follow the precision through transforms run in the browser: one short string
        # column travels instead of three.
        nodes = fig.scatter("x", "y", source=self.nodes, marker=factor_mark("bits", list(_MARKERS.values()), _BITS),
                            size="size", fill_color={"field": "score", "transform": self.mapper},
                            line_color=factor_cmap("bits", ["#666666", "#111111", "#111111", "#666666"], _BITS),
                            line_width="line_width", selection_line_color="#d6008f", selection_line_width=3,
                            nonselection_fill_alpha=0.6, nonselection_line_alpha=0.7, name="nodes")
        fig.scatter("x", "y", source=self.cpu_nodes, marker="x", size=20, line_color="#d62728", line_width=2.5,
                    name="cpu_fallback")
        # Labels near the visible window, none over another (see NodeLabels).
        self.labels = NodeLabels(fig, self.nodes, lambda: (self._labels, self._node_tensors))
        hover = HoverTool(renderers=[nodes], tooltips=[
            ("tensor", "@tensor"), ("node", "@id"), ("op", "@op"), ("bits", "@bits"),
            ("SNR", "$index{snr_db 2 dB}"), ("cosine", "$index{cosine 4}"),
            ("local SNR 8-bit", "$index{local_snr_8 1 dB}"), ("isolation gain", "$index{isolation_gain 4}"),
            ("rank", "$index{rank 0}"), ("latency share", "$index{latency_share 1%}"),
            ("HTP vs CPU", "$index{divergence 2 steps RMS}")],
            formatters={"$index": CustomJSHover(args={"source": self.nodes}, code=_SCORE_OR_DASH)})
        wheel = WheelZoomTool()
        fig.add_tools(hover, TapTool(renderers=[nodes]), wheel)
        fig.toolbar.active_scroll = wheel
        box = BoxSelectTool(renderers=[nodes])
        fig.add_tools(box)
        fig.toolbar.active_drag = box
        self.color_bar = ColorBar(color_mapper=self.mapper, width=10, title="SNR (dB)", title_text_font_size="11px",
                                  major_label_text_font_size="10px")
        fig.add_layout(self.color_bar, "right")
        self._hover = hover
        return fig

    def _minimap(self):
        mini = figure(width=110, height=560, x_range=Range1d(-3, 3), y_range=Range1d(-10, 1), tools="",
                      toolbar_location=None, output_backend="canvas", name="minimap")
        mini.axis.visible = False
        mini.grid.visible = False
        mini.min_border = 2
        mini.line("x", "y", source=self.edges, line_color="#c4c7ca", line_width=0.6)
        mini.scatter("x", "y", source=self.nodes, size=3, line_color=None,
                     fill_color={"field": "score", "transform": self.mapper}, nonselection_fill_alpha=1.0,
                     selection_fill_color="#d6008f")
        self._range_tool = RangeTool(x_range=self.figure.x_range, y_range=self.figure.y_range)
        self._range_tool.overlay.fill_color = "#1f77b4"
        self._range_tool.overlay.fill_alpha = 0.15
        mini.add_tools(self._range_tool)
        return mini

    # ---- data ----
    def _draw(self) -> None:
        """Replace the sources' data for the state's layout (a new model or a collapse/expand)."""
        layout = self.state.layout
        if layout is None:
            return
        nodes = layout.nodes
        tensors = self.state.tensors
        by_node: dict[str, list[str]] = {}
        for tensor, node in zip(tensors["tensor"], tensors["node"]):
            by_node.setdefault(node, []).append(tensor)
        inputs = set(tensors["tensor"]) if len(tensors) else set()
        self._node_tensors = []
        for node_id in nodes["id"]:
            found: list[str] = []
            for member in layout.members[node_id]:
                found += by_node.get(member, [])
                if node_id.startswith("input:") and member in inputs:
                    found.append(member)
            self._node_tensors.append(found)
        self._row_of_tensor = {t: i for i, ts in enumerate(self._node_tensors) for t in ts}
        # Op nodes are labelled with the tensor they produce too: names are what the ranking and find speak.
        self._labels = [f"{label} ({size})" if kind == "namespace" else
                        f"{label}  {_short(ts[0])}" if len(ts) == 1 and kind == "op" else label
                        for label, kind, size, ts in zip(nodes["label"], nodes["kind"], nodes["size"],
                                                         self._node_tensors)]
        study = self.state.study
        on_cpu = set(study.prepared.fallback_nodes) if study is not None else set()
        cpu_rows = [i for i, node_id in enumerate(nodes["id"]) if on_cpu.intersection(layout.members[node_id])]
        for i in cpu_rows:
            self._labels[i] += "  [CPU]"
        data = {
            "id": nodes["id"].tolist(), "x": nodes["x"].to_numpy(float), "y": nodes["y"].to_numpy(float),
            "op": [op or "namespace" for op in nodes["op"]], "size": np.where(nodes["kind"] == "namespace", 22.0, 13.0),
        }
        # Numbers travel as binary arrays, not JSON lists.
        data.update({c: np.asarray(v, dtype=float) if c in _NUMERIC else v for c, v in self._node_styles().items()})
        self._syncing = True
        try:
            self.nodes.selected.indices = []
            self.nodes.data = data
            self.edges.data = _polyline(layout.edges)
            self.cpu_nodes.data = {"x": data["x"][cpu_rows], "y": data["y"][cpu_rows]}
        finally:
            self._syncing = False
        self._fit_ranges()
        self._centred = False
        self._centre_on_top_ranked()
        self._style_mapper()
        self._draw_selection()

    def _node_styles(self) -> dict:
        return node_styles(self._node_tensors, self.state.tensors, self.state.color_by)

    def _style_mapper(self) -> None:
        score = self.state.color_by
        values = np.asarray(self.nodes.data.get("score", []), dtype=float)
        finite = values[np.isfinite(values)]
        low, high = (float(np.percentile(finite, 2)), float(np.percentile(finite, 98))) if len(finite) else (0.0, 1.0)
        if high <= low:
            high = low + 1e-9
        palette = list(RdYlGn11)[::-1] if SCORE_ATTENTION[score] == "low" else list(YlOrRd9)[::-1]
        if score == "rank":
            palette = palette[::-1]  # rank 1 (promote first) is the one that needs attention
        self.mapper.update(low=low, high=high, palette=palette)
        self.color_bar.title = _LABELS.get(score, score)

    def _fit_ranges(self) -> None:
        data = self.nodes.data
        if not len(data["x"]):
            return
        xs, ys = np.asarray(data["x"]), np.asarray(data["y"])
        top = float(ys.max())
        window = min(WINDOW_LAYERS, float(top - ys.min()) + 1)
        visible = ys >= top - window
        x0, x1 = float(xs[visible].min()), float(xs[visible].max())
        width = max(x1 - x0 + 4, 6)
        mid = (x0 + x1) / 2
        self.figure.x_range.update(start=mid - width / 2, end=mid + width / 2 + 1.5)
        self.figure.y_range.update(start=top - window, end=top + 1)
        self.minimap.x_range.update(start=float(xs.min()) - 1, end=float(xs.max()) + 1)
        self.minimap.y_range.update(start=float(ys.min()) - 1, end=top + 1)
        self.labels.keep_readable()

    # ---- state -> figure ----
    def _in_document(self, update) -> None:
        """Run `update` (which touches Bokeh models) where that is safe. State changes arrive from widget
        callbacks that Panel runs on the event loop without the document lock, and from worker threads; a
        served figure is changed in a next-tick callback, which holds the lock, and in one batch."""
        on_document_thread(self.figure, update, next_tick=True)

    def _on_layout(self, *_):
        self._in_document(self._draw)

    def _on_scores(self, *_):
        self._in_document(self._restyle)

    def _restyle(self) -> None:
        if len(self._node_tensors) != len(self.nodes.data["id"]) or self.state.layout is None:
            return
        if len(self.state.tensors) and not self._row_of_tensor:
            self._draw()  # the tensors arrived after the layout
            return
        new = self._node_styles()
        n = len(self.nodes.data["id"])
        patch = {c: [(slice(0, n), v)] for c, v in new.items() if not same_values(self.nodes.data[c], v)}
        if patch:
            self.nodes.patch(patch)
        self._style_mapper()
        self._centre_on_top_ranked()
        self.labels.fill(force=True)  # the ranking orders which labels win a crowded place

    def _on_selection(self, *_):
        count = len(self.state.selection)
        self._summary.object = f"<b>{count}</b> tensor(s) selected" if count else ""
        self._in_document(self._draw_selection)

    def _draw_selection(self) -> None:
        rows = sorted({self._row_of_tensor[t] for t in self.state.selection if t in self._row_of_tensor})
        if sorted(self.nodes.selected.indices) != rows:
            self._syncing = True
            try:
                self.nodes.selected.indices = rows
            finally:
                self._syncing = False
        self.labels.fill(force=True)  # selected nodes' labels go first

    def _on_focus(self, event):
        self._in_document(partial(self._scroll_to, event.new))

    def _centre_on_top_ranked(self) -> None:
        """Once per layout, when the ranking is known: show the most sensitive region, not the model's top. A
        ranking that changes its head before the user has moved the window moves it again."""
        if self.state.focus:
            return
        tensors = self.state.tensors
        ranked = tensors.dropna(subset=["rank"]) if len(tensors) else tensors
        if not len(ranked):
            return
        top = ranked.loc[ranked["rank"].idxmin(), "tensor"]
        y_range = self.figure.y_range
        if self._centred:
            moved = self._centred_view[1:] != (y_range.start, y_range.end)
            if moved or self._centred_view[0] == top:
                return
        # Centred once it has been drawn: a ranking that arrives before its tensors have rows waits for them.
        self._centred = self._scroll_to(top)
        self._centred_view = (top, y_range.start, y_range.end) if self._centred else ()

    def _scroll_to(self, tensor: str) -> bool:
        """Move the window onto `tensor`'s node; False when the graph has no row for it (yet)."""
        row = self._row_of_tensor.get(tensor)
        if row is None or row >= len(self.nodes.data["y"]):
            return False
        x, y = self.nodes.data["x"][row], self.nodes.data["y"][row]
        y_range, x_range = self.figure.y_range, self.figure.x_range
        height = y_range.end - y_range.start
        ys = np.asarray(self.nodes.data["y"], dtype=float)
        top, bottom = float(ys.max()) + 1, float(ys.min()) - 1
        # Centred on the node, but not past the graph's ends (no half-empty window at the top or bottom).
        start = min(max(y - height / 2, bottom), top - height) if top - bottom > height else y - height / 2
        y_range.update(start=start, end=start + height)
        if not x_range.start < x < x_range.end:
            half_x = (x_range.end - x_range.start) / 2
            x_range.update(start=x - half_x, end=x + half_x)
        # A move made here, inside a held document, never reaches the ranges' on_change callbacks (Panel writes
        # held events straight to the browser): the labels follow the window explicitly.
        self.labels.fill()
        return True

    # ---- figure -> state ----
    @shows_errors
    def _on_figure_selection(self, attr, old, new):
        if self._syncing:
            return
        tensors = [t for i in new if i < len(self._node_tensors) for t in self._node_tensors[i]]
        self.state.select(tensors)

    @shows_errors
    def _on_promote(self, event):
        self.state.promote_selected()

    @shows_errors
    def _on_demote(self, event):
        self.state.demote_selected()

    @shows_errors
    def _on_expand(self, event):
        self.state.expand()


def node_styles(node_tensors: list[list[str]], tensors, score: str) -> dict:
    """Per drawn node (its activation tensors in `node_tensors`): the `score` colouring it, its 8/16-bit marker
    and outline, and the hover values, from StudioState.tensors."""
    # Plain dicts: a per-row DataFrame lookup is far too slow for thousands of nodes.
    bits_of = dict(zip(tensors["tensor"], tensors["bits"])) if len(tensors) else {}
    values_of = {c: dict(zip(tensors["tensor"], tensors[c].astype(float))) for c in _HOVER_COLUMNS} \
        if len(tensors) else {}
    columns = {c: [] for c in _STYLE_COLUMNS}
    for ts in node_tensors:
        ts = [t for t in ts if t in bits_of]
        if not ts:
            bits, values, tensor = "-", {c: math.nan for c in _HOVER_COLUMNS}, ""
        else:
            kinds = {bits_of[t] for t in ts}
            bits = "16" if kinds == {16} else "8" if kinds == {8} else "8+16"
            if len(ts) == 1:
                values = {c: values_of[c][ts[0]] for c in _HOVER_COLUMNS}
                tensor = ts[0]
            else:
                values = {c: _aggregate(c, np.array([values_of[c][t] for t in ts])) for c in _HOVER_COLUMNS}
                tensor = f"{ts[0]} (+{len(ts) - 1} more)"
        columns["tensor"].append(tensor)
        columns["bits"].append(bits)
        columns["line_width"].append(2.6 if bits in ("16", "8+16") else 0.8)
        for c in _HOVER_COLUMNS:
            columns[c].append(values[c])
        columns["score"].append(values[score] if score in values else math.nan)
    return columns


def _polyline(edges) -> dict:
    """Every edge's points, edges separated by NaN (a gap in a Bokeh line)."""
    xs, ys = [], []
    for ex, ey in zip(edges["xs"], edges["ys"]):
        xs += [*ex, math.nan]
        ys += [*ey, math.nan]
    return {"x": np.asarray(xs, dtype=float), "y": np.asarray(ys, dtype=float)}


def _short(name: str, width: int = 32) -> str:
    """A tensor name that fits beside its node: its end, which tells tensors of one block apart."""
    return name if len(name) <= width else "\u2026" + name[-(width - 1):]


def _aggregate(column: str, values: np.ndarray) -> float:
    if not np.isfinite(values).any():
        return math.nan
    return float(_AGGREGATE[column](values))
