"""The graph's node labels in headless Chromium: the opening window and the window Find moves to show labels, no two
drawn labels overlap in a dense attention block (query/key/value projections side by side), and the legend stays
clear of the graph's tool bar, at common window sizes. Label boxes are measured in the page (the browser's own text
metrics), not taken from the server's estimate."""

from __future__ import annotations

import pytest

from gui_support import (chromium_path, make_small_study, on_loop, open_studio, source_column, studio_server,
                         wait_until, y_range)
from transformer_models import encoder_feeds, make_encoder

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

SIZES = [(1280, 800), (1600, 1000), (1920, 1080)]
MIN_LABELS = 8  # labels a window of 37 layers shows at least, at every size

# Every drawn label's box in page px, measured with the canvas font the glyph draws with, and whether it lies in the
# part of the graph's frame the window shows; that part's box; the nodes' markers' boxes.
DRAWN_LABELS = """
() => {
  const doc = Bokeh.documents[0];
  const fig = doc.get_model_by_name("graph"), labels = doc.get_model_by_name("labels");
  const view = fig == null ? null : Bokeh.index.find_one(fig);
  if (view == null || labels == null) return null;
  const rect = view.canvas_view.el.getBoundingClientRect();
  const sx = view.frame.x_scale, sy = view.frame.y_scale, f = view.frame.bbox;
  // What of the frame the window shows (a short window scrolls the page).
  const frame = {x0: Math.max(rect.left + f.left, 0), y0: Math.max(rect.top + f.top, 0),
                 x1: Math.min(rect.left + f.right, window.innerWidth), y1: Math.min(rect.top + f.bottom, window.innerHeight)};
  const column = (source, c) => { const d = source.data; return Array.from(d instanceof Map ? d.get(c) : d[c]); };
  const spec = (p, fallback) => (p == null ? fallback : (p.value !== undefined ? p.value : p));
  const glyph = labels.glyph;
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = `${spec(glyph.text_font_style, "normal")} ${spec(glyph.text_font_size, "10px")} ${spec(glyph.text_font, "helvetica")}`;
  const src = labels.data_source;
  const [xs, ys, texts, dxs, aligns] = ["x", "y", "label", "dx", "align"].map((c) => column(src, c));
  const boxes = texts.map((text, i) => {
    const m = ctx.measureText(text);
    const half = (m.fontBoundingBoxAscent + m.fontBoundingBoxDescent) / 2;
    const x = rect.left + sx.compute(xs[i]) + dxs[i], y = rect.top + sy.compute(ys[i]);
    const x0 = aligns[i] === "right" ? x - m.width : x;
    const box = {text, x0, x1: x0 + m.width, y0: y - half, y1: y + half, at: [xs[i], ys[i]]};
    box.visible = box.x0 < frame.x1 && frame.x0 < box.x1 && box.y0 < frame.y1 && frame.y0 < box.y1;
    return box;
  });
  const nodes = doc.get_model_by_name("nodes").data_source;
  const markers = column(nodes, "x").map((x, i) => {
    const px = rect.left + sx.compute(x), py = rect.top + sy.compute(column(nodes, "y")[i]);
    const r = column(nodes, "size")[i] / 2;
    return {x0: px - r, x1: px + r, y0: py - r, y1: py + r, id: column(nodes, "id")[i]};
  });
  return {frame, boxes, markers};
}
"""


def drawn_labels(page):
    return page.evaluate(DRAWN_LABELS)


def overlapping(a, b, slack: float = 0.5) -> bool:
    return (a["x0"] + slack < b["x1"] and b["x0"] + slack < a["x1"]
            and a["y0"] + slack < b["y1"] and b["y0"] + slack < a["y1"])


def overlaps(drawn) -> list:
    """Pairs of visible labels drawn over each other."""
    shown = [b for b in drawn["boxes"] if b["visible"]]
    return [(a["text"], b["text"]) for i, a in enumerate(shown) for b in shown[i + 1:] if overlapping(a, b)]


def visible_labels(drawn) -> list[str]:
    return [b["text"] for b in drawn["boxes"] if b["visible"]]


def new_page(browser, width, height):
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(60000)
    return context, page


@pytest.fixture(scope="module")
def deep_studio(tmp_path_factory):
    # Deeper than three windows: the top-ranked region and the last layers lie outside the labels placed at first.
    with studio_server(make_small_study(tmp_path_factory.mktemp("gui-labels") / "study", baselines=False,
                                        nodes=260)) as server:
        yield server


@pytest.fixture(scope="module")
def encoder_studio(tmp_path_factory):
    from mpstudio.data import FeedList
    from mpstudio.study import Study

    folder = tmp_path_factory.mktemp("gui-labels-encoder")
    study = Study.create(folder / "study", make_encoder(layers=2), FeedList(encoder_feeds(4)), name="tiny encoder")
    study.sensitivity()
    with studio_server(study) as server:
        yield server


@pytest.mark.parametrize("width,height", SIZES[:2])
def test_the_opening_window_and_the_one_find_moves_to_show_labels(browser, deep_studio, width, height):
    context, page = new_page(browser, width, height)
    try:
        state = open_studio(page, deep_studio)
        drawn = wait_until(lambda: (d := drawn_labels(page)) and len(visible_labels(d)) >= MIN_LABELS and d, 20,
                           message=f"at {width}x{height} the opening window shows fewer than {MIN_LABELS} labels: "
                                   f"{visible_labels(drawn_labels(page))}")
        assert not overlaps(drawn)
        # Find moves the window to the node farthest from it: beyond the labels placed for the opening window.
        ids, ys = source_column(page, "nodes", "id"), source_column(page, "nodes", "y")
        before = y_range(page, "graph")
        middle, window = sum(before) / 2, before[1] - before[0]
        node_of = {t: n for t, n in zip(state.tensors["tensor"], state.tensors["node"]) if n in ids}
        far = max(node_of, key=lambda t: abs(ys[ids.index(node_of[t])] - middle))
        row = ids.index(node_of[far])
        assert abs(ys[row] - middle) > 1.5 * window, "the model is too shallow to test a far jump"
        on_loop(state, lambda: state.find(far))
        wait_until(lambda: y_range(page, "graph") != before, 20, message="Find did not move the window")
        at = [source_column(page, "nodes", "x")[row], ys[row]]
        node = node_of[far]
        drawn = wait_until(lambda: (d := drawn_labels(page)) and len(visible_labels(d)) >= MIN_LABELS and d, 20,
                           message=f"the window Find moved to shows fewer than {MIN_LABELS} labels: "
                                   f"{visible_labels(drawn_labels(page))}")
        assert any(b["visible"] and b["at"] == at for b in drawn["boxes"]), \
            f"the node Find jumped to ({node}) has no label: {visible_labels(drawn)}"
        assert not overlaps(drawn)
    finally:
        context.close()


def test_labels_in_an_attention_block_do_not_overlap(browser, encoder_studio):
    context, page = new_page(browser, 1280, 800)
    try:
        state = open_studio(page, encoder_studio)
        names = state.tensors["tensor"].tolist()
        projections = [next(t for t in names if f"/layer.1/attention/{part}/MatMul" in t)
                       for part in ("query", "key", "value")]
        on_loop(state, lambda: state.find(projections[0]))
        wait_until(lambda: any("query" in t for t in visible_labels(drawn_labels(page))), 20,
                   message=f"the query projection has no label: {visible_labels(drawn_labels(page))}")
        drawn = drawn_labels(page)
        assert not overlaps(drawn), f"labels drawn over each other: {overlaps(drawn)}"
        # No label runs over a node's marker either, and each projection is told apart by its label.
        for box in (b for b in drawn["boxes"] if b["visible"]):
            hit = [m["id"] for m in drawn["markers"] if overlapping(box, m)]
            assert not hit, f"the label {box['text']!r} runs over the nodes {hit}"
        shown = visible_labels(drawn)
        for part in ("query", "key", "value"):
            assert any(part in text for text in shown), f"no label says {part!r}: {shown}"
        assert len(shown) >= MIN_LABELS
    finally:
        context.close()


@pytest.mark.parametrize("width,height", [SIZES[0], SIZES[2]])
def test_the_legend_is_clear_of_the_tool_bar(browser, deep_studio, width, height):
    context, page = new_page(browser, width, height)
    try:
        open_studio(page, deep_studio)
        legend = page.get_by_text("drag a box to select").first.evaluate(
            "(el) => { const r = el.getBoundingClientRect(); return {x0: r.left, x1: r.right, y0: r.top, y1: r.bottom}; }")
        for name in ("Expand all", "Promote to 16-bit", "Demote to 8-bit"):
            button = page.get_by_role("button", name=name).first.evaluate(
                "(el) => { const r = el.getBoundingClientRect(); return {x0: r.left, x1: r.right, y0: r.top, y1: r.bottom}; }")
            assert not overlapping(legend, button, 0.0), f"at {width}x{height} the legend {legend} covers {name!r} {button}"
        frame = drawn_labels(page)["frame"]
        assert legend["y1"] <= frame["y0"], f"at {width}x{height} the legend {legend} runs into the graph {frame}"
    finally:
        context.close()
