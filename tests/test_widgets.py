"""The studio's state and views without a browser: a real study on disk, real ORT runs, real Bokeh models."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from bokeh.document import Document
from bokeh.models import ColorBar
from bokeh.document.events import ColumnDataChangedEvent, ColumnsPatchedEvent, ColumnsStreamedEvent

from agent_fixtures import needs_qnn
from gui_support import make_small_study
from mpstudio.plan import PrecisionPlan
from mpstudio.widgets import ExportPanel, GraphView, ParetoPlot, SensitivityTable, Studio, StudioState

pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_small_study(tmp_path_factory.mktemp("widgets") / "study")


@pytest.fixture
def state(study):
    state = StudioState(study, evaluate_on_edit=False)  # test_gui_studio and test_preview cover evaluation on edit
    job = state.jobs[0]
    assert job.kind == "analyze" and job.wait(120) and job.status == "done", job.error
    yield state
    state.close()


def activations(state):
    return state.tensors["tensor"].tolist()


def test_opening_a_study_lays_out_its_graph_and_reads_its_ranking(state, study):
    graph = study.graph
    assert state.layout is not None and len(state.layout) == len(graph.nodes) + len(graph.inputs)
    assert activations(state) == graph.activations()
    assert (state.tensors["bits"] == 8).all()
    ranked = state.tensors.dropna(subset=["rank"])
    assert len(ranked) == len(state.report.ranking)  # every ranked tensor has its scores in the table
    top = state.report.ranking.iloc[0]
    row = state.tensors.set_index("tensor").loc[top["tensor"]]
    assert row["rank"] == 1 and row["snr_db"] == pytest.approx(top["snr_db"])
    assert state.plan.hash == PrecisionPlan.a8w8().hash and state.plan_id is not None  # a8w8 is stored
    assert set(state.evaluations["name"]) >= {"a8w8", "a16w8"}


def test_promote_and_demote_the_selection(state):
    chosen = activations(state)[3:7]
    state.select(chosen + ["no such tensor"])
    assert state.selection == chosen
    plan = state.promote_selected()
    assert set(plan.overrides) == set(chosen) and state.plan is plan and state.plan_id is None
    assert set(state.sixteen_bit()) >= set(chosen)
    state.select(chosen[:2])
    state.demote_selected()
    assert set(state.plan.overrides) == set(chosen[2:])
    state.select([])
    before = state.plan
    state.promote_selected()
    assert state.plan is before and "select tensors first" in state.error


def test_graph_selection_goes_both_ways_and_promotion_patches_the_figure(state):
    view = GraphView(state=state)
    doc = Document()
    doc.add_root(view.figure)
    doc.add_root(view.minimap)
    events = []
    doc.on_change(lambda event: events.append(event))
    source = view.nodes
    ids = source.data["id"]
    # Box/tap select in the figure -> the tensors those nodes produce are the state's selection.
    rows = [ids.index(state.tensors.set_index("tensor").loc[t, "node"]) for t in activations(state)[5:8]]
    source.selected.indices = rows
    assert state.selection == activations(state)[5:8]
    # The state's selection -> the figure.
    state.select(activations(state)[10:12])
    assert sorted(source.selected.indices) == sorted(ids.index(state.tensors.set_index("tensor").loc[t, "node"])
                                                     for t in activations(state)[10:12])
    # Promote: the figure is not rebuilt; the style columns are patched and the nodes turn to squares.
    events.clear()
    state.promote_selected()
    assert any(isinstance(e, ColumnsPatchedEvent) for e in events)
    assert not any(isinstance(e, ColumnDataChangedEvent) for e in events)
    for row in source.selected.indices:
        assert source.data["bits"][row] == "16"
    assert source.data["bits"][0] == "8"


def test_colour_by_a_score(state):
    view = GraphView(state=state)
    frame = state.tensors.set_index("tensor")
    for label, column in (("isolation gain", "isolation_gain"), ("SNR (dB)", "snr_db")):
        state.color_by = column
        row = next(i for i, t in enumerate(view._node_tensors) if len(t) == 1 and math.isfinite(frame.loc[t[0], column]))
        assert view.nodes.data["score"][row] == pytest.approx(frame.loc[view._node_tensors[row][0], column])
        assert view.figure.select_one(ColorBar).title == label
    state.color_by = "isolation_gain"
    assert view.mapper.palette[-1] != view.mapper.palette[0]


def test_colour_by_latency_share_estimates_the_current_plan(state):
    view = GraphView(state=state)
    state.color_by = "latency_share"
    job = state.jobs[0]
    assert job.kind == "latency" and job.wait(120) and job.status == "done", job.error
    shares = state.tensors["latency_share"]
    assert shares.notna().sum() > len(shares) / 2 and 0 < shares.sum() <= 1.0
    assert np.nansum(view.nodes.data["score"]) == pytest.approx(shares.sum(), rel=1e-6)
    # A new plan drops the old estimate and makes its own.
    state.select(activations(state)[3:5])
    state.promote_selected()
    job = state.jobs[0]
    assert job.kind == "latency" and job.wait(120) and job.status == "done"
    assert state.tensors["latency_share"].notna().any()


def test_table_selection_is_shared_with_the_graph(state):
    table = SensitivityTable(state=state)
    graph = GraphView(state=state)
    value = table.table.value
    assert value["rank"].iloc[0] == 1 and value["tensor"].iloc[0] == state.report.ranking["tensor"].iloc[0]
    table.table.selection = [0, 2]
    assert state.selection == [value["tensor"].iloc[0], value["tensor"].iloc[2]]
    assert len(graph.nodes.selected.indices) == 2
    graph.nodes.selected.indices = [graph._row_of_tensor[value["tensor"].iloc[1]]]
    assert table.table.selection == [1]
    state.promote_selected()  # a new plan patches the bits column in place
    assert table.table.value["bits"].iloc[1] == 16 and table.table.value["bits"].iloc[0] == 8


def test_collapse_and_expand_namespaces(state):
    view = GraphView(state=state)
    full = len(view.nodes.data["id"])
    assert "stage0" in state.param.collapsed.objects
    state.collapse("stage0")
    ids = view.nodes.data["id"]
    assert len(ids) < full and "ns:stage0" in ids
    row = ids.index("ns:stage0")
    view.nodes.selected.indices = [row]  # selecting the namespace node selects all of its tensors
    members = set(state.tensors.loc[state.tensors["namespace"].str.startswith("stage0"), "tensor"])
    assert set(state.selection) == members
    state.promote_selected()
    assert view.nodes.data["bits"][row] in ("16", "8+16")
    state.expand()
    assert len(view.nodes.data["id"]) == full


def test_find_selects_and_scrolls_to_a_tensor(state):
    view = GraphView(state=state)
    last = activations(state)[-2]
    state.query = "*" + last.split("/")[-2] + "/" + last.split("/")[-1]  # a pattern: the end of a name
    assert last in state.selection and state.focus == state.selection[0]
    row = view._row_of_tensor[state.focus]
    y_range = view.figure.y_range
    assert y_range.start < view.nodes.data["y"][row] < y_range.end
    state.query = "definitely-not-a-name"
    assert "no tensor or node is called" in state.message and "*definitely-not-a-name*" in state.message
    state.query = "*definitely-not*"
    assert "nothing matches" in state.message


def test_find_matches_whole_names_unless_given_a_pattern(state):
    """Find "p2o.Add.27" selects that tensor, not p2o.Add.270 too; "p2o.Add.27*" selects both."""
    import pandas as pd

    from mpstudio.widgets.editing import matching_tensors

    frame = pd.DataFrame({"tensor": ["p2o.Add.27", "p2o.Add.270", "p2o.Add.271", "x"],
                          "node": ["n27", "n270", "n271", ""]})
    assert matching_tensors(frame, "p2o.add.27") == ["p2o.Add.27"]
    assert matching_tensors(frame, "n270") == ["p2o.Add.270"]  # a producer's whole name selects its tensor
    assert matching_tensors(frame, "p2o.add.27*") == ["p2o.Add.27", "p2o.Add.270", "p2o.Add.271"]
    assert matching_tensors(frame, "p2o.add.2") == []
    tensor = activations(state)[3]
    assert state.find(tensor) == [tensor] and state.selection == [tensor]
    assert state.find(tensor[:-1]) == [] or state.find(tensor[:-1]) == [tensor[:-1]]


def test_evaluate_adds_a_point_and_a_click_on_a_point_loads_its_plan(state):
    plot = ParetoPlot(state=state)
    doc = Document()
    doc.add_root(plot.figure)
    events = []
    doc.on_change(lambda event: events.append(event))
    before = len(plot.points.data["plan_id"])
    state.select(activations(state)[4:9])
    plan = state.promote_selected()
    job = state.evaluate_plan()
    assert job.wait(120) and job.status == "done", job.error
    assert state.plan_id is not None and state.plan_id in plot.points.data["plan_id"]
    assert len(plot.points.data["plan_id"]) == before + 1
    # The new point is streamed (and changed rows patched): the plot's sources are not replaced.
    changed = [e for e in events if getattr(e, "model", None) is plot.points]
    assert any(isinstance(e, ColumnsStreamedEvent) for e in changed)
    assert not any(isinstance(e, ColumnDataChangedEvent) for e in changed)
    assert "estimate" in plot.figure.xaxis[0].axis_label and "higher is better" in plot.figure.yaxis[0].axis_label
    assert plot.current.data["x"] and set(plot.labels.data["text"]) == {"a8w8", "a16w8"}
    # A click on the a16w8 baseline loads that plan into the graph.
    graph = GraphView(state=state)
    row = plot.points.data["name"].index("a16w8")
    plot.points.selected.indices = [row]
    assert state.plan.activation_type == "uint16" and state.plan_id == plot.points.data["plan_id"][row]
    assert set(graph.nodes.data["bits"]) <= {"16", "-"}
    assert state.plan.hash != plan.hash


def test_a_failing_job_shows_a_readable_error(state):
    state.runner = "remote"
    state.agent_url = "not a url"
    job = state.evaluate_plan()
    assert job.wait(60) and job.status == "failed"
    assert "remote agent's URL" in job.error and job.error == state.error and "Traceback" not in state.error


def test_cancel_a_search(state):
    job = state.start_search("60")  # an output SNR no plan reaches: the search keeps going until cancelled
    state.cancel_jobs()
    assert job.wait(120) and job.status == "cancelled"
    # What the search evaluated before the cancel is on the plot, without switching tabs.
    assert set(state.evaluations["plan_id"]) == set(state.study.front(state.latency_source)["plan_id"])


def test_the_pareto_plot_follows_a_search(state):
    from gui_support import wait_until

    before = set(state.study.front(state.latency_source)["plan_id"])
    job, while_running = None, []

    def watch(event):
        plans = set(event.new["plan_id"]) if len(event.new) else set()
        if job is not None and job.status == "running":
            while_running.append(plans)

    state.param.watch(watch, "evaluations")
    job = state.start_search("55", max_evaluations=10)  # output SNR: not reached, so it walks its budget
    assert job.wait(300) and job.status == "done", job.error
    # The plot took each evaluation as it landed, while the search still ran.
    assert len(while_running) >= 2 and any(plans - before for plans in while_running)
    wait_until(lambda: set(state.evaluations["plan_id"]) == set(state.study.front(state.latency_source)["plan_id"]))


def test_a_bad_model_shows_an_error(tmp_path, study):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not an onnx file")
    state = StudioState(auto_analyze=False)
    job = state.open_model(bad, study.folder / "data" / "calibration")
    assert job.wait(60) and job.status == "failed"
    assert "bad.onnx" in state.error and "Traceback" not in state.error and state.study is None
    state = StudioState.from_arguments(model=str(bad))
    assert "--data" in state.error


def test_a_model_with_an_op_qnn_lacks_opens_with_the_fallback_box_ticked(tmp_path, monkeypatch):
    """Refused with the way out named in the studio's own terms; opened once "Allow CPU fallback" is ticked,
    as a study whose HTP runs leave that node to the CPU (and the graph marks it)."""
    from mpstudio.data import FeedList
    from test_rewrites import erf_feeds, erf_model

    monkeypatch.setenv("MPSTUDIO_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tmp_path / "erf.onnx", tmp_path / "samples"
    onnx.save(erf_model(), model)
    FeedList(erf_feeds(4)).save_npz(data)
    state = StudioState(auto_analyze=False)
    job = state.open_model(model, data)
    assert job.wait(60) and job.status == "failed"
    assert "/head/Erf [Erf]" in state.error and "Allow CPU fallback" in state.error and state.study is None
    state.allow_fallback = True
    job = state.open_model(model, data)
    assert job.wait(120) and job.status == "done", job.error
    assert state.study.cpu_fallback_nodes == ("/head/Erf",)
    view = GraphView(state=state)
    marked = [label for label in view._labels if label.endswith("[CPU]")]
    assert len(marked) == 1 and "Erf" in marked[0] and len(view.cpu_nodes.data["x"]) == 1  # and a red cross
    state.close()


def test_export_writes_valid_json(state, tmp_path):
    state.select(activations(state)[2:4])
    state.promote_selected()
    panel = ExportPanel(state=state)
    path = panel.downloads["ort"].callback()
    overrides = json.loads(open(path).read())
    assert set(activations(state)[2:4]) <= set(overrides)
    assert panel.downloads["ort"].filename.endswith(".overrides.json")
    encodings = json.loads(open(panel.downloads["qnn"].callback()).read())
    assert "activation_encodings" in encodings and "param_encodings" in encodings
    onnx.checker.check_model(onnx.load(panel.downloads["model"].callback()))


def test_the_studio_lays_out_every_view(state):
    studio = Studio(state)
    layout = studio.__panel__()
    assert studio.__panel__() is layout  # displayed twice, built once
    names = {type(v).__name__ for v in (studio.graph, studio.table, studio.pareto, studio.run, studio.export,
                                        studio.model)}
    assert names == {"GraphView", "SensitivityTable", "ParetoPlot", "RunPanel", "ExportPanel", "ModelPanel"}
    assert studio.model._report(state.study).count("QNN") >= 1
    layout.get_root(Document())  # every pane and binding renders
    assert "plan" in studio.run._plan_text(state.plan, state.plan_id)


def test_a_search_loads_its_recommended_plan(state):
    from mpstudio.widgets.search_card import SearchCard

    plot = ParetoPlot(state=state)
    card = SearchCard(state=state)
    assert not card._card.visible
    messages = []
    job = state.start_search("a16w8+50%", max_evaluations=6)
    job.param.watch(lambda event: messages.append((event.obj.message, event.obj.done, event.obj.total)), "message")
    # The job says where it runs: the walk on the CPU, the confirmation on the HTP (not "on cpu" alone).
    assert job.title == "searching for a16w8+50%: walk on cpu, confirmed on htp"
    assert job.wait(300) and job.status == "done", job.error
    result = job.result
    assert state.plan_id == result.recommended.plan_id and state.plan.hash == result.recommended.plan_hash
    assert "recommended" in state.message and "search result card" in state.message
    # Its counter counts one unit per phase, and the message names it (plans walked, then plans confirmed).
    counted = [(m, d, t) for m, d, t in messages if m.startswith(("walk on cpu: plans", "confirming on htp: plans"))]
    assert counted and all(m.startswith(("walk on", "confirming on", "preparing")) for m, _, _ in messages
                           if m not in ("starting", "done")), messages[:5]
    # The answer is a card: the pick, why, the CPU/HTP table and disagreements (when confirmed), alternatives.
    assert card._card.visible and state.search_result is result
    text = card._body.object
    assert f"Recommended: plan {result.recommended.plan_id}" in text and "Why this plan." in text
    assert "much better for little more" in text or "No plan of the front is much better" in text
    assert text.count("</tr>") >= len(result.considered) + 1  # every plan considered, a row each
    assert all(f">{c.plan_id}</td>" in text for c in result.considered)
    if result.confirmations:
        assert "<table" in text and ("CPU and HTP agree" in text or "CPU and HTP disagree" in text)
    assert set(plot.points.data["plan_id"]) >= {e.plan_id for e in result.path}
    # The search's HTP confirmation (where QNN is installed) shows on the plot beside the CPU points it checks.
    confirmed = {c.walk.plan_id: c.confirmed.value for c in result.confirmations}
    shown = dict(zip(plot.checks.data["plan_id"], plot.checks.data["other_value"]))  # (earlier searches' too)
    assert {k: shown.get(k) for k in confirmed} == pytest.approx(confirmed)
    assert plot._checks_item.visible == bool(confirmed)


@pytest.mark.slow
@needs_qnn
def test_evaluate_on_the_local_agent_and_on_a_remote_agent_by_url(state):
    from mpstudio.agent import LocalAgent

    state.select(activations(state)[6:9])
    state.promote_selected()
    state.runner, state.backend = "agent", "htp"
    job = state.evaluate_plan()
    assert job.wait(300) and job.status == "done", job.error
    assert "HTP emulator" in job.result.accuracy_source
    assert {lat.source for lat in job.result.latencies} >= {"estimate", "emulator"}
    assert state.agents.local is not None and state.agents.local.pid is not None  # started once, kept for the session
    # The same plan through an agent given by URL and token (what a device would be).
    with LocalAgent() as device:
        state.runner, state.backend = "remote", "cpu"
        state.agent_url, state.agent_token = device.url, "wrong token"
        job = state.evaluate_plan(PrecisionPlan.a8w8().promote(activations(state)[9:11]))
        assert job.wait(120) and job.status == "failed" and "token" in job.error.lower()
        state.agent_token = device.token
        job = state.evaluate_plan(PrecisionPlan.a8w8().promote(activations(state)[9:11]))
        assert job.wait(300) and job.status == "done", job.error
    agent = state.agents.local
    state.close()
    assert agent.pid is None or agent._process is None or agent._process.poll() is not None


def test_a_long_latency_label_does_not_overflow_the_axis(state):
    plot = ParetoPlot(state=state)
    frame = state.evaluations.copy()
    host = "a-build-host-with-a-rather-long-name.example"
    frame["latency_label"] = f"emulator host time on {host} (not device latency)"
    state.latency_source = "emulator"
    try:
        plot._note.object = ""
        plot._axis_labels(frame)
        assert len(plot.figure.xaxis.axis_label) <= 60 and "not device latency" in plot.figure.xaxis.axis_label
        assert host in plot._note.object  # the whole label is still shown, above the plot
    finally:
        state.latency_source = "estimate"


def test_an_edit_supersedes_the_evaluation_the_previous_edit_started(study):
    state = StudioState(study, first_samples=4)
    try:
        assert all(job.wait(120) for job in state.jobs)
        drawn = []
        state.param.watch(lambda event: drawn.append(list(zip(event.new["plan_hash"], event.new["kind"]))),
                          "provisional")
        state.select(activations(state)[12:13])
        first_plan = state.promote_selected()
        first = next(job for job in state.jobs if job.kind == "evaluate")
        assert drawn and drawn[0] == [(first_plan.hash, "predicted")], (state.message, drawn)  # at once
        state.select(activations(state)[13:14])
        second_plan = state.promote_selected()
        second = next(job for job in state.jobs if job.kind == "evaluate" and job is not first)
        assert first.wait(120) and second.wait(120), (first.status, second.status)
        assert second.status == "done" and first.status in ("cancelled", "done")
        assert state.provisional.empty  # nothing left over of either plan
        assert state.plan_id == study.plan_id(second_plan) and state.plan_id in set(state.evaluations["plan_id"])
    finally:
        state.close()


def test_finished_jobs_show_no_cancel_button(state):
    from mpstudio.widgets.jobs import JobBar, JobsView

    bar = JobBar(state=state)
    job = state.submit("search", "a short job", lambda progress, cancel: 1)
    bar._jobs[0] = job
    bar._render(0)
    if job.active:
        assert bar._cancels[0].visible
    assert job.wait(30) and job.status == "done"
    bar._jobs[0] = job  # a finished job still in its slot (its status changed before the bar's job list)
    bar._render(0)
    assert not bar._cancels[0].visible
    jobs = JobsView(state=state)
    slot = jobs._jobs.index(job)
    assert jobs._slots[slot].visible and "done" in jobs._texts[slot].object and not jobs._cancels[slot].visible


def test_the_jobs_view_fills_its_rows_and_never_adds_one(state):
    """Jobs come and go in fixed rows: the layout's children never change (a change of children the page misses,
    while it is still taking the session in, left it updating rows it never received)."""
    from mpstudio.widgets.jobs import JobsView

    view = JobsView(state=state)
    children = list(view._column.objects)
    jobs = [state.submit("search", f"job {i}", lambda progress, cancel: 1) for i in range(view.SLOTS + 2)]
    assert all(job.wait(30) for job in jobs)
    assert list(view._column.objects) == children and all(a is b for a, b in zip(view._column.objects, children))
    shown = [view._texts[i].object for i in range(view.SLOTS) if view._slots[i].visible]
    kept = state.jobs[:view.SLOTS]  # the study keeps the active, failed and latest jobs
    assert len(shown) == len(kept) >= 2 and f"<b>job {view.SLOTS + 1}</b>" in shown[0]  # the newest first
    assert not any("<b>job 0</b>" in text for text in shown) and not view._empty.visible


def test_a_dynamic_input_is_fixed_in_the_input_shapes_field(tmp_path, monkeypatch):
    """The studio's message names the Input shapes field beside the model path, not command-line flags."""
    from conftest import make_conv_model
    from mpstudio.data import FeedList

    monkeypatch.setenv("MPSTUDIO_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tmp_path / "dynamic.onnx", tmp_path / "samples"
    onnx.save(make_conv_model(dynamic_batch=True), model)
    rng = np.random.default_rng(0)
    FeedList([{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]).save_npz(data)
    state = StudioState(auto_analyze=False)
    job = state.open_model(model, data)
    assert job.wait(60) and job.status == "failed"
    assert "dynamic" in state.error and "Input shapes" in state.error and "--shape" not in state.error
    job = state.open_model(model, data, shapes="x=1,3,bad")
    assert job.wait(60) and job.status == "failed"
    assert "Input shapes" in state.error and "--shape" not in state.error, state.error
    state.close()


def test_a_model_typed_in_the_panel_never_reopens_the_study_the_studio_started_on(tmp_path, monkeypatch):
    """`panel serve app.py --args --model M --data D --study S`: S is M's study. A model a visitor then types in
    the Model and data panel (a broken one, another one) gets its own error or its own study, not S again."""
    from conftest import conv_feeds, make_conv_model
    from mpstudio.data import FeedList

    monkeypatch.setenv("MPSTUDIO_CACHE_DIR", str(tmp_path / "cache"))
    first, other, broken, data = (tmp_path / name for name in ("first.onnx", "other.onnx", "broken.onnx", "samples"))
    onnx.save(make_conv_model(seed=0), first)
    onnx.save(make_conv_model(seed=1), other)
    broken.write_bytes(first.read_bytes()[:200])
    FeedList(conv_feeds(4)).save_npz(data)
    started_on = tmp_path / "first.study"
    state = StudioState.from_arguments(study=str(started_on), model=str(first), data=str(data), auto_analyze=False)
    assert state.jobs[0].wait(120) and state.study.folder == started_on, state.error

    state.param.update(model_path=str(broken), data_path=str(data))
    job = state.open_model()
    assert job.wait(60) and job.status == "failed", "a broken model opened the study the studio started on"
    assert "broken.onnx" in state.error and state.study.folder == started_on
    state.model_path = str(other)
    job = state.open_model()
    assert job.wait(120) and job.status == "done", job.error
    assert state.study.folder != started_on and state.study.name == "other"
    state.close()


def test_an_axis_no_plan_has_says_which_runner_times_its_plans(tmp_path):
    """The study's plans ran in this process (accuracy and the cost model's estimate): the emulator and measured
    axes are empty, and say how to get a point on them, rather than "evaluate a plan" (done already)."""
    state = StudioState(make_small_study(tmp_path / "study", analyzed=False), auto_analyze=False)
    plot = ParetoPlot(state=state)
    assert "plan(s)" in plot._note.object
    state.latency_source = "emulator"
    assert state.evaluations.empty
    assert "local agent" in plot._note.object and "htp" in plot._note.object
    state.latency_source = "measured"
    assert state.evaluations.empty and "remote agent" in plot._note.object
    state.close()


def test_baseline_labels_on_the_pareto_plot_do_not_cover_each_other():
    """Baselines of one latency and nearly one accuracy (a8w8 and a8w8-pc on an encoder) get their names on
    different sides; the highest point's name goes below it, clear of the legend over the frame."""
    import pandas as pd

    from mpstudio.widgets.pareto import _FRAME_PX, _baseline_labels, _label_box, _overlap

    frame = pd.DataFrame({"origin": ["baseline"] * 4 + ["search"], "latency_ms": [1.6, 1.6, 2.95, 2.95, 2.0],
                          "value": [0.700, 0.701, 0.684, 0.684, 0.69],
                          "name": ["a8w8", "a8w8-pc", "a16w8", "a16w8-pc", "plan 7"]})
    labels = _baseline_labels(frame)
    assert labels["text"] == ["a8w8", "a8w8-pc", "a16w8", "a16w8-pc"]
    # The boxes as placed, in the same pixel frame the placement assumes.
    xs, ys = labels["x"], labels["y"]
    px = [(x - min(xs)) / (max(xs) - min(xs)) for x in xs]
    py = [(y - min(ys)) / (max(ys) - min(ys)) for y in ys]
    boxes = [_label_box((p * 2 / 3 + 1 / 6) * _FRAME_PX[0], (q * 2 / 3 + 1 / 6) * _FRAME_PX[1], 6.5 * len(text),
                        (dx, dy, align))
             for p, q, text, dx, dy, align in zip(px, py, labels["text"], labels["dx"], labels["dy"], labels["align"])]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]), boxes
    top = ys.index(max(ys))
    assert labels["dy"][top] < 0, "the highest baseline's name runs under the legend"


def test_the_legend_names_another_accuracy_source_briefly():
    """The cross-checks' key names a short source, else says what it is: a CPU source's name is longer than the
    plot's frame is wide (the triangles' tooltips name each)."""
    from mpstudio.loop.runners import CPU_SOURCE
    from mpstudio.widgets.pareto import _checks_label

    assert _checks_label(["HTP emulator on vm"]) == "on HTP emulator on vm"
    assert _checks_label([CPU_SOURCE]) == "same plan, other accuracy source"
    assert _checks_label(["HTP on sm8650", CPU_SOURCE]) == "same plan, 2 other accuracy sources"


def test_the_current_plan_is_stored_once_the_baselines_evaluate_it(tmp_path):
    """A new study opens on a8w8 before any plan is evaluated: when the background baselines store it, the current
    plan is that stored plan (the Run panel names it, the Pareto plot rings it), not "not evaluated yet"."""
    from mpstudio.widgets import RunPanel

    study = make_small_study(tmp_path / "study", analyzed=False, baselines=False)
    state = StudioState(study, evaluate_on_edit=False)
    assert state.plan_id is None
    for job in list(state.jobs):
        assert job.wait(120) and job.status in ("done", "cancelled"), job.error
    stored = study.plan_id(state.plan)
    assert stored is not None and state.plan_id == stored
    assert f"plan {stored}:" in RunPanel(state=state)._plan_text(state.plan, state.plan_id)
    state.close()


def test_the_export_panels_zip_reproduces_the_plan_in_orts_own_pipeline(state, tmp_path):
    """The overrides name the tensors of the prepared float model and leave the defaults to the plan: the panel's zip
    holds both, so ORT's quantizer run as docs/export.md shows on its files gives the plan's model (from the other
    downloads alone, the model a user has is not the one the names refer to)."""
    import zipfile

    from gui_support import small_feeds
    from mpstudio.data import CalibrationReader
    from mpstudio.export import read_quantized_tensors
    from test_export_reproduce import documented_pipeline

    state.select(activations(state)[2:5])
    plan = state.promote_selected()
    panel = ExportPanel(state=state)
    assert panel.downloads["all"].filename.endswith(".zip")
    with zipfile.ZipFile(panel.downloads["all"].callback()) as archive:
        names = archive.namelist()
        for name in names:  # as the documented snippet names them
            (tmp_path / ("mixed" + name[len(name.split(".")[0]):])).write_bytes(archive.read(name))
    assert {n.split(".", 1)[1] for n in names} >= {"plan.json", "overrides.json", "encodings.json", "qdq.onnx",
                                                      "float.onnx", "README.md"}, names
    mine = documented_pipeline(tmp_path, CalibrationReader(small_feeds(3, seed=5)))  # the user's own data
    assert read_quantized_tensors(mine) == read_quantized_tensors(state.study.quantizer.generate(plan))
