"""The session belongs to the study and the server (`panel serve app.py` in a process of its own, real Chromium):
a reload keeps the current plan, the search target, the selection and the running jobs, and a second tab on the
same study shows the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gui_support import (stop_process, accepts_connections, chromium_path, free_port, make_small_study, table_selection,
                         wait_for_bokeh, wait_until)

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
    return {"plan": page.locator("div", has_text="current plan:").last.inner_text(),
            "target": page.get_by_placeholder("a16w8+10% or a metric value").input_value(),
            "selected": page.get_by_text("tensor(s) selected").first.inner_text()
            if page.get_by_text("tensor(s) selected").count() else "",
            "search job": page.get_by_text(f"searching for {TARGET}").count() > 0}


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
