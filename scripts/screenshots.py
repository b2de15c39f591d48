"""Screenshots of the studio on the built-in demo, for the README.

    python scripts/screenshots.py [--out docs/images]

Opens the demo study (created and analysed on first use, about a minute), evaluates the baselines and a plan
that promotes the ten top-ranked tensors to 16 bits, and a8w8 with per-channel weights on the CPU and on the
HTP (emulator: a few minutes; --no-htp skips it), serves the studio with that plan loaded and the top
tensors selected, and photographs it in headless Chromium (scripts/install-browser installs one):
  studio.png  the whole studio;  graph.png  the graph view with a tensor's scores on hover;
  pareto.png  the Pareto plot and the ranking.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from gui_support import (PanelServer, chromium_path, figure_box, screen_points, source_column,  # noqa: E402
                         wait_for_bokeh, wait_until)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    parser.add_argument("--top", type=int, default=10, help="tensors the shown plan promotes")
    parser.add_argument("--no-htp", action="store_true",
                        help="skip the HTP evaluation of a8w8-pc (minutes on the emulator)")
    args = parser.parse_args(argv)
    browser_path = chromium_path()
    if browser_path is None:
        print("no Chromium found: run scripts/install-browser first", file=sys.stderr)
        return 2

    from playwright.sync_api import sync_playwright
    from mpstudio.widgets import Studio, StudioState

    study, plan, top = _demo_with_results(args.top, htp=not args.no_htp)
    states = []

    def session():
        state = StudioState(study)
        state.set_plan(plan)
        studio = Studio(state)
        state.find(top[0])  # scrolls the graph to the top-ranked tensor
        state.select(top[:5])
        states.append(state)
        return studio.template()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = PanelServer(session)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
            page.goto(server.url)
            wait_for_bokeh(page, 120000)
            state = wait_until(lambda: states[-1] if states else None)
            _photograph(page, state, top, out)
            browser.close()
    finally:
        for state in states:
            state.close()
        server.stop()
    for name in ("studio.png", "graph.png", "pareto.png"):
        print(out / name)
    return 0


def _demo_with_results(count: int, htp: bool):
    """The demo study with its baselines, a plan promoting its `count` top-ranked tensors, and a8w8 with
    per-channel weights evaluated: (study, that plan, the top-ranked tensors)."""
    from mpstudio.errors import MpstudioError
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study

    last = [""]

    def progress(done, total, message):
        if message != last[0]:
            print(message, flush=True)
            last[0] = message

    study = Study.demo(progress=progress)
    report = study.sensitivity(progress=progress)
    study.baselines(progress=progress)
    top = report.top(count)["tensor"].tolist()
    plan = PrecisionPlan.a8w8().promote(top)
    study.evaluate(plan, progress=progress)
    # Per-channel int8 weights, on the CPU and (where the QNN EP is installed) on the HTP: the Pareto plot
    # then shows the same plan from both backends, linked.
    per_channel = PrecisionPlan(activation_type="uint8", weight_type="int8", per_channel=True, name="a8w8-pc")
    study.evaluate(per_channel, progress=progress)
    if htp:
        try:
            study.evaluate(per_channel, "htp", progress=progress)
        except MpstudioError as exc:
            print(f"no HTP point: {exc}", file=sys.stderr)
    return study, plan, top


def _photograph(page, state, top: list[str], out: Path) -> None:
    """studio.png, graph.png (the top-ranked tensor's node hovered) and pareto.png of the served studio."""
    wait_until(lambda: state.report is not None, 120)
    wait_until(lambda: len(source_column(page, "points", "plan_id") or []) >= 3, 60)
    time.sleep(2)  # let the table and the plots settle
    page.screenshot(path=str(out / "studio.png"))

    # Hover the top-ranked tensor's node for its scores.
    ids = source_column(page, "nodes", "id")
    node = state.tensors.set_index("tensor").loc[top[0], "node"]
    row = ids.index(node)
    xs, ys = source_column(page, "nodes", "x"), source_column(page, "nodes", "y")
    ((sx, sy),) = screen_points(page, "graph", [xs[row]], [ys[row]])
    page.mouse.move(sx, sy)
    time.sleep(1)
    graph = figure_box(page, "graph")
    page.screenshot(path=str(out / "graph.png"), clip={
        "x": max(graph["x"] - 130, 0), "y": max(graph["y"] - 170, 0), "width": graph["width"] + 140,
        "height": min(graph["height"] + 170, 1000 - max(graph["y"] - 170, 0))})
    page.mouse.move(5, 5)
    time.sleep(0.5)
    pareto = figure_box(page, "pareto")
    page.screenshot(path=str(out / "pareto.png"), clip={
        "x": pareto["x"] - 10, "y": max(pareto["y"] - 60, 0), "width": min(pareto["width"] + 20, 1600 - pareto["x"] + 10),
        "height": min(pareto["height"] + 460, 1000 - max(pareto["y"] - 60, 0))})


if __name__ == "__main__":
    sys.exit(main())
