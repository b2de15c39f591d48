"""A Concat joining tensors of very different ranges (a detector's box coordinates in pixels and its class scores in
[0, 1], in one output): at 8 bits the joined scale leaves the narrow input a step or two, which output SNR hardly
sees. The quantizer, the analysis and the quantize command say so, and stop once the plan makes it 16-bit."""

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mpstudio.data import FeedList
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.quantize.concat_ranges import concat_range_note, squeezed_concat_inputs
from mpstudio.sensitivity import analyze


def detector_head(seed: int = 0, channels: int = 8, positions: int = 16, trunk: int = 0, pixels: float = 80.0) -> onnx.ModelProto:
    """x[1, channels, positions] -> `trunk` 1x1 Conv+Relu layers -> boxes (a 1x1 Conv scaled to pixels, [1, 4,
    positions]) and scores (a 1x1 Conv and a Sigmoid, [1, 3, positions]), joined on the channel axis into one
    output as YOLOv8's export joins them."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, channels, 1)).astype(np.float32) * 8 / channels, "wb"),
             numpy_helper.from_array(rng.normal(0, 0.5, (3, channels, 1)).astype(np.float32) * 8 / channels, "ws"),
             numpy_helper.from_array(np.array(pixels, np.float32), "pixels")]
    nodes, x = [], "x"
    for i in range(trunk):
        inits.append(numpy_helper.from_array(rng.normal(0, 1.5 / channels ** 0.5, (channels, channels, 1))
                                             .astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"t{i}"], name=f"/trunk/{i}/Conv"),
                  helper.make_node("Relu", [f"t{i}"], [f"r{i}"], name=f"/trunk/{i}/Relu")]
        x = f"r{i}"
    nodes += [helper.make_node("Conv", [x, "wb"], ["box_raw"], name="/head/box/Conv"),
              helper.make_node("Mul", ["box_raw", "pixels"], ["boxes"], name="/head/box/Mul"),
              helper.make_node("Conv", [x, "ws"], ["logits"], name="/head/cls/Conv"),
              helper.make_node("Sigmoid", ["logits"], ["scores"], name="/head/cls/Sigmoid"),
              helper.make_node("Concat", ["boxes", "scores"], ["out"], name="/head/Concat", axis=1)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, positions])]
    graph = helper.make_graph(nodes, "head", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 7, positions])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def head_feeds(n: int = 8, channels: int = 8, positions: int = 16):
    rng = np.random.default_rng(1 + n)
    return [{"x": rng.normal(0, 1, (1, channels, positions)).astype(np.float32)} for _ in range(n)]


def test_the_quantizer_names_the_squeezed_scores_and_what_to_do(tmp_path):
    quantizer = Quantizer(prepare_model(detector_head()), FeedList(head_feeds()), tmp_path / "cache")
    note = quantizer.range_note()
    assert note.startswith("warning: out, a model output, joins tensors of very different ranges (Concat /head/Concat)")
    assert "scores spans" in note and "promote out to uint16" in note and "task metric" in note
    # What the note says happens: in the a8w8 model the scores keep a step or two.
    session = ort.InferenceSession(str(quantizer.generate(PrecisionPlan.a8w8())), providers=["CPUExecutionProvider"])
    scores = np.concatenate([session.run(None, feed)[0][:, 4:] for feed in head_feeds()])
    assert len(np.unique(scores)) <= 3
    # At 16 bits (the output promoted, or everything) the scores keep their steps: no warning.
    assert quantizer.range_note(PrecisionPlan.a8w8().promote(["out"])) == ""
    assert quantizer.range_note(PrecisionPlan.a16w8()) == ""


def test_balanced_concats_and_other_ops_are_no_warning(tmp_path):
    model = detector_head()
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.array(1.0, np.float32), "pixels"))
    quantizer = Quantizer(prepare_model(model), FeedList(head_feeds()), tmp_path / "cache")
    assert quantizer.range_note() == ""
    graph = prepare_model(detector_head()).graph
    assert squeezed_concat_inputs(graph, {"boxes": 300.0, "scores": 1.0, "out": 300.0}) != []
    assert squeezed_concat_inputs(graph, {"boxes": 300.0, "scores": 30.0, "out": 300.0}) == []
    assert concat_range_note([]) == ""


def test_the_analysis_and_the_quantize_command_show_it(tmp_path):
    data = FeedList(head_feeds())
    report = analyze(Quantizer(prepare_model(detector_head()), data, tmp_path / "a"), data, isolation_samples=2)
    assert "warning: out, a model output, joins tensors of very different ranges" in report.status()
    model = tmp_path / "head.onnx"
    onnx.save(detector_head(), model)
    data.save_npz(tmp_path / "data")
    result = subprocess.run([sys.executable, "-m", "mpstudio", "quantize", str(model), "--data", str(tmp_path / "data"),
                             "-o", str(tmp_path / "q.onnx"), "--cache", str(tmp_path / "cli-cache"), "--quiet"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "warning: out, a model output, joins tensors of very different ranges" in result.stdout



def test_the_search_speaks_of_its_pick_and_evaluate_of_the_plan(tmp_path):
    model = tmp_path / "head.onnx"
    onnx.save(detector_head(), model)
    FeedList(head_feeds()).save_npz(tmp_path / "data")
    study = str(tmp_path / "s.study")
    run = lambda *args: subprocess.run([sys.executable, "-m", "mpstudio", *args, "--quiet"],  # noqa: E731
                                       capture_output=True, text=True, timeout=300)
    found = run("search", str(model), "--data", str(tmp_path / "data"), "--study", study, "--target", "a8w8",
                "--no-confirm")
    assert found.returncode == 0, found.stderr
    # On this tiny head every plan is priced alike, so the tie goes to the all-16-bit pick, whose scores are whole.
    assert "recommended: plan 4 a16w8-pc" in found.stdout and "joins tensors" not in found.stdout
    eight = run("evaluate", study, "--plan", "a8w8")
    assert eight.returncode == 0, eight.stderr
    assert "warning: out, a model output, joins tensors of very different ranges" in eight.stdout


def class_agreement(outputs, reference):
    """The share of positions whose best class (the scores, channels 4 on) is the float model's."""
    same = [np.argmax(o["out"][:, 4:], axis=1) == np.argmax(r["out"][:, 4:], axis=1) for o, r in zip(outputs, reference)]
    return float(np.mean(same))


def test_with_a_task_metric_the_search_promotes_the_squeezed_concat_first_and_finds_it_is_enough(tmp_path):
    from mpstudio.data import TaskMetric
    from mpstudio.search import search
    from mpstudio.study import Study

    onnx.save(detector_head(channels=64, positions=1024, trunk=3, pixels=400.0), tmp_path / "head.onnx")
    feeds = lambda n: FeedList(head_feeds(n, channels=64, positions=1024))  # noqa: E731
    metric = TaskMetric("class agreement", class_agreement, higher_is_better=True, needs_reference=True)
    with Study.create(tmp_path / "study", tmp_path / "head.onnx", feeds(8), feeds(6), metric) as study:
        result = search(study, "float-5%", confirm=None, weights="per-tensor", max_evaluations=8,
                        sensitivity_samples=8, isolation_samples=2, quiet=True)
        # The premise: all-8-bit loses the classes, and the output's SNR hardly sees the promotion that brings them
        # back (the isolation's order, by output SNR, puts other tensors first).
        a8 = study.evaluate(PrecisionPlan.a8w8())
        out16 = study.evaluate(PrecisionPlan.a8w8().promote(["out"]))
        assert a8.value < 0.8 and out16.value >= 0.95 and abs(out16.snr_db - a8.snr_db) < 3
        assert result.order[0] == "out" and result.order_note.startswith("out first: out joins scores")
        assert "order: out first" in result.describe() and result.to_json()["order_note"] == result.order_note
        assert result.reached and "out" in study.plan(result.recommended.plan_id).overrides
        assert result.recommended.name == "a8w8+1x16"
    with Study.create(tmp_path / "snr", tmp_path / "head.onnx", feeds(8), feeds(6)) as snr:
        assert search(snr, 60.0, confirm=None, weights="per-tensor", max_evaluations=6, sensitivity_samples=8,
                      isolation_samples=2, quiet=True).order_note == ""  # output SNR judges it as it is
