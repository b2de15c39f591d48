"""The sensitivity engine against hand-computed values, ORT's own qdq_loss_debug, and real QDQ models."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR, conv_feeds, make_conv_model
from mpstudio.data import Cancelled, FeedList
from mpstudio import qdq
from mpstudio.errors import MpstudioError
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.runtime import htp_input_rounding
from mpstudio.runtime import create_session, htp_weight_grid
from mpstudio.sensitivity import (ErrorAccumulator, SensitivityReport, SwitchableModel, analyze, check_prediction,
                                  qnn_region, tensor_scores, weight_scores)


def _ramp_model():
    """x[1,256] -> Relu -> Mul(2) -> y: quantization noise of x is set by the calibration range alone."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="/a/Relu"), helper.make_node("Mul", ["r", "two"], ["y"], name="/a/Mul")],
        "ramp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], initializer=[two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


@pytest.fixture(scope="module")
def conv_setup(tmp_path_factory):
    prepared = prepare_model(make_conv_model())
    quantizer = Quantizer(prepared, FeedList(conv_feeds(8)), tmp_path_factory.mktemp("conv-cache"))
    return prepared, quantizer


def _params(quantizer, plan):
    return {t: q.encoding for t, q in qdq.read(quantizer.generate(plan)).activations().items()}


def test_input_noise_matches_hand_computed_value(tmp_path):
    # Calibration spans exactly [0, 2.55]: uint8 scale 0.01, zero point 0. Evaluation values sit 0.003 above
    # each grid point, so every element's quantization error is -0.003 (round to nearest).
    prepared = prepare_model(_ramp_model())
    calibration = FeedList([{"x": (np.arange(256, dtype=np.float32) * np.float32(0.01)).reshape(1, 256)}])
    quantizer = Quantizer(prepared, calibration, tmp_path)
    x = (np.arange(255, dtype=np.float64) * 0.01 + 0.003)
    evaluation = FeedList([{"x": np.pad(x, (0, 1)).astype(np.float32).reshape(1, 256)}] * 3)
    frame = tensor_scores(quantizer.float_path, quantizer.generate(PrecisionPlan.a8w8()), prepared.graph, evaluation,
                          _params(quantizer, PrecisionPlan.a8w8()), _params(quantizer, PrecisionPlan.a16w8()))
    row = frame.set_index("tensor").loc["r"]  # Relu(x) = x here; ORT quantizes the Relu's output, not x
    signal = float(np.sum(x ** 2))
    noise = 255 * 0.003 ** 2 + 0.0  # the padded zero quantizes exactly
    expected_snr = 10 * np.log10(signal / noise)
    assert row["snr_db"] == pytest.approx(expected_snr, abs=0.01)
    assert row["local_snr_8"] == pytest.approx(expected_snr, abs=0.01)
    assert row["mse"] == pytest.approx(255 * 0.003 ** 2 / 256, rel=1e-3)
    assert row["max_abs"] == pytest.approx(0.003, abs=1e-5)
    assert row["local_snr_16"] > expected_snr + 40  # 256x finer steps: about 48 dB better
    assert row["samples"] == 3 and bool(row["passes_snr"]) is True


def _shrinking_model():
    """x[1,2,1,64] -> Conv(1x1, weights 0.004 and 10) -> c -> Mul(2) -> y. Per-tensor uint8 weights (step 10/255)
    round 0.004 to 0, so with the weights quantized c loses its large first term: its calibrated range shrinks
    from about [0, 4.1] (float weights) to [0, 0.1]."""
    w = numpy_helper.from_array(np.array([0.004, 10.0], np.float32).reshape(1, 2, 1, 1), "w")
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="/a/Conv"), helper.make_node("Mul", ["c", "two"], ["y"], name="/a/Mul")],
        "shrink", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, 64])], initializer=[w, two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _shrinking_feeds(count, seed):
    rng = np.random.default_rng(seed)
    return FeedList([{"x": np.stack([rng.uniform(0, 1000, 64), rng.uniform(0, 0.01, 64)]).reshape(1, 2, 1, 64)
                      .astype(np.float32)} for _ in range(count)])


def test_local_error_reads_the_model_the_ranges_were_calibrated_on(tmp_path):
    # Ranges are calibrated with the weights quantized, as the HTP runs the model. Quantizing the float model's
    # values with them counts clipping the QDQ model never does (c reaches 4.1 in float, 0.1 with quantized
    # weights): the tensor ranked most harmful, and promoting it changed nothing (the detector's top-k plans).
    prepared = prepare_model(_shrinking_model())
    quantizer = Quantizer(prepared, _shrinking_feeds(8, 0), tmp_path)
    params_8, params_16 = _params(quantizer, PrecisionPlan.a8w8()), _params(quantizer, PrecisionPlan.a16w8())
    carried = quantizer.calibration_model(PrecisionPlan.a8w8())
    assert numpy_helper.to_array(next(i for i in onnx.load(carried).graph.initializer if i.name == "w")).ravel()[0] == 0
    high = params_8["c"].scale[0] * (255 - params_8["c"].zero_point[0])
    assert 0.09 < high < 0.11  # the range the QDQ model runs with
    evaluation = _shrinking_feeds(3, 1)
    model_8 = quantizer.generate(PrecisionPlan.a8w8())
    scored = tensor_scores(quantizer.float_path, model_8, prepared.graph, evaluation, params_8, params_16,
                           local_model=carried).set_index("tensor").loc["c"]
    on_float = tensor_scores(quantizer.float_path, model_8, prepared.graph, evaluation, params_8, params_16
                             ).set_index("tensor").loc["c"]
    # By hand: the carried model's c (10 * x1) quantized alone with c's 8-bit parameters.
    scale, zero = params_8["c"].scale[0], params_8["c"].zero_point[0]
    values = np.concatenate([10 * np.float32(f["x"][0, 1, 0]).astype(np.float64) for f in evaluation.feeds()])
    quantized = (np.clip(np.round(values / scale) + zero, 0, 255) - zero) * scale
    expected = 10 * np.log10(np.sum(values ** 2) / np.sum((values - quantized) ** 2))
    assert scored["local_snr_8"] == pytest.approx(expected, abs=0.5)
    assert scored["local_snr_8"] > 35 and scored["local_snr_16"] > scored["local_snr_8"] + 20
    assert on_float["local_snr_8"] < 5  # what reading the float model reported: clipped
    assert scored["snr_db"] == on_float["snr_db"]  # accumulated error stays against the float model


def test_accumulator_streams_like_one_concatenated_pass():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(3, 50)).astype(np.float32) for _ in range(5)]
    ys = [x + rng.normal(0, 0.1, x.shape).astype(np.float32) for x in xs]
    acc = ErrorAccumulator()
    for x, y in zip(xs, ys):
        acc.add(x, y)
    x, y = np.concatenate([a.ravel() for a in xs]).astype(np.float64), np.concatenate([a.ravel() for a in ys])
    assert acc.snr_db == pytest.approx(10 * np.log10(np.sum(x ** 2) / np.sum((x - y) ** 2)), rel=1e-6)
    assert acc.cosine == pytest.approx(np.dot(x, y) / np.linalg.norm(x) / np.linalg.norm(y), rel=1e-6)
    assert acc.max_abs == pytest.approx(np.max(np.abs(x - y)), rel=1e-6)


def test_agrees_with_ort_qdq_loss_debug(conv_setup, tmp_path):
    from onnxruntime.quantization.qdq_loss_debug import (collect_activations, compute_activation_error,
                                                         create_activation_matching,
                                                         modify_model_output_intermediate_tensors)

    prepared, quantizer = conv_setup
    qdq_path = quantizer.generate(PrecisionPlan.a8w8())
    evaluation = FeedList(conv_feeds(5, seed=7))
    frame = tensor_scores(quantizer.float_path, qdq_path, prepared.graph, evaluation,
                          _params(quantizer, PrecisionPlan.a8w8()), _params(quantizer, PrecisionPlan.a16w8()))
    modify_model_output_intermediate_tensors(str(quantizer.float_path), str(tmp_path / "f.onnx"))
    # mpstudio's CPU numerics take the weights the HTP requantizes on the HTP's grid and round the graph input as
    # the HTP does: ORT's tool reads the same
    grid = htp_input_rounding(htp_weight_grid(str(qdq_path)))
    if isinstance(grid, bytes):
        qdq_path = tmp_path / "grid.onnx"
        qdq_path.write_bytes(grid)
    modify_model_output_intermediate_tensors(str(qdq_path), str(tmp_path / "q.onnx"))
    float_acts = collect_activations(str(tmp_path / "f.onnx"), iter(evaluation.feeds()))
    qdq_acts = collect_activations(str(tmp_path / "q.onnx"), iter(evaluation.feeds()))
    errors = compute_activation_error(create_activation_matching(qdq_acts, float_acts))
    ours = frame.set_index("tensor")
    compared = [t for t in errors if "xmodel_err" in errors[t] and t in ours.index and ours.loc[t, "matched"]]
    assert len(compared) >= 3
    for t in compared:
        assert ours.loc[t, "snr_db"] == pytest.approx(errors[t]["xmodel_err"], abs=0.05), t
    # A float tensor without a QDQ counterpart (its Relu was folded into the Conv) is reported, not guessed.
    assert not ours.loc["conv1_out", "matched"] and np.isnan(ours.loc["conv1_out", "snr_db"])


def test_weight_scores_follow_ort_arithmetic(conv_setup):
    prepared, _ = conv_setup
    frame = weight_scores(prepared.model, prepared.graph).set_index("tensor")
    w = onnx.numpy_helper.to_array(next(i for i in prepared.model.graph.initializer if i.name == "conv1.weight"))
    # Hand-computed uint8 asymmetric per-tensor quantization (range widened to include 0, as ORT does).
    lo, hi = min(0.0, float(w.min())), max(0.0, float(w.max()))
    scale = np.float32((hi - lo) / 255)
    zero = np.round(-lo / scale)
    deq = (np.clip(np.rint(w / scale) + zero, 0, 255) - zero) * scale
    expected = 10 * np.log10(np.sum(w.astype(np.float64) ** 2) / np.sum((w - deq).astype(np.float64) ** 2))
    assert frame.loc["conv1.weight", "snr_pt_8"] == pytest.approx(expected, abs=0.05)
    assert (frame["snr_pt_16"] > frame["snr_pt_8"] + 40).all()
    assert frame.loc["conv1.weight", "axis"] == 0


def test_switchable_model_reproduces_the_real_qdq_models(conv_setup):
    prepared, quantizer = conv_setup
    path_8, path_16 = quantizer.generate(PrecisionPlan.a8w8()), quantizer.generate(PrecisionPlan.a16w8())
    switchable = SwitchableModel(path_8, _params(quantizer, PrecisionPlan.a16w8()))
    real_8, real_16 = create_session(path_8), create_session(path_16)
    for feed in conv_feeds(3, seed=3):
        for real, config in ((real_8, set()), (real_16, set(switchable.tensors))):
            acc = ErrorAccumulator()
            acc.add(real.run(None, feed)[0], switchable.run(feed, config)[0])
            assert acc.snr_db > 40


def test_isolation_matches_regenerated_plans_and_predicts(conv_setup):
    prepared, quantizer = conv_setup
    evaluation = FeedList(conv_feeds(6, seed=11))
    report = analyze(quantizer, evaluation, isolation_samples=6, selection=["relu1_out", "add_out"])
    iso = report.isolation.scores.set_index("region")
    assert {"backbone", "selection"} <= set(iso.index)
    assert report.isolation.all_16 > report.isolation.all_8
    # Promoting one tensor in the switchable model agrees with the regenerated QDQ model of that plan.
    for tensor in ("x", "add_out"):
        check = check_prediction(quantizer, report, [tensor], evaluation)
        assert check.measured == pytest.approx(iso.loc[tensor, "promoted"], abs=1e-3)
        assert check.prediction.predicted == pytest.approx(iso.loc[tensor, "promoted"], abs=1e-6)
    both = report.predict(["x", "add_out"])
    singles = [iso.loc[t, "promoted"] for t in ("x", "add_out")]
    if min(singles) >= report.isolation.all_8:
        assert max(singles) <= both.predicted
    else:  # a promotion that costs accuracy (a convert's extra rounding) pulls the pair's prediction down
        assert min(singles) <= both.predicted <= max(singles)
    assert list(report.ranking["rank"]) == list(range(1, len(report.ranking) + 1))
    with pytest.raises(MpstudioError, match="no isolation score"):
        report.predict(["conv1_out"])


def test_report_round_trip_and_html(conv_setup, tmp_path):
    _, quantizer = conv_setup
    report = analyze(quantizer, FeedList(conv_feeds(4, seed=2)), isolation_samples=4)
    report.save(tmp_path / "r")
    loaded = SensitivityReport.load(tmp_path / "r")
    assert loaded.ranking["tensor"].tolist() == report.ranking["tensor"].tolist()
    np.testing.assert_allclose(loaded.ranking["isolation_gain"], report.ranking["isolation_gain"], equal_nan=True)
    assert loaded.predict(["x"]).predicted == pytest.approx(report.predict(["x"]).predicted)
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<script" not in page and "http" not in page and "add_out" in page
    with pytest.raises(MpstudioError, match="report.json"):
        SensitivityReport.load(tmp_path)


def test_progress_and_cancel(conv_setup):
    _, quantizer = conv_setup
    calls = []
    analyze(quantizer, FeedList(conv_feeds(3)), isolation_samples=2, progress=lambda d, t, m: calls.append((d, t, m)))
    assert {m for _, _, m in calls} >= {"scoring tensors", "scoring weights", "isolation scores"}
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        analyze(quantizer, FeedList(conv_feeds(3)), cancel=cancel)


def test_qnn_region_lists_what_ort_converts_with_a_tensor(conv_setup):
    prepared, _ = conv_setup
    region = qnn_region(prepared.model, prepared.graph, "relu1_out")
    assert region.tensors[0] == "relu1_out" and "add_out" in region.tensors and region.source == "qnn"


def test_analyze_command(tmp_path, capsys):
    from mpstudio.cli import build_parser

    onnx.save(make_conv_model(), tmp_path / "m.onnx")
    FeedList(conv_feeds(5)).save_npz(tmp_path / "data")
    parser = build_parser()
    args = parser.parse_args(["analyze", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "data"), "--out",
                              str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "--quiet", "--top", "3"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "rank" in printed and "report written" in printed
    assert {"ranking.csv", "report.html", "report.json"} <= {p.name for p in (tmp_path / "out").iterdir()}
    bad = parser.parse_args(["analyze", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "data"), "--out",
                             str(tmp_path / "o2"), "--plan", str(tmp_path / "missing.json")])
    with pytest.raises(MpstudioError, match="plan file not found"):
        bad.func(bad)


def test_demo_weights_show_per_channel_matters(demo):
    frame = weight_scores(demo.model.model, demo.model.graph)
    convs = frame[frame["op"] == "Conv"]
    # The demo's accuracy loss comes largely from per-tensor weights: per-channel int8 is far better.
    assert convs["per_channel_gain_8"].median() > 3
    assert (convs["snr_pt_8"] < 30).sum() >= 5


def test_cached_prefix_runs_match_full_runs_and_resolve_like_the_real_plan(conv_setup):
    prepared, quantizer = conv_setup
    switchable = SwitchableModel(quantizer.generate(PrecisionPlan.a8w8()), _params(quantizer, PrecisionPlan.a16w8()),
                                 float_model=prepared.model, graph=prepared.graph, cuts=3)
    samples = conv_feeds(3, seed=5)
    cached = switchable.cached(samples)
    for config in ([], ["x"], ["add_out"], switchable.tensors):
        setting = switchable.setting(config)
        for full, fast in zip([switchable.run(s, setting) for s in samples], cached.outputs(setting)):
            np.testing.assert_allclose(fast[0], full[0], rtol=1e-5, atol=1e-6)
    # Promoting relu1_out makes its reader compute at 16 bits; ORT converts that reader's other inputs.
    edges = switchable.setting(["relu1_out"]).edges
    assert any(t == "relu1_out" for t, _ in edges)
    assert not switchable.setting([]).edges


def _masked_model():
    """x[1,8,16], mask[1,16] -> (1 - mask) * -10000 added to x @ W -> Softmax -> y: the mask's branch is zero
    when no position is masked, as in a BERT encoder fed full sequences."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (16, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(-10000.0, np.float32), "big")]
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w"], ["scores"], name="/attn/MatMul"),
             node("Sub", ["one", "mask"], ["inverted"], name="/mask/Sub"),
             node("Mul", ["inverted", "big"], ["bias"], name="/mask/Mul"),
             node("Add", ["scores", "bias"], ["masked"], name="/attn/Add"),
             node("Softmax", ["masked"], ["y"], name="/attn/Softmax", axis=-1)]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16]),
                                                helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_a_branch_that_stays_exactly_zero_is_not_ranked_as_damaged(tmp_path):
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.normal(0, 1, (1, 8, 16)).astype(np.float32), "mask": np.ones((1, 16), np.float32)}
             for _ in range(4)]
    quantizer = Quantizer(prepare_model(_masked_model()), FeedList(feeds), tmp_path)
    report = analyze(quantizer, FeedList(feeds), isolation_samples=2)
    ranking = report.ranking.set_index("tensor")
    zero = [t for t in ranking.index if t in ("inverted", "bias")]
    assert zero, ranking.index.tolist()  # the branch is quantized and scored
    for tensor in zero:
        assert ranking.loc[tensor, "snr_db"] >= 200.0 and ranking.loc[tensor, "cosine"] == 1.0, ranking.loc[tensor]
    assert report.ranking["tensor"].iloc[0] not in zero
