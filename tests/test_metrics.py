"""Task metrics stored by reference, built-in metrics on real outputs, targets, and what a search recommends."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR, chain_feeds, make_chain_model
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.loop.inprocess import run_outputs
from mpstudio.metrics import (
    MetricSpec, ctc_cer, ctc_charset, metric_spec, output_agreement, output_cosine, recall_at_k, top1_agreement,
)
from mpstudio.plan import PrecisionPlan
from mpstudio.search import (
    LITTLE_MORE, LineProgress, Target, better_for_little_more, closest_plan, search,
)
from mpstudio.sources import Latency
from mpstudio.store import Evaluation
from mpstudio.study import Study

REPO = Path(__file__).resolve().parents[1]


# ---- small real models ---------------------------------------------------------------------------------------
def make_ctc_model(classes: int, steps: int = 12, features: int = 16, seed: int = 0,
                   character: str | None = None) -> onnx.ModelProto:
    """x[1, steps, features] -> MatMul -> Softmax -> probs[1, steps, classes]: a CTC head's shape and output."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(0, 1.5, (features, classes)).astype(np.float32), "head.weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "head.weight"], ["logits"], name="/head/MatMul"),
         helper.make_node("Softmax", ["logits"], ["probs"], name="/head/Softmax", axis=-1)],
        "ctc_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, steps, features])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, steps, classes])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)
    if character is not None:
        onnx.helper.set_model_props(model, {"character": character})
    return model


def make_embedding_model(features: int = 24, dims: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x[1, 4, features] (4 tokens) -> MatMul -> Tanh -> emb[1, 4, dims] (mean-pooled by recall@k)."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(0, 0.4, (features, dims)).astype(np.float32), "proj.weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "proj.weight"], ["h"], name="/proj/MatMul"),
         helper.make_node("Tanh", ["h"], ["emb"], name="/proj/Tanh")],
        "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, features])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 4, dims])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _chain_study(tmp_path, metric=None, samples=6, **kw) -> Study:
    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=4), path)
    return Study.create(tmp_path / "study", path, FeedList(chain_feeds(8)), FeedList(chain_feeds(samples, seed=5)),
                        metric, **kw)


def _write_metric_module(root: Path, body: str, package: str = "usermetrics", module: str = "scores") -> Path:
    """A package `usermetrics.scores` under `root` (a folder to put on PYTHONPATH)."""
    folder = root / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
    (folder / f"{module}.py").write_text(textwrap.dedent(body))
    return root


SIGN_AGREEMENT = """
    import numpy as np

    def sign_agreement(outputs, reference, scale=1.0):
        a = np.concatenate([o["y"].ravel() for o in outputs])
        b = np.concatenate([r["y"].ravel() for r in reference])
        return scale * float(np.mean(np.sign(a) == np.sign(b)))

    sign_agreement.higher_is_better = True
    sign_agreement.metric_name = "sign agreement"

    def mean_abs_error(outputs, reference):
        return float(np.mean([np.abs(o["y"] - r["y"]).mean() for o, r in zip(outputs, reference)]))

    def one_argument(outputs):
        return 0.0

    def text_result(outputs, reference):
        return "good"

    def not_finite(outputs, reference):
        return float("nan")

    def raises(outputs, reference):
        raise KeyError("logits")

    THRESHOLD = 3
"""


@pytest.fixture
def metric_module(tmp_path, monkeypatch):
    root = _write_metric_module(tmp_path / "site", SIGN_AGREEMENT)
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [n for n in sys.modules if n.startswith("usermetrics")]:
        del sys.modules[name]


# ---- metrics by reference --------------------------------------------------------------------------------------
def test_a_metric_by_reference_is_stored_and_rebuilt_when_the_study_reopens(tmp_path, metric_module):
    spec = metric_spec("usermetrics.scores:sign_agreement", args={"scale": 2.0})
    assert spec.kind == "reference" and spec.name == "sign agreement" and spec.higher_is_better
    assert spec.args["function"] == "usermetrics.scores:sign_agreement" and spec.args["args"] == {"scale": 2.0}
    with _chain_study(tmp_path, spec) as study:
        a8 = study.evaluate(PrecisionPlan.a8w8())
        assert 1.0 < a8.value <= 2.0  # scale=2 from the stored JSON args reached the function
        assert study.float_value() == 2.0  # the float model agrees with itself
    with Study.open(tmp_path / "study") as again:  # no metric given: rebuilt from the stored reference
        assert again.metric_spec == spec
        evaluation = again.evaluate(PrecisionPlan.a16w8())
        assert evaluation.metric == "sign agreement" and evaluation.value >= a8.value
        assert again.stored_float_value() == 2.0 and "float model (ORT CPU): sign agreement 2.0000" in again.summary()


def test_bad_metric_references_say_what_is_wrong(tmp_path, metric_module):
    cases = {
        "nosuchpackage.scores:fn": "no module named 'nosuchpackage'.*PYTHONPATH",
        "usermetrics.scores:missing": "has no function 'missing'; it defines: .*sign_agreement",
        "usermetrics.scores:THRESHOLD": "is a int, not a function",
        "usermetrics.scores:one_argument": r"cannot be called as fn\(outputs, reference\)",
        "usermetrics.scores": "unknown metric .usermetrics.scores.: give module:function",
        "usermetrics.scores:": "neither module:function",
        "accuracy": "unknown metric 'accuracy'.*top1",
    }
    for text, message in cases.items():
        with pytest.raises(MpstudioError, match=message):
            metric_spec(text, direction="higher")
    with pytest.raises(MpstudioError, match=r"cannot be called as fn\(outputs, reference, nope=...\)"):
        metric_spec("usermetrics.scores:sign_agreement", args={"nope": 1})
    with pytest.raises(MpstudioError, match="say whether a higher usermetrics.scores:mean_abs_error is better"):
        metric_spec("usermetrics.scores:mean_abs_error")
    assert not metric_spec("usermetrics.scores:mean_abs_error", direction="lower").higher_is_better
    with pytest.raises(MpstudioError, match="not valid JSON"):
        metric_spec("top1", args="{k: 1}")
    with pytest.raises(MpstudioError, match="--charset"):
        metric_spec("cer")

    # What a function returns is checked when a plan is evaluated; the failed job keeps its error.
    for name, message in (("text_result", r"returned a str \('good'\), not a number"),
                          ("not_finite", "returned nan; a metric returns a finite number"),
                          ("raises", "raised KeyError: 'logits'")):
        folder = tmp_path / name
        folder.mkdir()
        with _chain_study(folder, metric_spec(f"usermetrics.scores:{name}", direction="higher")) as study:
            with pytest.raises(MpstudioError, match=message):
                study.evaluate(PrecisionPlan.a8w8())
            assert study.evaluations().empty


def test_a_study_whose_metric_module_is_gone_opens_and_says_how_to_fix_it(tmp_path, metric_module):
    with _chain_study(tmp_path, metric_spec("usermetrics.scores:sign_agreement")) as study:
        study.evaluate(PrecisionPlan.a8w8())
    sys.path.remove(str(metric_module))
    for name in [n for n in sys.modules if n.startswith("usermetrics")]:
        del sys.modules[name]
    with Study.open(tmp_path / "study") as study:
        assert len(study.evaluations()) == 1 and "sign agreement" in study.summary()  # results read without it
        with pytest.raises(MpstudioError, match="no module named 'usermetrics'.*study found it in .*scores.py.*"
                                                "PYTHONPATH"):
            study.evaluate(PrecisionPlan.a16w8())


# ---- built-in metrics on real outputs -------------------------------------------------------------------------
def test_builtin_output_metrics_on_a_quantized_model(tmp_path):
    with _chain_study(tmp_path) as study:
        reference = study.float_outputs()
        outputs = run_outputs(study.quantizer.generate(PrecisionPlan.a8w8()), study.evaluation_data)
        snr, cosine = output_agreement(reference, outputs)
        agree = top1_agreement(outputs, reference, axis=1)
        # argmax over the class axis (1 of N, C, H, W) at every other position: 6 samples x 16 x 16 pixels.
        by_hand = np.mean([np.mean(o["y"].argmax(1) == r["y"].argmax(1)) for o, r in zip(outputs, reference)])
        assert agree == pytest.approx(by_hand) and 0.3 < agree < 1.0
        assert top1_agreement(reference, reference, axis=1) == 1.0
        assert output_cosine(outputs, reference) == pytest.approx(cosine) and 0.9 < cosine < 1.0
        assert output_cosine(reference, reference) == pytest.approx(1.0)
        assert 5.0 < snr < 60.0


def test_builtin_metrics_are_named_from_the_command_line_and_scored_by_a_study(tmp_path):
    for text, name, higher in (("top1", "top-1 agreement", True), ("cosine", "output cosine", True),
                               ("recall@3", "R@3", True), ("R@1", "R@1", True)):
        spec = metric_spec(text)
        assert (spec.kind, spec.name, spec.higher_is_better) == ("reference", name, higher)
    assert metric_spec("snr") == MetricSpec()
    folder = tmp_path / "top1"
    folder.mkdir()
    with _chain_study(folder, metric_spec("top1", args={"axis": 1})) as study:
        evaluation = study.evaluate(PrecisionPlan.a8w8())
        outputs = run_outputs(study.quantizer.generate(PrecisionPlan.a8w8()), study.evaluation_data)
        assert evaluation.value == pytest.approx(top1_agreement(outputs, study.float_outputs(), axis=1))
        assert study.float_value() == 1.0



def test_top1_on_a_class_map_takes_the_class_axis_it_is_given(tmp_path):
    """A segmenter's logits are N, C, H, W: the argmax over the last axis (W) picked a column per class and row,
    and read as pixels' class agreement. A 4-D output names its class axis; the agreement is then per pixel."""
    from mpstudio.metric_terms import metric_terms

    with _chain_study(tmp_path) as study:  # y: [1, 4, 16, 16]
        reference = study.float_outputs()
        outputs = run_outputs(study.quantizer.generate(PrecisionPlan.a8w8()), study.evaluation_data)
        with pytest.raises(MpstudioError, match=r"output 'y' is 1x4x16x16; say which axis holds the classes \(its "
                                                r"axis 1 looks like .*--metric-args '\{\"axis\": 1\}'"):
            top1_agreement(outputs, reference)
        with pytest.raises(MpstudioError, match="axis 4 is not an axis of output 'y'"):
            top1_agreement(outputs, reference, axis=4)
        spec = metric_spec("top1", args={"axis": 1})
        terms = metric_terms(spec, study.prepared, outputs, reference)
        pixels = [np.sum(o["y"].argmax(1) == r["y"].argmax(1)) for o, r in zip(outputs, reference)]
        assert terms.columns[:, 0].tolist() == pixels and terms.columns[:, 1].tolist() == [256] * len(outputs)
        assert terms.value() == pytest.approx(top1_agreement(outputs, reference, axis=1))
        assert top1_agreement(outputs, reference, axis=-3) == terms.value()
    # A 3-D output (a sequence's N, T, C) keeps the last axis.
    sequence = [{"logits": np.eye(5, dtype=np.float32)[None]}]
    assert top1_agreement(sequence, [{"logits": np.eye(5, dtype=np.float32)[None, ::-1]}]) == pytest.approx(1 / 5)
    # On the command line the study is not created until the axis is given.
    model = tmp_path / "chain.onnx"
    FeedList(chain_feeds(2)).save_npz(tmp_path / "data")
    out = _cli("search", model, "--data", tmp_path / "data", "--study", tmp_path / "seg", "--metric", "top1",
               "--no-confirm", "--quiet")
    assert out.returncode == 2 and "--metric-args '{\"axis\": 1}'" in out.stderr, out.stderr
    assert not (tmp_path / "seg" / "study.json").exists()
    # From Python too, refused by its output's shape before the data is copied: nothing is written.
    with pytest.raises(MpstudioError, match=r"output 'y' is 1x4x16x16; say which axis holds the classes"):
        Study.create(tmp_path / "seg2", model, FeedList(chain_feeds(2)), metric="top1")
    with pytest.raises(MpstudioError, match="axis 5 is not an axis of output 'y'"):
        Study.create(tmp_path / "seg2", model, FeedList(chain_feeds(2)), metric=metric_spec("top1", args={"axis": 5}))
    with pytest.raises(MpstudioError, match="the model has no output 'z'"):
        Study.create(tmp_path / "seg2", model, FeedList(chain_feeds(2)),
                     metric=metric_spec("top1", args={"axis": 1, "output": "z"}))
    assert not (tmp_path / "seg2").exists()

def test_ctc_cer_with_a_charset_file_and_labels(tmp_path):
    chars = list("abcdefghij")
    model = make_ctc_model(len(chars) + 2)  # blank, the characters, a space
    path = tmp_path / "ctc.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(3)
    feeds = FeedList([{"x": rng.normal(0, 1, (1, 12, 16)).astype(np.float32)} for _ in range(6)])
    reference = run_outputs(path, feeds)
    charset = tmp_path / "charset.txt"
    charset.write_text("\n".join(chars) + "\n")
    spec = metric_spec("cer", charset=charset)
    assert spec.args["args"]["charset"] == chars and not spec.higher_is_better
    assert ctc_cer(reference, reference, chars) == 0.0  # against the float model's own text
    from mpstudio.ctc_text import character_error_rate, ctc_greedy_decode

    texts = [ctc_greedy_decode(r["probs"][0], ["<blank>"] + chars + [" "]).strip() for r in reference]
    assert any(texts)
    assert ctc_cer(reference, reference, chars, labels=texts) == 0.0
    wrong = [t[::-1] + "x" for t in texts]
    assert ctc_cer(reference, reference, chars, labels=wrong) == pytest.approx(character_error_rate(texts, wrong))
    noisy = [{"probs": r["probs"] + rng.uniform(0, 0.4, r["probs"].shape).astype(np.float32)} for r in reference]
    assert 0.0 < ctc_cer(noisy, reference, chars) <= 2.0
    with pytest.raises(MpstudioError, match="lists 9 characters, but the model outputs 12 classes"):
        ctc_cer(reference, reference, chars[:-1])
    with pytest.raises(MpstudioError, match="6 evaluation samples"):
        ctc_cer(reference, reference, chars, labels=texts[:3])
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(texts) + "\n")
    assert metric_spec("cer", charset=charset, labels=labels).args["args"]["labels"] == texts


def test_the_models_character_metadata_is_validated_before_it_is_trusted():
    chars = list("abcdefghij")
    good = make_ctc_model(12, character="\n".join(chars))
    assert ctc_charset(good) == ["<blank>"] + chars + [" "]
    page = "<!DOCTYPE html>\n<html>\n<head><title>dict</title></head>\n<body>...</body>\n</html>"
    for character, message in ((page, "is an HTML page, not a character list"),
                               ("\n".join(chars[:7] + ["ab", "cd", "ef"]), "not one character per line"),
                               ("\n".join(chars[:5]), "lists 5 characters, but the model outputs 12 classes")):
        with pytest.raises(MpstudioError, match=message + ".*--metric cer --charset FILE"):
            ctc_charset(make_ctc_model(12, character=character))
    with pytest.raises(MpstudioError, match="no 'character' metadata.*--charset FILE"):
        ctc_charset(make_ctc_model(12))


def test_recall_at_k_over_alternating_samples_and_over_two_outputs(tmp_path):
    # By hand: queries 0..2, documents 0..2; query 1 is closest to document 2.
    q = [np.array([[1.0, 0.0, 0.0]]), np.array([[0.0, 0.6, 0.8]]), np.array([[0.0, 0.0, 1.0]])]
    d = [np.array([[1.0, 0.1, 0.0]]), np.array([[0.0, 1.0, 0.0]]), np.array([[0.0, 0.5, 1.0]])]
    alternating = [{"e": v} for pair in zip(q, d) for v in pair]
    assert recall_at_k(alternating, alternating, k=1) == pytest.approx(2 / 3)
    assert recall_at_k(alternating, alternating, k=2) == 1.0
    two_outputs = [{"q": a, "d": b} for a, b in zip(q, d)]
    assert recall_at_k(two_outputs, two_outputs, k=1, pair=["q", "d"]) == pytest.approx(2 / 3)
    with pytest.raises(MpstudioError, match="even number"):
        recall_at_k(alternating[:5], alternating[:5], k=1)

    # Real outputs: a token encoder, documents are their queries with noise; the quantized model retrieves
    # about as well as the float one.
    path = tmp_path / "enc.onnx"
    onnx.save(make_embedding_model(), path)
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(12):
        query = rng.normal(0, 1, (1, 4, 24)).astype(np.float32)
        feeds += [{"x": query}, {"x": (query + rng.normal(0, 0.8, query.shape)).astype(np.float32)}]
    with Study.create(tmp_path / "s", path, FeedList(feeds), metric=metric_spec("recall@1")) as study:
        float_r1 = study.float_value()
        assert 0.5 <= float_r1 <= 1.0
        a8 = study.evaluate(PrecisionPlan.a8w8())
        assert a8.metric == "R@1" and abs(a8.value - float_r1) <= 0.25


# ---- targets ----------------------------------------------------------------------------------------------------
def test_target_forms_and_thresholds():
    refs = {"float": 0.012, "a8w8": 0.15, "a16w8": 0.27, "a16w8-pc": 0.05, "a8w8+3x16": 0.04}
    cases = [("0.02", None, 0.02), ("float", "float", 0.012), ("float-2%", "float", 0.012 * 1.02),
             ("float+2%", "float", 0.012 * 1.02), ("a16w8-pc+5%", "a16w8-pc", 0.0525),
             ("a8w8+3x16 + 10 %", "a8w8+3x16", 0.044), ("a8w8+3x16", "a8w8+3x16", 0.04)]
    for text, base, threshold in cases:
        goal = Target.parse(text)
        assert goal.baseline == base, text
        assert goal.threshold(refs, higher_is_better=False) == pytest.approx(threshold), text
    # Higher is better: a margin still loosens toward worse, whatever its sign.
    assert Target.parse("float-1%").threshold({"float": 0.8}, True) == pytest.approx(0.792)
    assert Target.parse("float+1%").threshold({"float": 0.8}, True) == pytest.approx(0.792)
    assert Target.parse(0.5).value == 0.5
    for bad in ("", "nan", "inf"):
        with pytest.raises(MpstudioError):
            Target.parse(bad)


def test_target_names_are_checked_against_the_study(tmp_path, metric_module):
    with _chain_study(tmp_path) as study:  # output SNR: float is the reference itself
        with pytest.raises(MpstudioError, match="float model is the reference itself"):
            Target.parse("float-1%").check(study)
        study.add_plan(PrecisionPlan.a8w8().promote(["block0_out"], name="mine"))
        Target.parse("mine+2%").check(study)
        Target.parse("a16w8-pc+5%").check(study)
        with pytest.raises(MpstudioError, match="names 'mystery'.*one of: a8w8, a16w8, a8w8-pc, a16w8-pc, mine"):
            Target.parse("mystery+2%").check(study)
        # A margin without its % sign names the form meant, for a baseline and for a stored plan.
        with pytest.raises(MpstudioError, match="a margin is a percentage of the reference, such as 'a16w8\\+10%'"):
            Target.parse("a16w8+10").check(study)
        with pytest.raises(MpstudioError, match="such as 'mine-2.5%'"):
            Target.parse("mine - 2.5").check(study)
        with pytest.raises(MpstudioError, match="names 'fast please'"):
            search(study, "fast please", quiet=True)
        assert study.searches().empty  # refused before anything ran


def test_a_number_the_metric_cannot_take_is_refused_before_any_work(tmp_path):
    with _chain_study(tmp_path, metric_spec("cosine")) as study:
        Target.parse("0.999").check(study)
        Target.parse("1").check(study)  # the float model's own value: reachable
        with pytest.raises(MpstudioError, match=r"target 1.5 is outside what output cosine can take \(\[-1, 1\]\)"):
            search(study, "1.5", quiet=True)
        assert study.searches().empty
    (tmp_path / "snr").mkdir()
    with _chain_study(tmp_path / "snr") as study:  # output SNR has no bound
        Target.parse("400").check(study)


def test_search_relative_to_float_and_to_a_named_plan(tmp_path, metric_module):
    with _chain_study(tmp_path, metric_spec("usermetrics.scores:sign_agreement")) as study:
        result = search(study, "float-3%", weights="per-tensor", max_evaluations=8, quiet=True)
        assert result.float_value == 1.0 and result.threshold == pytest.approx(0.97)
        assert result.to_json()["float_value"] == 1.0 and "float model (ORT CPU)" in result.describe()
        per_channel = search(study, "a16w8-pc+1%", weights="per-tensor", max_evaluations=8, quiet=True)
        pc = next(e for e in per_channel.path if e.name == "a16w8-pc")  # the search evaluated the named baseline
        assert per_channel.threshold == pytest.approx(pc.value - 0.01 * abs(pc.value))


# ---- what a search recommends ---------------------------------------------------------------------------------
def _evaluation(plan_id, value, ms, name=None):
    return Evaluation(plan_id, f"h{plan_id}", name or f"plan{plan_id}", "cpu", "ORT CPU QDQ", "CER", value, False,
                      None, None, 10, 0.1, (Latency(ms, "estimate", "HTP v75 (cost model)"),))


def test_a_missed_target_recommends_the_closest_plan_never_a_dominated_one():
    a8, a16 = _evaluation(1, 0.15, 1.6, "a8w8"), _evaluation(2, 0.05, 2.4, "a16w8")
    prefix_a, prefix_b = _evaluation(3, 0.09, 1.9), _evaluation(4, 0.06, 2.5)  # b: a16w8 dominates it
    path = [a8, a16, prefix_a, prefix_b]
    best = closest_plan(path, higher_is_better=False, sixteen_bit={1: 0, 2: 300, 3: 20, 4: 250})
    assert best is a16
    for other in path:  # nothing evaluated beats the recommendation
        assert not (other.value < best.value)
    # Ties: fewer 16-bit tensors first, then lower latency, then path order.
    tie = [_evaluation(5, 0.05, 2.2), _evaluation(6, 0.05, 2.1), _evaluation(7, 0.05, 2.3)]
    assert closest_plan([a16, *tie], False, {2: 300, 5: 40, 6: 60, 7: 40}).plan_id == 5
    assert closest_plan([a16, *tie], False, {2: 300, 5: 40, 6: 40, 7: 40}).plan_id == 6
    assert closest_plan([a16, *tie], False, {}).plan_id == 6  # counts unknown: latency decides
    # A latency budget keeps the recommendation within it when a plan fits.
    assert closest_plan(path, False, {}, latency_budget_ms=2.0) is prefix_a


def test_much_better_for_little_more():
    # The demo's case: CER 0.058 recommended; 0.008 for +0.07 ms is pointed out.
    recommended = _evaluation(10, 0.058, 2.00)
    far_better = _evaluation(11, 0.008, 2.07)
    too_dear = _evaluation(12, 0.004, 2.00 * (1 + LITTLE_MORE) + 0.05)
    slightly_better = _evaluation(13, 0.050, 2.05)
    cheaper = _evaluation(14, 0.2, 1.5)
    dominated = _evaluation(15, 0.010, 2.09)  # far_better is better and cheaper
    path = [recommended, far_better, too_dear, slightly_better, cheaper, dominated]
    found = better_for_little_more(recommended, path, False, float_value=0.012)
    assert [e.plan_id for e in found] == [11]
    assert better_for_little_more(recommended, path, False, float_value=0.012, latency_budget_ms=2.05) == []
    # Output SNR has no float value: at least 3 dB more.
    snr = [Evaluation(i, f"h{i}", f"p{i}", "cpu", "ORT CPU QDQ", "SNR", v, True, v, 0.9, 4, 0.1,
                      (Latency(ms, "estimate", "HTP v75 (cost model)"),))
           for i, v, ms in ((1, 20.0, 1.0), (2, 23.5, 1.05), (3, 21.0, 1.02))]
    assert [e.plan_id for e in better_for_little_more(snr[0], snr, True, None, snr_metric=True)] == [2]


def test_a_search_that_misses_reports_by_how_much_and_prints_progress(tmp_path, metric_module, capfd):
    with _chain_study(tmp_path, metric_spec("usermetrics.scores:sign_agreement")) as study:
        result = search(study, "float", weights="per-tensor", max_evaluations=6, sensitivity_samples=4,
                        isolation_samples=2)
        err = capfd.readouterr().err
        assert "mpstudio: search: a8w8" in err and "isolating up to" in err  # progress without a callback
        # The analysis ran with the search's sample counts (4 scored, 2 isolated).
        assert list((study.folder / "sensitivity").glob("a8w8-4-2*/ranking.csv"))
        if not result.reached:
            assert result.misses_by == pytest.approx(result.threshold - result.recommended.value)
            assert "misses the threshold by" in result.describe() and result.to_json()["misses_by"] > 0
            # Never a dominated plan: among what the walk evaluated, or on the HTP among the confirmed plans.
            pool = [c.confirmed for c in result.confirmations] if result.confirmed else result.path
            assert all(e.value <= result.recommended.value for e in pool)
        search(study, "float", weights="per-tensor", max_evaluations=6, sensitivity_samples=4, isolation_samples=2,
               quiet=True)
        assert capfd.readouterr().err == ""


def test_line_progress_throttles_one_step():
    lines = []

    class Stream:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    progress = LineProgress(Stream(), interval=3600)
    for i in range(1, 50):
        progress(i, 49, "running model on cpu")
    progress(1, 2, "search: a8w8 CER 0.15")
    assert "".join(lines).count("\n") == 2


def test_sample_counts_of_a_study(tmp_path):
    with _chain_study(tmp_path, samples=6, calibration_samples=3, evaluation_samples=4) as study:
        assert len(study.calibration) == 3 and len(study.evaluation_data) == 4
    (tmp_path / "other").mkdir()
    with pytest.raises(MpstudioError, match="at least 1"):
        _chain_study(tmp_path / "other", evaluation_samples=0)


# ---- the command line, end to end -------------------------------------------------------------------------------
def _cli(*args, pythonpath=(), timeout=600):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *map(str, pythonpath)])}
    return subprocess.run([sys.executable, "-m", "mpstudio", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_search_with_a_metric_module_then_show_and_search_the_study_from_new_processes(tmp_path):
    site = _write_metric_module(tmp_path / "site", SIGN_AGREEMENT, package="pkg", module="mod")
    model = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=4), model)
    FeedList(chain_feeds(6)).save_npz(tmp_path / "data")
    folder = tmp_path / "s"
    first = _cli("search", model, "--data", tmp_path / "data", "--study", folder, "--metric", "pkg.mod:sign_agreement",
                 "--target", "float-2%", "--weights", "per-tensor", "--max-evaluations", "8", "--calibration-samples",
                 "4", "--quiet", pythonpath=[site])
    assert first.returncode in (0, 1), first.stderr
    assert "target: sign agreement >= 0.9800 (float-2%)" in first.stdout
    assert "float model (ORT CPU): sign agreement 1.0000" in first.stdout
    assert "Traceback" not in first.stderr

    show = _cli("study", "show", folder)  # no metric module needed to read the results
    assert show.returncode == 0, show.stderr
    assert "sign agreement (pkg.mod:sign_agreement)" in show.stdout and "float model (ORT CPU)" in show.stdout

    with Study.open(folder) as study:
        before = len(study.evaluations())
        assert len(study.calibration) == 4 and len(study.evaluation_data) == 6
    again = _cli("search", "--study", folder, "--target", "float", "--weights", "per-tensor", "--max-evaluations", "8",
                 "--quiet", pythonpath=[site])
    assert again.returncode in (0, 1), again.stderr
    assert "target: sign agreement >= 1.0000 (float)" in again.stdout
    with Study.open(folder) as study:
        assert study.searches()["status"].tolist() == ["done", "done"]
        assert len(study.evaluations()) >= before
        assert set(study.evaluations()["metric"]) == {"sign agreement"}

    # Without the module: a search answered by stored results runs; one that needs a new evaluation says why not.
    replayed = _cli("search", "--study", folder, "--target", "float", "--weights", "per-tensor", "--max-evaluations",
                    "8", "--quiet")
    assert replayed.returncode in (0, 1) and "(0 new)" in replayed.stdout, replayed.stderr
    missing = _cli("search", "--study", folder, "--target", "a16w8-pc+1%", "--weights", "per-tensor", "--quiet")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "cannot import module 'pkg.mod'" in missing.stderr and "PYTHONPATH" in missing.stderr

    other = _cli("search", "--study", folder, "--metric", "top1", "--quiet", pythonpath=[site])
    assert other.returncode == 2 and "a study keeps one metric" in other.stderr
    resized = _cli("search", "--study", folder, "--eval-samples", "3", "--quiet", pythonpath=[site])
    assert resized.returncode == 2 and "created with 6 evaluation samples" in resized.stderr
    unknown = _cli("search", "--study", folder, "--target", "nonesuch+2%", "--quiet", pythonpath=[site])
    assert unknown.returncode == 2 and "names 'nonesuch'" in unknown.stderr and "a16w8-pc" in unknown.stderr


def test_bad_metric_on_the_command_line_fails_before_any_work(tmp_path):
    site = _write_metric_module(tmp_path / "site", SIGN_AGREEMENT, package="pkg", module="mod")
    model = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=2), model)
    FeedList(chain_feeds(2)).save_npz(tmp_path / "data")
    for metric, message in (("pkg.mod:nope", "has no function 'nope'"), ("pkg.mod:one_argument", "cannot be called"),
                            ("pkg.mod:text_result", "returned a str")):
        out = _cli("search", model, "--data", tmp_path / "data", "--study", tmp_path / metric.replace(":", "_"),
                   "--metric", metric, "--metric-direction", "higher", "--quiet", pythonpath=[site])
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr



def test_a_metric_that_fails_on_the_float_model_leaves_no_study_to_refuse_its_fix(tmp_path):
    site = _write_metric_module(tmp_path / "site", SIGN_AGREEMENT, package="pkg", module="mod")
    model = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=2), model)
    FeedList(chain_feeds(2)).save_npz(tmp_path / "data")
    kept = tmp_path / "mine"  # a folder the user made, with a file of their own
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    for folder in (tmp_path / "new", kept):
        search = lambda metric: _cli("search", model, "--data", tmp_path / "data", "--study", folder,  # noqa: E731
                                     "--metric", metric, "--metric-direction", "higher", "--max-evaluations", "3",
                                     "--no-confirm", "--quiet", pythonpath=[site])
        broken = search("pkg.mod:text_result")
        assert broken.returncode == 2 and "returned a str" in broken.stderr, broken.stderr
        assert f"{folder} was not created: fix the metric" in broken.stderr
        assert not (folder / "study.json").exists()
        fixed = search("pkg.mod:sign_agreement")
        assert fixed.returncode in (0, 1) and "a study keeps one metric" not in fixed.stderr, fixed.stderr
        assert "float model (ORT CPU): sign agreement 1.0000" in fixed.stdout
    assert (kept / "notes.txt").read_text() == "mine"


def test_isolation_scores_with_a_metric_that_compares_with_the_float_model(tmp_path):
    from mpstudio.sensitivity import analyze

    with _chain_study(tmp_path) as study:
        report = analyze(study.quantizer, study.calibration.head(4), isolation_samples=2,
                         metric=metric_spec("top1", args={"axis": 1}).build(study.prepared))
        assert report.isolation.metric == "top-1 agreement"
        # Agreement with the float model: all-16-bit agrees more than all-8-bit, and almost fully.
        assert 0.0 < report.isolation.all_8 < report.isolation.all_16 <= 1.0 and report.isolation.all_16 > 0.9


def test_a_charset_of_single_characters_that_spell_markup_is_still_a_charset():
    chars = list("<html>abcd")
    assert ctc_charset(make_ctc_model(12, character="\n".join(chars) + "\n")) == ["<blank>"] + chars + [" "]
