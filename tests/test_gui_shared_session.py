"""The session belongs to the study and the server (`panel serve app.py` in a process of its own, real Chromium):
a reload keeps the current plan, the search target, the selection and the running jobs, and a second tab on the
same study shows the same."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpstudio.widgets.study_session import LEFT_FILE
from gui_support import (accepts_connections, chromium_path, free_port, make_small_study, page_log, stop_process,
                         studio_server, table_selection, wait_for_bokeh, wait_until)

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

ROOT = Path(__file__).resolve().parent.parent
TARGET = "a16w8+7%"


def served_studio(study, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", "panel", "serve", "app.py", "--port", str(port), "--address",
                               "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}", "--args", "--study",
                               str(study.folder), "--root", str(tmp_path)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"))
    wait_until(lambda: accepts_connections(port), 60, message="panel serve app.py did not start")
    return server, f"http://127.0.0.1:{port}/app"


def opened(page, url):
    page.goto(url)
    wait_for_bokeh(page)
    page.locator(".tabulator-row").first.wait_for(state="visible")
    return page


def shown(page) -> dict:
    """What a tab shows of the session: the current plan line, the target field, the selection, the jobs."""
    # The Run panel's line begins with "current plan:" (a hint that a base "beats the current plan: ..." does not).
    return {"plan": page.locator("div", has_text=re.compile(r"^current plan:")).last.inner_text(),
            "target": page.get_by_placeholder("a16w8+10% or a metric value").input_value(),
            "selected": page.get_by_text("tensor(s) selected").first.inner_text()
            if page.get_by_text("tensor(s) selected").count() else "",
            # The search as a job (running, or the last to end) or, once other jobs have ended after it, its card.
            "search job": page.get_by_text(f"searching for {TARGET}").count() > 0
            or page.locator(".mpstudio-search-card").count() > 0}


def test_a_reload_and_a_second_tab_show_the_plan_target_selection_and_jobs(browser, tmp_path):
    study = make_small_study(tmp_path / "study")
    tensor = study.graph.activations()[5]
    server, url = served_studio(study, tmp_path)
    try:
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page = opened(context.new_page(), url)
        page.set_default_timeout(60000)
        find = page.get_by_placeholder("find a name (or *pattern*)")
        find.fill(tensor)
        find.press("Enter")
        page.get_by_text("1 tensor(s) selected").wait_for()
        initial = shown(page)["plan"]
        page.get_by_role("button", name="Promote to 16-bit").click()
        before = wait_until(lambda: shown(page) if shown(page)["plan"] not in (initial, "") and "16" in
                            shown(page)["plan"] else None, 90,
                            message=f"the promote did not change the current plan: {shown(page)}")
        target = page.get_by_placeholder("a16w8+10% or a metric value")
        target.fill(TARGET)
        target.press("Enter")
        page.get_by_role("button", name="Search").first.click()
        page.locator(".mpstudio-job", has_text=f"searching for {TARGET}").first.wait_for()

        page.reload()  # while the search runs (or just after it ended)
        wait_for_bokeh(page)
        page.locator(".tabulator-row").first.wait_for()
        after = wait_until(lambda: (s := shown(page))["selected"] and s["search job"] and s, 60,
                           message=f"the reload lost the session: {shown(page)}")
        assert after["target"] == TARGET and after["selected"].startswith("1 tensor"), after
        # The search the closed tab started runs on and ends in the reloaded tab: its answer becomes the plan.
        answer = wait_until(lambda: (p := shown(page)["plan"]) != before["plan"] and p, 300,
                            message=f"the search's answer did not reach the reloaded tab: {shown(page)}")

        second = opened(browser.new_context(viewport={"width": 1280, "height": 800}).new_page(), url)
        other = wait_until(lambda: (s := shown(second))["selected"] and s["search job"] and s, 60,
                           message=f"the second tab shows another session: {shown(second)}")
        assert other["plan"] == answer and other["target"] == TARGET

        # A selection made in one tab shows in the other.
        find2 = second.get_by_placeholder("find a name (or *pattern*)")
        find2.fill(study.graph.activations()[6])
        find2.press("Enter")
        picked = study.graph.activations()[6]
        wait_until(lambda: table_selection(page) == [picked], 30,
                   message="the first tab did not follow the second tab's selection")
    finally:
        stop_process(server)
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log, log[-4000:]


def _analyses(states) -> list:
    """Every analysis job the sessions' states started themselves (a mirror of another tab's job is not one)."""
    return [job for state in states for job in state.jobs
            if job.kind == "analyze" and getattr(job, "owner", None) is state]


def _stacks() -> str:
    """Where the studio's analysis lanes are now (for a result that does not arrive: busy, or stuck)."""
    import sys
    import threading
    import traceback

    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(f"--- {names.get(ident)}\n" + "".join(traceback.format_stack(frame)[-40:])
                     for ident, frame in sys._current_frames().items() if "studio-long" in str(names.get(ident)))


def _ranked(page) -> None:
    page.locator(".tabulator-cell[tabulator-field='rank']", has_text="1").first.wait_for(timeout=180000)


def test_a_tab_that_comes_back_after_every_tab_closed_shows_the_running_analysis_and_its_result(browser, tmp_path):
    """Every tab closes while the study's analysis runs: the analysis runs on, and the next tab shows that job (not
    one started afresh), then its ranking; a tab that comes back after it ended shows the ranking at once."""
    study = make_small_study(tmp_path / "study", analyzed=False, baselines=False, nodes=800)  # ~40 s to analyse on an idle machine
    # A closed tab's session ends within seconds (a new tab's session must outlive its page's load, under load).
    quick_end = {"unused_session_lifetime_milliseconds": 5000, "check_unused_sessions_milliseconds": 1000}
    with studio_server(study, closes_states=True, **quick_end) as studio:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.set_default_timeout(60000)
        page.goto(studio.url)
        first = wait_until(lambda: studio.states[0] if studio.states else None)
        job = wait_until(lambda: next(iter(_analyses([first])), None), 120, message="no analysis started")
        wait_until(lambda: job.status != "queued", 120, message="the analysis did not start")
        context.close()  # every tab of the study has gone
        wait_until(lambda: first._membership.closed, 60, message="the closed tab's session did not end")
        assert job.active, "the analysis ended before the test could come back to it; make it longer"

        page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
        page.set_default_timeout(60000)
        page.goto(studio.url)
        second = wait_until(lambda: studio.states[1] if len(studio.states) > 1 else None)
        wait_until(lambda: any(getattr(j, "source", None) is job for j in second.jobs), 60,
                   message=f"the new tab does not show the analysis: {[j.title for j in second.jobs]}")
        wait_for_bokeh(page)
        # In its job bar while it runs, with its progress.
        shown_in_bar = page.locator(".mpstudio-job-bar >> text=sensitivity analysis >> visible=true")
        wait_until(lambda: shown_in_bar.count() > 0 or not job.active, 60,
                   message="the running analysis is not in the new tab's job bar")
        _ranked(page)  # its partial rankings reach the new tab too, then its result
        wait_until(lambda: job.status == "done" and second.report is job.result, 480,
                   message=f"the analysis's result did not reach the new tab: {job.status} {job.done}/{job.total} "
                           f"{job.message} {job.finished.is_set()} {_stacks()}")
        assert _analyses(studio.states) == [job], "an analysis was started again"
        # The tab was told a job of the study was already running; once that job has ended, the message line no
        # longer says it runs.
        told = page.locator(".mpstudio-message", has_text="already running on this study")
        wait_until(lambda: "already running" not in second.message and told.count() == 0, 60,
                   message=f"the message still says an ended job runs: {second.message!r}")

        page.context.close()  # and once more, after the analysis ended: its ranking is shown, nothing re-run
        wait_until(lambda: second._membership.closed, 30, message="the second tab's session did not end")
        page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
        page.goto(studio.url)
        wait_for_bokeh(page)
        third = wait_until(lambda: studio.states[2] if len(studio.states) > 2 else None)
        _ranked(page)
        assert third.report is job.result and third.plan.hash == first.plan.hash
        assert _analyses(studio.states) == [job], "an analysis was started again"
        page.context.close()


def test_a_reload_comes_back_to_the_study_the_tab_opened_and_its_plan(browser, tmp_path):
    """A study opened from the Model and data panel, not the one the server was started on: a reload shows it again,
    with the plan promoted in it (a reload used to open the server's study, so the tab's work was out of reach)."""
    study = make_small_study(tmp_path / "study")
    other = make_small_study(tmp_path / "other", name="the other net")
    tensor = other.graph.activations()[4]
    server, url = served_studio(study, tmp_path)
    try:
        page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
        console = page_log(page)
        opened(page, url)
        page.set_default_timeout(60000)
        page.get_by_placeholder("path/to/study/").fill(str(other.folder))
        page.get_by_placeholder("path/to/study/").press("Tab")
        page.get_by_role("button", name="Open study").click()
        page.get_by_text("the other net").first.wait_for()
        find = page.get_by_placeholder("find a name (or *pattern*)")
        find.fill(tensor)
        find.press("Enter")
        page.get_by_text("1 tensor(s) selected").wait_for()
        page.get_by_role("button", name="Promote to 16-bit").click()
        # The promote is the study's plan once the server keeps it for the study's tabs (in the study folder too).
        wait_until(lambda: promoted_in(other.folder, tensor), 120,
                   message=f"the promote did not reach the server: {shown(page)}; page: {console[-8:]}")
        promoted = re.compile(r"plan \d+: .*1x16")
        wait_until(lambda: promoted.search(shown(page)["plan"]), 60,  # the tab itself shows it too
                   message=f"the tab that opened another study did not show its promote: {shown(page)}; "
                           f"page: {console[-8:]}")

        page.reload()
        wait_for_bokeh(page)
        page.get_by_text("the other net").first.wait_for()
        wait_until(lambda: promoted.search(shown(page)["plan"]), 60,
                   message=f"the reload lost the promoted plan: {shown(page)}; page: {console[-8:]}")
        assert page.get_by_text("small residual net").count() == 0
    finally:
        stop_process(server)
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log, log[-4000:]


def promoted_in(folder, tensor: str) -> bool:
    """Whether the plan the server keeps for the study in `folder` has `tensor` at 16 bits."""
    try:
        kept = json.loads((folder / LEFT_FILE).read_text())
    except (OSError, ValueError):
        return False
    return kept["plan"]["overrides"].get(tensor, {}).get("type") == "uint16"


def test_a_server_started_again_on_the_study_opens_on_the_plan_target_and_selection_its_tabs_left(browser, tmp_path):
    """Stopping the server ends its jobs; the study keeps its results, and what its tabs left: the first tab of the
    server started again on the study shows that plan, target and selection (it opened on a base chosen afresh)."""
    study = make_small_study(tmp_path / "study")
    tensor = study.graph.activations()[3]
    server, url = served_studio(study, tmp_path)
    try:
        page = opened(browser.new_context(viewport={"width": 1600, "height": 1000}).new_page(), url)
        page.set_default_timeout(60000)
        find = page.get_by_placeholder("find a name (or *pattern*)")
        find.fill(tensor)
        find.press("Enter")
        page.get_by_text("1 tensor(s) selected").wait_for()
        page.get_by_role("button", name="Promote to 16-bit").click()
        target = page.get_by_placeholder("a16w8+10% or a metric value")
        target.fill(TARGET)
        target.press("Enter")
        left = wait_until(lambda: re.search(r"plan \d+: .*1x16", (s := shown(page))["plan"]) and s["target"] == TARGET
                          and s, 120, message=f"the promote did not change the current plan: {shown(page)}")
        page.context.close()
    finally:
        stop_process(server)
    server, url = served_studio(study, tmp_path)
    try:
        page = opened(browser.new_context(viewport={"width": 1600, "height": 1000}).new_page(), url)
        wait_until(lambda: shown(page)["plan"] == left["plan"], 60,
                   message=f"the server started again lost the plan: {shown(page)} (left {left})")
        again = shown(page)
        assert again["target"] == TARGET and again["selected"].startswith("1 tensor"), again
    finally:
        stop_process(server)
