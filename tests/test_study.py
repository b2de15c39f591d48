"""Studies on disk: a real SQLite file, real ORT sessions, reopened as a new process would."""

from __future__ import annotations

import json
import socket
import sqlite3
import time

import numpy as np
import pytest

from conftest import chain_feeds, make_chain_model, requires_qnn
from mpstudio.data import FeedList, TaskMetric
from mpstudio.errors import MpstudioError
from mpstudio.loop.front import pareto_mask
from mpstudio.loop.runners import CPU_SOURCE
from mpstudio.plan import PrecisionPlan
from mpstudio.store import STALE_AFTER_S
from mpstudio.study import Study


@pytest.fixture
def chain_study(tmp_path):
    import onnx

    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(), path)
    study = Study.create(tmp_path / "study", path, FeedList(chain_feeds(8)), FeedList(chain_feeds(6, seed=7)))
    yield study
    study.close()


def test_create_evaluate_reopen(chain_study, tmp_path):
    a8 = chain_study.evaluate(PrecisionPlan.a8w8())
    a16 = chain_study.evaluate(PrecisionPlan.a16w8())
    assert not a8.cached and a8.metric == "output SNR (dB)" and a8.higher_is_better
    assert a8.value == pytest.approx(a8.snr_db) and 0.9 < a8.cosine <= 1.0
    assert a16.value > a8.value + 10  # 16-bit activations are far closer to the float model
    est = a8.latency("estimate")
    assert est is not None and est.source == "estimate" and est.ms > 0
    assert a16.latency("estimate").ms > est.ms
    again = chain_study.evaluate(PrecisionPlan.a8w8())
    assert again.cached and again.value == a8.value
    chain_study.close()

    reopened = Study.open(tmp_path / "study")
    frame = reopened.evaluations()
    assert sorted(frame["name"]) == ["a16w8", "a8w8"]
    assert set(frame["latency_source"]) == {"estimate"}
    assert frame.set_index("name").loc["a8w8", "value"] == pytest.approx(a8.value)
    assert reopened.plan(a8.plan_id).hash == PrecisionPlan.a8w8().hash
    assert reopened.plan(a8.plan_hash[:8]).hash == a8.plan_hash
    reopened.close()


def test_output_agreement_matches_a_direct_computation(chain_study):
    from mpstudio.loop.inprocess import run_outputs

    evaluation = chain_study.evaluate(PrecisionPlan.a8w8())
    quant = run_outputs(chain_study.quantizer.generate(PrecisionPlan.a8w8()), chain_study.evaluation_data)
    ref = run_outputs(chain_study.quantizer.float_path, chain_study.evaluation_data)
    r = np.concatenate([o["y"].ravel() for o in ref]).astype(np.float64)
    q = np.concatenate([o["y"].ravel() for o in quant]).astype(np.float64)
    assert evaluation.snr_db == pytest.approx(10 * np.log10((r @ r) / ((q - r) @ (q - r))), abs=1e-6)
    assert evaluation.cosine == pytest.approx(r @ q / np.sqrt((r @ r) * (q @ q)), abs=1e-9)


def test_python_metric_is_needed_again_to_evaluate_but_not_to_read(tmp_path):
    import onnx

    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=2), path)
    mean_abs = TaskMetric("mean |y|", lambda outs: float(np.mean([np.abs(o["y"]).mean() for o in outs])), True)
    study = Study.create(tmp_path / "s", path, FeedList(chain_feeds(4)), metric=mean_abs)
    first = study.evaluate(PrecisionPlan.a8w8())
    assert first.metric == "mean |y|"
    study.close()
    reopened = Study.open(tmp_path / "s")
    assert reopened.evaluations()["value"].tolist() == [pytest.approx(first.value)]
    with pytest.raises(MpstudioError, match="given in Python"):
        reopened.evaluate(PrecisionPlan.a16w8())
    reopened.close()
    with Study.open(tmp_path / "s", metric=mean_abs) as again:
        assert again.evaluate(PrecisionPlan.a16w8()).metric == "mean |y|"


def test_pareto_mask_directions_ties_and_nan():
    acc = [0.5, 0.3, 0.3, 0.1, 0.2, np.nan, 0.1]
    lat = [1.0, 2.0, 2.0, 3.0, 4.0, 0.5, 3.0]
    # Lower is better (an error rate): the 0.3 pair ties and both stay; 0.2 at 4 ms is dominated by 0.1 at 3 ms.
    assert pareto_mask(acc, lat, higher_is_better=False).tolist() == [True, True, True, True, False, False, True]
    # Higher is better: only the fastest point with the best accuracy so far.
    assert pareto_mask(acc, lat, higher_is_better=True).tolist() == [True, False, False, False, False, False, False]
    # Same latency, different accuracy: only the better one.
    assert pareto_mask([1.0, 2.0], [1.0, 1.0], True).tolist() == [False, True]


def test_front_uses_one_latency_source_and_the_metric_direction(chain_study):
    plans = [PrecisionPlan.a8w8(), PrecisionPlan.a16w8()]
    tensors = [t for t in chain_study.graph.activations() if t.startswith("block")]
    plans += [PrecisionPlan.a8w8().promote(tensors[:k]) for k in (2, 6)]
    for plan in plans:
        chain_study.evaluate(plan)
    front = chain_study.front("estimate")
    assert len(front) == 4 and front["pareto"].any()
    a16 = front[front["name"] == "a16w8"].iloc[0]
    assert a16["pareto"]  # the most accurate plan is always on the front
    for _, row in front[front["pareto"]].iterrows():
        better = front[(front["value"] > row["value"]) & (front["latency_ms"] < row["latency_ms"])]
        assert better.empty
    assert chain_study.front("measured").empty
    text = chain_study.summary()
    assert "a16w8" in text and "estimate" in text and "front" in text


def test_results_of_an_earlier_numerics_neither_make_the_front_nor_cross_check_it(chain_study):
    """A study kept from an earlier mpstudio holds CPU results of its numerics: more of them than of the current
    numerics, yet the front is of the current CPU numerics, and they are not shown as another backend's check."""
    from mpstudio.store import AccuracyRecord

    old_source = "ORT CPU QDQ (fake-quant, HTP weights)"  # the name of the numerics before input rounding
    plans = [PrecisionPlan.a8w8(), PrecisionPlan.a16w8()]
    tensors = [t for t in chain_study.graph.activations() if t.startswith("block")]
    plans += [PrecisionPlan.a8w8().promote(tensors[:k]) for k in (2, 6)]
    evaluations = [chain_study.evaluate(plan) for plan in plans]
    for evaluation in evaluations:  # every plan again under the old name, and one more plan only under it
        chain_study.store.record(evaluation.plan_id, AccuracyRecord(
            "cpu", old_source, evaluation.metric, evaluation.value - 0.5, True, None, None, 6, 0.1))
    for k in (3, 4):  # plans only the old numerics scored: it has the most plans
        plan = PrecisionPlan.a8w8().promote(tensors[:k])
        plan_id = chain_study.add_plan(plan, "search")
        chain_study.store.record(plan_id, AccuracyRecord("cpu", old_source, evaluations[0].metric, 1.0, True, None,
                                                         None, 6, 0.1), latencies=[chain_study.estimate(plan)])
    assert len(chain_study.front("estimate", accuracy_source=old_source)) == 6
    front = chain_study.front("estimate")
    assert set(front["accuracy_source"]) == {CPU_SOURCE} and len(front) == 4
    assert chain_study.cross_checks("estimate", front).empty
    assert old_source not in chain_study.summary()


def test_jobs_left_running_by_a_dead_process_are_pending_again(chain_study, tmp_path):
    job = chain_study.submit(PrecisionPlan.a16w8())
    assert chain_study.submit(PrecisionPlan.a16w8()) == job  # no duplicate queueing
    chain_study.close()
    db = sqlite3.connect(tmp_path / "study" / "study.sqlite")
    with db:  # what a process of this host killed mid-evaluation leaves behind (no such pid runs)
        db.execute("UPDATE jobs SET status = 'running', owner = ? WHERE id = ?", (f"{socket.gethostname()}:999999999", job))
    db.close()
    study = Study.open(tmp_path / "study")
    assert study.jobs().set_index("job_id").loc[job, "status"] == "pending"
    done = study.run_pending()
    assert [e.name for e in done] == ["a16w8"]
    assert study.jobs().set_index("job_id").loc[job, "status"] == "done"
    study.close()


def test_work_of_another_host_is_judged_by_its_heartbeat(chain_study, tmp_path):
    job = chain_study.submit(PrecisionPlan.a8w8().promote(["x"]))
    chain_study.close()
    db = sqlite3.connect(tmp_path / "study" / "study.sqlite")
    with db:  # a process on another machine sharing the folder: alive while its heartbeat is fresh
        db.execute("UPDATE jobs SET status = 'running', owner = 'elsewhere:12', updated = ? WHERE id = ?",
                   (time.time(), job))
    study = Study.open(tmp_path / "study")
    assert study.jobs().set_index("job_id").loc[job, "status"] == "running"
    assert study.store.claim_job() is None
    with db:
        db.execute("UPDATE jobs SET updated = ? WHERE id = ?", (time.time() - 2 * STALE_AFTER_S, job))
    db.close()
    assert study.jobs().set_index("job_id").loc[job, "status"] == "pending"
    assert study.store.claim_job() == job
    study.close()


def test_bad_input_is_refused_clearly(chain_study, tmp_path):
    with pytest.raises(MpstudioError, match="not a study folder"):
        Study.open(tmp_path / "nowhere")
    with pytest.raises(MpstudioError, match="already holds a study"):
        Study.create(chain_study.folder, chain_study.quantizer.float_path, chain_study.calibration)
    with pytest.raises(MpstudioError, match="no plan"):
        chain_study.plan(999)
    with pytest.raises(MpstudioError, match="backend"):
        chain_study.evaluate(PrecisionPlan.a8w8(), backend="gpu")
    with pytest.raises(MpstudioError, match="no_such_tensor"):
        chain_study.evaluate(PrecisionPlan.a8w8().promote(["no_such_tensor"]))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "study.json").write_text("{not json")
    with pytest.raises(MpstudioError, match="not valid JSON"):
        Study.open(bad)
    with pytest.raises(MpstudioError, match="shape"):
        Study.create(tmp_path / "mismatch", chain_study.quantizer.float_path,
                     FeedList([{"x": np.zeros((1, 3, 8, 8), np.float32)}]))
    assert not (tmp_path / "mismatch" / "study.json").exists()


def test_a_failed_evaluation_keeps_earlier_results(chain_study, tmp_path):
    first = chain_study.evaluate(PrecisionPlan.a8w8())
    (chain_study.folder / "data" / "evaluation" / "000002.npz").write_bytes(b"not an npz")
    with pytest.raises(MpstudioError):
        chain_study.evaluate(PrecisionPlan.a16w8())
    frame = chain_study.evaluations()
    assert frame["name"].tolist() == ["a8w8"] and frame["value"].iloc[0] == pytest.approx(first.value)


def test_evaluation_over_a_real_agent_matches_in_process(chain_study, tmp_path):
    from mpstudio.agent import LocalAgent

    local = chain_study.evaluate(PrecisionPlan.a8w8())
    other = Study.create(tmp_path / "other", chain_study.quantizer.float_path, chain_study.calibration,
                         chain_study.evaluation_data)
    with LocalAgent() as agent:
        remote = other.evaluate(PrecisionPlan.a8w8(), "cpu", agent.client)
    assert remote.value == pytest.approx(local.value, abs=1e-6)
    assert remote.accuracy_source == CPU_SOURCE
    other.close()


@pytest.mark.htp
@requires_qnn
def test_htp_evaluation_records_emulator_latency_apart(chain_study):
    from mpstudio.agent import LocalAgent

    with LocalAgent() as agent:
        evaluation = chain_study.evaluate(PrecisionPlan.a8w8(), "htp", agent.client)
    sources = {lat.source for lat in evaluation.latencies}
    assert sources == {"estimate", "emulator"}
    assert "emulator" in evaluation.accuracy_source.lower()
    emulator = evaluation.latency("emulator")
    assert "not device latency" in emulator.label
    front = chain_study.front("emulator")
    assert len(front) == 1 and front["latency_label"].iloc[0] == emulator.label


@requires_qnn
def test_profiled_htp_runs_recalibrate_the_studys_cost_model(chain_study):
    """A real local agent profiles each HTP run per op; the study keeps the profiles, refits the cost model on
    them and re-estimates every plan, labelled with where it was calibrated. On x86_64 the agent's HTP is the
    emulator, whose host time the study uses only because the run asked for it (`profile=True`)."""
    import math

    from mpstudio.agent import LocalAgent

    before = {p.name: chain_study.estimate(p).ms for p in (PrecisionPlan.a8w8(), PrecisionPlan.a16w8())}
    with LocalAgent() as agent:
        assert chain_study.evaluate(PrecisionPlan.a8w8(), "htp", agent.client).latency("emulator") is not None
        assert chain_study.profiles().empty  # emulator runs are not profiled unless asked
        chain_study.evaluate(PrecisionPlan.a16w8(), "cpu")
        a16 = chain_study.evaluate(PrecisionPlan.a16w8(), "htp", agent.client, profile=True)
    kept = chain_study.profiles()
    assert kept["plan_id"].tolist() == [chain_study.plan_id(PrecisionPlan.a16w8())]
    frame = chain_study.evaluations()
    estimates = frame[frame["latency_source"] == "estimate"].drop_duplicates("plan_id")
    assert estimates["latency_label"].str.contains("calibrated on").all()
    assert (frame.groupby(["plan_id", "accuracy_source"])["latency_source"].apply(lambda s: (s == "estimate").sum())
            <= 1).all()  # one estimate per plan, the recalibrated one
    measured = a16.latency("emulator").ms
    after = chain_study.estimate(PrecisionPlan.a16w8()).ms
    assert abs(math.log(after / measured)) < abs(math.log(before["a16w8"] / measured))
    # Emulator latency comes from HTP runs: its front shows their HTP accuracy, not the CPU one.
    assert chain_study.front("emulator")["accuracy_source"].str.startswith("HTP emulator").all()
    assert chain_study.front("estimate")["accuracy_source"].nunique() == 1
    reopened = Study.open(chain_study.folder)  # the calibration is part of the study
    assert "calibrated on" in reopened.estimate(PrecisionPlan.a8w8()).label
    reopened.close()
