"""Plans the HTP cannot build, as results: stored with QNN's words and the first failing node, shown by `study show`,
not built again until the toolchain changes, and passed over by the search's HTP confirmation.

The failing plan is real: QNN's HTP backend rejects LRN at 16 bits (backendValidateOpConfig, error 3110) and
builds it at 8 bits, so a model with one LRN builds as a8w8 and fails as a16w8 on the HTP emulator.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR, requires_qnn
from mpstudio.data import FeedList
from mpstudio.loop.build_failures import BuildFailed, first_failing_node, toolchain_of
from mpstudio.loop.runners import Target, runner_for
from mpstudio.plan import PrecisionPlan
from mpstudio.search import search
from walk_support import front_order
from mpstudio.store import DB_FILE, StudyStore
from mpstudio.store_builds import BuildRows
from mpstudio.study import Study

LRN_NODE = "/norm/LRN"


def lrn_model(channels: int = 8, size: int = 16, blocks: int = 2, activation: str = "Relu", lrn_after: int = 0,
              seed: int = 0) -> onnx.ModelProto:
    """x[1,3,size,size] -> `blocks` x (/convI/Conv -> /convI/<activation>) -> /head/Conv -> y, with /norm/LRN after
    block `lrn_after`."""
    rng = np.random.default_rng(seed)
    inits, nodes, current, cin = [], [], "x", 3
    for i in range(blocks):
        w = (rng.uniform(-1, 1, (channels, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"conv{i}.weight"))
        nodes += [helper.make_node("Conv", [current, f"conv{i}.weight"], [f"conv{i}_out"], name=f"/conv{i}/Conv",
                                   pads=[1, 1, 1, 1]),
                  helper.make_node(activation, [f"conv{i}_out"], [f"act{i}_out"], name=f"/conv{i}/{activation}")]
        current, cin = f"act{i}_out", channels
        if i == lrn_after:
            nodes.append(helper.make_node("LRN", [current], ["norm_out"], name=LRN_NODE, size=3))
            current = "norm_out"
    inits.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, (4, channels, 1, 1)).astype(np.float32), "head.weight"))
    nodes.append(helper.make_node("Conv", [current, "head.weight"], ["y"], name="/head/Conv"))
    graph = helper.make_graph(nodes, "lrn_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _feeds(n: int, seed: int, size: int = 16) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 3, size, size)).astype(np.float32)} for _ in range(n)]


@pytest.fixture
def lrn_study(tmp_path):
    onnx.save(lrn_model(), tmp_path / "lrn.onnx")
    study = Study.create(tmp_path / "study", tmp_path / "lrn.onnx", FeedList(_feeds(8, 1)), FeedList(_feeds(4, 5)))
    yield study
    study.close()


def _rows(folder) -> list[tuple]:
    with sqlite3.connect(folder / DB_FILE) as db:
        return db.execute("SELECT plan_id, attempts, node, toolchain FROM build_failures ORDER BY plan_id").fetchall()


# ---- what a refusal names --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, node", [
    ("Unsupported nodes in QNN EP: { name: /norm/LRN_token_7, type: LRN }; backendValidateOpConfig() failed for node "
     "`/norm/LRN_token_7_2` of type `Lrn` with error code 3110", "/norm/LRN"),
    ("ONNX Runtime could not create a htp session: [ONNXRuntimeError] : 1 : FAIL : Node '/enc/GatherND_token_3' "
     "OpType:GatherND with domain:com.ms.internal.nhwc was inserted", "/enc/GatherND"),
    ("the model cannot run on the HTP backend; QNN refused 1 node(s): node 'mask_gather' (GatherND): 3110.",
     "mask_gather"),
    ("agent http://127.0.0.1:1: 422 the model cannot run on the HTP backend; QNN refused 3 node(s): node "
     "'DequantizeLinear_token_5' (DequantizeLinear): Failed to add node; node '/norm/LRN_token_7' (LRN): Failed to add "
     "node; node 'l0_QuantizeLinear' (QuantizeLinear): Failed to add node.", "/norm/LRN"),
    ("Unsupported nodes in QNN EP: { name: , type: QuantizeLinear }{ name: /a/Resize_token_2, type: Resize }",
     "/a/Resize"),
    ("ONNX Runtime could not create a htp session: [ONNXRuntimeError] : 11 : EP_FAIL : Failed to finalize QNN graph. "
     "Error: QNN_COMMON_ERROR_MEM_ALLOC: Memory allocation related error., Code: 1002", ""),
])
def test_the_first_failing_node_is_read_from_qnns_words(text, node):
    assert first_failing_node(text) == node


def test_walk_front_passes_over_plans_that_cannot_be_built():
    """The confirmation's order over a front of five plans (cheapest first, the pick at 3)."""
    def run(verdicts, at=3, budget=9):
        return front_order(verdicts, at, budget)

    # The pick cannot be built: the dearer plan reaches, so cheaper ones follow (the pick passed over) until one misses.
    assert run([False, True, True, None, True]) == [3, 4, 2, 1, 0]
    # Nothing dearer builds: the nearest cheaper plan that builds sets the direction; it misses, nothing dearer is
    # left to reach the target, so the cheaper plans are what remains to recommend from.
    assert run([False, False, False, None, None]) == [3, 4, 2, 1, 0]
    assert run([False, True, False, None, None]) == [3, 4, 2, 1, 0]
    assert run([True, True, False, False, None]) == [3, 4, 2, 1, 0]
    assert run([True, False, True, False, None]) == [3, 4, 2, 1]
    assert run([False, False, False, None, None], budget=2) == [3, 4, 2, 1]
    # Every plan builds: as before, a pick that misses looks only at dearer plans.
    assert run([True, True, True, False, False]) == [3, 4]
    # A cheaper plan that cannot be built is passed over, not taken for the edge.
    assert run([True, False, None, True, True]) == [3, 2, 1]
    # Nothing builds: every plan is tried once.
    assert sorted(run([None] * 5)) == [0, 1, 2, 3, 4]
    # The budget counts plans that built.
    assert run([True, True, None, True, True], budget=2) == [3, 2, 1]


# ---- the store -------------------------------------------------------------------------------------------------

def test_a_store_older_than_the_table_opens_and_gains_it(tmp_path):
    store = StudyStore(tmp_path / DB_FILE)
    store.close()
    with sqlite3.connect(tmp_path / DB_FILE) as db:
        db.execute("DROP TABLE build_failures")
    store = StudyStore(tmp_path / DB_FILE)
    try:
        assert BuildRows(store).frame().empty
        plan_id = store.add_plan("abc", "a16w8", "user", {}, 3)
        assert BuildRows(store).record(plan_id, "htp", "HTP emulator on here", "75", "e", "", "", {"x": "1"}) == 1
        assert BuildRows(store).record(plan_id, "htp", "HTP emulator on here", "75", "e", "", "", {"x": "2"}) == 2
        frame = BuildRows(store).frame()
        assert frame["attempts"].tolist() == [2] and frame["toolchain"].iloc[0] == {"x": "2"}
    finally:
        store.close()


# ---- a real plan the HTP emulator cannot build -----------------------------------------------------------------

@pytest.mark.htp
@requires_qnn
def test_a_plan_the_htp_cannot_build_is_stored_shown_and_not_built_again(lrn_study):
    study = lrn_study
    built = study.evaluate(PrecisionPlan.a8w8(name="a8w8"), "htp")
    assert built.backend == "htp" and np.isfinite(built.value)
    with pytest.raises(BuildFailed) as raised:
        study.evaluate(PrecisionPlan.a16w8(name="a16w8"), "htp")
    failure = raised.value.failure
    assert not raised.value.known and failure.name == "a16w8" and failure.node == LRN_NODE
    assert "3110" in failure.qnn and "Lrn" in failure.qnn  # QNN's own words, from its verbose log
    assert failure.toolchain["htp_arch"] == "75" and failure.toolchain["onnxruntime_qnn"] not in ("", "none")
    assert [f.plan_id for f in study.build_failures()] == [failure.plan_id]
    assert study.build_failures()[0].estimate_ms > 0  # the plot places it by its estimate

    shown = subprocess.run([sys.executable, "-m", "mpstudio", "study", "show", str(study.folder)],
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    line = next(l for l in shown.stdout.splitlines() if "cannot build" in l)
    assert line.startswith(f"plan {failure.plan_id} a16w8 cannot build on HTP v75") and LRN_NODE in line
    assert "3110" in line

    # Known with this toolchain: refused at once, nothing built (the stored attempts stay one).
    with pytest.raises(BuildFailed) as again:
        study.evaluate(PrecisionPlan.a16w8(name="a16w8"), "htp")
    assert again.value.known
    assert [(r[0], r[1]) for r in _rows(study.folder)] == [(failure.plan_id, 1)]
    # The job of a search records the refusal as its error.
    job = study.submit(PrecisionPlan.a16w8(name="a16w8"), "htp")
    with pytest.raises(BuildFailed):
        study.run_job(job)
    assert "cannot build on HTP v75" in study.jobs().set_index("job_id").loc[job, "error"]
    assert _rows(study.folder)[0][1] == 1


@pytest.mark.htp
@requires_qnn
def test_a_known_failure_is_built_again_when_the_toolchain_changes(lrn_study):
    study = lrn_study
    with pytest.raises(BuildFailed):
        study.evaluate(PrecisionPlan.a16w8(name="a16w8"), "htp")
    plan_id, attempts, _, toolchain = _rows(study.folder)[0]
    older = {**json.loads(toolchain), "onnxruntime_qnn": "2.6.0"}  # as an older onnxruntime-qnn recorded it
    with sqlite3.connect(study.folder / DB_FILE) as db:
        db.execute("UPDATE build_failures SET toolchain = ? WHERE plan_id = ?", (json.dumps(older), plan_id))
    with pytest.raises(BuildFailed) as raised:
        study.evaluate(PrecisionPlan.a16w8(name="a16w8"), "htp")
    assert not raised.value.known  # really built again
    rows = _rows(study.folder)
    assert rows[0][1] == attempts + 1 == 2
    assert json.loads(rows[0][3]) == toolchain_of(Target.of("htp", runner_for(None), study.htp_arch))


@pytest.mark.htp
@requires_qnn
def test_the_search_passes_over_a_plan_the_htp_cannot_build_and_recommends_one_that_builds(tmp_path):
    """The LRN in the last block matters most: the walk's pick on the CPU promotes it and so does a16w8, and the HTP
    can build neither; the confirmation goes on to the plans of the front that build and recommends one of them."""
    onnx.save(lrn_model(channels=16, size=32, blocks=6, activation="Sigmoid", lrn_after=5), tmp_path / "deep.onnx")
    with Study.create(tmp_path / "deep", tmp_path / "deep.onnx", FeedList(_feeds(8, 1, 32)),
                      FeedList(_feeds(4, 5, 32))) as study:
        result = search(study, "a16w8+2%", weights="per-tensor", max_evaluations=8, confirm_plans=3, quiet=True)
        unbuilt = {f.plan_id: f for f in result.unbuildable}
        a16 = study.plan_id(PrecisionPlan.a16w8())
        assert result.walk_pick is not None and {a16, result.walk_pick.plan_id} <= set(unbuilt)
        assert all(f.node == LRN_NODE for f in unbuilt.values())
        assert result.confirmed and result.recommended.backend == "htp"
        assert result.recommended.plan_id not in unbuilt
        assert "the walk's pick cannot be built there" in result.stop_reason
        # Recommended among the plans that built, on the HTP's numbers: none of them did better there.
        assert result.recommended.value == max(c.confirmed.value for c in result.confirmations)
        text = result.describe()
        assert f"cannot build on HTP v75: plan {a16} a16w8" in text
        record = study.searches()["result"].iloc[-1]
        assert {a16, result.walk_pick.plan_id} <= {f["plan_id"] for f in record["unbuildable"]}
        assert record["recommended_plan_id"] == result.recommended.plan_id


@pytest.mark.htp
@requires_qnn
def test_a_plan_an_agent_cannot_build_is_stored_with_the_agents_toolchain(lrn_study):
    """Over a real agent process (HTTP on loopback): the agent's explanation names the node, the failure is kept
    for the agent's accuracy source with the agent's versions, and a second evaluation asks the agent nothing."""
    from mpstudio.agent import LocalAgent

    study = lrn_study
    with LocalAgent() as local:
        agent = local.client
        with pytest.raises(BuildFailed) as raised:
            study.evaluate(PrecisionPlan.a16w8(name="a16w8"), "htp", agent)
        failure = raised.value.failure
        info = agent.info()
        assert failure.node == LRN_NODE and failure.target == study.accuracy_source("htp", agent)
        assert failure.toolchain == {"onnxruntime": info.onnxruntime, "onnxruntime_qnn": info.onnxruntime_qnn,
                                     "htp_arch": study.htp_arch}
        with pytest.raises(BuildFailed) as again:
            study.evaluate(PrecisionPlan.a16w8(name="a16w8"), "htp", agent)
        assert again.value.known and _rows(study.folder)[0][1] == 1


@pytest.mark.htp
@requires_qnn
def test_a_plan_an_older_toolchain_could_not_build_is_built_again_and_its_failure_forgotten(lrn_study):
    """A failure an older onnxruntime-qnn recorded (written into the SQLite file as that version would have) for a
    plan this toolchain builds: the plan is built, evaluated, and no longer listed as unbuildable."""
    study = lrn_study
    plan_id = study.add_plan(PrecisionPlan.a8w8(name="a8w8"))
    target = Target.of("htp", runner_for(None), study.htp_arch)
    older = {**toolchain_of(target), "onnxruntime_qnn": "2.6.0"}
    BuildRows(study.store).record(plan_id, "htp", target.source, study.htp_arch, "Failed to finalize QNN graph", "",
                                  "", older)
    assert [f.plan_id for f in study.build_failures()] == [plan_id]
    evaluation = study.evaluate(PrecisionPlan.a8w8(name="a8w8"), "htp")
    assert evaluation.backend == "htp" and np.isfinite(evaluation.value)
    assert study.build_failures() == [] and _rows(study.folder) == []


@pytest.mark.htp
@requires_qnn
def test_a_walk_on_the_htp_whose_a16w8_cannot_be_built_says_what_to_do(lrn_study):
    from mpstudio.errors import MpstudioError

    with pytest.raises(MpstudioError, match="cannot build on HTP v75.*walk on the CPU"):
        search(lrn_study, "a16w8+2%", backend="htp", weights="per-tensor", max_evaluations=4, quiet=True)
    assert [f.name for f in lrn_study.build_failures()] == ["a16w8"]


def test_the_prefix_walk_passes_over_prefixes_the_backend_cannot_build():
    """The prefix walk of a search on the HTP (a stand-in walk; the grid is what is tested): k from 20 on cannot be
    built, k >= 12 reaches the target. The grid passes over the unbuildable ones and pins the edge at 12."""
    from mpstudio.loop.build_failures import BuildFailure
    from mpstudio.search.grid import PrefixGrid
    from mpstudio.store import Evaluation

    def evaluation(k):
        return Evaluation(k, "h", f"+{k}", "htp", "HTP", "m", 0.5 + 0.01 * k, True, None, None, 1, 0.0)

    class Walk:
        workers, hib, budget = [None], True, 12

        def __init__(self):
            self.evaluated, self.unbuilt = [], []

        def left(self):
            return self.budget - len(self.evaluated)

        def reaches(self, e):
            return e.value >= 0.62

        def pointless(self, plan):
            return None

        def evaluate(self, plans, pass_over=False):
            assert pass_over  # the grid's plans are passed over, never an error
            out = []
            for k in plans:
                if k >= 20:
                    self.unbuilt.append(k)
                    out.append(BuildFailure(k, f"+{k}", "htp", "HTP", "75", "refused", "", "", {}))
                else:
                    self.evaluated.append(k)
                    out.append(evaluation(k))
            return out

    walk = Walk()
    grid = PrefixGrid(walk, lambda k: k, 37, {0: evaluation(0)})
    reason = grid.run(prior=None)
    assert walk.unbuilt and set(walk.unbuilt) == grid.unbuilt and not set(walk.unbuilt) & set(grid.known)
    assert 12 in grid.known and 11 in grid.known and "target reached with 12 promoted" in reason
