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
