"""Divergence triage on real HTP (emulator) and CPU sessions: a planted divergence is found as the first one,
chunking changes nothing, the table lands in the study, the command line prints it."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pandas as pd
import pytest
from conftest import IR, requires_qnn
from onnx import TensorProto, helper, numpy_helper

from mpstudio import MpstudioError
from mpstudio.data import FeedList
from mpstudio.diverge import COLUMNS, compare, diverge, load_report, resolve_plan
from mpstudio.plan import PrecisionPlan
from mpstudio.study import Study

pytestmark = [requires_qnn, pytest.mark.htp]

UPSTREAM = ["conv_out", "square", "divisor"]


def make_reciprocal_model(epsilon: float = 1e-3, op: str = "Reciprocal", size: int = 16) -> onnx.ModelProto:
    """x -> /stem/Conv -> conv_out -> Mul(itself) -> square -> Add(epsilon) -> divisor -> `op` -> inverse
    -> Sigmoid -> y.

    The HTP's uint8 Reciprocal is not ORT's (dequantize, 1/x in float, quantize), by construction here:
    `divisor` is never zero in float but its smallest values round to code 0 in uint8, where ORT computes
    1/0 = inf and saturates at the top of the range and the HTP does not (measured: up to 252 codes apart;
    away from 0 it is still up to 28 codes off near 1). With `op="Sigmoid"` the same chain agrees everywhere.
    `size`: the input's height and width.
    """
    weight = np.random.default_rng(0).normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv_out"], name="/stem/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["conv_out", "conv_out"], ["square"], name="/block/Mul"),
        helper.make_node("Add", ["square", "epsilon"], ["divisor"], name="/block/Add"),
        helper.make_node(op, ["divisor"], ["inverse"], name=f"/block/{op}"),
        helper.make_node("Sigmoid", ["inverse"], ["y"], name="/head/Sigmoid"),
    ]
    graph = helper.make_graph(
        nodes, "reciprocal_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, size, size])],
        initializer=[numpy_helper.from_array(weight, "w"),
                     numpy_helper.from_array(np.array(epsilon, np.float32), "epsilon")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def feeds(n: int = 4, size: int = 16):
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(0, 1, (1, 1, size, size)).astype(np.float32)} for _ in range(n)]


def make_study(folder, op: str = "Reciprocal", size: int = 16) -> Study:
    model = folder.parent / f"{folder.name}.onnx"
    folder.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(make_reciprocal_model(op=op, size=size), model)
    return Study.create(folder, model, FeedList(feeds(size=size)), name="reciprocal net")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    with make_study(tmp_path_factory.mktemp("diverge") / "study") as study:
        yield study


def test_a_planted_divergence_is_the_first_and_its_inputs_agree(study):
    report = diverge(study, "a8w8", samples=2)
    frame = report.frame.set_index("tensor")
    assert list(report.frame.columns) == COLUMNS
    assert report.first()["tensor"].tolist() == ["inverse"]
    assert frame.loc["inverse", "rms_steps"] > 10 and frame.loc["inverse", "mismatch"] > 0.05
    assert frame.loc["inverse", "inputs"] == "divisor" and frame.loc["inverse", "inputs_agree"]
    # Cut out and fed the CPU's codes of `divisor` on both backends, the Reciprocal alone still differs: the
    # op itself, not an upstream difference it amplifies.
    assert frame.loc["inverse", "cause"] == "op" and frame.loc["inverse", "isolated_rms_steps"] > 10
    assert not frame.loc[UPSTREAM, "diverges"].any(), frame.loc[UPSTREAM, "rms_steps"]
    assert (frame.loc[UPSTREAM, "rms_steps"] < 0.5).all()
    assert frame.loc["x", "status"] == "graph input (fed alike)" and not frame.loc["x", "diverges"]
    # Downstream it is carried along: y differs too, but its input does not agree, so it is not a first one.
    assert frame.loc["y", "diverges"] and not frame.loc["y", "first"]
    assert report.perturbed == () and (report.frame["status"] == "compared").sum() == len(frame) - 1
    assert report.samples == 2 and "HTP emulator" in report.htp_source or "HTP on" in report.htp_source


def test_the_same_chain_with_an_op_both_compute_alike_does_not_diverge(tmp_path):
    with make_study(tmp_path / "control", op="Sigmoid") as control:
        report = diverge(control, "a8w8", samples=2)
    assert not report.frame["diverges"].any(), report.frame[["tensor", "rms_steps"]]
    assert report.first().empty and "no first divergence" in report.describe()


def test_sixteen_bit_tensors_are_compared_in_their_own_steps(study):
    report = diverge(study, "a16w8", samples=1)
    frame = report.frame.set_index("tensor")
    assert (frame.loc[UPSTREAM, "dtype"] == "uint16").all()
    # The cut works on 16-bit Q/DQ too, and the planted Reciprocal is the first divergence as at 8 bits. The
    # Conv agrees to about one 16-bit step because the CPU takes its uint8 weights on the grid the HTP
    # requantizes them to (runtime.htp_weight_grid); with the weights as written it is 26 steps RMS off.
    assert report.first()["tensor"].tolist() == ["inverse"]
    assert frame.loc["conv_out", "rms_steps"] < 2 and frame.loc["conv_out", "snr_db"] > 60


def test_chunks_of_one_tensor_give_the_same_table(study):
    path = study.quantizer.generate(PrecisionPlan.a8w8())
    whole = compare(path, study.evaluation_data, samples=1, chunk_size=100)
    single = compare(path, study.evaluation_data, samples=1, chunk_size=1)
    assert whole.chunks == 1 and single.chunks == len(single.frame) - 1  # the graph input is fed, not exposed
    numbers = ["rms_steps", "max_steps", "mismatch", "snr_db", "max_abs"]
    pd.testing.assert_frame_equal(whole.frame[["tensor", *numbers]], single.frame[["tensor", *numbers]])


def test_the_table_is_kept_in_the_study(study):
    report = diverge(study, "a8w8", samples=1)
    plan_id = study.plan_id(PrecisionPlan.a8w8())
    assert report.csv_path == study.folder / "divergence" / f"plan-{plan_id}.csv"
    assert report.csv_path.with_suffix(".json").exists()
    saved = load_report(study, plan_id)
    assert saved["tensor"].tolist() == report.frame["tensor"].tolist()
    assert saved.loc[saved["first"], "tensor"].tolist() == ["inverse"]


def test_plans_by_id_name_builtin_and_file(study, tmp_path):
    wide = PrecisionPlan.a8w8().promote(["divisor", "inverse"], name="wide")
    plan_id = study.add_plan(wide)
    assert resolve_plan(study, str(plan_id)).hash == wide.hash
    assert resolve_plan(study, "wide").hash == wide.hash
    assert resolve_plan(study, "a8w8-pc").per_channel
    path = PrecisionPlan.a8w8().promote(["square"]).save(tmp_path / "plan.json")
    assert resolve_plan(study, str(path)).overrides["square"].type == "uint16"
    assert resolve_plan(None, None).hash == PrecisionPlan.a8w8().hash
    with pytest.raises(MpstudioError, match="has no plan 999"):
        diverge(study, "999")
    with pytest.raises(MpstudioError, match="unknown plan 'nope'.*a8w8"):
        resolve_plan(study, "nope")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "mpstudio", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300, check=False)


def test_command_line_on_a_study_and_on_a_bare_model(study, tmp_path):
    result = run_cli("diverge", str(study.folder), "--plan", "a8w8", "--samples", "1", "--chunk", "3")
    assert result.returncode == 0, result.stderr
    assert "first diverging tensors" in result.stdout and "inverse" in result.stdout
    assert f"full table: {study.folder / 'divergence'}" in result.stdout
    assert "tensors on htp and cpu" in result.stderr  # progress goes to stderr, the table to stdout
    unknown = run_cli("diverge", str(study.folder), "--plan", "77", "--quiet")
    assert unknown.returncode == 2 and "no plan 77" in unknown.stderr and "Traceback" not in unknown.stderr
    # A bare model and its data: a study is made beside it, and the plan defaults to a8w8.
    model, data = tmp_path / "net.onnx", tmp_path / "data"
    onnx.save(make_reciprocal_model(), model)
    FeedList(feeds()).save_npz(data)
    bare = run_cli("diverge", str(model), "--data", str(data), "--study", str(tmp_path / "net.study"), "--samples",
                   "1", "--quiet")
    assert bare.returncode == 0, bare.stderr
    assert "plan a8w8" in bare.stdout and "inverse" in bare.stdout
    assert list((tmp_path / "net.study" / "divergence").glob("plan-*.csv"))
    no_data = run_cli("diverge", str(model), "--quiet")
    assert no_data.returncode == 2 and "--data" in no_data.stderr


@pytest.mark.slow
def test_the_demo_names_its_first_diverging_tensors(demo, demo_quantizer):
    path = demo_quantizer.generate(PrecisionPlan.a8w8())
    report = compare(path, demo.evaluation.head(1), samples=1)
    first = report.first()
    assert len(first) >= 1 and first["rms_steps"].min() > report.threshold_steps
    assert report.perturbed == ()
    assert set(first["cause"]) <= {"op", "inputs"}, first["cause"]
    # Every first divergence reads only tensors that agree; the model's output is downstream of them.
    diverging = set(report.frame.loc[report.frame["diverges"], "tensor"])
    assert all(not set(inputs.split(";")) & diverging for inputs in first["inputs"])


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_the_graph_colours_by_divergence(study):
    pytest.importorskip("panel")
    from mpstudio.widgets import GraphView, StudioState

    state = StudioState(study, auto_analyze=False)
    try:
        view = GraphView(state=state)
        state.color_by = "divergence"  # runs the triage of the current plan (or reads the study's table)
        job = state.jobs[0]
        assert job.kind == "diverge" and job.wait(300) and job.status == "done", job.error
        frame = state.tensors.set_index("tensor")
        assert frame.loc["inverse", "divergence"] > 10 and frame.loc["conv_out", "divergence"] < 1
        row = view._row_of_tensor["inverse"]
        assert view.nodes.data["score"][row] == pytest.approx(frame.loc["inverse", "divergence"])
        assert view.color_bar.title == "HTP vs CPU (steps)"
        assert state.focus == "inverse" and "inverse" in state.message
        # Another plan drops the table and compares that plan.
        state.set_plan(PrecisionPlan.a16w8())
        job = state.jobs[0]
        assert job.kind == "diverge" and job.wait(300) and job.status == "done", job.error
        assert state.divergence is not None and state.plan_id == study.plan_id(PrecisionPlan.a16w8())
    finally:
        state.close()
