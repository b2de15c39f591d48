"""The built-in demo: real model, deterministic rendered data, CER metric."""

import numpy as np
import pytest

from mpstudio.demos.ocr import load_demo, preprocess_line, render_line
from mpstudio.ctc_text import character_error_rate, ctc_greedy_decode, edit_distance
from mpstudio.loop.inprocess import evaluate
from mpstudio.plan import PrecisionPlan


def test_edit_distance_and_cer_by_hand():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "abc") == 0
    assert character_error_rate(["abc", "xyz"], ["abd", "xyz"]) == pytest.approx(1 / 6)


def test_greedy_ctc_decoding_drops_repeats_and_blanks():
    charset = ["<blank>", "a", "b"]
    steps = [1, 1, 0, 1, 2, 2, 0, 0]
    probs = np.eye(3, dtype=np.float32)[steps]
    assert ctc_greedy_decode(probs, charset) == "aab"


def test_preprocessing_matches_the_recognizer_input():
    rgb = render_line("Hello world", seed=3)
    x = preprocess_line(rgb)
    assert x.shape == (1, 3, 48, 320) and x.dtype == np.float32
    assert -1.0 <= x.min() and x.max() <= 1.0
    np.testing.assert_array_equal(render_line("Hello world", seed=3), rgb)


def test_demo_is_deterministic_and_split(demo, tmp_path):
    assert len(demo.calibration) == 100 and len(demo.evaluation) == 100 == len(demo.texts)
    assert demo.model.inputs[0].shape == (1, 3, 48, 320)
    other = load_demo(cache_dir=tmp_path)
    assert other.texts == demo.texts
    assert other.evaluation.head(5).fingerprint() == demo.evaluation.head(5).fingerprint()
    assert not set(demo.texts) & set(other.calibration.base.folder.parent.joinpath("texts.txt").read_text().splitlines()[:100])


def test_float_model_reads_the_lines(demo):
    cer = evaluate(demo.model_path, demo.evaluation, demo.metric)
    assert cer < 0.03


def test_per_channel_weights_recover_what_per_tensor_loses(demo, demo_quantizer):
    """The demo's error is mostly in the weights: per-channel int8 weights beat a8w8 by far."""
    part = demo.evaluation.head(40)
    metric = load_demo(evaluation_lines=40, cache_dir=demo_quantizer.cache_dir.parent).metric
    a8w8 = evaluate(demo_quantizer.generate(PrecisionPlan.a8w8()), part, metric)
    per_channel = evaluate(demo_quantizer.generate(PrecisionPlan(weight_type="int8", per_channel=True)), part, metric)
    assert per_channel < a8w8 / 2
