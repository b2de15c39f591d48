"""A tab closed while the studio's jobs post to it leaves no traceback in the server's log (`panel serve app.py`
in a process of its own, as users run it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gui_support import stop_process, accepts_connections, chromium_path, free_port, make_small_study, wait_for_bokeh, wait_until

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

ROOT = Path(__file__).resolve().parent.parent
CLOSED_STREAM = ("WebSocketClosedError", "StreamClosedError", "Task exception was never retrieved", "Traceback")


def test_closing_tabs_while_a_job_posts_leaves_no_traceback(browser, tmp_path):
    study = make_small_study(tmp_path / "study")
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as stderr:
        server = subprocess.Popen([sys.executable, "-m", "panel", "serve", "app.py", "--port", str(port), "--address",
                                   "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}", "--args", "--study",
                                   str(study.folder), "--root", str(tmp_path)], cwd=ROOT, env=env,
                                  stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_until(lambda: accepts_connections(port), 60, message="panel serve app.py did not start")
        for _ in range(3):
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(60000)
            page.goto(f"http://127.0.0.1:{port}/app")
            wait_for_bokeh(page)
            page.get_by_role("button", name="Search").first.click()
            page.locator(".mpstudio-job").first.wait_for(state="visible")
            time.sleep(0.5)  # the search is posting its progress when the tab goes
            context.close()
        time.sleep(8)  # the abandoned sessions' jobs post (and end) after their tabs have gone
    finally:
        stop_process(server)
    text = log.read_text()
    found = [marker for marker in CLOSED_STREAM if marker in text]
    assert not found, f"the server logged {found} after tabs closed:\n{text[-4000:]}"
