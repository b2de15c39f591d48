"""The studio's shared selection, errors, job independence, static save and first view, in headless Chromium."""

from __future__ import annotations

import logging

import pytest

from gui_support import (chromium_path, drag_box, figure_box, make_small_study, on_loop, open_studio, screen_points,
                         selected_rows, source_column, studio_server, table_selection, top_ranked_row, visible_rows,
                         wait_for_bokeh, wait_until, y_range)

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]


class ServerLog(logging.Handler):
    """Every error the server thread logs (Bokeh, Tornado and Panel report callback failures this way)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def errors(self) -> list[str]:
        return [self.format(r) for r in self.records if r.levelno >= logging.ERROR or r.exc_info
                or "Traceback" in r.getMessage() or "pending_writes" in r.getMessage()]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_small_study(tmp_path_factory.mktemp("gui-studio") / "study")


@pytest.fixture(scope="module")
def studio(study):

    with studio_server(study) as server:
        yield server


@pytest.fixture
def server_log():
    handler = ServerLog()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def graph_rows(state, tensors, ids):
    """The graph's source rows drawing `tensors`."""
    nodes = state.tensors.set_index("tensor")["node"]
    return sorted({ids.index(nodes[t] or f"input:{t}") for t in tensors})


def test_clicking_table_rows_selects_in_the_graph_without_a_server_error(page, studio, server_log):
    state = open_studio(page, studio)
    ids = source_column(page, "nodes", "id")
    rows = page.locator(".tabulator-row")
    first = rows.nth(0).locator(".tabulator-cell[tabulator-field='tensor']").text_content().strip()
    rows.nth(0).locator(".tabulator-cell[tabulator-field='tensor']").click()
    wait_until(lambda: state.selection == [first], 30, message=f"state selection {state.selection}")
    wait_until(lambda: selected_rows(page, "nodes") == graph_rows(state, [first], ids), 30,
               message="the graph did not select the clicked row's tensor")
    third = rows.nth(2).locator(".tabulator-cell[tabulator-field='tensor']").text_content().strip()
    rows.nth(2).locator(".tabulator-cell[tabulator-field='tensor']").click(modifiers=["Control"])
    wait_until(lambda: set(state.selection) == {first, third}, 30, message=f"state selection {state.selection}")
    wait_until(lambda: sorted(selected_rows(page, "nodes")) == graph_rows(state, [first, third], ids), 30,
               message="the graph did not select both rows' tensors")
    page.get_by_text("2 tensor(s) selected").first.wait_for(state="visible", timeout=30000)

    # A box select replaces the selection everywhere: the state, the graph's summary and the table.
    xs, ys = source_column(page, "nodes", "x"), source_column(page, "nodes", "y")
    points = screen_points(page, "graph", xs, ys)
    inside = drag_box(page, points, visible_rows(page, "graph", points, 5))
    boxed = {ids[i] for i in inside}
    frame = state.tensors
    expected = {t for t, node in zip(frame["tensor"], frame["node"]) if (node or f"input:{t}") in boxed}
    wait_until(lambda: set(state.selection) == expected, 30, message=f"state selection {state.selection} is not "
                                                                     f"{expected}")
    wait_until(lambda: set(table_selection(page) or []) == expected, 30, message="the table shows another selection")
    page.get_by_text(f"{len(expected)} tensor(s) selected").first.wait_for(state="visible", timeout=30000)
    assert sorted(selected_rows(page, "nodes")) == sorted(inside)

    page.get_by_role("button", name="Promote to 16-bit").click()
    quantizable = {t for t in expected if state.study.graph.tensors[t].quantizable}
    wait_until(lambda: set(state.plan.overrides) == quantizable, 30,
               message=f"promoted {set(state.plan.overrides)}, not the selection {quantizable}")
    assert server_log.errors() == []


@pytest.fixture(scope="module")
def deep_studio(tmp_path_factory):
    """A studio on a 120-node residual net fed inputs quantization represents exactly (multiples of 1/255 in
    [0, 1]): its most sensitive tensor is then deep in the model, below the window shown at the top."""
    import numpy as np
    import onnx

    from gui_models import make_residual_model
    from mpstudio.data import FeedList
    from mpstudio.study import Study

    folder = tmp_path_factory.mktemp("gui-deep")
    onnx.save(make_residual_model(120, size=8), folder / "deep.onnx")
    rng = np.random.default_rng(0)
    feeds = FeedList([{"x": (rng.integers(0, 256, (1, 3, 8, 8)) / 255).astype(np.float32)} for _ in range(12)],
                     name="grid")
    study = Study.create(folder / "study", folder / "deep.onnx", feeds, name="deep residual net")
    study.sensitivity()
    with studio_server(study) as server:
        yield server


def test_the_graph_opens_on_the_top_ranked_tensor_and_names_tensors(page, deep_studio):
    from mpstudio.widgets.graph_view import WINDOW_LAYERS

    state = open_studio(page, deep_studio)
    row, tensor = top_ranked_row(page, state)
    ys = source_column(page, "nodes", "y")
    assert ys[row] < max(ys) - WINDOW_LAYERS, "the top-ranked tensor is in the model's first window"
    start, end = y_range(page, "graph")
    assert start < ys[row] < end
    assert source_column(page, "nodes", "tensor")[row] == tensor  # what the hover shows
    labels = page.evaluate("""() => {
      for (const m of Bokeh.documents[0].all_models)
        if (m.type === "ColumnDataSource" || m.constructor.__name__ === "ColumnDataSource") {
          const data = m.data instanceof Map ? m.data : new Map(Object.entries(m.data));
          if (data.has("label")) return Array.from(data.get("label"));
        }
      return null; }""")
    assert any(tensor[-20:] in label for label in labels), labels[:5]


PAINTED = """
(name) => {
  const model = Bokeh.documents[0].get_model_by_name(name);
  const view = model == null ? null : Bokeh.index.find_one(model);
  if (view == null) return 0;
  const canvas = view.canvas_view.primary.canvas;
  const ctx = canvas.getContext("2d");
  const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  let painted = 0;
  for (let i = 0; i < pixels.length; i += 4)
    if (pixels[i + 3] > 0 && (pixels[i] < 240 || pixels[i + 1] < 240 || pixels[i + 2] < 240)) painted++;
  return painted;
}
"""


def layout_positions(page):
    pareto = figure_box(page, "pareto")
    caption = page.get_by_text("Sensitivity ranking").first.bounding_box()
    graph = figure_box(page, "graph")
    return [pareto["x"], pareto["y"], pareto["height"], caption["x"], caption["y"], graph["y"], graph["height"]]


def test_an_error_is_dismissible_and_does_not_move_the_views(page, studio):
    state = open_studio(page, studio)
    before = layout_positions(page)
    assert not state.selection
    page.get_by_role("button", name="Promote to 16-bit").click()  # nothing selected: a user error
    toast = page.locator(".alert-danger").get_by_text("select tensors first").first
    toast.wait_for(state="visible", timeout=30000)
    during = layout_positions(page)
    assert all(abs(a - b) <= 3 for a, b in zip(before, during)), (before, during)
    # The axis title of the Pareto plot stays above the ranking's caption.
    pareto = figure_box(page, "pareto")
    caption = page.get_by_text("Sensitivity ranking").first.bounding_box()
    assert pareto["y"] + pareto["height"] <= caption["y"] + 1
    page.get_by_role("button", name="\u2715").click()
    toast.wait_for(state="hidden", timeout=30000)
    wait_until(lambda: state.error == "", 30)
    after = layout_positions(page)
    assert all(abs(a - b) <= 3 for a, b in zip(before, after)), (before, after)


def test_a_bad_model_error_does_not_wait_behind_a_long_job(page, studio, tmp_path):
    import threading

    state = open_studio(page, studio)
    release = threading.Event()

    def long_work(progress, cancel):  # an analysis that lasts until the test ends
        while not (release.is_set() or cancel.is_set()):
            progress(0, 1, "analysing")
            release.wait(0.2)
        return None

    job = on_loop(state, lambda: state.submit("analyze", "a long analysis", long_work))
    try:
        wait_until(lambda: job.status == "running", 30)
        bad = tmp_path / "broken.onnx"
        bad.write_bytes(b"\x08\x07not a model")
        page.get_by_placeholder("path/to/model.onnx").fill(str(bad))
        page.get_by_placeholder("path/to/samples/").fill(str(tmp_path))
        page.get_by_placeholder("path/to/samples/").press("Enter")
        page.get_by_role("button", name="Open model").click()
        message = page.locator(".alert-danger").get_by_text("broken.onnx").first
        message.wait_for(state="visible", timeout=30000)
        assert "is not a readable ONNX model" in message.text_content()
        assert job.status == "running"  # the error did not wait for the analysis
    finally:
        release.set()
    assert job.wait(30)


def test_the_served_studio_asks_nothing_of_other_hosts(browser, studio):
    """Every request of a served page goes to the studio's own server (offline, a font or stylesheet site would fail
    and leave the page unstyled; online it would tell a third party who opens the studio)."""
    from urllib.parse import urlsplit

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        requested = []
        page.on("request", lambda request: requested.append(request.url))
        open_studio(page, studio)
        page.wait_for_timeout(2000)  # stylesheets and fonts the page's scripts ask for later
    finally:
        context.close()
    own = urlsplit(studio.url).netloc
    elsewhere = [url for url in requested if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != own]
    assert elsewhere == [], elsewhere


def test_a_static_save_renders_offline(browser, study, tmp_path):
    import re

    from mpstudio.widgets import Studio, StudioState

    state = StudioState(study)
    try:
        assert state.jobs[0].wait(120)
        path = tmp_path / "studio.html"
        Studio(state).save(str(path))
        graph_path, pareto_path = tmp_path / "graph.html", tmp_path / "pareto.html"
        studio = Studio(state)
        studio.graph.save(str(graph_path))
        studio.pareto.save(str(pareto_path))
    finally:
        state.close()
    for saved in (path, graph_path, pareto_path):
        text = saved.read_text()
        assert not re.findall(r"<script[^>]*\bsrc=[\"']https?://", text), saved
        assert "Bokeh.set_log_level" in text or "BokehJS" in text  # BokehJS itself is in the page
        # Panel's models' stylesheets are in the page too, not imported from its CDN or a server's static path.
        imported = re.findall(r'"name":"ImportedStyleSheet","id":"[^"]+","attributes":\{"url":"([^"]+)"', text)
        assert imported == [], (saved, imported)
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, offline=True)
    try:
        page = context.new_page()
        requested = []
        page.on("request", lambda request: requested.append(request.url))
        page.route("http*://**", lambda route: route.abort())  # nothing from the network
        page.goto(path.as_uri())
        wait_for_bokeh(page, 120000)
        box = wait_until(lambda: figure_box(page, "graph"), 60, message="the saved page shows no graph")
        assert box["width"] > 100 and box["height"] > 100
        # The graph's canvas has been painted: nodes and edges, not a blank rectangle.
        painted = wait_until(lambda: page.evaluate(PAINTED, "graph") or None, 60, message="the graph is blank")
        assert painted > 200, painted
        page.locator(".tabulator-row").first.wait_for(state="visible")
        stylesheets = [url for url in requested if ".css" in url]
        assert stylesheets == [], f"the saved page asks the network for stylesheets: {stylesheets}"
    finally:
        context.close()


PROVISIONAL = """
() => ["predicted", "partial"].map((name) => {
  const data = Bokeh.documents[0].get_model_by_name(name).data_source.data;
  const status = data instanceof Map ? data.get("status") : data.status;
  return Array.from(status || []);
})
"""


def test_promote_draws_a_predicted_point_then_the_measured_one(page, studio, server_log):
    import threading

    state = open_studio(page, studio)
    state.first_samples = 4  # of 12: two partial values before the full one
    kinds = []
    state.param.watch(lambda event: kinds.append(list(event.new["kind"])), "provisional")
    row = page.locator(".tabulator-row").nth(4).locator(".tabulator-cell[tabulator-field='tensor']")
    tensor = row.text_content().strip()
    row.click()
    wait_until(lambda: state.selection == [tensor], 30)
    # An evaluation already runs: the promoted plan's own waits its turn, and its predicted point stands meanwhile.
    release = threading.Event()

    def earlier_evaluation(progress, cancel):
        while not (release.is_set() or cancel.is_set()):
            progress(0, 1, "evaluating")
            release.wait(0.2)
    blocker = on_loop(state, lambda: state.submit("evaluate", "an earlier evaluation", earlier_evaluation))
    try:
        wait_until(lambda: blocker.status == "running", 30)
        known = set(source_column(page, "points", "plan_id"))
        page.get_by_role("button", name="Promote to 16-bit").click()
        page.wait_for_function(f"() => ({PROVISIONAL})()[0].length > 0", timeout=60000)
        predicted, partial = page.evaluate(PROVISIONAL)
        assert predicted == ["predicted, not measured yet"] and partial == []
        hover = page.evaluate("""() => Bokeh.documents[0].get_model_by_name("predicted").data_source.data""")
        assert "isolation scores" in (hover["detail"] if isinstance(hover, dict) else "")[0]
        legend = page.evaluate("""() => Bokeh.documents[0].get_model_by_name("pareto_legend").items
                                  .map((item) => item.label.value)""")
        assert legend[:2] == ["measured", "predicted"]
        assert set(source_column(page, "points", "plan_id")) == known  # nothing measured yet
    finally:
        release.set()
    # Then measured: values on 4 and 8 of the 12 samples with their intervals, then the stored result, which
    # the provisional point gives way to.
    wait_until(lambda: state.plan_id is not None and state.plan_id in source_column(page, "points", "plan_id"), 120,
               message="the measured point did not appear")
    wait_until(lambda: page.evaluate(PROVISIONAL) == [[], []], 30, message="a provisional point was left over")
    assert kinds[0] == ["predicted"] and kinds.count(["partial"]) == 2 and kinds[-1] == [], kinds
    assert server_log.errors() == []


@pytest.fixture(scope="module")
def unanalyzed_studio(tmp_path_factory):
    """A studio on a 600-node study not analysed yet: opening it starts the analysis, a job of several seconds
    (the progressive analysis finishes a smaller one before the bar can be read)."""
    import onnx

    from gui_models import make_residual_model
    from gui_support import small_feeds
    from mpstudio.study import Study

    folder = tmp_path_factory.mktemp("gui-unanalyzed")
    onnx.save(make_residual_model(600, size=8), folder / "model.onnx")
    study = Study.create(folder / "study", folder / "model.onnx", small_feeds(), name="unanalysed net")
    study.baselines()
    with studio_server(study) as server:
        yield server


def test_the_job_bar_shows_the_running_analysis_and_cancels_it(page, unanalyzed_studio):
    page.goto(unanalyzed_studio.url)
    wait_for_bokeh(page)
    state = wait_until(lambda: unanalyzed_studio.states[-1] if unanalyzed_studio.states else None)
    job = wait_until(lambda: next((j for j in state.jobs if j.kind == "analyze"), None))
    chip = page.locator(".mpstudio-bar-job", has=page.get_by_text("sensitivity analysis"))
    chip.wait_for(state="visible", timeout=60000)
    box = page.locator(".mpstudio-job-bar").first.bounding_box()
    assert box["y"] < 120 and box["height"] <= 64  # across the top of the main area
    status = chip.locator(".job-status").first
    wait_until(lambda: status.text_content() == "running", 60, message="the bar does not say the analysis runs")
    assert job.status == "running"
    chip.locator(".mpstudio-job-cancel button").click()
    assert job.wait(60) and job.status == "cancelled"
    chip.wait_for(state="hidden", timeout=30000)
    page.locator(".mpstudio-bar-idle").get_by_text("sensitivity analysis cancelled").wait_for(timeout=30000)
    # What the analysis had delivered before the cancel stays shown, marked partial.
    assert state.report is None or state.report.meta.get("partial")
    assert page.locator(".mpstudio-job-bar").first.bounding_box()["height"] == pytest.approx(box["height"], abs=1)


def test_a_saved_page_leaves_out_the_modules_of_models_it_does_not_use(tmp_path):
    """Panel lists the script modules of every model class the process has loaded (Vizzu's, from a CDN, once
    anything imported panel.models.vizzu); a saved page keeps only those of the models it contains."""
    import re

    import panel as pn
    import panel.models.vizzu  # noqa: F401  (loaded, as another part of a process may load it)

    from mpstudio.widgets.base import save_inline
    from mpstudio.widgets.offline_page import unused_module_scripts

    path = tmp_path / "page.html"
    save_inline(pn.Column(pn.pane.Markdown("text")), path)
    assert re.findall(r'<script type="module" src="(https?://[^"]+)', path.read_text()) == []
    # A page that has the model keeps its module.
    url = panel.models.vizzu.VizzuChart.__javascript_modules__[0]
    page = (f'<script type="module" src="{url}"></script>'
            '<script>{"type":"object","name":"panel.models.vizzu.VizzuChart"}</script>')
    assert url in unused_module_scripts(page)
    assert url not in unused_module_scripts(page.replace('VizzuChart"', 'Other"'))


def test_a_saved_view_carries_no_design_another_part_of_the_process_set(tmp_path):
    """A design set for the whole process (Fast, by a template or an extension call elsewhere) added its script
    modules, named by CDN address, to every saved page: offline they fail."""
    import re

    import panel as pn
    from panel.theme import Fast

    from mpstudio.widgets.base import _process_config, save_inline

    path = tmp_path / "page.html"
    # Read and set as the process's, not through `pn.config.design`: while a served studio of another test renders
    # a page in its thread, that reads the session's design (seen in a full run of the suite).
    before = _process_config("design")
    _process_config("design", Fast)
    try:
        save_inline(pn.Column(pn.pane.Markdown("text")), path)
        assert _process_config("design") is Fast  # the process's setting is left as it was
    finally:
        _process_config("design", before)
    assert re.findall(r'<script type="module" src="(https?://[^"]+)', path.read_text()) == []


def test_a_page_saved_while_another_thread_sets_a_design_still_names_no_other_host(tmp_path):
    """Panel's configuration is shared by a process's threads: a served template sets its design while it renders
    a session's page, so a page saved meanwhile in another thread was written with the Fast design's CDN script
    modules and its font's stylesheet (seen in a full run of the suite). The offline rewrite drops every file a
    design adds; the page is saved with none."""
    import re

    import panel as pn
    from bokeh.resources import INLINE
    from panel.theme import Fast

    from mpstudio.widgets.offline_page import make_offline
    from mpstudio.widgets.studio import _fast_without_web_font

    _fast_without_web_font()  # as in a process that served the studio: a second design class named "Fast"
    path = tmp_path / "page.html"
    before = pn.config.design
    pn.config.design = Fast  # what the other thread had set when Panel wrote the page
    try:
        pn.Column(pn.pane.Markdown("text")).save(path, resources=INLINE)
    finally:
        pn.config.design = before
    written = path.read_text()
    assert "fast_design.js" in written  # the page as Panel wrote it in that moment
    make_offline(path)
    page = path.read_text()
    assert re.findall(r'<(?:script|link)[^>]*\s(?:src|href)="(https?://[^"]+)"', page) == []
