"""Tooltips stay inside the window in headless Chromium at 1280x800: the Pareto plot's latency-source buttons at
the window's right edge, its points (one with a long name) and the graph's nodes nearest the right edge."""

from __future__ import annotations

import math
import re

import pytest

from gui_support import (chromium_path, frame_box, make_small_study, open_studio, screen_points, source_column,
                         studio_server, wait_until)
from mpstudio.plan import PrecisionPlan

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

WIDTH, HEIGHT = 1280, 800
# A user's name for a plan can run long; unwrapped, its tooltip is wider than the room on either side of a point.
LONG_NAME = "attention blocks of layers 0 to 5 at 16 bit, kept after the review of " + "x" * 60

# Every Bokeh tooltip shown on the page (a fixed element of its own, outside the figure), as page rectangles.
SHOWN_TOOLTIPS = """() => [...document.querySelectorAll('.bk-Tooltip')].map((el) => {
  const r = el.getBoundingClientRect(); return {x: r.left, y: r.top, width: r.width, height: r.height};
}).filter((r) => r.width > 0 && r.height > 0)"""


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    study = make_small_study(tmp_path_factory.mktemp("gui-tooltips") / "study")
    tensors = study.graph.activations()[3:6]
    study.evaluate(PrecisionPlan.a8w8().promote(tensors, name=LONG_NAME))
    with studio_server(study) as server:
        yield server


def hover_all(page, figure: str, renderer: str, x: str, y: str, count: int):
    """Hover the `count` points of `renderer` nearest the right edge of `figure`'s frame; each shown tooltip's
    rectangle with the point hovered."""
    frame = frame_box(page, figure)
    points = screen_points(page, figure, source_column(page, renderer, x), source_column(page, renderer, y))
    inside = [p for p in points if frame["x"] < p[0] < frame["x"] + frame["width"]
              and frame["y"] < p[1] < min(frame["y"] + frame["height"], HEIGHT)]
    assert inside, f"no point of {renderer} in view"
    shown = []
    for sx, sy in sorted(inside, key=lambda p: -p[0])[:count]:
        page.mouse.move(sx, sy)
        tips = wait_until(lambda: page.evaluate(SHOWN_TOOLTIPS), 10, message=f"no tooltip at ({sx}, {sy})")
        shown += [(tip, (sx, sy)) for tip in tips]
        page.mouse.move(5, 5)
        wait_until(lambda: not page.evaluate(SHOWN_TOOLTIPS), 10)
    return shown


def test_tooltips_stay_inside_the_window(browser, studio):
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    page.set_default_timeout(60000)
    try:
        state = open_studio(page, studio)
        wait_until(lambda: LONG_NAME in set(source_column(page, "points", "name") or []), 60,
                   message="the long-named plan is not plotted")
        assert state.study is not None
        shown = hover_all(page, "pareto", "points", "latency_ms", "value", 8)
        shown += hover_all(page, "graph", "nodes", "x", "y", 6)
        buttons = page.locator(".bk-btn-group button")
        for i in range(buttons.count()):
            if buttons.nth(i).text_content().strip() in ("estimate", "emulator", "measured"):
                buttons.nth(i).hover()
                tips = wait_until(lambda: page.evaluate(SHOWN_TOOLTIPS), 10, message="no tooltip on the button")
                shown += [(tip, buttons.nth(i).text_content().strip()) for tip in tips]
                page.mouse.move(5, 5)
                wait_until(lambda: not page.evaluate(SHOWN_TOOLTIPS), 10)
        for tip, point in shown:
            assert tip["x"] >= -0.5 and tip["x"] + tip["width"] <= WIDTH + 0.5, \
                f"the tooltip of {point} is cut at the window's edge: {tip}"
            assert tip["y"] >= -0.5 and tip["y"] + tip["height"] <= HEIGHT + 0.5, \
                f"the tooltip of {point} is cut at the window's top or bottom: {tip}"
        assert any(tip["width"] > 250 for tip, _ in shown)  # the long name's tooltip was among them
        assert any(point == "measured" for _, point in shown)  # so was the rightmost button's
    finally:
        context.close()


def test_the_tabs_beside_the_ranking_fit_the_window(browser, studio):
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    page.set_default_timeout(60000)
    try:
        open_studio(page, studio)
        for title in ("Ranking", "Time per node", "Blocks", "Compare plans"):
            tab = page.get_by_text(title, exact=True).first.evaluate(
                "(el) => { const r = el.getBoundingClientRect(); return {x: r.left, width: r.width}; }")
            assert tab["x"] + tab["width"] <= WIDTH + 0.5, f"the tab {title!r} is cut at the right edge: {tab}"
    finally:
        context.close()


def test_a_nodes_tooltip_says_a_missing_score_is_missing_not_nan(browser, studio):
    """A score the node does not have (no HTP run of the plan, so no HTP/CPU divergence) reads "-", as in the
    ranking, never "NaN steps RMS"; the scores it has keep their figures and units."""
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    page.set_default_timeout(60000)
    try:
        state = open_studio(page, studio)
        assert state.tensors["divergence"].isna().all() and state.tensors["snr_db"].notna().any()
        frame = frame_box(page, "graph")
        points = screen_points(page, "graph", source_column(page, "nodes", "x"), source_column(page, "nodes", "y"))
        snr = source_column(page, "nodes", "snr_db")
        sx, sy = next(p for p, value in zip(points, snr) if value is not None and math.isfinite(value)
                      and frame["x"] < p[0] < frame["x"] + frame["width"]
                      and frame["y"] < p[1] < min(frame["y"] + frame["height"], HEIGHT))
        page.mouse.move(sx, sy)
        text = wait_until(lambda: page.evaluate(TOOLTIP_TEXT), 10, message="no tooltip on the node")
        assert "NaN" not in text, text
        assert re.search(r"HTP vs CPU:\s*-(\s|$)", text), text
        assert re.search(r"SNR:\s*-?\d+\.\d\d dB", text), text
    finally:
        context.close()


# The text of the shown tooltips (BokehJS draws each in a shadow root of its own).
TOOLTIP_TEXT = """() => [...document.querySelectorAll('.bk-Tooltip')].filter((el) => el.getBoundingClientRect().width > 0)
  .map((el) => (el.shadowRoot || el).querySelector('.bk-tooltip-content')?.innerText || '').join('\\n')"""
