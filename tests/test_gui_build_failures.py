"""The Pareto plot's mark for plans the HTP cannot build: a cross at the plan's estimated latency (over its point
when the plot shows one, along the bottom edge otherwise), with QNN's reason in its tooltip; in the state and in
headless Chromium."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from conftest import requires_qnn
from gui_support import (chromium_path, open_studio, screen_points, source_column, studio_server, wait_until)
from mpstudio.data import FeedList
from mpstudio.loop.build_failures import BuildFailed
from mpstudio.plan import PrecisionPlan
from mpstudio.study import Study
from test_build_failures import LRN_NODE, _feeds, lrn_model

TOOLTIPS = """
() => {
  const found = [];
  const visit = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (typeof el.className === "string" && el.className.toLowerCase().includes("tooltip")) found.push(el.innerText);
      if (el.shadowRoot) visit(el.shadowRoot);
    }
  };
  visit(document);
  return found;
}
"""

pytestmark = [pytest.mark.htp, requires_qnn, pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The LRN model's study: both baselines on the CPU; on the HTP, a8w8 built, and two plans that cannot be
    built there (a16w8, which the CPU scored too, and the LRN's tensors promoted, which nothing scored)."""
    folder = tmp_path_factory.mktemp("unbuilt")
    onnx.save(lrn_model(), folder / "lrn.onnx")
    study = Study.create(folder / "study", folder / "lrn.onnx", FeedList(_feeds(8, 1)), FeedList(_feeds(4, 5)))
    study.sensitivity(samples=8, isolation_samples=4)
    study.baselines("cpu")
    study.evaluate(PrecisionPlan.a8w8(name="a8w8"), "htp")
    for plan in (PrecisionPlan.a16w8(name="a16w8"),
                 PrecisionPlan.a8w8().promote(["act0_out", "norm_out"], name="lrn-16")):
        with pytest.raises(BuildFailed):
            study.evaluate(plan, "htp")
    yield study
    study.close()


def test_the_plot_marks_plans_that_cannot_be_built(study):
    from mpstudio.widgets import StudioState
    from mpstudio.widgets.pareto import ParetoPlot

    state = StudioState(study, auto_analyze=False, evaluate_on_edit=False)
    try:
        plot = ParetoPlot(state=state)
        crosses = plot.unbuilt.data
        points = dict(zip(plot.points.data["plan_id"], zip(plot.points.data["latency_ms"], plot.points.data["value"])))
        a16, lrn16 = study.plan_id(PrecisionPlan.a16w8()), study.plan_id(PrecisionPlan.a8w8().promote(
            ["act0_out", "norm_out"]))
        assert sorted(crosses["plan_id"]) == sorted([a16, lrn16])
        row = {pid: i for i, pid in enumerate(crosses["plan_id"])}
        # a16w8 has a CPU point: the cross is drawn over it.
        assert (crosses["latency_ms"][row[a16]], crosses["value"][row[a16]]) == points[a16]
        # The promoted plan has no point: at its estimate, below every point.
        assert lrn16 not in points
        estimate = next(f.estimate_ms for f in study.build_failures() if f.plan_id == lrn16)
        assert crosses["latency_ms"][row[lrn16]] == pytest.approx(estimate)
        assert crosses["value"][row[lrn16]] < min(plot.points.data["value"])
        assert all(LRN_NODE in reason and "3110" in reason for reason in crosses["reason"])
        assert set(crosses["where"]) == {"HTP v75"} and plot._unbuilt_item.visible
        assert plot._legend.nrows == 2  # a fourth key: two rows, not a legend wider than the frame
        # On another latency axis the plan that has no point has no latency to be drawn at.
        state.latency_source = "emulator"
        state.refresh_evaluations()
        assert lrn16 not in plot.unbuilt.data["plan_id"]
    finally:
        state.close()


@pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser")
def test_the_cross_shows_why_in_its_tooltip(page, study, tmp_path):
    with studio_server(study) as studio:
        state = open_studio(page, studio)
        wait_until(lambda: "lrn-16" in (source_column(page, "unbuilt", "name") or []), 30,
                   message="the plot shows no crosses for the plans that cannot be built")
        xs, ys = source_column(page, "unbuilt", "latency_ms"), source_column(page, "unbuilt", "value")
        names = source_column(page, "unbuilt", "name")
        (sx, sy), = screen_points(page, "pareto", [xs[names.index("lrn-16")]], [ys[names.index("lrn-16")]])
        page.mouse.move(sx - 20, sy - 20)
        page.mouse.move(sx, sy)
        # Bokeh draws its tooltips in shadow roots: read the text of every one shown.
        text = wait_until(lambda: next((t for t in page.evaluate(TOOLTIPS) if "cannot build on" in t), None), 10,
                          message="hovering the cross shows no tooltip")
        assert "lrn-16" in text and "HTP v75" in text and LRN_NODE in text and "3110" in text
        # A picture to look at: $MPSTUDIO_SCREENSHOTS keeps it.
        shot = Path(os.environ.get("MPSTUDIO_SCREENSHOTS", tmp_path)) / "pareto-unbuilt.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 0


def test_the_search_card_lists_the_plans_that_cannot_be_built(study):
    """The card of a search whose confirmation passed over plans: each with QNN's reason, escaped."""
    from mpstudio.search import search
    from mpstudio.widgets.search_card import search_card_html

    result = search(study, "a16w8", weights="per-tensor", max_evaluations=4, confirm_plans=2, quiet=True)
    assert result.unbuildable
    card = search_card_html(result)
    assert "Cannot build on HTP v75" in card and LRN_NODE in card and "`/norm/LRN_token_7`" in card
    assert "<li>plan" in card and "{ name:" in card  # QNN's braces and backticks, as text


def test_a_plan_the_studio_cannot_build_is_marked_when_its_evaluation_fails(study):
    from mpstudio.search.targets import named_baselines
    from mpstudio.widgets import StudioState
    from mpstudio.widgets.pareto import ParetoPlot

    state = StudioState(study, auto_analyze=False, evaluate_on_edit=False)
    try:
        plot = ParetoPlot(state=state)
        before = set(plot.unbuilt.data["plan_id"])
        state.backend = "htp"
        job = state.evaluate_plan(named_baselines()["a16w8-pc"], streamed=False)
        assert job.wait(120) and job.status == "failed" and "cannot build on HTP v75" in job.error
        plan_id = study.plan_id(named_baselines()["a16w8-pc"])
        wait_until(lambda: set(plot.unbuilt.data["plan_id"]) == before | {plan_id}, 30,
                   message="the plot does not mark the plan whose evaluation failed to build")
    finally:
        state.close()
