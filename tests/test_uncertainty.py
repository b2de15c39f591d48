"""Paired uncertainty on real studies: per-sample metric terms stored with every evaluation (a small classifier
built with onnx.helper, real ORT sessions, a real SQLite store), the per-plan interval and the paired bootstrap
of two plans on the same samples, and "within noise" against a target."""

from __future__ import annotations

import sqlite3

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mpstudio.data import FeedList
from mpstudio.loop.uncertainty import interval, lower_bounds, paired_difference, target_verdict
from mpstudio.metric_terms import MetricTerms, metric_terms
from mpstudio.ctc_text import character_error_rate
from mpstudio.metrics import metric_spec, recall_at_k, top1_agreement
from mpstudio.plan import PrecisionPlan
from mpstudio.study import Study

pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")

SAMPLES = 60


def make_classifier(classes: int = 20, features: int = 16, hidden: int = 24, seed: int = 0) -> onnx.ModelProto:
    """x[1,16] -> MatMul -> Relu -> MatMul -> Add -> logits[1,20]: a classifier whose top-1 8-bit quantization
    flips on some samples (one hidden unit with a wide range coarsens the 8-bit grid of the others)."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.6, (features, hidden)).astype(np.float32)
    w1[:, 0] *= 60.0
    w2 = rng.normal(0, 0.6, (hidden, classes)).astype(np.float32)
    w2[0, :] *= 0.001
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(rng.normal(0, 0.1, (classes,)).astype(np.float32), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("MatMul", ["hr", "w2"], ["z"], name="fc2"),
             helper.make_node("Add", ["z", "b2"], ["logits"], name="bias")]
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, features])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def feeds(n: int, seed: int = 1) -> FeedList:
    rng = np.random.default_rng(seed)
    return FeedList([{"x": rng.normal(0, 1, (1, 16)).astype(np.float32)} for _ in range(n)], name="random")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uncertainty")
    onnx.save(make_classifier(), folder / "classifier.onnx")
    s = Study.create(folder / "study", folder / "classifier.onnx", feeds(SAMPLES), metric=metric_spec("top1"),
                     name="classifier")
    yield s
    s.close()


def test_every_evaluation_stores_per_sample_terms_that_give_its_value(study):
    a8 = study.evaluate(PrecisionPlan.a8w8())
    terms = study.terms(a8.plan_id, a8.accuracy_source)
    assert terms is not None and terms.units == SAMPLES and terms.names == ("agree", "positions")
    assert terms.value() == pytest.approx(a8.value, abs=1e-12)
    # Each sample's hit is the float model's argmax against the plan's on that sample (an ORT run of the plan).
    from mpstudio.loop.inprocess import run_outputs

    outputs = run_outputs(study.quantizer.generate(PrecisionPlan.a8w8()), study.evaluation_data)
    hits = [top1_agreement([o], [r]) for o, r in zip(outputs, study.float_outputs())]
    assert terms.columns[:, 0].tolist() == hits
    # The stored result carries its interval and resolution: one sample of 60.
    assert a8.low <= a8.value <= a8.high and a8.high - a8.low > 0
    assert a8.resolution == pytest.approx(1 / SAMPLES)
    assert "95 % interval" in a8.describe()
    row = study.evaluations().query("plan_id == @a8.plan_id").iloc[0]
    assert row["value_low"] == pytest.approx(a8.low) and row["resolution"] == pytest.approx(1 / SAMPLES)


def test_the_paired_bootstrap_of_two_plans_on_the_same_samples(study):
    a8 = study.evaluate(PrecisionPlan.a8w8())
    a16 = study.evaluate(PrecisionPlan.a16w8())
    diff = study.compare(PrecisionPlan.a16w8(), PrecisionPlan.a8w8())
    assert diff.difference == pytest.approx(a16.value - a8.value, abs=1e-12)
    assert diff.low <= diff.difference <= diff.high and diff.samples == SAMPLES
    assert diff.resolution == pytest.approx(1 / SAMPLES)
    # Seeded: the same interval every time.
    again = study.compare(PrecisionPlan.a16w8(), PrecisionPlan.a8w8())
    assert (again.low, again.high) == (diff.low, diff.high)
    # Paired beats unpaired: what both plans get right on a sample cancels, so the interval of the difference is
    # narrower than the two plans' own intervals combined.
    width = diff.high - diff.low
    assert width < (a8.high - a8.low) + (a16.high - a16.low)
    # A plan against itself: exactly zero, within noise.
    same = study.compare(PrecisionPlan.a8w8(), PrecisionPlan.a8w8())
    assert same.difference == same.low == same.high == 0.0 and same.verdict == "within noise"
    assert "vs a8w8" in same.describe() and f"{SAMPLES} samples" in same.describe()


def test_the_paired_interval_holds_a_known_difference():
    # Two synthetic plans sharing most per-sample errors: the paired interval is narrow and excludes 0 when one
    # plan is better on many samples, and holds 0 when they differ on two samples of 200.
    rng = np.random.default_rng(0)
    base = rng.random(200) < 0.7
    better = base.copy()
    better[np.flatnonzero(~base)[:30]] = True  # 30 more hits
    a = MetricTerms("ratio", ("hit", "n"), np.stack([better, np.ones(200)], 1))
    b = MetricTerms("ratio", ("hit", "n"), np.stack([base, np.ones(200)], 1))
    d = paired_difference(a, b, metric="top-1", higher_is_better=True)
    assert d.difference == pytest.approx(30 / 200) and d.low > 0.08 and d.verdict == "better"
    close = base.copy()
    close[np.flatnonzero(~base)[:2]] = True
    c = MetricTerms("ratio", ("hit", "n"), np.stack([close, np.ones(200)], 1))
    near = paired_difference(c, b, metric="top-1", higher_is_better=True)
    assert near.low <= 0 <= near.high and near.verdict == "within noise"
    # A per-plan interval covers the plan's value; its resolution is one sample's weight.
    spread = interval(b)
    assert spread.low < spread.value < spread.high and spread.resolution == pytest.approx(1 / 200)


def test_within_noise_against_a_target():
    # Missed by less than one query's weight (recall@1 over 250 queries): within noise, whatever the interval.
    assert target_verdict(0.684, 0.686, True, resolution=1 / 250) == "within noise"
    assert target_verdict(0.684, 0.686, True, resolution=None) == "misses"
    assert target_verdict(0.70, 0.686, True, low=0.68, high=0.72) == "within noise"
    assert target_verdict(0.70, 0.686, True, low=0.69, high=0.71) == "reaches"
    assert target_verdict(0.03, 0.02, False, low=0.025, high=0.035) == "misses"


def test_terms_of_recall_and_cer_give_the_metrics_values():
    rng = np.random.default_rng(4)
    outputs = [{"e": rng.normal(0, 1, (1, 8)).astype(np.float32)} for _ in range(20)]
    spec = metric_spec("recall@1")
    terms = metric_terms(spec, None, outputs, outputs)
    assert terms.unit == "query" and terms.units == 10
    assert terms.value() == pytest.approx(recall_at_k(outputs, outputs, k=1))
    assert terms.resolution == pytest.approx(1 / 10)
    charset = ["a", "b", "c"]
    classes = ["<blank>", "a", "b", "c", " "]

    def one_hot(text):
        steps = []
        for ch in text:
            steps += [classes.index(ch), 0]
        probs = np.zeros((1, len(steps), len(classes)), np.float32)
        probs[0, np.arange(len(steps)), steps] = 1
        return {"y": probs}
    labels, decoded = ["abc", "cab", "aa"], ["abc", "cb", "aab"]
    spec = metric_spec("cer", charset=charset, labels=labels)
    outs = [one_hot(t) for t in decoded]
    terms = metric_terms(spec, None, outs, outs)
    assert terms.value() == pytest.approx(character_error_rate(decoded, labels))
    assert terms.resolution == pytest.approx(1 / 8)
    part = metric_terms(spec, None, outs[1:], outs[1:], indices=[1, 2])
    assert part.value() == pytest.approx(character_error_rate(decoded[1:], labels[1:]))


def test_an_older_store_without_terms_opens_and_reads(study, tmp_path):
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(study.folder, copy, ignore=shutil.ignore_patterns("*.lock"))
    db = sqlite3.connect(copy / "study.sqlite")
    db.execute("DROP TABLE sample_terms")
    db.execute("UPDATE accuracy SET low = NULL, high = NULL, resolution = NULL")
    db.commit()
    db.close()
    with Study.open(copy) as old:
        e = old.store.evaluation(old.plan_id(PrecisionPlan.a8w8()), old.evaluations()["accuracy_source"].iloc[0])
        assert e.low is None and e.interval_text() == "" and old.terms(e.plan_id, e.accuracy_source) is None
        with pytest.raises(Exception, match="per-sample terms"):
            old.compare(PrecisionPlan.a16w8(), PrecisionPlan.a8w8())


def _evaluation(plan_id, value, ms, low=None, high=None):
    from mpstudio.sources import Latency
    from mpstudio.store import Evaluation

    return Evaluation(plan_id, f"h{plan_id}", f"plan{plan_id}", "cpu", "ORT CPU", "top-1", value, True, None, None,
                      60, 0.1, (Latency(ms=ms, source="estimate", where="HTP v75 cost model"),), low=low, high=high,
                      resolution=1 / 60)


def test_the_pick_prefers_a_plan_that_clearly_reaches_and_names_cheaper_ones_within_noise():
    from mpstudio.search import choose

    cheap, dear, worse = _evaluation(1, 0.80, 1.0), _evaluation(2, 0.95, 2.0), _evaluation(3, 0.5, 0.5)
    verdicts = {1: "within noise", 2: "reaches", 3: "misses"}
    choice = choose([cheap, dear, worse], 0.80, True, verdicts=verdicts)
    assert choice.pick.plan_id == 2 and "clearly" in choice.why and "within noise" in choice.why
    assert {c.plan_id: c.verdict for c in choice.considered} == {1: "within noise", 2: "picked", 3: "misses"}
    # None clearly reaches: the cheapest within noise, said so.
    choice = choose([cheap, worse], 0.80, True, verdicts={1: "within noise", 3: "misses"})
    assert choice.pick.plan_id == 1 and "no stored plan clearly reaches" in choice.why
    # One plan is counted as one ("1 are within noise" read wrong), and is not "the cheapest of those 1".
    assert "; 1 is within noise of it" in choice.why and "the one whose value meets it" in choice.why, choice.why


def test_of_plans_within_noise_the_pick_is_one_whose_value_meets_the_target():
    """None clearly reaches 0.895: a cheap plan 0.04 under it and a dearer one over it are both within noise of it
    (the samples cannot tell). The dearer one meets the target by its value, so it is the pick, and the note names
    the cheaper one that falls short; without any that meets it, the cheapest within noise is."""
    from mpstudio.search import choose

    short, over, dearest = _evaluation(1, 0.855, 0.177), _evaluation(2, 0.91, 0.244), _evaluation(3, 0.93, 0.30)
    verdicts = {1: "within noise", 2: "within noise", 3: "within noise"}
    choice = choose([short, over, dearest], 0.895, True, verdicts=verdicts)
    assert choice.pick.plan_id == 2
    assert "whose value meets it" in choice.why and "1 cheaper plan(s) within noise fall short" in choice.why
    assert {c.plan_id: c.verdict for c in choice.considered}[1] == "within noise"
    # Lower is better (CER): the same rule, mirrored.
    low, high = _evaluation(4, 0.030, 1.0), _evaluation(5, 0.018, 1.4)
    choice = choose([low, high], 0.020, False, verdicts={4: "within noise", 5: "within noise"})
    assert choice.pick.plan_id == 5
    # None meets it by its value: the cheapest within noise, said so.
    choice = choose([short, _evaluation(6, 0.88, 0.2)], 0.895, True, verdicts={1: "within noise", 6: "within noise"})
    assert choice.pick.plan_id == 1 and "none meets it by its value" in choice.why
    assert "2 are within noise of it" in choice.why and "the cheapest of those 2" in choice.why, choice.why


def test_the_search_reports_a_plan_within_noise_of_its_target(tmp_path):
    """A target half a sample above a16w8's top-1 (60 samples): a16w8 neither clearly reaches nor clearly misses
    it, and the search says so (its printed result, its JSON), while a8w8 clearly misses."""
    from mpstudio.search import search

    onnx.save(make_classifier(), tmp_path / "classifier.onnx")
    with Study.create(tmp_path / "s", tmp_path / "classifier.onnx", feeds(SAMPLES), metric=metric_spec("top1")) as s:
        a16 = s.evaluate(PrecisionPlan.a16w8())
        target = a16.value + 0.5 / SAMPLES
        result = search(s, target, weights="per-tensor", max_evaluations=6, confirm=None, quiet=True)
        text = result.describe()
        assert result.verdict == "within noise" and result.within_noise
        assert "within noise of the target" in text and "95 % interval" in text
        considered = {c.name: c for c in result.considered}
        assert considered["a8w8"].evidence == "misses"
        assert considered["a16w8"].evidence == "within noise"
        record = result.to_json()
        assert record["verdict"] == "within noise" and record["resolution"] == pytest.approx(1 / SAMPLES)
        low, high = record["recommended_interval"]
        assert low <= result.recommended.value <= high
        # The studio's search card says so too.
        from mpstudio.widgets.search_card import search_card_html

        card = search_card_html(result)
        assert "within noise of the target" in card and "95 % interval" in card


def test_the_command_line_prints_intervals_and_a_paired_difference(study):
    import json
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "mpstudio", *args], capture_output=True, text=True, timeout=300)

    study.evaluate(PrecisionPlan.a8w8())
    study.evaluate(PrecisionPlan.a16w8())
    shown = run("evaluate", str(study.folder), "--plan", "a16w8", "--versus", "a8w8", "--quiet")
    assert shown.returncode == 0, shown.stderr
    assert "95 % interval" in shown.stdout and "resolution 0.0167" in shown.stdout
    assert "paired: top-1 agreement +" in shown.stdout and "vs a8w8, 60 samples" in shown.stdout
    record = json.loads(run("evaluate", str(study.folder), "--plan", "a16w8", "--versus", "a8w8", "--json",
                            "--quiet").stdout)
    assert record["interval"][0] <= record["value"] <= record["interval"][1]
    assert record["versus"]["difference"] == pytest.approx(record["value"] - record["versus"]["versus_value"])
    show = run("study", "show", str(study.folder))
    assert show.returncode == 0 and "95 % interval" in show.stdout and "resolution: one count" in show.stdout


def test_a_target_relative_to_a_plan_is_judged_paired_with_it(tmp_path):
    """Target "a16w8": a16w8 itself is within noise of it (exactly on it), and a8w8 clearly misses it: paired with
    a16w8 on the same samples its shortfall is clear, though a16w8's value lies inside a8w8's own interval."""
    from mpstudio.search import search

    onnx.save(make_classifier(), tmp_path / "classifier.onnx")
    with Study.create(tmp_path / "s", tmp_path / "classifier.onnx", feeds(SAMPLES), metric=metric_spec("top1")) as s:
        result = search(s, "a16w8", weights="per-tensor", max_evaluations=6, confirm=None, quiet=True)
        considered = {c.name: c for c in result.considered}
        a8, a16 = considered["a8w8"], considered["a16w8"]
        assert a16.evidence == "within noise" and result.verdict == "within noise"
        assert a8.low <= a16.value <= a8.high  # unpaired, a8w8 would be within noise too
        assert a8.evidence == "misses"
        assert "+0.0000 against the threshold; within noise" in result.describe()


def test_lower_bounds_of_sums_over_resampled_units():
    units = np.zeros((8, 3))
    units[:, 0] = 1.0  # the same on every unit: no spread, the bound is the sum
    units[0, 1] = 8.0  # all on one unit, left out of a third of the resamples: nothing sure
    units[:, 2] = np.linspace(0.5, 1.5, 8)  # spread but positive on every unit: bounded above zero, below the sum
    bounds = lower_bounds(units)
    assert bounds[0] == pytest.approx(8.0)
    assert bounds[1] == 0.0
    assert 0.0 < bounds[2] < units[:, 2].sum()
    np.testing.assert_array_equal(bounds, lower_bounds(units))  # seeded
    np.testing.assert_array_equal(lower_bounds(units[:1]), units[:1].sum(axis=0))  # one unit: its sum


def test_a_fine_resolution_reads_as_a_number_not_zero():
    """Top-1 agreement over 24 class maps of 224 x 224 pixels has a step of 8.3e-07, which four decimals showed as
    "resolution 0.0000"."""
    from mpstudio.store import Evaluation
    from mpstudio.value_text import step_text

    step = 1 / (24 * 224 * 224)
    done = Evaluation(1, "h", "a8w8", "cpu", "cpu", "top-1 agreement", 0.99, True, None, None, 24, 1.0,
                      low=0.98, high=1.0, resolution=step)
    assert "resolution 8.3e-07)" in done.interval_text()
    assert step_text(1 / 60) == "0.0167" and step_text(1 / 768) == "0.0013"
