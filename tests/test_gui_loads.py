"""Page loads without browser errors: the studio loaded again and again, and in two tabs at once, while its
analysis runs and before any plan is evaluated (an empty Pareto plot, whose legend is drawn anyway)."""

from __future__ import annotations

import pytest

from gui_support import chromium_path, make_small_study, studio_server, wait_for_bokeh, wait_until

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

LOADS = 20


def _watch(page, errors: list[str]) -> None:
    """Collect uncaught page errors and the console's errors (a missing resource offline is not one of ours)."""
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on("console", lambda message: errors.append(f"console: {message.text}")
            if message.type == "error" and "net::ERR_" not in message.text else None)


@pytest.mark.slow
def test_loads_and_two_tabs_raise_no_page_error(browser, tmp_path):
    # Not analysed and no baselines: every session starts its analysis while its baselines stream into an
    # empty Pareto plot (the points' colours then change under the legend).
    study = make_small_study(tmp_path / "study", analyzed=False, baselines=False)
    with studio_server(study) as studio:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        try:
            for _ in range(LOADS):
                page = context.new_page()
                _watch(page, errors)
                page.goto(studio.url)
                wait_for_bokeh(page)
                page.locator(".tabulator-row").first.wait_for(state="visible")
                page.wait_for_timeout(200)  # a repaint after the first updates
                page.close()
            assert errors == [], errors[:5]
            assert len(studio.states) == LOADS

            first, second = context.new_page(), context.new_page()
            for page in (first, second):
                _watch(page, errors)
            first.goto(studio.url)
            second.goto(studio.url)
            for page in (first, second):
                wait_for_bokeh(page)
                page.locator(".tabulator-row").first.wait_for(state="visible")
            wait_until(lambda: all(s.report is not None for s in studio.states[-2:]), 120,
                       message="the two tabs' analyses did not report")
            for page in (first, second):
                page.locator(".tabulator-cell[tabulator-field='rank']", has_text="1").first.wait_for()
            first.wait_for_timeout(500)
            assert errors == [], errors[:5]
        finally:
            context.close()


def test_the_pareto_legend_reads_no_colour_from_data():
    """A legend entry drawn from a renderer with data-driven colours reads them while BokehJS is still updating
    them (RangeError in DataView.getUint32 on page loads): every key has constant colours."""
    from bokeh.models import Legend

    from mpstudio.widgets import StudioState
    from mpstudio.widgets.pareto import ParetoPlot

    figure = ParetoPlot(state=StudioState()).figure
    legends = [item for item in figure.center + figure.above if isinstance(item, Legend)]
    assert legends
    for legend in legends:
        for item in legend.items:
            for renderer in item.renderers:
                for visual in ("fill_color", "line_color"):
                    value = getattr(renderer.glyph, visual, None)
                    columns = set(renderer.data_source.data)
                    constant = value is None or (isinstance(value, str) and value not in columns)
                    assert constant, (item.label, visual, value)


def test_updates_after_the_session_ended_fail_no_job(caplog):
    """A closed tab's session: the job that posts an update of its destroyed views still finishes, with no
    traceback (a search went on and failed with KeyError 'id' in the graph's restyle)."""
    import logging

    from bokeh.document import Document

    from mpstudio.widgets.lanes import Job, Lanes

    finished = []
    lanes = Lanes(finished.append)
    lanes._doc = Document()  # a session's document after the session ended: no session context

    def update_of_a_destroyed_view():
        raise KeyError("id")

    def work(progress, cancel):
        progress(1, 2, "half")
        lanes.post(update_of_a_destroyed_view)
        return 42

    job = Job(kind="search", title="a search")
    with caplog.at_level(logging.INFO):
        lanes.submit(job, work, lambda result: update_of_a_destroyed_view())
        assert job.wait(30)
    lanes.close()
    assert job.status == "done" and job.result == 42 and finished == [job]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_view_that_fails_to_show_a_result_fails_its_job_and_the_lane_runs_on(caplog):
    """A bug in a live view's handling of a result (a refresh that raised TypeError) is said on the job; the
    lane's worker survives, so the jobs queued behind it still run (a comparison stayed queued for ever)."""
    from mpstudio.widgets.lanes import Job, Lanes

    lanes = Lanes(lambda job: None)

    def broken_view(result):
        raise TypeError("Constant parameter 'tensors' cannot be modified")

    first, second = Job(kind="latency", title="where the time goes"), Job(kind="latency", title="comparing")
    lanes.submit(first, lambda progress, cancel: 1, broken_view)
    lanes.submit(second, lambda progress, cancel: 2)
    assert first.wait(30) and second.wait(30)
    lanes.close()
    assert first.status == "failed" and "TypeError" in first.error and "where the time goes" in first.error
    assert second.status == "done" and second.result == 2


# Counts the Tabulators the page destroys (Panel rebuilds one whenever its configuration changes).
COUNT_DESTROYED = """
(() => {
  window.__tables_destroyed = 0;
  const hook = setInterval(() => {
    if (window.Tabulator === undefined) return;
    clearInterval(hook);
    const destroy = window.Tabulator.prototype.destroy;
    window.Tabulator.prototype.destroy = function () { window.__tables_destroyed += 1; return destroy.apply(this, arguments); };
  }, 5);
})();
"""


def test_opening_a_study_rebuilds_no_table_in_the_page(page, tmp_path):
    """The ranking's rows arriving when a study opens (20-45 s after the page loads on a fresh server, once the
    model is prepared) only update its table. A column whose type changed from the empty table's made Panel rebuild
    the Tabulator, asynchronously; its page count, updated meanwhile, then reached the half-built table and the page
    raised "Cannot read properties of null (reading 'verticalFillMode')"."""
    from gui_support import PanelServer, on_loop
    from mpstudio.widgets import Studio, StudioState

    study = make_small_study(tmp_path / "study", baselines=False)
    states = []

    def session():
        states.append(StudioState(auto_analyze=False, evaluate_on_edit=False))
        return Studio(states[-1]).template()
    server = PanelServer(session)
    errors: list[str] = []
    try:
        page.add_init_script(COUNT_DESTROYED)
        _watch(page, errors)
        page.goto(server.url)
        wait_for_bokeh(page)
        state = wait_until(lambda: states[-1] if states else None)
        page.locator(".tabulator").first.wait_for(state="attached")
        page.wait_for_timeout(500)
        before = page.evaluate("window.__tables_destroyed")
        on_loop(state, lambda: state.set_study(study))
        page.locator(".tabulator-row").first.wait_for(state="visible")
        page.wait_for_timeout(1000)
        assert page.evaluate("window.__tables_destroyed") == before, "opening the study rebuilt a table"
        assert errors == [], errors[:5]
    finally:
        for state in states:
            state.close()
        server.stop()
