"""A plan before its full evaluation: the prediction from isolation scores and the cost model, and the streamed
evaluation's partial values with their intervals (real studies, real ORT sessions, a real SQLite store)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from gui_support import make_small_study
from mpstudio.loop.prediction import monotone_fit
from mpstudio.loop.streaming import SampleTerms, cer_terms, snr_terms, stream_order
from mpstudio.ctc_text import character_error_rate
from mpstudio.metrics import output_agreement
from mpstudio.plan import PrecisionPlan

pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_small_study(tmp_path_factory.mktemp("preview") / "study")


def ranked(study, start, stop):
    return study.sensitivity().ranking["tensor"].iloc[start:stop].tolist()


def test_stream_order_runs_every_sample_once_first_chunk_first():
    chunks = stream_order(100, 16)
    assert len(chunks[0]) == 16 and [len(c) for c in chunks] == [16, 16, 32, 36]
    flat = [i for chunk in chunks for i in chunk]
    assert sorted(flat) == list(range(100))
    assert chunks == stream_order(100, 16)  # the same samples first for every plan
    assert chunks[0] != list(range(16))  # spread over the set, not its head
    assert stream_order(5, 16) == [[0, 1, 2, 3, 4]]


def test_sample_terms_on_every_sample_give_the_metric_and_no_interval(study):
    references = study.float_outputs()
    path = study.quantizer.generate(PrecisionPlan.a8w8())
    from mpstudio.loop.inprocess import run_outputs

    outputs = run_outputs(path, study.evaluation_data)
    terms = snr_terms(references)
    n = len(outputs)
    value, low, high = terms.partial(outputs, list(range(n)), n)
    assert value == pytest.approx(output_agreement(references, outputs)[0], abs=1e-9)
    assert low == value == high
    # On part of the samples: an interval around the value, narrowing as the samples come to cover the set
    # (n = 12 here; from 4 to 10 samples the finite-population factor alone halves it).
    value4, low4, high4 = terms.partial(outputs[:4], [0, 1, 2, 3], n)
    most = list(range(n - 2))
    value10, low10, high10 = terms.partial(outputs[:n - 2], most, n)
    assert low4 < value4 < high4 and low10 < value10 < high10
    assert high10 - low10 < high4 - low4


def test_cer_terms_agree_with_the_cer_metric():
    charset = ["<blank>", "a", "b", "c", " "]
    references = ["abc", "cab", "aa", "bcbc"]
    decoded = ["abc", "cb", "aab", "bcbc"]

    def one_hot(text):
        steps = []
        for ch in text:  # a blank between characters, so repeats survive the CTC decoding
            steps += [charset.index(ch), 0]
        probs = np.zeros((1, len(steps), len(charset)), np.float32)
        probs[0, np.arange(len(steps)), steps] = 1
        return {"y": probs}

    outputs = [one_hot(t) for t in decoded]
    terms = cer_terms(references, charset)
    value, low, high = terms.partial(outputs, [0, 1, 2, 3], 4)
    assert value == pytest.approx(character_error_rate(decoded, references))
    # A subset is scored against its own references.
    value, _, _ = terms.partial([outputs[1], outputs[2]], [1, 2], 4)
    assert value == pytest.approx(character_error_rate(decoded[1:3], references[1:3]))


def test_the_interval_closes_as_the_samples_cover_the_set():
    rng = np.random.default_rng(3)
    num, den = rng.integers(0, 5, 200).astype(float), rng.integers(20, 40, 200).astype(float)
    terms = SampleTerms("ratio", lambda outputs, idx: (num[idx], den[idx]), lambda a, b: a / b)
    widths = []
    for n in (10, 50, 150, 199):
        _, low, high = terms.partial([None] * n, list(range(n)), 200)
        widths.append(high - low)
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0] / 5
    # Over random subsets of 20, the 95 % interval holds the full set's value most of the time.
    full = num.sum() / den.sum()
    held = 0
    for seed in range(60):
        idx = sorted(np.random.default_rng(seed).choice(200, 20, replace=False).tolist())
        _, low, high = terms.partial([None] * 20, idx, 200)
        held += low <= full <= high
    assert held >= 50, held


def test_monotone_fit_pools_violations():
    xs, ys = monotone_fit([3, 1, 2, 4], [0.2, 0.5, 0.1, 0.05], increasing=False)
    assert list(xs) == [1, 2, 3, 4]
    assert all(a >= b for a, b in zip(ys, ys[1:]))
    assert ys[0] == 0.5 and ys[1] == ys[2] == pytest.approx(0.15)


def test_a_streamed_evaluation_reports_partial_values_and_stores_the_full_one(study, tmp_path):
    plan = PrecisionPlan.a8w8().promote(ranked(study, 0, 3))
    seen = []
    streamed = study.evaluate(plan, partial=seen.append, first_samples=4)
    assert [p.samples for p in seen] == [4, 8] and all(p.total == 12 for p in seen)
    for point in seen:
        assert point.low <= point.value <= point.high and point.plan_hash == plan.hash
        assert point.latency is not None and point.latency.source == "estimate"
        assert point.accuracy_source == streamed.accuracy_source
    # The stored result is the full set's, the same as an evaluation that does not stream.
    copy = tmp_path / "copy"
    shutil.copytree(study.folder, copy, ignore=shutil.ignore_patterns("*.lock"))
    from mpstudio.study import Study

    with Study.open(copy) as other:
        other.store._db.execute("DELETE FROM accuracy WHERE plan_id = ?", (streamed.plan_id,))
        other.store._db.commit()
        (copy / "results.count").unlink()
        plain = other.evaluate(plan)
    assert not plain.cached and plain.value == pytest.approx(streamed.value, abs=1e-9)
    assert study.store.evaluation(streamed.plan_id, streamed.accuracy_source).samples == 12
    # Evaluated already: nothing runs, nothing partial.
    again = []
    assert study.evaluate(plan, partial=again.append).cached and again == []


def test_a_prediction_has_a_value_in_the_metric_and_the_cost_models_latency(study):
    plan = PrecisionPlan.a8w8().promote(ranked(study, 0, 4))
    prediction = study.predict(plan, study.sensitivity())
    assert prediction.placed and prediction.plan_hash == plan.hash
    assert prediction.latency.source == "estimate" and "approximate" in prediction.latency.detail
    # Its latency comes without making the plan's model: promotion costs added up, close for one tensor.
    single = PrecisionPlan.a8w8().promote(ranked(study, 0, 1))
    assert study.predict(single).latency.ms == pytest.approx(study.estimate(single).ms, rel=0.05)
    # Between all-8-bit and the larger of all-16-bit and the plan's own estimate: on this small model a few
    # 16-bit tensors cost more than all of them (their converts), so all-16-bit alone is no upper bound.
    low, high = (study.estimate(p).ms for p in (PrecisionPlan.a8w8(), PrecisionPlan.a16w8()))
    assert low <= prediction.latency.ms <= max(high, study.estimate(plan).ms) + 1e-9
    base = study.evaluations().drop_duplicates("plan_id").set_index("name")
    # Output SNR: promoting the top tensors predicts at least the all-8-bit value, at most the all-16-bit one
    # (isolation scores are moved onto the evaluation set by the all-8-bit plan's measured SNR).
    assert base.loc["a8w8", "value"] - 1e-6 <= prediction.value <= base.loc["a16w8", "value"] + 3.0
    # Without a sensitivity report there is nothing to predict the accuracy from; the latency is still known.
    from mpstudio.preview import predict_plan

    empty = predict_plan(study, plan, None)
    assert not empty.placed and not math.isfinite(empty.value) and empty.latency is not None


@pytest.mark.parametrize("metric", ["cosine", "top1"])
def test_a_built_in_metric_streams_paired_first_values(tmp_path, metric):
    """Output cosine and top-1 agreement have per-sample terms: a promotion's first values come paired with the
    plan it was made from, on the same samples, and the stored value is the full set's."""
    import onnx

    from conftest import chain_feeds, make_chain_model
    from mpstudio.data import FeedList
    from mpstudio.metrics import metric_spec
    from mpstudio.study import Study

    onnx.save(make_chain_model(blocks=3), tmp_path / "chain.onnx")
    with Study.create(tmp_path / "study", tmp_path / "chain.onnx", FeedList(chain_feeds(6)),
                      FeedList(chain_feeds(12, seed=4)),
                      metric=metric_spec(metric, args={"axis": 1} if metric == "top1" else None)) as study:
        base = study.evaluate(PrecisionPlan.a8w8())
        plan = PrecisionPlan.a8w8().promote(study.graph.activations()[1:3])
        seen = []
        full = study.evaluate(plan, partial=seen.append, first_samples=4, versus=PrecisionPlan.a8w8())
        assert [p.samples for p in seen] == [4, 8]
        for point in seen:
            assert point.low <= point.value <= point.high and point.metric == full.metric
            assert point.paired is not None and f"vs {base.name}" in point.paired.describe()
        assert not full.cached and full.samples == 12
