"""The automatic search: targets, budgets, cancel, and a real process killed mid-search then resumed."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import pytest

from conftest import chain_feeds, make_chain_model, requires_qnn
from mpstudio.data import Cancelled, FeedList
from mpstudio.errors import MpstudioError
from mpstudio.plan import PrecisionPlan
from mpstudio.loop.runners import CPU_SOURCE
from mpstudio.search import Confirmation, Target, disagreements, meets, search
from mpstudio.store import Evaluation
from mpstudio.study import Study


def _make_study(tmp_path, blocks=6, samples=6, size=16):
    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=blocks, size=size), path)
    return Study.create(tmp_path / "study", path, FeedList(chain_feeds(8, size=size)),
                        FeedList(chain_feeds(samples, size=size, seed=5)))


@pytest.fixture
def study(tmp_path):
    s = _make_study(tmp_path, size=48)
    yield s
    s.close()


def test_targets_parse_and_resolve_in_both_directions():
    class E:
        def __init__(self, value):
            self.value = value

    baselines = {"a8w8": E(0.5), "a16w8": E(0.2)}
    assert Target.parse("0.14").threshold(baselines, False) == 0.14
    assert Target.parse("a16w8+10%").threshold(baselines, False) == pytest.approx(0.22)  # an error rate may rise 10%
    assert Target.parse("a16w8+10%").threshold({"a16w8": E(40.0)}, True) == pytest.approx(36.0)  # SNR may fall 10%
    assert Target.parse("a16w8").threshold(baselines, False) == pytest.approx(0.2)
    assert meets(0.21, 0.22, False) and not meets(0.23, 0.22, False) and meets(37, 36, True)
    assert Target.parse("a16w8-10%").threshold(baselines, False) == pytest.approx(0.22)  # either sign: worse
    assert Target.parse("fast please").baseline == "fast please"  # a plan's name, checked against the study


def _sigmoid_study(tmp_path, samples=4):
    """The chain model with Sigmoid in place of Relu: 16-bit Sigmoids cost the HTP much more than 8-bit ones (no
    LUT), so the cost model prices a few promoted tensors well below all-16-bit and the walk has room to walk (at 64x64:
    at 32x32 the refit model prices every partial promotion at or above all-16-bit)."""
    model = make_chain_model(blocks=6, channels=16, size=64)
    for node in model.graph.node:
        if node.op_type == "Relu":
            node.op_type = "Sigmoid"
    path = tmp_path / "sigmoid.onnx"
    onnx.save(model, path)
    return Study.create(tmp_path / "study", path, FeedList(chain_feeds(8, size=64)),
                        FeedList(chain_feeds(samples, size=64, seed=5)))


def _est(e):
    return e.latency("estimate").ms


def test_search_reaches_a_relative_target_with_few_evaluations(tmp_path):
    from mpstudio.search import dominates

    study = _sigmoid_study(tmp_path)
    seen = []
    result = search(study, "a16w8+10%", max_evaluations=12, weights="per-tensor", confirm=None,
                    progress=lambda done, total, message: seen.append(message))
    a16 = result.baselines["a16w8"]
    assert result.threshold == pytest.approx(a16.value - 0.1 * abs(a16.value))
    assert result.reached and meets(result.recommended.value, result.threshold, True)
    assert result.evaluations <= 12 and result.gap >= 0
    assert 0 < result.promoted < len(result.order)  # fewer tensors than all: the point of the search
    assert _est(result.recommended) < _est(a16)
    # No plan dearer than a stored plan that reaches the target (a16w8 does) was evaluated.
    for e in result.path[2:]:
        assert _est(e) < _est(a16)
    stored = set(study.evaluations()["plan_id"])
    assert {e.plan_id for e in result.path} <= stored
    assert any(m.startswith("search:") for m in seen)
    searches = study.searches()
    assert searches["status"].tolist() == ["done"] and searches["result"].iloc[0]["reached"]
    # The pick is the cheapest stored plan that reaches the target, and no stored plan dominates it.
    considered = searches["result"].iloc[0]["considered"]
    assert {c["plan_id"] for c in considered} == stored
    picked = [c for c in considered if c["verdict"] == "picked"]
    assert [c["plan_id"] for c in picked] == [result.recommended.plan_id]
    assert all(c["estimate_ms"] >= picked[0]["estimate_ms"] for c in considered if c["reaches"])
    assert not any(dominates(e, result.recommended, True) for e in result.path if e.plan_id != result.recommended.plan_id)
    text = result.describe()
    assert "recommended" in text and "why: the cheapest" in text and "picked" in text
    study.close()


def test_a_plan_a_stored_plan_dominates_is_never_recommended_nor_evaluated(study):
    """A user's partial plan evaluated before the search that the cost model prices above all-16-bit (its converts
    cost more than the 16-bit convolutions it saves) and that scores below it is dominated by a16w8: the search
    never recommends it, and evaluates no partial promotion priced at or above all-16-bit."""
    a16 = study.evaluate(PrecisionPlan.a16w8())
    convs = [t for t in study.graph.activations() if t.endswith("_conv")]
    # Everything but the first convolution's output: its 16-bit input and the 16-bit convolutions after it each
    # need a convert (every conv output and y promoted, the input left at 8 bits, is priced within a tie under
    # all-16-bit since the refit with `tiny_ops`: a tie, not a dearer plan).
    users = PrecisionPlan.a8w8().promote([*convs[1:], "y", "x"], name="user's pick")
    mine = study.evaluate(users)
    assert _est(mine) >= _est(a16) and mine.value < a16.value  # the premise, as measured
    result = search(study, 1000.0, max_evaluations=10, weights="per-tensor", confirm=None, quiet=True)
    assert not result.reached and result.recommended.plan_id == a16.plan_id
    assert [e.name for e in result.path][:2] == ["a8w8", "a16w8"]
    dearer = [e.name for e in result.path[2:] if _est(e) >= _est(a16)]
    assert dearer == [], f"evaluated partial promotions priced at or above all-16-bit: {dearer}"
    verdicts = {c.plan_id: c.verdict for c in result.considered}
    assert verdicts[mine.plan_id] == f"dominated by plan {a16.plan_id}" and verdicts[a16.plan_id] == "picked"
    assert "no stored plan reaches the target" in result.choice
    assert f"dominated by plan {a16.plan_id}" in result.describe()
    assert result.to_json()["considered"][0]["verdict"] in ("misses", "picked", f"dominated by plan {a16.plan_id}")


def test_per_channel_weights_consider_a16w8_pc(study):
    result = search(study, "a16w8-pc+5%", weights="per-channel", max_evaluations=8, confirm=None, quiet=True)
    names = [e.name for e in result.path]
    assert names[:4] == ["a8w8", "a16w8", "a8w8-pc", "a16w8-pc"]  # both weight forms of both baselines
    assert {"a8w8-pc", "a16w8-pc"} <= set(result.baselines)
    assert any(c.name == "a16w8-pc" for c in result.considered)
    assert "per-channel int8 weights" in result.weights_note and "a16w8-pc" in result.weights_note
    # a16w8-pc reaches its own target: the pick is it or a plan no dearer that reaches it too.
    pc = result.baselines["a16w8-pc"]
    assert result.reached and _est(result.recommended) <= _est(pc)
    auto = search(study, "a16w8-pc+5%", weights="auto", max_evaluations=8, confirm=None, quiet=True)
    assert "weights:" in auto.describe() and ("measured" in auto.weights_note or "no better" in auto.weights_note
                                              or "decisive" in auto.weights_note)


def test_no_sensitivity_analysis_when_a_baseline_answers(study):
    result = search(study, 1.0, weights="per-tensor", max_evaluations=6, confirm=None, quiet=True)  # 1 dB: a8w8 does
    assert result.reached and result.recommended.name == "a8w8"
    assert "no sensitivity analysis" in result.stop_reason and result.evaluations == 2
    assert not (study.folder / "sensitivity").exists() or not any((study.folder / "sensitivity").iterdir())


def test_the_walk_does_not_assume_accuracy_rises_with_k():
    """The prefix walk against accuracies that rise then fall with k (promoting too many tensors hurts, as on
    the issue's encoder): "every tensor" misses, a middle k reaches; the walk finds the smallest k that does."""
    from mpstudio.search.grid import PrefixGrid

    def value(k):  # rises to k=22 then falls: k=37 is worse than k=22
        return 0.60 + 0.004 * k if k <= 22 else 0.688 - 0.0012 * (k - 22)

    class Walk:
        workers, hib, budget = [None], True, 20

        def __init__(self):
            self.evaluated = []

        def left(self):
            return self.budget - len(self.evaluated)

        def reaches(self, e):
            return e.value >= 0.686

        def pointless(self, plan):
            return None

        def evaluate(self, plans, pass_over=False):
            self.evaluated += plans
            return [Evaluation(k, "h", f"+{k}", "cpu", "CPU", "m", value(k), True, None, None, 1, 0.0) for k in plans]

    walk = Walk()
    known = {0: Evaluation(0, "h", "base", "cpu", "CPU", "m", value(0), True, None, None, 1, 0.0)}
    reason = PrefixGrid(walk, lambda k: k, 37, known).run(prior=None)
    assert 37 in walk.evaluated and not walk.reaches(known[37])  # every tensor: a miss, and the walk went on
    smallest = min(k for k in range(38) if value(k) >= 0.686)
    assert smallest in known and walk.reaches(known[smallest]) and smallest - 1 in known
    assert "target reached with" in reason and len(walk.evaluated) < 20


def test_promotions_are_ranked_against_the_per_channel_base(study):
    """With per-channel weights as the base, the order comes from a sensitivity analysis of that base: its
    isolation switches between all-8 and all-16-bit activations with per-channel weights, so its all-8-bit
    value is the per-channel plan's own output SNR."""
    from mpstudio.loop.inprocess import run_outputs
    from mpstudio.metrics import output_agreement

    result = search(study, "a16w8+5%", weights="per-channel", max_evaluations=6, confirm=None, quiet=True)
    base = PrecisionPlan(activation_type="uint8", weight_type="int8", per_channel=True)
    assert study.plan(result.path[2].plan_id).hash == base.hash  # the base, after the two baselines
    report = study.sensitivity(plan=base)  # what the search computed, loaded
    assert report.meta["plan_hash"] == base.hash
    samples = study.calibration.head(report.isolation.samples)
    reference = run_outputs(study.quantizer.float_path, samples, "cpu")
    own, _ = output_agreement(reference, run_outputs(study.quantizer.generate(base), samples, "cpu"))
    a8w8, _ = output_agreement(reference, run_outputs(study.quantizer.generate(PrecisionPlan.a8w8()), samples, "cpu"))
    assert abs(own - a8w8) > 1e-4  # the two bases differ on this model (by 0.001 dB: the tolerance below is finer)
    assert report.isolation.all_8 == pytest.approx(own, abs=1e-5)
    assert study.sensitivity().isolation.all_8 == pytest.approx(a8w8, abs=1e-5)  # a8w8's analysis is another one


def test_budgets_stop_the_walk(study):
    result = search(study, 1000.0, max_evaluations=4, weights="per-tensor")  # an SNR no plan reaches
    assert not result.reached and result.evaluations <= 4
    a8_estimate = result.baselines["a8w8"].latency("estimate").ms
    capped = search(study, 1000.0, max_evaluations=8, weights="per-tensor", latency_budget_ms=a8_estimate * 1.0001)
    assert "latency budget" in capped.stop_reason
    with pytest.raises(MpstudioError, match="at least 3"):
        search(study, 30.0, max_evaluations=2)


def test_cancel_keeps_what_finished_and_a_rerun_continues(study):
    cancel = threading.Event()

    def progress(done, total, message):
        if message.startswith("search:") and done >= 3:
            cancel.set()

    with pytest.raises(Cancelled):
        search(study, "a16w8+5%", max_evaluations=12, weights="per-channel", progress=progress, cancel=cancel)
    kept = len(study.evaluations())
    assert kept >= 3 and study.searches()["status"].tolist() == ["cancelled"]
    result = search(study, "a16w8+5%", max_evaluations=12, weights="per-channel")
    assert result.new_evaluations == result.evaluations - kept  # finished evaluations are reused, not rerun
    assert study.searches()["status"].tolist() == ["done"]  # the same search record, continued


def test_a_killed_search_process_resumes_with_nothing_lost(tmp_path):
    """SIGKILL a real `mpstudio search` process mid-walk; reopen; continue; every finished evaluation stays."""
    model = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=8, size=48), model)
    data = tmp_path / "data"
    FeedList(chain_feeds(24, size=48)).save_npz(data)
    folder = tmp_path / "study"
    command = [sys.executable, "-m", "mpstudio", "search", str(model), "--data", str(data), "--study", str(folder),
               "--target", "a16w8+2%", "--max-evaluations", "14", "--weights", "per-channel", "--quiet"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    db_path = folder / "study.sqlite"
    deadline = time.monotonic() + 300
    count = 0
    while time.monotonic() < deadline and process.poll() is None:
        if db_path.exists():
            try:
                with sqlite3.connect(db_path, timeout=5) as db:
                    count = db.execute("SELECT COUNT(*) FROM accuracy").fetchone()[0]
            except sqlite3.OperationalError:
                count = 0
            if count >= 3:
                break
        time.sleep(0.05)
    assert process.poll() is None, f"the search ended before it could be killed:\n{process.stdout.read().decode()}"
    process.send_signal(signal.SIGKILL)
    process.wait()

    with Study.open(folder) as study:
        before = study.evaluations()[["plan_id", "accuracy_source", "value", "created"]].drop_duplicates()
        assert len(before) >= 3
        assert set(study.searches()["status"]) == {"interrupted"}
        assert not (study.jobs()["status"] == "running").any()  # a job the kill interrupted is pending again
    resumed = subprocess.run([sys.executable, "-m", "mpstudio", "study", "resume", str(folder), "--quiet"],
                             env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "search(es) continued" in resumed.stdout
    with Study.open(folder) as study:
        after = study.evaluations()[["plan_id", "accuracy_source", "value", "created"]].drop_duplicates()
        # (the resumed search also confirms its front on the HTP: more sources for the same plans)
        merged = before.merge(after, on=["plan_id", "accuracy_source"], suffixes=("_before", "_after"))
        assert len(merged) == len(before)  # nothing finished was lost
        assert np.array_equal(merged["created_before"], merged["created_after"])  # nor evaluated again
        assert np.allclose(merged["value_before"], merged["value_after"])
        searches = study.searches()
        assert searches["status"].tolist() == ["done"]
        assert searches["result"].iloc[0]["evaluations"] <= 14
        assert len(after) > len(before) or searches["result"].iloc[0]["reached"]


def _model_and_data(tmp_path, samples: int):
    """A small chain model file and a folder of its samples, as a user gives them to the command line."""
    model = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=4), model)
    data = tmp_path / "data"
    FeedList(chain_feeds(samples)).save_npz(data)
    return model, data


def test_search_command_line_prints_the_front_and_how_to_export(tmp_path):
    model, data = _model_and_data(tmp_path, 6)
    out = subprocess.run([sys.executable, "-m", "mpstudio", "search", str(model), "--data", str(data), "--study",
                          str(tmp_path / "s"), "--target", "a16w8+10%", "--weights", "per-tensor", "--quiet"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "recommended: plan" in out.stdout and "on the front" in out.stdout and "mpstudio export" in out.stdout
    plan_id = out.stdout.split("--plan ")[1].split()[0]
    export = subprocess.run([sys.executable, "-m", "mpstudio", "export", str(tmp_path / "s"), "--plan", plan_id,
                             "--format", "all", "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr
    from mpstudio.export import validate_encodings

    encodings = next((tmp_path / "out").glob("*.encodings.json"))
    # The encodings describe ORT's QDQ model (`.qdq.onnx`), not the one with the HTP's weights (`.htp.qdq.onnx`).
    qdq = next(p for p in (tmp_path / "out").glob("*.qdq.onnx") if not p.name.endswith(".htp.qdq.onnx"))
    validate_encodings(json.loads(encodings.read_text()), qdq)
    assert next((tmp_path / "out").glob("*.overrides.json")).exists()
    show = subprocess.run([sys.executable, "-m", "mpstudio", "study", "show", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120)
    assert show.returncode == 0 and "a16w8" in show.stdout and "estimate" in show.stdout
    missing = subprocess.run([sys.executable, "-m", "mpstudio", "study", "show", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "not a study folder" in missing.stderr and "Traceback" not in missing.stderr


def test_search_spreads_over_an_agent_pool(tmp_path):
    """Two real agents on loopback: each round evaluates one plan per agent, and every result is stored."""
    from mpstudio.agent import AgentPool, LocalAgent

    study = _make_study(tmp_path, size=32)
    with LocalAgent() as first, LocalAgent() as second:
        with AgentPool([first.client, second.client]) as pool:
            assert len(pool.healthy()) == 2
            result = search(study, "a16w8+10%", runner=pool, weights="per-tensor", max_evaluations=12)
    assert result.reached
    in_process = Study.create(tmp_path / "again", study.quantizer.float_path, study.calibration, study.evaluation_data)
    walked = result.walk_pick or next(e for e in result.path if e.plan_id == result.recommended.plan_id)
    same = in_process.evaluate(study.plan(walked.plan_id))
    assert same.value == pytest.approx(walked.value, abs=1e-6)  # agents score as this process does
    if result.confirmed:  # the confirmation ran on the agents' HTP too
        assert all(c.confirmed.backend == "htp" for c in result.confirmations)
    assert set(study.jobs()["status"]) == {"done"}
    study.close()
    in_process.close()


@pytest.mark.htp
@requires_qnn
def test_search_confirms_its_front_on_htp_by_default(tmp_path):
    model, data = _model_and_data(tmp_path, 4)
    out = subprocess.run([sys.executable, "-m", "mpstudio", "search", str(model), "--data", str(data), "--study",
                          str(tmp_path / "s"), "--weights", "per-tensor", "--confirm-plans", "2", "--quiet"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode in (0, 1), out.stderr
    assert "confirmed on HTP" in out.stdout and "CPU and HTP" in out.stdout
    with Study.open(tmp_path / "s") as study:
        frame = study.evaluations()
        assert {CPU_SOURCE} < set(frame["accuracy_source"])
        htp = frame[frame["accuracy_source"].str.startswith("HTP")]
        assert 1 <= len(htp) <= 2 and set(htp["backend"]) == {"htp"}
        record = study.searches()["result"].iloc[0]
        assert [c["plan_id"] for c in record["confirmations"]] == htp["plan_id"].tolist()
        recommended = htp[htp["plan_id"] == record["recommended_plan_id"]]
        assert len(recommended) == 1 and recommended["value"].iloc[0] == pytest.approx(record["recommended_value"])
    skipped = subprocess.run([sys.executable, "-m", "mpstudio", "search", "--study", str(tmp_path / "s"),
                              "--target", "a16w8+20%", "--weights", "per-tensor", "--no-confirm", "--quiet"],
                             capture_output=True, text=True, timeout=600)
    assert skipped.returncode in (0, 1), skipped.stderr
    assert "confirmed on" not in skipped.stdout


@pytest.mark.htp
@requires_qnn
def test_the_htp_confirmation_moves_the_pick_where_cpu_and_htp_disagree(tmp_path):
    """A model whose uint8 Reciprocal the HTP computes differently from ORT's CPU (see test_diverge): all-8-bit
    is about 1.2 dB better on the HTP. With a target between the two, the walk on the CPU must promote, and the
    confirmation finds that the HTP reaches the target with the cheaper all-8-bit plan, and says so. At 80x80
    one tensor's 16-bit premium (8 us or more estimated) is more than the cost model resolves; at 48x48 it is
    2.6 us, within its 2.2 us floor (a latency tie that goes to the better value), and at some sizes (56, 64,
    72, 96) the two backends agree on all-8-bit."""
    from test_diverge import make_study

    with make_study(tmp_path / "study", size=80) as study:
        a8_cpu = study.evaluate(PrecisionPlan.a8w8(), "cpu").value
        a8_htp = study.evaluate(PrecisionPlan.a8w8(), "htp").value
        assert a8_htp > a8_cpu + 0.5  # the planted disagreement, as measured (not part of what is tested)
        target = (a8_cpu + a8_htp) / 2
        result = search(study, target, weights="per-tensor", max_evaluations=8)
        assert result.confirmed and result.reached
        assert result.walk_pick is not None and result.walk_pick.backend == "cpu"
        assert meets(result.walk_pick.value, target, True)
        assert result.recommended.name == "a8w8" and result.recommended.backend == "htp"
        assert result.recommended.value == pytest.approx(a8_htp)
        assert (result.recommended.latency("estimate").ms < result.walk_pick.latency("estimate").ms)
        assert any("a8w8 misses the target on ORT CPU" in d and "reaches it on HTP" in d
                   for d in result.disagreements)
        text = result.describe()
        assert "CPU and HTP disagree" in text and "the walk on ORT CPU" in text
        assert study.searches()["result"].iloc[-1]["walk_pick_plan_id"] == result.walk_pick.plan_id


@pytest.mark.htp
@requires_qnn
def test_an_agent_that_dies_during_the_confirmation_loses_nothing(tmp_path):
    """The agent process is killed as the first HTP run starts: the search still returns the walk's result,
    says why the confirmation stopped, and keeps every evaluation the walk stored."""
    from mpstudio.agent import LocalAgent

    study = _make_study(tmp_path, size=32)
    agent = LocalAgent()
    agent.start()

    def progress(done, total, message):
        if "on htp" in message and agent._process.poll() is None:
            agent._process.kill()
            agent._process.wait()

    try:
        result = search(study, "a16w8+10%", runner=agent.client, weights="per-tensor", max_evaluations=8,
                        progress=progress)
    finally:
        agent.stop()
    assert not result.confirmed and "confirmation on the HTP stopped after 0 plan(s)" in result.confirm_note
    assert "unreachable" in result.confirm_note and result.confirm_note in result.describe()
    assert result.recommended.backend == "cpu" and result.reached
    assert study.searches()["status"].tolist() == ["done"]
    stored = study.evaluations()
    assert {e.plan_id for e in result.path} <= set(stored[stored["backend"] == "cpu"]["plan_id"])
    study.close()


def test_disagreements_name_the_target_and_the_order():
    def e(plan_id, value, source):
        return Evaluation(plan_id, "h", f"p{plan_id}", "x", source, "snr", value, True, None, None, 1, 0.0)

    pairs = [Confirmation(e(1, 20.0, "CPU"), e(1, 19.0, "HTP")), Confirmation(e(2, 22.0, "CPU"), e(2, 18.0, "HTP")),
             Confirmation(e(3, 25.0, "CPU"), e(3, 25.0, "HTP"))]
    found = disagreements(pairs, threshold=21.0, higher_is_better=True)
    assert found == ["plan 2 p2 reaches the target on CPU (22.0000) and misses it on HTP (18.0000)",
                     "CPU ranks plan 2 ahead of plan 1, HTP the reverse"]
    assert disagreements(pairs[2:], 21.0, True) == []
    assert disagreements([Confirmation(e(4, 1.0, "CPU"), e(4, 1.0, "HTP")),
                          Confirmation(e(5, 1.0, "CPU"), e(5, 2.0, "HTP"))], 1.5, False) == [
        "plan 5 p5 reaches the target on CPU (1.0000) and misses it on HTP (2.0000)"]  # a tie is no reversal


def test_confirm_is_checked():
    with pytest.raises(MpstudioError, match="confirm must be one of htp"):
        search(None, 30.0, confirm="gpu")
