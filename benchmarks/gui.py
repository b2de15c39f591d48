"""The graph view in headless Chromium on a 2,000-node model, against a plain Bokeh scatter of the same points.

    python benchmarks/gui.py [--nodes 2000] [--rounds 5]

Serves, in one Panel server, (a) the studio's GraphView (edges, labels, colours, 8/16-bit markers, hover,
minimap, colour bar, its widgets) and (b) a plain Bokeh figure with one scatter of the same node positions,
and measures in the same run:
  1. first render: from navigation until the page's Bokeh document is idle (session made on the server,
     models sent, everything drawn), the best of `--rounds` alternating fresh page loads of each, so a
     noisy neighbour hurts both sides alike (target: the graph view at most 2x the plain scatter);
  2. select-to-state round trip: the nodes' selection set in the browser (what a box select does) until the
     studio's state holds those tensors and the sensitivity table in the browser shows them selected,
     timed in the browser, median of 20 selections of 1 to 50 nodes (target: at most 300 ms).
Needs Chromium (scripts/install-browser). Prints a table; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gui_models import make_residual_model  # noqa: E402
from gui_support import PanelServer, chromium_path, small_feeds, wait_for_bokeh, wait_until  # noqa: E402

RENDER_TARGET = 2.0
ROUND_TRIP_TARGET_MS = 300.0

ROUND_TRIP = """
async ([rows, tensors]) => {
  const doc = Bokeh.documents[0];
  const nodes = doc.get_model_by_name("nodes").data_source;
  let table = null;
  for (const model of doc.all_models) {
    if (model.type === "DataTabulator" || model.constructor.__name__ === "DataTabulator") table = model;
  }
  const names = table.source.data instanceof Map ? table.source.data.get("tensor") : table.source.data.tensor;
  const want = new Set(tensors);
  const start = performance.now();
  nodes.selected.indices = rows;
  while (true) {
    const shown = Array.from(table.source.selected.indices).map((i) => names[i]);
    if (shown.length === want.size && shown.every((t) => want.has(t))) return performance.now() - start;
    if (performance.now() - start > 10000) return -1;
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
}
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    browser_path = chromium_path()
    if browser_path is None:
        print("no Chromium found: run scripts/install-browser first", file=sys.stderr)
        return 2

    from playwright.sync_api import sync_playwright

    from mpstudio.study import Study
    from mpstudio.widgets import StudioState

    with tempfile.TemporaryDirectory(prefix="mpstudio-bench-gui-") as tmp:
        model = Path(tmp) / "model.onnx"
        onnx.save(make_residual_model(args.nodes, size=8), model)
        study = Study.create(Path(tmp) / "study", model, small_feeds(4))
        started = time.perf_counter()
        probe = StudioState(study, auto_analyze=False)  # lays the graph out once (cached on disk after)
        layout_s = time.perf_counter() - started
        layout = probe.layout
        print(f"model: {len(study.graph.nodes)} nodes, {len(layout.edges)} edges drawn; layout {layout.engine} "
              f"{layout_s:.2f} s, {layout.depth} layers")
        states = []
        servers = _servers(study, layout, states)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
                render = _render_times(browser, servers, args.rounds)
                trips = _round_trips(browser, servers["select"].url, states)
                browser.close()
        finally:
            for state in states:
                state.close()
            for server in servers.values():
                server.stop()
    return _report(render, trips)


def _servers(study, layout, states: list) -> dict:
    """One Panel server each for the graph view, the plain scatter, and the graph view beside the table."""
    import panel as pn
    from bokeh.plotting import figure

    from mpstudio.widgets import GraphView, SensitivityTable, StudioState

    def graph_page():
        state = StudioState(study, auto_analyze=False)
        states.append(state)
        return pn.Column(GraphView(state=state), sizing_mode="stretch_both", min_height=900)

    def scatter_page():
        fig = figure(sizing_mode="stretch_both", min_height=480, tools="pan,wheel_zoom,box_select,tap,reset")
        fig.scatter(layout.nodes["x"].tolist(), layout.nodes["y"].tolist(), size=13)
        return pn.Column(pn.pane.Bokeh(fig, sizing_mode="stretch_both"), sizing_mode="stretch_both", min_height=900)

    def select_page():
        state = StudioState(study, auto_analyze=False)
        states.append(state)
        return pn.Row(GraphView(state=state), SensitivityTable(state=state), sizing_mode="stretch_both",
                      min_height=900)

    return {name: PanelServer(factory, name) for name, factory in
            (("graph", graph_page), ("scatter", scatter_page), ("select", select_page))}


def _render_times(browser, servers: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds from navigation to an idle Bokeh document, per page, over alternating fresh page loads."""
    render = {"graph": [], "scatter": []}
    for round_ in range(rounds + 1):  # the first round warms caches and is dropped
        for name in ("scatter", "graph") if round_ % 2 else ("graph", "scatter"):
            context = browser.new_context(viewport={"width": 1400, "height": 950})
            page = context.new_page()
            start = time.perf_counter()
            page.goto(servers[name].url)
            wait_for_bokeh(page, 120000)
            if round_:
                render[name].append(time.perf_counter() - start)
            context.close()
    return render


def _round_trips(browser, url: str, states: list) -> list[float]:
    """Milliseconds of 20 select -> state -> table round trips, timed in the browser."""
    context = browser.new_context(viewport={"width": 1400, "height": 950})
    page = context.new_page()
    page.goto(url)
    wait_for_bokeh(page, 120000)
    state = states[-1]
    view_rows = _rows(state)
    trips = []
    for i in range(20):
        count = 1 + (i * 7) % 50
        start_row = (i * 97) % max(1, len(view_rows) - count)
        rows = list(range(start_row, start_row + count))
        tensors = sorted({t for r in rows for t in view_rows[r]})
        if not tensors:
            continue
        ms = page.evaluate(ROUND_TRIP, [rows, tensors])
        wait_until(lambda: set(state.selection) == set(tensors), 10)
        trips.append(ms if ms >= 0 else float("inf"))
    context.close()
    return trips


def _report(render: dict[str, list[float]], trips: list[float]) -> int:
    """Print the table; 0 when every target is met, else 1."""
    graph_s, scatter_s = min(render["graph"]), min(render["scatter"])
    medians = statistics.median(render["graph"]), statistics.median(render["scatter"])
    trip_ms = statistics.median(trips)
    lost = sum(math.isinf(ms) for ms in trips)
    ratio = graph_s / scatter_s
    rows = [
        ("first render, graph view (best)", f"{graph_s * 1000:.0f} ms", f"median {medians[0] * 1000:.0f} ms"),
        ("first render, plain scatter (best)", f"{scatter_s * 1000:.0f} ms", f"median {medians[1] * 1000:.0f} ms"),
        ("ratio", f"{ratio:.2f}x", f"<= {RENDER_TARGET:.1f}x (medians: {medians[0] / medians[1]:.2f}x)"),
        ("select -> state -> table (median of 20)", f"{trip_ms:.0f} ms", f"<= {ROUND_TRIP_TARGET_MS:.0f} ms"),
        ("select -> state -> table (worst)", f"{max(trips):.0f} ms", ""),
        ("round trips the table never showed", f"{lost}", "0 (a lost update is a miss, whatever the median)"),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value, target in rows:
        print(f"{label:<{width}}  {value:>9}  {target}")
    ok = ratio <= RENDER_TARGET and trip_ms <= ROUND_TRIP_TARGET_MS and lost == 0
    print("all targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


def _rows(state) -> list[list[str]]:
    """Per drawn node (row of the nodes source), the tensors selecting it selects, as the GraphView maps them."""
    layout = state.layout
    by_node = state.tensors.groupby("node")["tensor"].agg(list).to_dict()
    out = []
    for node_id in layout.nodes["id"]:
        found = []
        for member in layout.members[node_id]:
            found += by_node.get(member, [])
            if node_id.startswith("input:"):
                found.append(member)
        out.append(found)
    return out


if __name__ == "__main__":
    sys.exit(main())
