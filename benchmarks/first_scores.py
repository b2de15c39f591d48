"""Cold start of the studio: `panel serve app.py` on an empty cache, until the ranking table shows scores.

    python benchmarks/first_scores.py [--limit 60] [--timeout 900]

Starts `panel serve app.py` (the built-in demo) as a new process with MPSTUDIO_CACHE_DIR set to a new empty
folder, so everything is made from nothing: the demo's rendered lines and prepared model, the study, the
calibration, the QDQ models, and the sensitivity analysis. Opens the page in headless Chromium (1600x1000)
and measures, from the moment the server process starts:
  - page: the studio's Bokeh document has rendered;
  - cheap scores: the sensitivity table holds accumulated SNR values (the first partial ranking);
  - isolation: the table holds isolation gains (a partial ranking with isolated tensors);
  - final: the table's caption no longer says "partial" (the analysis ended), if it ends before --timeout.
Target: cheap scores within --limit seconds (60). Needs Chromium (scripts/install-browser). Exits 1 when
the target is missed.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from gui_support import chromium_path, free_port, wait_until  # noqa: E402

TABLE_COLUMN = """
(column) => {
  if (window.Bokeh === undefined || Bokeh.documents.length === 0) return null;
  for (const model of Bokeh.documents[0].all_models) {
    if (model.type === "DataTabulator" || model.constructor.__name__ === "DataTabulator") {
      const data = model.source.data;
      const value = data instanceof Map ? data.get(column) : data[column];
      return value == null ? [] : Array.from(value).filter((v) => v !== null && Number.isFinite(v)).length;
    }
  }
  return null;
}
"""

STATUS = """
() => {
  for (const model of Bokeh.documents[0].all_models) {
    const text = model.text;
    if (typeof text === "string" && text.includes("partial: ")) return text.replace(/<[^>]*>/g, "");
  }
  return null;
}
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=float, default=60.0, help="target for the first scores, in seconds")
    parser.add_argument("--timeout", type=float, default=900.0, help="stop waiting for the final ranking here")
    args = parser.parse_args(argv)
    if chromium_path() is None:
        print("no Chromium found: run scripts/install-browser")
        return 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="mpstudio-cold-") as cache:
        port = free_port()
        env = {**os.environ, "MPSTUDIO_CACHE_DIR": cache, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        started = time.perf_counter()
        log = open(Path(cache) / "server.log", "wb")
        server = subprocess.Popen([sys.executable, "-m", "panel", "serve", "app.py", "--port", str(port),
                                   "--address", "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}"],
                                  cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        marks: dict[str, float] = {}
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1600, "height": 1000})

                def opened():
                    if server.poll() is not None:
                        raise RuntimeError(f"the server exited: {(Path(cache) / 'server.log').read_text()[-2000:]}")
                    try:
                        page.goto(f"http://127.0.0.1:{port}/app", timeout=10000)
                    except Exception:
                        return False
                    return True
                wait_until(opened, 120, 0.5, "the studio did not start serving")
                page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0 && "
                                       "Bokeh.documents[0].is_idle", timeout=120000)
                marks["page"] = time.perf_counter() - started
                deadline = started + args.timeout
                while time.perf_counter() < deadline and "final" not in marks:
                    now = time.perf_counter() - started
                    scores = page.evaluate(TABLE_COLUMN, "snr_db") or 0
                    gains = page.evaluate(TABLE_COLUMN, "isolation_gain") or 0
                    if scores and "cheap scores" not in marks:
                        marks["cheap scores"] = now
                        status = page.evaluate(STATUS)
                        print(f"    the table's caption then: {re.sub('<[^>]*>', '', html.unescape(status or ''))}")
                    if gains and "isolation" not in marks:
                        marks["isolation"] = now
                    if gains and page.evaluate(STATUS) is None:
                        marks["final"] = now
                    time.sleep(0.25)
                browser.close()
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
            log.close()
    print(f"panel serve app.py on an empty cache ({os.cpu_count()} cores): seconds from the server's start")
    for name in ("page", "cheap scores", "isolation", "final"):
        value = marks.get(name)
        print(f"    {name:<13} {'-' if value is None else f'{value:.1f} s'}")
    first = marks.get("cheap scores")
    if first is None or first > args.limit:
        print(f"MISSED: cheap scores within {args.limit:.0f} s")
        return 1
    print(f"cheap scores after {first:.1f} s (target <= {args.limit:.0f} s): target met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
