"""Where the time goes, block totals and two plans compared (no browser): a real small study, the real cost model
over the real regenerated QDQ models."""

from __future__ import annotations

import numpy as np
import pytest

from gui_support import make_small_study
from mpstudio.loop.blocks import block_of, default_depth
from mpstudio.loop.plan_compare import PAIRED_ROW
from mpstudio.widgets import Studio, StudioState

pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_small_study(tmp_path_factory.mktemp("latency") / "study")


@pytest.fixture
def studio(study):
    state = StudioState(study, evaluate_on_edit=False)
    analysis = next(job for job in state.jobs if job.kind == "analyze")
    assert analysis.wait(120) and analysis.status == "done", analysis.error
    studio = Studio(state)
    yield studio
    state.close()


def latest(state, kind="latency"):
    job = next(job for job in state.jobs if job.kind == kind)
    assert job.wait(120) and job.status == "done", job.error
    return job


def test_per_node_latency_names_its_sources_and_adds_up(studio):
    state, view = studio.state, studio.latency
    latest(state)
    times = view.result
    frame = times.frame
    assert "estimate" in times.estimate_label and times.measured_label == ""  # no profile kept: said, not faked
    assert np.isclose(frame["share"].sum(), 1.0, atol=1e-6)
    assert np.allclose(frame["added_ms"], 0.0)  # the base plan adds nothing over itself
    assert state.tensors["latency_share"].notna().any()  # the ranking's column and the graph's colouring
    assert "measured column: empty" in view._header.object
    # Promote three tensors: the view follows, and what they add (converts included) shows per node.
    tensors = state.tensors["tensor"].tolist()[4:7]
    state.select(tensors)
    state.promote_selected()
    latest(state)
    promoted = view.result
    assert promoted.added_ms > 0 and promoted.frame["added_ms"].max() > 0
    assert promoted.converts == int(((promoted.frame["kind"] == "convert") & (promoted.frame["base_ms"] == 0)).sum())
    assert "8\u219416-bit convert" in view._header.object


def test_block_totals_and_block_promote(studio):
    state, blocks = studio.state, studio.blocks
    latest(state)
    frame = blocks.frame()
    assert frame["tensors"].sum() == len(state.tensors)
    assert np.isclose(frame["estimate_ms"].sum(), studio.latency.result.frame["estimate_ms"].sum())
    depth = default_depth([n.namespace for n in state.study.graph.nodes.values()])
    assert blocks.depth == depth
    block = frame.sort_values("tensors", ascending=False).iloc[0]["block"]
    blocks.table.value = frame
    blocks.table.selection = [int(frame.index[frame["block"] == block][0])]
    blocks._on_promote(None)
    inside = [t for t, n in zip(state.tensors["tensor"], state.tensors["namespace"]) if block_of(n, depth) == block]
    quantizable = {t for t in inside if state.study.graph.tensors[t].quantizable}
    assert quantizable and quantizable <= set(state.sixteen_bit())


def test_two_plans_compared(studio):
    state, compare = studio.state, studio.compare
    state.refresh_evaluations()  # the study holds its baselines
    names = {o.split(": ", 1)[-1]: o for o in compare._a.options}
    job = compare.compare("current plan", names["a16w8"])
    assert job.wait(120) and job.status == "done", job.error
    summary, diff = compare._summary.value, compare._diff.value
    assert len(diff) > 0 and compare._note.object.count("differ") == 1
    assert set(diff["bits_a"]) == {8} and set(diff["bits_b"]) == {16}
    assert summary.loc["converts (8<->16)", "a"] == 0
    assert float(summary.loc["estimate ms", "b"]) > float(summary.loc["estimate ms", "a"])
    # Both are stored with per-sample terms from one source: B minus A on the same samples, as Study.compare says.
    study = state.study
    plan_a, plan_b = compare._plan("current plan"), compare._plan(names["a16w8"])
    expected = study.compare(plan_b, plan_a)
    result = job.result
    assert result.paired == expected and result.paired_source
    assert summary.loc[PAIRED_ROW, "b"].startswith(f"{expected.difference:+.4g} [{expected.low:+.4g}")
    assert expected.verdict in summary.loc["paired verdict", "b"] and "B \u2212 A" in compare._note.object


def test_two_plans_without_shared_terms_say_so(studio):
    state, compare = studio.state, studio.compare
    state.refresh_evaluations()
    names = {o.split(": ", 1)[-1]: o for o in compare._a.options}
    state.select(state.tensors["tensor"].tolist()[2:4])
    state.promote_selected()  # an edited plan nobody has evaluated
    job = compare.compare("current plan", names["a16w8"])
    assert job.wait(120) and job.status == "done", job.error
    assert job.result.paired is None
    assert compare._summary.value.loc[PAIRED_ROW, "b"] == "no paired value"
    assert "no paired difference" in compare._note.object


def test_a_kept_profile_is_mapped_to_nodes_and_named_by_its_source(tmp_path):
    from mpstudio.agent.protocol import OpCost, OpProfile
    from mpstudio.loop.node_latency import kept_profile
    from mpstudio.loop.recalibration import keep_profile
    from mpstudio.sources import Latency

    ops = (OpCost(op="conv", node="conv", op_type="Conv", onnx_nodes=("conv",), cost=30.0, unit="cycles"),
           OpCost(op="fused", node="add", op_type="Add", onnx_nodes=("add", "relu"), cost=10.0, unit="cycles"))
    profile = OpProfile(ops=ops, unit="cycles", source="emulator", device="x86_64 HTP emulator", backend="htp",
                        runs=3)
    keep_profile(tmp_path, 7, Latency(ms=2.0, source="emulator", where="x86_64 HTP emulator"), profile)
    per_node, label = kept_profile(tmp_path, 7)
    assert per_node.to_dict() == pytest.approx({"conv": 1.5, "add": 0.25, "relu": 0.25})  # 2 ms split by cost
    assert label.startswith("emulator host time") and "not device latency" in label
    assert kept_profile(tmp_path, 8) is None


def test_plan_b_is_another_plan_than_the_current_one(studio):
    state, compare = studio.state, studio.compare
    state.refresh_evaluations()
    names = {o.split(": ", 1)[-1]: o for o in compare._b.options}
    compare._b.value = names["a16w8"]
    state.load_plan(int(names["a16w8"].split(":")[0]))  # the current plan becomes B's: B moves to another
    assert compare._b.value != names["a16w8"] and compare._b.value.split(":")[0] != str(state.plan_id)



def test_a_value_near_one_is_not_rounded_to_one_in_the_comparison(study):
    """A cosine of 0.99998 read as "1" hides the difference two plans are compared for."""
    import pandas as pd

    from mpstudio.latency import estimate_latency
    from mpstudio.loop.plan_compare import compare_plans
    from mpstudio.plan import PrecisionPlan

    a, b = PrecisionPlan.a8w8(), PrecisionPlan.a16w8()
    estimates = [estimate_latency(study.quantizer.generate(p), study.cost_arch) for p in (a, b)]
    rows = [pd.Series({"value": v, "accuracy_source": "ORT CPU QDQ", "latency_ms": e.ms, "latency_label": "estimate"})
            for v, e in zip((0.998847, 0.999982), estimates)]
    result = compare_plans(study.graph, a, b, *estimates, *rows, "output cosine", None)
    cells = result.summary["a"].tolist() + result.summary["b"].tolist()
    assert "0.998847" in cells and "0.999982" in cells
    assert "accuracy (output cosine)" in result.summary.index  # the metric named once, beside the values
