"""The studio end to end in headless Chromium (Debian's package, driven by Playwright): box-select, promote,
evaluate, the Pareto plot, export, errors, and `panel serve app.py` on the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gui_support import (stop_process, accepts_connections, chromium_path, drag_box, free_port, make_small_study, open_studio,
                         screen_points, selected_rows, source_column, studio_server, table_selection, visible_rows,
                         wait_for_bokeh, wait_until)

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_small_study(tmp_path_factory.mktemp("gui") / "study")


@pytest.fixture(scope="module")
def studio(study):
    """A Panel server whose every session is a studio on the small study; `states` holds their states."""

    with studio_server(study) as server:
        yield server


def test_box_select_promote_evaluate_and_see_the_new_point(page, studio):
    state = open_studio(page, studio)
    ids = source_column(page, "nodes", "id")
    xs, ys = source_column(page, "nodes", "x"), source_column(page, "nodes", "y")
    points = screen_points(page, "graph", xs, ys)
    # Drag a box around four nodes in view (the graph opens on the top-ranked tensor).
    inside = drag_box(page, points, visible_rows(page, "graph", points, 4))
    wait_until(lambda: sorted(selected_rows(page, "nodes")) == inside, 10, message="the box selected other nodes")
    expected = [t for t in state.tensors["tensor"] if state.tensors.set_index("tensor").loc[t, "node"] in
                {ids[i] for i in inside} or (t in state.study.graph.inputs and f"input:{t}" in {ids[i] for i in inside})]
    wait_until(lambda: set(state.selection) == set(expected) and state.selection, 10,
               message=f"state selection {state.selection} is not {expected}")
    # The table shows the same selection.
    wait_until(lambda: set(table_selection(page) or []) == set(expected), 10, message="the table shows another selection")

    before = source_column(page, "points", "plan_id") or []  # the promote evaluates the plan too (on edit)
    page.get_by_role("button", name="Promote to 16-bit").click()
    # 30 s: served studios measure the per-channel baselines in the background, so a loaded machine answers late.
    wait_until(lambda: set(state.plan.overrides) == set(expected), 30,
               message=f"the plan's overrides {sorted(state.plan.overrides)} are not the selection {sorted(expected)}"
               f" (plan {state.plan.name})")
    wait_until(lambda: all((source_column(page, "nodes", "bits") or [""] * len(ids))[i] == "16"
                           for i in inside if state.tensors is not None), 10, message="promoted nodes are not drawn as 16-bit")

    page.get_by_role("button", name="Evaluate current plan").click()
    wait_until(lambda: state.plan_id is not None and state.plan_id in (source_column(page, "points", "plan_id") or []),
               120, message="the evaluated plan did not appear on the Pareto plot")
    assert len(source_column(page, "points", "plan_id")) == len(before) + 1
    assert page.get_by_text("done").count() >= 1


def test_click_a_pareto_point_loads_its_plan_into_the_graph(page, studio):
    state = open_studio(page, studio)
    names = source_column(page, "points", "name")
    row = names.index("a16w8")
    x, y = source_column(page, "points", "latency_ms")[row], source_column(page, "points", "value")[row]
    ((sx, sy),) = screen_points(page, "pareto", [x], [y])
    page.mouse.click(sx, sy)
    wait_until(lambda: state.plan.activation_type == "uint16", 10, message="the click did not load the plan")
    wait_until(lambda: set(source_column(page, "nodes", "bits")) <= {"16", "-"}, 10,
               message="the graph does not show the 16-bit plan")
    assert page.get_by_text("loaded plan").count() >= 1


def test_export_downloads_a_valid_overrides_json(page, studio):
    state = open_studio(page, studio)
    find = page.get_by_placeholder("find a name (or *pattern*)")
    find.fill("*stage0/block1/*")  # a pattern: find selects the block's tensors
    find.press("Enter")
    wait_until(lambda: state.selection, 10, message="find selected nothing")
    chosen = list(state.selection)
    assert all("stage0/block1/" in t for t in chosen)
    page.get_by_role("button", name="Promote to 16-bit").click()
    wait_until(lambda: set(state.plan.overrides) == set(chosen), 10)
    with page.expect_download() as download_info:
        page.get_by_role("button", name="TensorQuantOverrides JSON").click()
    download = download_info.value
    assert download.suggested_filename.endswith(".overrides.json")
    overrides = json.loads(Path(download.path()).read_text())
    assert set(chosen) <= set(overrides)
    assert all(isinstance(v, list) and v and "quant_type" in v[0] for v in overrides.values())


def test_a_bad_model_shows_an_error_message(page, studio, tmp_path):
    open_studio(page, studio)
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07not a model")
    page.get_by_placeholder("path/to/model.onnx").fill(str(bad))
    page.get_by_placeholder("path/to/samples/").fill(str(tmp_path))
    page.get_by_placeholder("path/to/samples/").press("Enter")
    page.get_by_role("button", name="Open model").click()
    message = page.locator(".alert-danger").get_by_text("broken.onnx").first
    message.wait_for(state="visible", timeout=30000)
    text = message.text_content()
    assert "is not a readable ONNX model" in text, text
    assert "Traceback" not in text


@pytest.mark.slow
def test_panel_serve_app_opens_the_demo(page, tmp_path):
    pytest.importorskip("rapidocr_onnxruntime", reason="the demo model needs `pip install mpstudio[demo]`")
    port = free_port()
    env = {**os.environ, "MPSTUDIO_CACHE_DIR": os.environ.get("MPSTUDIO_TEST_DEMO_CACHE") or str(tmp_path / "cache")}
    server = subprocess.Popen([sys.executable, "-m", "panel", "serve", "app.py", "--port", str(port), "--address",
                               "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: accepts_connections(port), 60, message="panel serve app.py did not start")
        page.goto(f"http://127.0.0.1:{port}/app")
        wait_for_bokeh(page)
        # The demo study is created (model prepared, lines rendered), then its graph appears: 404 nodes + input.
        wait_until(lambda: len(source_column(page, "nodes", "id") or []) >= 400, 240,
                   message="the demo's graph did not appear")
        assert page.get_by_text("demo: PP-OCRv4").count() >= 1 or page.get_by_text("PP-OCRv4").count() >= 1
        # Its sensitivity analysis runs as a job with a progress bar and a cancel button.
        page.get_by_text("sensitivity analysis").first.wait_for(timeout=60000)
        page.get_by_role("button", name="Cancel").first.click()
        page.locator(".job-status", has_text="cancelled").first.wait_for(timeout=120000)
    finally:
        stop_process(server)

