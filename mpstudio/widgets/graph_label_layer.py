"""NodeLabels: the graph figure's labels, for the nodes near the visible window, placed at the frame's pixel scale
(graph_labels) and placed again when the window leaves that band, is zoomed, resized or panned sideways."""

from __future__ import annotations

from typing import Callable

import numpy as np
from bokeh.models import ColumnDataSource

from .base import in_document, on_model_change
from .graph_labels import FONT_PX, GAP_PX, label_forms, place_labels

# The frame's size in px until the browser has reported it (the figure is at least this big).
FALLBACK_FRAME_PX = (440.0, 560.0)
# The fewest px between neighbours of a row that a fitted window keeps: room for a short label ("query") between.
MIN_PX_PER_UNIT = 56.0


class NodeLabels:
    """The text layer of the graph `figure` over the `nodes` source (columns id, x, y, op, size, rank);
    `texts()` gives each node's full label and its activation tensors. Call `fill()` after moving the window
    from the server (Panel writes a held document's events straight to the browser, so the ranges' callbacks
    do not see them); `fill(force=True)` after the nodes, the ranking or the selection changed."""

    def __init__(self, figure, nodes: ColumnDataSource, texts: Callable[[], tuple[list[str], list[list[str]]]]):
        self.figure, self.nodes, self._texts = figure, nodes, texts
        self.source = ColumnDataSource(data={"x": np.zeros(0), "y": np.zeros(0), "label": [], "dx": np.zeros(0),
                                             "align": []})
        self._band = (0.0, 0.0)
        self._view: tuple = ()  # the x range and pixel scale the labels were placed for
        self._due = False  # a placement after the browser's pan or zoom is scheduled
        # Only the nodes near the window: laying out thousands of texts would dominate the first render.
        figure.text("x", "y", text="label", source=self.source, x_offset="dx", text_align="align",
                    text_font_size=f"{FONT_PX}px", text_baseline="middle", text_color="#333", name="labels")
        for axis in (figure.x_range, figure.y_range):
            on_model_change(axis, ["start", "end"], self._on_view)
        on_model_change(figure, ["inner_width", "inner_height"], self._on_view)
        on_model_change(figure, "inner_width", self._on_frame_width)

    def fill(self, force: bool = False) -> None:
        """Labels for the nodes within one window's height above and below the visible window, none over another
        label or a node, the selected nodes' and the top-ranked first."""
        x_range, y_range = self.figure.x_range, self.figure.y_range
        start, end = y_range.start, y_range.end
        view = (x_range.start, x_range.end, *self.pixel_scale())
        low, high = self._band
        if not force and low <= start and end <= high and _close(view, self._view):
            return
        height = end - start
        low, high = start - height, end + height
        data = self.nodes.data
        ys, xs = np.asarray(data["y"], dtype=float), np.asarray(data["x"], dtype=float)
        # Only nodes across the window can have a label in it (a wide model's other columns cost nothing).
        rows = np.flatnonzero((ys >= low) & (ys <= high) & (xs >= x_range.start - 1) & (xs <= x_range.end + 1))
        self._band, self._view = (low, high), view
        labels, tensors = self._texts()
        if len(labels) != len(ys):
            rows = rows[:0]
        xs, ys = xs[rows], ys[rows]
        forms = label_forms([labels[i] for i in rows], ys, [data["op"][i] for i in rows], [tensors[i] for i in rows])
        rank = np.asarray(data["rank"], dtype=float)[rows] if len(data.get("rank", [])) == len(data["y"]) else \
            np.full(len(rows), np.nan)
        rank = np.where(np.isfinite(rank), rank, np.inf)
        selected = set(self.nodes.selected.indices)
        order = sorted(range(len(rows)), key=lambda j: (rows[j] not in selected, rank[j], -ys[j], xs[j]))
        placed = place_labels(forms, xs, ys, np.asarray(data["size"], dtype=float)[rows], order, view[2], view[3],
                              (x_range.start, x_range.end))
        at = np.asarray(placed.nodes, dtype=int)
        new = {"x": xs[at], "y": ys[at], "label": placed.texts,
               "dx": np.array([GAP_PX if side == "right" else -GAP_PX for side in placed.sides]),
               "align": ["left" if side == "right" else "right" for side in placed.sides]}
        old = self.source.data
        if any(len(old.get(c, ())) != len(v) or list(old[c]) != list(v) for c, v in new.items()):
            self.source.data = new  # unchanged labels (a promotion, a selection elsewhere) send nothing

    def pixel_scale(self) -> tuple[float, float]:
        """px per data unit across and down, from the frame's size as the browser reports it."""
        fig = self.figure
        size = []
        for attr, fallback in zip(("inner_width", "inner_height"), FALLBACK_FRAME_PX):
            try:
                value = getattr(fig, attr)
            except Exception:  # not reported yet (Bokeh raises on an unset read-only property)
                value = None
            size.append(float(value) if value else fallback)
        return (size[0] / max(float(fig.x_range.end - fig.x_range.start), 1e-9),
                size[1] / max(float(fig.y_range.end - fig.y_range.start), 1e-9))

    def keep_readable(self) -> None:
        """Narrow the window across until neighbours of a row are MIN_PX_PER_UNIT px apart: a narrow frame shows
        fewer columns, centred on the selected nodes in view, else where it was. Called when the window is fitted
        and when the frame's width is reported, never after a zoom (a user may zoom out past it)."""
        x_range, y_range = self.figure.x_range, self.figure.y_range
        most = self.pixel_scale()[0] * float(x_range.end - x_range.start) / MIN_PX_PER_UNIT
        if x_range.end - x_range.start <= most:
            return
        data = self.nodes.data
        rows = [i for i in self.nodes.selected.indices if i < len(data["y"])
                and y_range.start <= data["y"][i] <= y_range.end]
        middle = float(np.mean([data["x"][i] for i in rows])) if rows else (x_range.start + x_range.end) / 2
        x_range.update(start=middle - most / 2, end=middle + most / 2)
        self.fill()

    def _on_frame_width(self, attr, old, new):
        if new:
            self.keep_readable()

    def _on_view(self, attr, old, new):
        """A pan, zoom or resize in the browser: placed once it has fully arrived (a pan changes a range's start
        and end one after the other)."""
        doc = self.figure.document
        if doc is None or doc.session_context is None:
            self.fill()
            return
        if self._due:
            return
        self._due = True

        def fill():
            self._due = False
            self.fill()
        try:
            doc.add_next_tick_callback(in_document(doc, fill))
        except Exception:  # the session ended
            self._due = False


def _close(a: tuple, b: tuple, tolerance: float = 0.005) -> bool:
    """Two (x start, x end, px per x, px per y) views the same labels serve: equal within `tolerance` of the span
    and of the scales."""
    if len(a) != len(b):
        return False
    span = abs(a[1] - a[0]) or 1.0
    return (abs(a[0] - b[0]) <= tolerance * span and abs(a[1] - b[1]) <= tolerance * span
            and all(abs(p - q) <= tolerance * abs(q) for p, q in zip(a[2:], b[2:])))
