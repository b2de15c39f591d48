"""A default export reproduces the study's plan in the user's own tools: ORT's quantizer fed the overrides as
docs/export.md shows gives the study's model output for output, and the model with the HTP's weights gives the
study's stored accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from conftest import chain_feeds, conv_feeds, make_chain_model, make_conv_model
from mpstudio.data import CalibrationReader, FeedList
from mpstudio.export import export_plan, read_quantized_tensors
from mpstudio.export_reproduce import CPU_DISABLED_OPTIMIZERS, CPU_SESSION_CONFIG, htp_weights
from mpstudio.metrics import output_agreement
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan, TensorOverride
from mpstudio.quantize import Quantizer
from mpstudio.runtime import create_session as mpstudio_session

DOCS = Path(__file__).parent.parent / "docs" / "export.md"


def documented_pipeline(folder: Path, reader) -> Path:
    """The stand-alone ORT snippet of docs/export.md, run as written in `folder` (files named mixed.*)."""
    text = DOCS.read_text()
    code = text.split("Without mpstudio:", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    here = Path.cwd()
    try:
        import os
        os.chdir(folder)
        exec(compile(code, str(DOCS), "exec"), {"reader": reader})
    finally:
        os.chdir(here)
    return folder / "mixed.mine.onnx"


def outputs(model, feeds, **session_kwargs) -> list[list[np.ndarray]]:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"], **session_kwargs)
    return [sess.run(None, feed) for feed in feeds]


def assert_same_outputs(mine, study_model, feeds) -> None:
    """Sample by sample, bit for bit: ORT's default CPU run, and the study's own numerics."""
    for got, want in zip(outputs(mine, feeds), outputs(study_model, feeds)):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    ours, theirs = mpstudio_session(mine, "cpu"), mpstudio_session(study_model, "cpu")
    for feed in feeds:
        for a, b in zip(ours.run(None, feed), theirs.run(None, feed)):
            np.testing.assert_array_equal(a, b)


PLANS = {
    "mixed": PrecisionPlan.a8w8().promote(["conv1_out", "relu1_out"]),
    "a16w8": PrecisionPlan.a16w8(),
    "per-channel-int8": PrecisionPlan(weight_type="int8", per_channel=True).promote(["add_out"]),
    "weight-override": PrecisionPlan.a8w8().with_overrides({"conv2.weight": TensorOverride("int8", per_channel=True)}),
}


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return Quantizer(prepare_model(make_conv_model()), FeedList(conv_feeds(8)), tmp_path_factory.mktemp("conv"))


@pytest.mark.parametrize("which", list(PLANS))
def test_default_export_reproduces_the_plan_in_orts_own_pipeline(conv, which, tmp_path):
    plan = PLANS[which]
    result = export_plan(conv, plan, tmp_path, formats=("ort", "float", "model"), name="mixed")
    # The user's own calibration data, not the study's: pinned parameters make it irrelevant.
    mine = documented_pipeline(tmp_path, CalibrationReader(FeedList(conv_feeds(3, seed=5))))
    assert_same_outputs(mine, conv.generate(plan), conv_feeds(6, seed=9))
    # Every tensor the study quantizes, with its values; ORT may keep one Q/DQ pair more between an op and its
    # Relu, which mpstudio's post-pass removes (fuse_activations) and which changes no output (checked above).
    ours, evaluated = read_quantized_tensors(mine), read_quantized_tensors(result.model)
    assert {name: ours.get(name) for name in evaluated} == evaluated
    assert any("pins every activation's scale and zero point" in note for note in result.notes)
    assert "init_overrides" in result.readme.read_text()


def test_an_unpinned_export_says_it_does_not_reproduce_and_does_not(conv, tmp_path):
    plan = PLANS["mixed"]
    result = export_plan(conv, plan, tmp_path, formats=("ort", "float"), name="mixed", with_parameters=False)
    assert any("does NOT pin activation parameters" in note for note in result.notes)
    mine = documented_pipeline(tmp_path, CalibrationReader(FeedList(conv_feeds(3, seed=5))))
    assert read_quantized_tensors(mine) != read_quantized_tensors(conv.generate(plan))


def test_chain_model_default_export_reproduces_the_plan(tmp_path):
    quantizer = Quantizer(prepare_model(make_chain_model()), FeedList(chain_feeds(6)), tmp_path / "q")
    plan = PrecisionPlan.a8w8().promote(["block1_out", "block2_conv"])
    export_plan(quantizer, plan, tmp_path, formats=("ort", "float"), name="mixed")
    mine = documented_pipeline(tmp_path, CalibrationReader(FeedList(chain_feeds(2, seed=7))))
    assert_same_outputs(mine, quantizer.generate(plan), chain_feeds(5, seed=11))


@pytest.mark.slow
def test_demo_default_export_reproduces_the_plan_sample_by_sample(demo, demo_quantizer, tmp_path):
    stem = demo.model.graph.activations()[:3]
    plan = PrecisionPlan(weight_type="int8", per_channel=True).promote(stem)
    export_plan(demo_quantizer, plan, tmp_path, formats=("ort", "float"), name="mixed")
    mine = documented_pipeline(tmp_path, CalibrationReader(demo.evaluation.head(2)))
    feeds = list(demo.evaluation.head(8))
    assert_same_outputs(mine, demo_quantizer.generate(plan), feeds)


# ---- the model the study scored ------------------------------------------------------------------------------
def _cpu_outputs(model, feeds, **session_kwargs) -> list[dict[str, np.ndarray]]:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"], **session_kwargs)
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(None, feed))) for feed in feeds]


def test_the_htp_weights_model_gives_the_studys_stored_value(tmp_path):
    from mpstudio.study import Study

    plan = PLANS["mixed"]  # a 16-bit Conv with uint8 per-tensor weights the HTP requantizes
    with Study.create(tmp_path / "study", make_conv_model(), FeedList(conv_feeds(6)),
                      FeedList(conv_feeds(4, seed=3))) as study:
        stored = study.evaluate(plan, "cpu", measure_latency=False)
        result = export_plan(study.quantizer, plan, tmp_path / "out", name="mixed")
        feeds = list(study.evaluation_data.feeds())
        references = study.float_reference.outputs()
    weights = htp_weights(result.model)
    assert weights is not None and "conv2.weight" in weights.weights
    assert result.htp_model.read_bytes() == weights.model
    assert any("mixed.htp.qdq.onnx holds the weights the HTP computes with" in n for n in result.notes)
    options = ort.SessionOptions()
    for key, value in CPU_SESSION_CONFIG.items():
        options.add_session_config_entry(key, value)
    study_settings = {"sess_options": options, "disabled_optimizers": list(CPU_DISABLED_OPTIMIZERS)}
    snr, _ = output_agreement(references, _cpu_outputs(result.htp_model, feeds, **study_settings))
    assert snr == stored.snr_db
    # The plain model computes with the stored uint8 weights: another number, as the README warns.
    plain, _ = output_agreement(references, _cpu_outputs(result.model, feeds, **study_settings))
    assert plain != stored.snr_db


def test_no_htp_model_when_the_htp_takes_every_weight_as_stored(conv, tmp_path):
    result = export_plan(conv, PLANS["per-channel-int8"], tmp_path, name="pc")
    assert result.htp_model is None and not (tmp_path / "pc.htp.qdq.onnx").exists()
    assert any("pc.qdq.onnx is the model the study scored" in n for n in result.notes)
