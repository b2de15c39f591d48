"""Screenshots of the studio on the built-in demo, for the README.

    python scripts/screenshots.py [--out docs/images]

Opens the demo study (created and analysed on first use, about a minute), evaluates the baselines and a plan
that promotes the ten top-ranked tensors to 16 bits, and a8w8 with per-channel weights on the CPU and on the
HTP (emulator: a few minutes; --no-htp skips it), serves the studio with that plan loaded and the top
tensors selected, and photographs it in headless Chromium (scripts/install-browser installs one):
  studio.png  the whole studio;  graph.png  the graph view with a tensor's scores on hover;
  pareto.png  the Pareto plot and the ranking.

    python scripts/screenshots.py --views [--study FOLDER | --model MODEL.onnx] [--size 1280x800 --size 1600x1000]

The review set instead, at each window size: opening, paired (a promotion's paired first value, while only part
of the samples is measured), search (the result card after a short CPU search), latency (time per node, the graph
coloured by latency share), blocks (block totals) and compare (two plans side by side), as <view>-<W>x<H>.png. On
the demo by default, on a study folder (--study) or on a study of an ONNX model on random inputs with the output
cosine as its metric (--model; created in --work the first time).
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
    parser.add_argument("--views", action="store_true", help="the review set (see above), not the README's three")
    parser.add_argument("--study", help="--views: a study folder (default: the demo)")
    parser.add_argument("--model", help="--views: an ONNX model, studied on random inputs")
    parser.add_argument("--work", default="mpstudio-screenshot-studies", help="--views --model: the study's parent")
    parser.add_argument("--samples", type=int, default=24, help="--views --model: calibration and evaluation samples")
    parser.add_argument("--size", action="append", type=_size, help="--views: a window size WxH (repeatable)")
    parser.add_argument("--target", help="--views: the search target (default: the studio's)")
    parser.add_argument("--search-budget", type=int, default=4, help="--views: evaluations of the search")
    args = parser.parse_args(argv)
    browser_path = chromium_path()
    if browser_path is None:
        print("no Chromium found: run scripts/install-browser first", file=sys.stderr)
        return 2
    if args.views:
        return _views(args, browser_path)

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


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a window size is WIDTHxHEIGHT, like 1280x800, not {text!r}") from None
    return width, height


def _views(args, browser_path: str) -> int:
    """The review set of every --size of the chosen study (see the module's docstring)."""
    from playwright.sync_api import sync_playwright
    from screenshot_views import Shooter, model_study

    from mpstudio.study import Study

    def progress(done, total, message, last=[""]):
        if message != last[0]:
            print(message, flush=True)
            last[0] = message

    if args.model:
        model = Path(args.model)
        study = model_study(model, Path(args.work) / model.stem, args.samples, progress)
    else:
        study = Study.open(args.study) if args.study else Study.demo(progress=progress)
        if study.sensitivity_reports.latest is None:  # an analysed study keeps its report
            study.sensitivity(progress=progress)
        study.baselines(progress=progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ranked = study.sensitivity_reports.latest.top(30)["tensor"].tolist()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        for size in args.size or [(1600, 1000)]:
            shooter = Shooter(study, out, size, ranked, args.target, args.search_budget)
            for path in shooter.run(browser):
                print(path, flush=True)
        browser.close()
    study.close()
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
    per_channel = PrecisionPlan.a8w8_pc()
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
