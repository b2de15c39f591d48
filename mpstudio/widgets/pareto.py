"""ParetoPlot: accuracy against latency of every evaluated plan; the front highlighted, baselines marked, the
latency source in the axis label; a click on a point loads that plan. A plan being evaluated shows first as a
predicted point (a hollow diamond), then as a partial measurement with its interval (a whisker, clipped to at
most the measured values' span beyond them, so one wide interval does not squash the plot), until its full result
is stored; a promotion's partial value is also shown above the plot as its paired difference from the plan it was
made from, with that difference's interval. A plan the HTP cannot build is a cross at its estimated latency (over
its point when the plot shows one, else along the bottom edge), its tooltip saying why. The figure is built once;
a refresh patches and streams its sources."""

from __future__ import annotations

import html
import math

import pandas as pd
import panel as pn
import param
from bokeh.models import (ColumnDataSource, HoverTool, LabelSet, Legend, LegendItem, TapTool, Tooltip,
                          Whisker)
from bokeh.plotting import figure

from ..value_text import value_text
from .base import View, laid_out_once, on_document_thread, on_model_change, shows_errors
from .source_updates import update_source
from .state import StudioState

# Columns of the sources. Sources are updated through update_source: the rows that changed are patched, new
# rows streamed, and the data replaced only when rows disappear.
_POINTS = ["plan_id", "name", "origin", "value", "latency_ms", "sixteen_bit", "front", "color", "marker", "size",
           "accuracy_source", "latency_label", "interval"]
_PROVISIONAL = ["plan_hash", "name", "value", "low", "high", "latency_ms", "status", "interval", "detail",
                "accuracy_source", "paired", "verdict", "low_shown", "high_shown"]
_VERDICT_COLOURS = {"better": "#1a7f37", "worse": "#b42318", "within noise": "#555"}
# The same plans scored by another accuracy source (a search's HTP confirmation), linked to their point.
_CHECKS = ["plan_id", "name", "latency_ms", "value", "other_value", "other_source"]
# Plans a backend could not build: at their estimate, over their point or along the plot's bottom edge.
_UNBUILT = ["plan_id", "name", "latency_ms", "value", "where", "reason", "shown"]
_UNBUILT_TOOLTIP = """<div style="max-width: 420px; white-space: normal; font-size: 12px">
<b>plan @plan_id: @name</b> cannot build on @where<br>
<span style="color: #b00020">@reason</span><br>
latency: @latency_ms{0.000} ms (estimate by the HTP cost model)<br>accuracy: @shown</div>"""
_XY = ["x", "y"]
_LABELS = ["x", "y", "text", "dx", "dy", "align"]
# The plot never gets less height than this (toolbar, legend, axes and a readable frame): a short window scrolls
# the page instead of squeezing the axis into the ranking below.
PLOT_MIN_HEIGHT = 300
NOTE_MIN_HEIGHT = 60  # the note's three short lines at the narrowest layout

_SHORT_AXIS = {"estimate": "latency (ms, HTP cost-model estimate)",  # fits a 1280-wide window
               "emulator": "emulator host time (ms, not device latency)",
               "measured": "latency (ms, measured on the device)"}

# The note of an axis no evaluation has yet: where its latency comes from (a run in this process times nothing).
_NONE_YET = {"estimate": "no evaluations yet: evaluate a plan",
             "emulator": "no plan timed on the HTP emulator yet: evaluate one on the local agent, backend htp (a run "
                         "in this process gives its accuracy, not a timing)",
             "measured": "no plan timed on a device yet: evaluate one on a remote agent (a run in this process gives "
                         "its accuracy, not a timing)"}


class ParetoPlot(View):
    """Every evaluation of the study as a point; tap one to load its plan into the graph."""

    state = param.ClassSelector(class_=StudioState)

    def __init__(self, **params):
        super().__init__(**params)
        self._syncing = False
        self._note_base = ""  # what the note says of the evaluations, or a promotion's paired value in its place
        self._note_axis = ""  # the latency axis's whole label, when the axis shows it shortened
        self._note_paired = ""  # a streaming promotion's paired value
        self.points = ColumnDataSource(data=_empty(_POINTS))
        self.front = ColumnDataSource(data=_empty(_XY))
        self.current = ColumnDataSource(data=_empty(_XY))
        self.labels = ColumnDataSource(data=_empty(_LABELS))
        self.checks = ColumnDataSource(data=_empty(_CHECKS))
        self.unbuilt = ColumnDataSource(data=_empty(_UNBUILT))
        self.predicted = ColumnDataSource(data=_empty(_PROVISIONAL))
        self.partial = ColumnDataSource(data=_empty(_PROVISIONAL))
        self.figure = self._figure()
        on_model_change(self.points.selected, "indices", self._on_tap)
        # Its tooltip opens to the left: the group ends at the window's right edge, where a tooltip on its right
        # (a widget's default) is drawn outside the window.
        self._source = pn.widgets.RadioButtonGroup.from_param(
            self.state.param.latency_source, button_type="light", name="latency",
            description=Tooltip(content=self.state.param.latency_source.doc, position="left"))
        self._note = pn.pane.HTML("", margin=(0, 10), sizing_mode="stretch_width", min_height=NOTE_MIN_HEIGHT)
        self.state.param.watch(lambda *_: on_document_thread(self.figure, self._update), ["evaluations"])
        self.state.param.watch(lambda *_: on_document_thread(self.figure, self._update_provisional), ["provisional"])
        self.state.param.watch(lambda *_: on_document_thread(self.figure, self._update_current), ["plan", "plan_id"])
        self._update()

    @laid_out_once
    def __panel__(self):
        # Every part above the plot declares its least height: a column's least height is the sum of its parts,
        # and the plot's frame would otherwise be drawn below its box, over the ranking.
        return pn.Column(pn.Row(pn.pane.HTML("<b>Accuracy vs latency</b>", margin=(8, 10)), self._source, height=44),
                         self._note, pn.pane.Bokeh(self.figure, sizing_mode="stretch_both", min_height=PLOT_MIN_HEIGHT),
                         sizing_mode="stretch_both")

    def _figure(self):
        fig = figure(tools="pan,wheel_zoom,box_zoom,reset", sizing_mode="stretch_both", min_height=PLOT_MIN_HEIGHT,
                     min_width=300, toolbar_location="above", name="pareto")
        fig.step("x", "y", source=self.front, mode="after", line_color="#d62728", line_width=2, line_alpha=0.7,
                 name="front")
        points = fig.scatter("latency_ms", "value", source=self.points, marker="marker", size="size",
                             fill_color="color", line_color="#222", selection_line_color="#d6008f",
                             selection_line_width=3, nonselection_fill_alpha=0.9, nonselection_line_alpha=0.9,
                             name="points")
        fig.add_layout(Whisker(source=self.partial, base="latency_ms", lower="low_shown", upper="high_shown",
                               dimension="height", line_color="#0b6e99", line_width=1.5))
        for end in ("low_shown", "high_shown"):  # the whisker's ends inside the axis range (annotations are not)
            fig.scatter("latency_ms", end, source=self.partial, size=1, fill_alpha=0, line_alpha=0)
        predicted = fig.scatter("latency_ms", "value", source=self.predicted, marker="diamond", size=20,
                                fill_color="#e67e00", fill_alpha=0.2, line_color="#e67e00", line_width=2.5,
                                line_dash="dashed", name="predicted")
        partial = fig.scatter("latency_ms", "value", source=self.partial, marker="circle_dot", size=13,
                              fill_color="#9fd3ea", line_color="#0b6e99", line_width=2, name="partial")
        fig.segment("latency_ms", "value", "latency_ms", "other_value", source=self.checks, line_color="#6a3d9a",
                    line_dash="dotted", line_width=1.5)
        checks = fig.scatter("latency_ms", "other_value", source=self.checks, marker="inverted_triangle", size=12,
                             fill_color=None, line_color="#6a3d9a", line_width=2, name="cross_checks")
        unbuilt = fig.scatter("latency_ms", "value", source=self.unbuilt, marker="x", size=16, line_color="#b00020",
                              line_width=3, name="unbuilt")
        fig.scatter("x", "y", source=self.current, marker="circle", size=24, fill_color=None, line_color="#d6008f",
                    line_width=2.5, name="current")
        fig.add_layout(LabelSet(x="x", y="y", text="text", source=self.labels, x_offset="dx", y_offset="dy",
                                text_align="align", text_font_size="11px", text_color="#333", name="baseline_labels"))
        fig.add_tools(HoverTool(renderers=[points], tooltips=[
            ("plan", "@plan_id: @name (@origin)"), ("accuracy", "@value{0.0000}"),
            ("latency", "@latency_ms{0.000} ms"), ("interval", "@interval"), ("16-bit tensors", "@sixteen_bit"),
            ("on the front", "@front"), ("accuracy from", "@accuracy_source"), ("latency", "@latency_label")]),
            TapTool(renderers=[points]))
        fig.add_tools(HoverTool(renderers=[predicted, partial], tooltips=[
            ("plan", "@name"), ("status", "@status"), ("accuracy", "@value{0.0000}"), ("interval", "@interval"),
            ("paired", "@paired"),
            ("latency", "@latency_ms{0.000} ms (estimate by the HTP cost model)"), ("how", "@detail"),
            ("accuracy from", "@accuracy_source")]))
        fig.add_tools(HoverTool(renderers=[checks], tooltips=[
            ("plan", "@plan_id: @name"), ("accuracy", "@other_value{0.0000} (@value{0.0000} on the front's source)"),
            ("accuracy from", "@other_source"), ("latency", "@latency_ms{0.000} ms")]))
        # QNN's words run long: a template wraps them (fields in a template are escaped as in the list form).
        fig.add_tools(HoverTool(renderers=[unbuilt], tooltips=_UNBUILT_TOOLTIP))
        self._checks_item = LegendItem(label="same plan, other backend", renderers=[checks], visible=False)
        self._unbuilt_item = LegendItem(label="cannot build on the HTP", renderers=[unbuilt], visible=False)
        # The legend draws a key of constant colours, not the points' renderer: BokehJS updates a glyph's data
        # before its colours, and a legend painted in between reads a colour past the end (a RangeError).
        measured_key = fig.scatter(x=[], y=[], marker="circle", size=10, fill_color="#d62728", line_color="#222",
                                   name="measured_key")
        self._legend = Legend(items=[LegendItem(label="measured", renderers=[measured_key]),
                                     LegendItem(label="predicted", renderers=[predicted]),
                                     LegendItem(label="measured so far (95 % interval)", renderers=[partial]),
                                     self._checks_item, self._unbuilt_item],
                              orientation="horizontal", label_text_font_size="11px",
                              glyph_height=14, glyph_width=14, spacing=6, padding=4, margin=4,
                              background_fill_alpha=0.7, border_line_alpha=0, name="pareto_legend")
        fig.add_layout(self._legend, "above")
        fig.x_range.range_padding = fig.y_range.range_padding = 0.25  # room for the baselines' labels
        fig.xaxis.axis_label = "latency (ms)"
        fig.yaxis.axis_label = "accuracy"
        return fig

    # ---- state -> figure ----
    def _update(self, *_):
        frame: pd.DataFrame = self.state.evaluations
        study = self.state.study
        if frame is None or frame.empty or study is None:
            data, front, labels = _empty(_POINTS), _empty(_XY), _empty(_LABELS)
            self._note_base = (f"<span style='color:#666'>{_NONE_YET[self.state.latency_source]}</span>"
                               if study is not None else "")
        else:
            frame = frame.reset_index(drop=True)
            data, front, labels = _points(frame), _front(frame), _baseline_labels(frame)
            source = str(frame["accuracy_source"].iloc[0])
            # The source by its short name, the whole of it on hover: written out ("ORT CPU QDQ (fake-quant, HTP
            # weights, ...)"), it wraps the note over more lines than it has room for above the plot.
            self._note_base = (f"<span style='color:#666;font-size:12px' title='{html.escape(source, quote=True)}'>"
                               f"{len(frame)} plan(s), {int(frame['pareto'].astype(bool).sum())} on the front; "
                               f"accuracy from {html.escape(source.split(' (', 1)[0])}</span>")
        checks = self.state.cross_checks
        if checks is None or checks.empty or study is None or frame is None or frame.empty:
            checks_data = _empty(_CHECKS)
        else:
            checks_data = {c: checks[c].tolist() for c in _CHECKS}
            self._checks_item.label = {"value": _checks_label(list(dict.fromkeys(checks["other_source"])))}
        self._checks_item.visible = bool(checks_data["plan_id"])
        # Read with the evaluations they go with (a refresh of the evaluations is a refresh of these too).
        unbuilt = _unbuilt(study.build_failures() if study is not None else [], data, self.state.latency_source)
        self._unbuilt_item.visible = bool(unbuilt["plan_id"])
        if unbuilt["plan_id"]:
            self._unbuilt_item.label = {"value": "cannot build on " + ", ".join(dict.fromkeys(unbuilt["where"]))}
        # One row holds the three constant keys; with a fourth or fifth the legend takes two rows, not the width
        # of the frame and more (it would run out over the views on the plot's left).
        self._legend.nrows = 2 if self._checks_item.visible or self._unbuilt_item.visible else "auto"
        self._syncing = True
        try:
            update_source(self.checks, checks_data)
            update_source(self.unbuilt, unbuilt)
            self.points.selected.indices = []
            update_source(self.points, data)
            update_source(self.front, front)
            update_source(self.labels, labels)
        finally:
            self._syncing = False
        self._axis_labels(frame)
        self._update_provisional()

    def _axis_labels(self, frame) -> None:
        study = self.state.study
        self._note_axis = ""
        if study is None:
            return
        direction = "higher" if study.higher_is_better else "lower"
        self.figure.yaxis.axis_label = f"{study.metric_name} ({direction} is better)"
        labels = sorted(set(frame["latency_label"])) if frame is not None and len(frame) else []
        source = "; ".join(labels) if labels else self.state.latency_source
        full = f"latency (ms, {source})"
        # The axis has room for about 60 characters; a longer label (a host's name, a calibration) is cut off,
        # so the axis says what kind of number it is and the note above the plot says the rest.
        self.figure.xaxis.axis_label = full if len(full) <= 60 else _SHORT_AXIS[self.state.latency_source]
        if len(full) > 60:
            # A device's name and a calibration's come from agents and files: text, never markup.
            self._note_axis = f"<br><span style='color:#666;font-size:12px'>{html.escape(full)}</span>"
        self._render_note()

    def _render_note(self) -> None:
        # While a promotion streams, its paired value takes the summary's place (the note has room for three short
        # lines at the narrowest layout; the summary is back when the evaluation ends).
        self._note.object = (self._note_paired or self._note_base) + self._note_axis

    def _update_provisional(self, *_):
        """Predicted and partial points of plans being evaluated, on the estimate axis (the cost model is their
        latency), for the accuracy source the plot shows."""
        frame: pd.DataFrame = self.state.provisional
        shown_source = self.points.data["accuracy_source"][0] if self.points.data["accuracy_source"] else None
        if frame is None or frame.empty or self.state.latency_source != "estimate":
            frame = frame.iloc[0:0] if frame is not None else pd.DataFrame(columns=_PROVISIONAL)
        values = list(self.points.data["value"]) + (frame["value"].astype(float).tolist() if len(frame) else [])
        paired = ""
        for kind, source in (("predicted", self.predicted), ("partial", self.partial)):
            rows = frame[frame["kind"] == kind] if len(frame) else frame
            if kind == "partial" and shown_source is not None and len(rows):
                rows = rows[rows["accuracy_source"] == shown_source]
            update_source(source, _provisional(rows, kind, values) if len(rows) else _empty(_PROVISIONAL))
            if kind == "partial" and len(rows):
                paired = _paired_note(rows)
        self._note_paired = paired
        self._render_note()
        self._update_current()

    def _update_current(self, *_):
        plan_id = self.state.plan_id
        data = self.points.data
        xs = [x for pid, x in zip(data["plan_id"], data["latency_ms"]) if pid == plan_id]
        ys = [y for pid, y in zip(data["plan_id"], data["value"]) if pid == plan_id]
        if not xs:  # not evaluated yet: ring its provisional point, if it has one
            current = self.state.plan.hash
            for source in (self.partial, self.predicted):
                found = [i for i, h in enumerate(source.data["plan_hash"]) if h == current]
                if found:
                    xs, ys = [source.data["latency_ms"][found[0]]], [source.data["value"][found[0]]]
                    break
        update_source(self.current, {"x": xs[:1], "y": ys[:1]})

    # ---- figure -> state ----
    @shows_errors
    def _on_tap(self, attr, old, new):
        if self._syncing or not new:
            return
        plan_id = self.points.data["plan_id"][new[-1]]
        if plan_id is not None and not (isinstance(plan_id, float) and math.isnan(plan_id)):
            self.state.load_plan(int(plan_id))


def _empty(columns: list[str]) -> dict[str, list]:
    """No rows (new lists each time: a source's streamed rows extend its lists)."""
    return {column: [] for column in columns}


def _points(frame: pd.DataFrame) -> dict[str, list]:
    """The measured points: every evaluation of the front `frame` (study.front)."""
    baseline = frame["origin"] == "baseline"
    on_front = frame["pareto"].astype(bool)
    return {
        "plan_id": frame["plan_id"].astype(int).tolist(), "name": frame["name"].tolist(),
        "origin": frame["origin"].tolist(), "value": frame["value"].astype(float).tolist(),
        "latency_ms": frame["latency_ms"].astype(float).tolist(),
        "sixteen_bit": frame["sixteen_bit"].astype(int).tolist(),
        "front": ["yes" if f else "no" for f in on_front],
        "color": ["#d62728" if f else "#9aa0a6" for f in on_front],
        "marker": ["square" if b else "circle" for b in baseline],
        "size": [13 if b else 10 for b in baseline],
        "accuracy_source": frame["accuracy_source"].tolist(),
        "latency_label": frame["latency_label"].tolist(),
        "interval": [_interval(lo, hi) for lo, hi in zip(frame["latency_low_ms"], frame["latency_high_ms"])],
    }


# The legend's key for another accuracy source's values of the same plans: its name when short, else what it is
# (the triangles' tooltips name each source).
_CHECKS_LABEL_CHARS = 32


def _checks_label(sources: list[str]) -> str:
    if len(sources) == 1 and len(sources[0]) <= _CHECKS_LABEL_CHARS:
        return f"on {sources[0]}"
    if len(sources) == 1:
        return "same plan, other accuracy source"
    return f"same plan, {len(sources)} other accuracy sources"


def _unbuilt(failures, points: dict[str, list], latency_source: str) -> dict[str, list]:
    """The crosses of plans a backend could not build (`build_failures.BuildFailure`s): over the plan's point when
    `points` (the plotted `_points`) has one, else at its estimate along the bottom edge of the points (only on the
    estimate axis: it is the one latency such a plan has)."""
    values = points["value"]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    edge = low - 0.08 * ((high - low) or 1.0)
    at = {pid: (x, y, source) for pid, x, y, source in zip(points["plan_id"], points["latency_ms"], values,
                                                           points["accuracy_source"])}
    rows = _empty(_UNBUILT)
    for f in failures:
        if f.plan_id in at:
            x, y, shown = at[f.plan_id][0], at[f.plan_id][1], f"{value_text(at[f.plan_id][1])} on {at[f.plan_id][2]}"
        elif latency_source == "estimate" and f.estimate_ms is not None:
            x, y, shown = f.estimate_ms, edge, f"none: not built on {f.where}"
        else:
            continue
        for column, value in zip(_UNBUILT, (f.plan_id, f.name, x, y, f.where, f.reason, shown)):
            rows[column].append(value)
    return rows


def _front(frame: pd.DataFrame) -> dict[str, list]:
    """The front's step line, by latency."""
    pts = frame[frame["pareto"].astype(bool)].sort_values("latency_ms")
    return {"x": pts["latency_ms"].astype(float).tolist(), "y": pts["value"].astype(float).tolist()}


# Where a baseline's name may go, in order of preference: (x_offset, y_offset, text_align) in pixels (up is +y).
_LABEL_PLACES = ((0, 9, "center"), (0, -22, "center"), (9, -6, "left"), (-9, -6, "right"))
# The plot's frame, roughly, in pixels, and how much of it the points' span takes (range_padding 0.25 each side).
_FRAME_PX, _SPAN_SHARE, _CHAR_PX, _LINE_PX = (430.0, 180.0), 1 / 1.5, 6.5, 14.0


def _baseline_labels(frame: pd.DataFrame) -> dict[str, list]:
    """The baselines' names beside their points: above, unless that would cover a name already placed (baselines
    of one latency, or of one accuracy) or run past the top of the frame (under the legend); then below, right or
    left."""
    rows = frame[frame["origin"] == "baseline"]
    xs, ys = rows["latency_ms"].astype(float).tolist(), rows["value"].astype(float).tolist()
    names = rows["name"].astype(str).tolist()
    out = {"x": xs, "y": ys, "text": names, "dx": [], "dy": [], "align": []}
    if not xs:
        return out
    # Points in pixels of the frame, as the plot draws them (the axis ranges span the points plus padding).
    spans = [(max(v) - min(v)) or 1.0 for v in (xs, ys)]
    px = [((x - min(xs)) / spans[0] * _SPAN_SHARE + (1 - _SPAN_SHARE) / 2) * _FRAME_PX[0] for x in xs]
    py = [((y - min(ys)) / spans[1] * _SPAN_SHARE + (1 - _SPAN_SHARE) / 2) * _FRAME_PX[1] for y in ys]
    placed: list[tuple[float, float, float, float]] = []
    chosen: dict[int, tuple] = {}
    for i in sorted(range(len(xs)), key=lambda i: -py[i]):  # the highest first: it has the fewest places
        width = _CHAR_PX * len(names[i])
        boxes = [(place, _label_box(px[i], py[i], width, place)) for place in _LABEL_PLACES]
        place, box = next(((place, box) for place, box in boxes if box[3] <= _FRAME_PX[1] * 0.85
                           and not any(_overlap(box, other) for other in placed)), boxes[0])
        placed.append(box)
        chosen[i] = place
    out["dx"], out["dy"], out["align"] = ([chosen[i][k] for i in range(len(xs))] for k in range(3))
    return out


def _label_box(x: float, y: float, width: float, place) -> tuple[float, float, float, float]:
    """The pixels a name of `width` takes beside the point (x, y), placed as `place` (one of _LABEL_PLACES)."""
    dx, dy, align = place
    left = x + dx - (width / 2 if align == "center" else width if align == "right" else 0)
    return left, y + dy, left + width, y + dy + _LINE_PX


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _clip_limits(values) -> tuple[float, float]:
    """How far a whisker may run: the span of the plotted `values` beyond them on either side (a tenth of their
    size, or 1e-3, when they are one value)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return -math.inf, math.inf
    low, high = min(finite), max(finite)
    span = (high - low) or max(abs(high) * 0.1, 1e-3)
    return low - span, high + span


def _paired_note(rows: pd.DataFrame) -> str:
    """The partial points' paired differences, one line each, coloured by what they say."""
    lines = [f"<span class='mpstudio-paired' style='color:#9a6700;font-size:12px'>so far, {html.escape(text)}</span>"
             if verdict == "unpaired" else
             f"<span class='mpstudio-paired' style='color:{_VERDICT_COLOURS.get(verdict, '#555')};"
             f"font-size:12px;font-weight:600'>paired, so far: {html.escape(text)}</span>"
             for text, verdict in zip(rows["paired"], rows["verdict"]) if text]
    return "".join(lines[:1])


def _provisional(rows: pd.DataFrame, kind: str, values=()) -> dict[str, list]:
    """The `kind` ("predicted" or "partial") points of StudioState.provisional `rows`; whiskers clipped to
    `_clip_limits(values)`."""
    floor, ceiling = _clip_limits(values)
    lows, highs = rows["low"].astype(float).tolist(), rows["high"].astype(float).tolist()
    return {
        "low_shown": [lo if math.isnan(lo) else max(lo, floor) for lo in lows],
        "high_shown": [hi if math.isnan(hi) else min(hi, ceiling) for hi in highs],
        "paired": rows["paired"].tolist() if "paired" in rows else [""] * len(rows),
        "verdict": rows["verdict"].tolist() if "verdict" in rows else [""] * len(rows),
        "plan_hash": rows["plan_hash"].tolist(), "name": rows["name"].tolist(),
        "value": rows["value"].astype(float).tolist(), "low": rows["low"].astype(float).tolist(),
        "high": rows["high"].astype(float).tolist(), "latency_ms": rows["latency_ms"].astype(float).tolist(),
        "status": ["predicted, not measured yet" if kind == "predicted" else
                   f"measured on {s} of {t} samples so far" for s, t in zip(rows["samples"], rows["total"])],
        "interval": [_accuracy_interval(lo, hi) for lo, hi in zip(rows["low"], rows["high"])],
        "detail": rows["detail"].tolist(), "accuracy_source": rows["accuracy_source"].tolist(),
    }


def _accuracy_interval(low, high) -> str:
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "-"
    return f"{value_text(low)}-{value_text(high)} (95 %, for the value on every sample)"


def _interval(low, high) -> str:
    """The estimate's interval for the hover, or a dash for a latency without one (a measurement)."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "-"
    return f"{low:.3f}-{high:.3f} ms (cost model's interval)"
