"""Activations whose calibrated range is under QNN's minimum: the quantizer says so, and so do the commands that
calibrate, instead of scoring every tensor near 0 dB without a word."""

import subprocess
import sys

import onnx
from onnx import numpy_helper

from conftest import conv_feeds, make_conv_model
from mpstudio.data import FeedList
from mpstudio.model import prepare_model
from mpstudio.quantize import Quantizer
from mpstudio.quantize.calibrate import QNN_MINIMUM_RANGE, narrow_range_note, narrow_tensors
from mpstudio.sensitivity import analyze, analyze_progressive


def vanishing_model() -> onnx.ModelProto:
    """The conv model with its weights and biases scaled down a million times: what a model with random weights
    and no trained BatchNorm statistics does to its activations (the head's constant Add, which preparation folds
    into the last Conv's bias, lifts the last two)."""
    model = make_conv_model()
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1e-6, init.name))
    return model


def test_the_quantizer_names_the_activations_under_the_minimum_range(tmp_path):
    quantizer = Quantizer(prepare_model(vanishing_model()), FeedList(conv_feeds(4)), tmp_path / "cache")
    narrow = narrow_tensors(quantizer.calibrate(), quantizer.graph.activations())
    assert narrow == ["conv1_out", "relu1_out"]
    note = quantizer.range_note()
    assert note.startswith("warning: 2 of 5 activation tensors span less than")
    assert "conv1_out" in note and f"{QNN_MINIMUM_RANGE:g}" in note and "preprocessed" in note



def test_a_plan_that_clips_a_bias_says_so(tmp_path):
    """The last Conv reads a vanishing tensor and adds the head's 0.5: on the grid input scale x weight scale its
    int32 bias holds a few millionths, so a per-tensor uint8 weight (a16w8) loses the bias (a segmenter's a16w8
    read 0 % pixel agreement, unexplained); ORT widens a symmetric weight's scale to fit it (a16w8-pc)."""
    import numpy as np
    import onnxruntime as ort

    from mpstudio.plan import PrecisionPlan
    from mpstudio.quantize.bias_clip import clipped_biases

    prepared = prepare_model(vanishing_model())
    quantizer = Quantizer(prepared, FeedList(conv_feeds(4)), tmp_path / "cache")
    feed = conv_feeds(1)[0]
    expected = ort.InferenceSession(prepared.model.SerializeToString()).run(None, feed)[0]
    for plan in (PrecisionPlan.a16w8(), PrecisionPlan.a16w8_pc()):
        path = quantizer.generate(plan)
        clipped = clipped_biases(onnx.load(path), prepared.model)
        got = ort.InferenceSession(str(path)).run(None, feed)[0]
        if plan.per_channel:
            assert clipped == [] and quantizer.bias_note(plan) == ""
            np.testing.assert_allclose(got, expected, atol=0.01)
        else:
            assert [(c.node, c.channels, c.size) for c in clipped] == [("/backbone/conv2/Conv", 4, 4)]
            assert clipped[0].holds < 1e-4 < 0.4 < clipped[0].largest and np.abs(got).max() < 0.01 < 0.4 < expected.min()
            note = quantizer.range_note(plan)
            assert "warning: a16w8 clips the int32 bias of 1 node(s): /backbone/conv2/Conv (Conv): 4 of 4" in note
            assert "per-channel int8 weights" in note and note.startswith("warning: 2 of 5 activation tensors")

def test_a_healthy_model_has_no_warning(tmp_path):
    quantizer = Quantizer(prepare_model(make_conv_model()), FeedList(conv_feeds(4)), tmp_path / "cache")
    assert quantizer.range_note() == ""


def test_one_dead_tensor_of_many_is_no_warning_unless_it_is_an_output():
    names = [f"t{i}" for i in range(99)] + ["y"]
    assert narrow_range_note(["t5"], len(names), ["y"]) == ""
    assert narrow_range_note([f"t{i}" for i in range(5)], len(names), ["y"]).startswith("warning: 5 of 100")
    assert "(the model output y among them)" in narrow_range_note(["y"], len(names), ["y"])


def test_the_analysis_and_the_quantize_command_show_it(tmp_path):
    quantizer = Quantizer(prepare_model(vanishing_model()), FeedList(conv_feeds(4)), tmp_path / "cache")
    report = analyze(quantizer, FeedList(conv_feeds(4)), isolation_samples=2)
    assert "warning: 2 of 5 activation tensors" in report.status()
    assert report.summary().endswith(report.meta["range_note"])  # what a Python user prints shows it too
    saved = report.save(tmp_path / "report")
    from mpstudio.sensitivity import SensitivityReport

    assert "warning: 2 of 5" in SensitivityReport.load(saved).status()
    progressive = analyze_progressive(quantizer, FeedList(conv_feeds(4)), isolation_samples=2, workers=0)
    assert "warning: 2 of 5 activation tensors" in progressive.status()

    model = tmp_path / "m.onnx"
    onnx.save(vanishing_model(), model)
    FeedList(conv_feeds(4)).save_npz(tmp_path / "data")
    result = subprocess.run([sys.executable, "-m", "mpstudio", "quantize", str(model), "--data", str(tmp_path / "data"),
                             "-o", str(tmp_path / "q.onnx"), "--cache", str(tmp_path / "cli-cache"), "--quiet"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "warning: 2 of 5 activation tensors" in result.stdout
