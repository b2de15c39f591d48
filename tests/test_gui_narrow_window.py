"""The studio in a 1280x800 window (headless Chromium, a real study): the Compare tab's button in view, the
search card's figures on one line each, and one ring on the Pareto plot for the current plan whatever the plans
loaded before."""

from __future__ import annotations

import pytest

from gui_support import chromium_path, make_small_study, open_studio, source_column, studio_server, wait_until
from mpstudio.plan import PrecisionPlan

pytestmark = [pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
              pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser")]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    s = make_small_study(tmp_path_factory.mktemp("narrow") / "study")
    yield s
    s.close()


@pytest.fixture
def narrow(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(60000)
    yield page
    context.close()


BOX = """(el) => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                                                             bottom: r.bottom, height: r.height}; }"""


def test_the_compare_button_is_in_view_beside_the_two_choices(narrow, study):
    with studio_server(study) as studio:
        open_studio(narrow, studio)
        narrow.locator(".bk-tab", has_text="Compare plans").first.click()
        button = narrow.get_by_role("button", name="Compare", exact=True)
        button.wait_for(state="visible")
        box = button.evaluate(BOX)
        assert box["right"] <= 1280 - 10, box  # not cut by the window's edge (the tab's right end)


def test_one_ring_marks_the_current_plan_after_loading_others(narrow, study):
    top = study.sensitivity().top(4)["tensor"].tolist()
    plans = [PrecisionPlan.a8w8().promote(top[:2]), PrecisionPlan.a8w8().promote(top)]
    ids = [study.evaluate(plan).plan_id for plan in plans]
    with studio_server(study) as studio:
        state = open_studio(narrow, studio)
        for plan_id in [*ids, ids[0]]:
            state.post(lambda plan_id=plan_id: state.load_plan(plan_id))
            wait_until(lambda: state.plan_id == plan_id, 30)
            row = list(source_column(narrow, "points", "plan_id")).index(plan_id)
            want = source_column(narrow, "points", "latency_ms")[row]
            wait_until(lambda: source_column(narrow, "current", "x") == [want], 30,
                       message=f"the ring is not on plan {plan_id} alone: {source_column(narrow, 'current', 'x')}")


def test_the_two_plans_compared_show_side_by_side(narrow, study):
    with studio_server(study) as studio:
        state = open_studio(narrow, studio)
        narrow.locator(".bk-tab", has_text="Compare plans").first.click()
        narrow.get_by_role("button", name="Compare", exact=True).click()
        narrow.get_by_text("activation tensor(s) differ").first.wait_for(state="visible")
        for column in ("a", "b"):  # both plans' cells within the window, beside the row names
            cell = narrow.locator(f".tabulator-cell[tabulator-field='{column}']").first
            cell.wait_for(state="visible")
            box = cell.evaluate(BOX)
            assert box["right"] <= 1280 and box["left"] >= 0, (column, box)
        assert state.study is not None


def test_a_script_thread_driving_a_served_studio_moves_the_plot(narrow, study):
    """A script or a notebook may call a served studio's state from its own thread: the Pareto plot's changes go to
    the session's event loop (Bokeh refuses them from another thread) and the page follows."""
    top = study.sensitivity().top(3)["tensor"].tolist()
    plan_id = study.evaluate(PrecisionPlan.a8w8().promote(top[:1])).plan_id
    with studio_server(study) as studio:
        state = open_studio(narrow, studio)
        state.refresh_evaluations()  # from this thread, as a script would
        state.load_plan(plan_id)
        wait_until(lambda: plan_id in (source_column(narrow, "points", "plan_id") or []), 30)
        row = list(source_column(narrow, "points", "plan_id")).index(plan_id)
        want = source_column(narrow, "points", "latency_ms")[row]
        wait_until(lambda: source_column(narrow, "current", "x") == [want], 30,
                   message=f"the ring did not move to plan {plan_id}: {source_column(narrow, 'current', 'x')}")
