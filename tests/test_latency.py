"""The HTP latency cost model and labelled latencies, on QDQ models made by mpstudio's Quantizer."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import onnx
import pytest
from conftest import IR, conv_feeds, make_conv_model
from latency_profile import PROFILE, fingerprint, quantized
from onnx import TensorProto, helper, numpy_helper

from mpstudio.agent.protocol import LatencyStats, OpProfile
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.latency import (
    HTP_ARCHS,
    HTP_ONLY,
    OP_COLUMNS,
    WITH_CPU_IO,
    Latency,
    LatencyEstimate,
    calibrate,
    estimate_latency,
    htp_arch,
    promotion_costs,
)
from mpstudio.latency.ops import MECHANISMS
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer


# ---- small models -------------------------------------------------------------------------------------------
def make_single_conv(cin: int = 32, cout: int = 32, size: int = 8) -> onnx.ModelProto:
    """x[1, cin, size, size] -> 3x3 Conv (pad 1) -> y[1, cout, size, size]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.2, (cout, cin, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, (cout,)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        "one_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])],
        initializer=[w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def make_mobilenet_v2(size: int = 224) -> onnx.ModelProto:
    """MobileNet-v2 (width 1.0) with random weights: latency depends on shapes, not on weight values."""
    rng = np.random.default_rng(0)
    nodes, inits, count = [], [], [0]

    def conv(x, cin, cout, k, stride=1, group=1, relu6=True):
        count[0] += 1
        name = f"conv{count[0]}"
        scale = (2 / (k * k * cin / group)) ** 0.5
        weight = rng.normal(0, scale, (cout, cin // group, k, k)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, name + ".w"))
        inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), name + ".b"))
        nodes.append(helper.make_node("Conv", [x, name + ".w", name + ".b"], [name], name=name, kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4, group=group))
        if not relu6:
            return name
        nodes.append(helper.make_node("Clip", [name, "zero", "six"], [name + "_relu6"], name=name + "_clip"))
        return name + "_relu6"

    inits += [numpy_helper.from_array(np.array(0, np.float32), "zero"),
              numpy_helper.from_array(np.array(6, np.float32), "six")]
    x, cin = conv("x", 3, 32, 3, stride=2), 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            y = x if t == 1 else conv(x, cin, hidden, 1)
            y = conv(y, hidden, hidden, 3, stride=stride, group=hidden)
            y = conv(y, hidden, c, 1, relu6=False)
            if stride == 1 and cin == c:
                nodes.append(helper.make_node("Add", [x, y], [y + "_res"], name=y + "_add"))
                y += "_res"
            x, cin = y, c
    x = conv(x, cin, 1280, 1)
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="flatten")]
    inits += [numpy_helper.from_array(rng.normal(0, 0.02, (1000, 1280)).astype(np.float32), "fc.w"),
              numpy_helper.from_array(np.zeros(1000, np.float32), "fc.b")]
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(nodes, "mobilenet_v2",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def quantizer_for(model: onnx.ModelProto, shape, cache) -> Quantizer:
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    return Quantizer(prepare_model(model), FeedList(feeds), cache)


@pytest.fixture(scope="module")
def single_conv(tmp_path_factory):
    q = quantizer_for(make_single_conv(), (1, 32, 8, 8), tmp_path_factory.mktemp("one-conv"))
    return q.generate(PrecisionPlan.a8w8()), q.generate(PrecisionPlan.a16w8())


@pytest.fixture(scope="module")
def conv_net(tmp_path_factory):
    q = Quantizer(prepare_model(make_conv_model()), FeedList(conv_feeds(4)), tmp_path_factory.mktemp("conv-net"))
    return q


# ---- Latency --------------------------------------------------------------------------------------------------
def test_latency_labels_name_the_source_and_what_the_figure_includes():
    # A latency stored before scopes existed (no `includes`) reads as what it was: an estimate with CPU I/O.
    assert (Latency(1.5, "estimate", "HTP v75 (cost model)").label
            == "estimate, HTP v75 cost model, HTP + CPU graph I/O")
    htp = Latency(1.2, "estimate", "HTP v75 (cost model)", includes=HTP_ONLY, low_ms=1.0, high_ms=1.5)
    assert htp.label == "estimate, HTP v75 cost model, HTP only" and htp.interval == "1.000-1.500 ms"
    assert str(htp) == "1.200 ms [1.000-1.500 ms] (estimate, HTP v75 cost model, HTP only)"
    calibrated = Latency(1.0, "estimate", "HTP v75 (cost model, calibrated on Galaxy S24)")
    assert calibrated.label.startswith("estimate, calibrated on Galaxy S24, HTP v75 cost model")
    assert calibrated.calibrated_on == "Galaxy S24"
    measured = Latency(2.0, "measured", "Galaxy S24")
    assert measured.label == "measured on Galaxy S24, whole session run" and measured.is_device_latency
    emulated = Latency(300.0, "emulator", "x86_64 host")
    assert "not device latency" in emulated.label and not emulated.is_device_latency
    assert str(measured) == "2.000 ms (measured on Galaxy S24, whole session run)"


@pytest.mark.parametrize("kwargs", [
    dict(ms=1.0, source="guess", where="here"),
    dict(ms=-1.0, source="measured", where="phone"),
    dict(ms=float("nan"), source="estimate", where="HTP v75 (cost model)"),
    dict(ms="fast", source="measured", where="phone"),
    dict(ms=1.0, source="measured", where=""),
    dict(ms=1.0, source="estimate", where="HTP v75 (cost model)", includes="everything"),
    dict(ms=1.0, source="estimate", where="HTP v75 (cost model)", low_ms=0.5),
    dict(ms=1.0, source="estimate", where="HTP v75 (cost model)", low_ms=1.2, high_ms=1.5),
])
def test_latency_rejects_bad_values(kwargs):
    with pytest.raises(MpstudioError):
        Latency(**kwargs)


def test_latency_round_trips_and_checks_its_dict():
    latency = Latency(0.75, "estimate", "HTP v73 (cost model)", "QDQ", HTP_ONLY, 0.6, 0.9)
    assert Latency.from_dict(latency.to_dict()) == latency
    old = Latency.from_dict({"ms": 0.75, "source": "estimate", "where": "HTP v73 (cost model)", "detail": "QDQ"})
    assert old.includes == WITH_CPU_IO and old.low_ms is None
    with pytest.raises(MpstudioError, match="missing"):
        Latency.from_dict({"ms": 1.0, "source": "measured"})
    with pytest.raises(MpstudioError, match="unknown"):
        Latency.from_dict({"ms": 1.0, "source": "measured", "where": "phone", "when": "now"})
    with pytest.raises(MpstudioError, match="source"):
        Latency.from_dict({"ms": 1.0, "source": "estimated", "where": "phone"})


@pytest.mark.parametrize("source", ["measured", "emulator"])
def test_from_stats_keeps_the_agents_source(source):
    stats = LatencyStats.from_times([3_000_000, 1_000_000, 2_000_000], source=source, device="Snapdragon X Elite",
                                    backend="htp")
    latency = Latency.from_stats(stats)
    assert latency.source == source and latency.ms == pytest.approx(2.0)
    assert latency.where == "Snapdragon X Elite" and "3 timed runs" in latency.detail
    assert (source == "measured") == latency.is_device_latency


# ---- architectures ------------------------------------------------------------------------------------------------
def test_every_arch_is_accepted_and_an_unknown_one_lists_the_valid(single_conv):
    a8, _ = single_conv
    assert sorted(HTP_ARCHS) == ["68", "69", "73", "75", "79"]
    times = [estimate_latency(a8, arch).ms for arch in HTP_ARCHS]
    assert all(t > 0 for t in times)
    assert times[-1] < times[0]  # a newer generation is faster
    assert htp_arch("v75") is htp_arch(75) is HTP_ARCHS["75"]
    with pytest.raises(MpstudioError) as info:
        estimate_latency(a8, "81")
    assert all(f"v{a}" in str(info.value) for a in HTP_ARCHS)


# ---- hand-computed values -------------------------------------------------------------------------------------------
def test_one_conv_prices_its_macs_types_and_bytes(single_conv):
    a8, a16 = single_conv
    arch = HTP_ARCHS["75"]
    macs = 1 * 32 * 8 * 8 * 32 * 9  # batch x cout x output pixels x cin x kernel
    rows = [estimate_latency(m, "75").ops.set_index("node").loc["conv"] for m in (a8, a16)]
    for conv, act_type in zip(rows, ("uint8", "uint16")):
        assert conv["macs"] == macs and conv["act_type"] == act_type and conv["weight_type"] == "uint8"
        assert conv["weight_bytes"] == 32 * 32 * 9 * 1 + 32 * 4  # uint8 weights, int32 bias
        assert conv["engine"] == "hmx" and conv["op_class"] == "hmx"
        assert conv["ms"] == pytest.approx(max(conv["compute_ms"], conv["memory_ms"]) + conv["overhead_ms"])
    # 16-bit activations: the 16x8 matrix rate and twice the activation bytes.
    assert rows[1]["compute_ms"] / rows[0]["compute_ms"] == pytest.approx(arch.costs.rate_16x8)
    assert rows[1]["act_bytes"] == 2 * rows[0]["act_bytes"]


def test_the_estimate_says_what_it_includes_and_carries_an_interval(single_conv):
    estimate = estimate_latency(single_conv[0], "75")
    ops = estimate.ops
    io = ops[ops["kind"] == "io"]
    assert set(io["op_type"]) == {"QuantizeLinear", "DequantizeLinear"} and (io["engine"] == "cpu").all()
    assert estimate.htp.includes == HTP_ONLY and estimate.latency.includes == WITH_CPU_IO
    assert estimate.htp_ms == pytest.approx(ops.loc[ops["kind"] != "io", "ms"].sum())
    assert estimate.ms == pytest.approx(estimate.htp_ms + io["ms"].sum())
    for latency in (estimate.htp, estimate.latency):
        assert latency.low_ms < latency.ms < latency.high_ms
    # An all-8-bit model's interval is the fit's spread of absolute w8a8 figures.
    factor = estimate.htp.high_ms / estimate.htp.ms
    assert factor == pytest.approx(np.exp(HTP_ARCHS["75"].spread.absolute), rel=1e-6)
    assert ops["share"].sum() == pytest.approx(1.0) and list(ops.columns) == list(OP_COLUMNS)


def test_low_channel_conv_pays_for_hmx_padding(tmp_path, monkeypatch):
    narrow = quantizer_for(make_single_conv(cin=3, cout=32, size=16), (1, 3, 16, 16), tmp_path / "n")
    full = quantizer_for(make_single_conv(cin=32, cout=32, size=16), (1, 32, 16, 16), tmp_path / "f")
    # Loaded, not paths: a path's parse is cached, and the mechanisms switch below change it.
    models = [onnx.load(q.generate(PrecisionPlan.a8w8())) for q in (narrow, full)]
    # Without `shallow_input`, as any convolution that is not the first: 3 channels fill a 32-channel block.
    monkeypatch.setitem(MECHANISMS, "shallow_input", False)
    rows = [estimate_latency(m).ops.set_index("node").loc["conv"] for m in models]
    assert rows[0]["macs"] * 32 == rows[1]["macs"] * 3
    assert rows[0]["compute_ms"] == pytest.approx(rows[1]["compute_ms"])
    # With it (the default), the 8-bit first convolution over the RGB graph input packs its 3x3 taps and 3
    # channels into one block of 32 (27 deep): a ninth of the matrix work of 9 taps x one padded block each.
    monkeypatch.setitem(MECHANISMS, "shallow_input", True)
    packed = estimate_latency(models[0]).ops.set_index("node").loc["conv"]
    assert packed["macs"] == rows[0]["macs"]
    assert packed["compute_ms"] == pytest.approx(rows[0]["compute_ms"] / 9)


# ---- models that are not (or not quite) QDQ ---------------------------------------------------------------------
def test_float_model_is_estimated_as_fp16(conv_net):
    float_estimate = estimate_latency(conv_net.float_path)
    compute = float_estimate.ops[float_estimate.ops["kind"] == "compute"]
    assert set(compute["act_type"]) == {"float16"}
    assert (float_estimate.ops["op_type"] == "Cast").sum() == 2  # fp32 graph input in, output out
    assert float_estimate.latency.source == "estimate"
    quantized = estimate_latency(conv_net.generate(PrecisionPlan.a8w8()))
    compute8 = quantized.ops[quantized.ops["kind"] == "compute"]
    assert compute["ms"].sum() > compute8["ms"].sum()


def test_model_in_memory_and_as_bytes_give_the_same_estimate(single_conv):
    a8, _ = single_conv
    from_path = estimate_latency(a8).ms
    assert estimate_latency(onnx.load(str(a8))).ms == pytest.approx(from_path)
    assert estimate_latency(a8.read_bytes()).ms == pytest.approx(from_path)


def test_bad_models_are_clear_errors(tmp_path):
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07 this is not protobuf \xff\xfe")
    with pytest.raises(MpstudioError, match="corrupt.onnx"):
        estimate_latency(corrupt)
    with pytest.raises(MpstudioError, match="not found"):
        estimate_latency(tmp_path / "missing.onnx")
    with pytest.raises(MpstudioError, match="path, bytes or an onnx.ModelProto"):
        estimate_latency(42)
    empty = helper.make_model(helper.make_graph([], "empty", [], []), ir_version=IR)
    with pytest.raises(MpstudioError, match="no nodes"):
        estimate_latency(empty)
    with pytest.raises(MpstudioError, match="no nodes"):
        promotion_costs(empty, ["x"])


def test_estimate_is_labelled_estimate_everywhere(single_conv):
    estimate = estimate_latency(single_conv[0], "73")
    assert isinstance(estimate, LatencyEstimate)
    assert estimate.latency.source == "estimate" and not estimate.latency.is_device_latency
    assert estimate.latency.where == "HTP v73 (cost model)"
    assert estimate.latency.label == "estimate, HTP v73 cost model, HTP + CPU graph I/O"
    assert estimate.htp.label == "estimate, HTP v73 cost model, HTP only"
    assert "estimate" in estimate.summary() and HTP_ONLY in estimate.summary()
    assert estimate.to_dict()["latency"]["source"] == "estimate"
    assert estimate.to_dict()["htp"]["includes"] == HTP_ONLY


# ---- mixed precision on a small net ----------------------------------------------------------------------------------
def test_converts_are_counted_at_precision_boundaries(conv_net):
    a8 = estimate_latency(conv_net.generate(PrecisionPlan.a8w8()))
    a16 = estimate_latency(conv_net.generate(PrecisionPlan.a16w8()))
    mixed = estimate_latency(conv_net.generate(PrecisionPlan.a8w8().promote(["relu1_out"])))
    assert a8.converts == 0 and a16.converts == 0 and a8.convert_ms == 0
    assert mixed.converts > 0 and mixed.convert_ms > 0
    converts = mixed.ops[mixed.ops["kind"] == "convert"]
    assert set(converts["op_type"]) == {"Convert"} and (converts["elements"] > 0).all()
    # On a net this small the two converts' fixed costs outweigh computing everything at 16 bits.
    assert a8.ms < mixed.ms and a8.ms < a16.ms < mixed.ms


def test_promotion_costs_match_regenerated_models(conv_net):
    a8 = conv_net.generate(PrecisionPlan.a8w8())
    tensors = conv_net.graph.activations()
    costs = promotion_costs(a8, tensors, graph=conv_net.graph)
    assert list(costs.index) == list(tensors) and costs.name == "promotion_ms"
    base = estimate_latency(a8).ms
    for tensor in tensors:
        regenerated = estimate_latency(conv_net.generate(PrecisionPlan.a8w8().promote([tensor]))).ms
        assert costs[tensor] == pytest.approx(regenerated - base, rel=0.05, abs=1e-4), tensor
    all16 = promotion_costs(conv_net.generate(PrecisionPlan.a16w8()), tensors, graph=conv_net.graph)
    assert (all16 == 0).all()


def test_promotion_costs_of_unknown_tensors_are_nan(conv_net):
    costs = promotion_costs(conv_net.generate(PrecisionPlan.a8w8()), ["no_such_tensor", "relu1_out"])
    assert math.isnan(costs["no_such_tensor"]) and costs["relu1_out"] > 0


# ---- the demo ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_models(demo_quantizer):
    q = demo_quantizer
    a8, a16 = q.generate(PrecisionPlan.a8w8()), q.generate(PrecisionPlan.a16w8())
    costs = promotion_costs(a8, q.graph.activations(), graph=q.graph)
    cheap_first = list(costs.sort_values().index)
    mixed = q.generate(PrecisionPlan.a8w8().promote(cheap_first[:20]))
    return q, a8, a16, mixed, costs


@pytest.mark.parametrize("arch", sorted(HTP_ARCHS))
def test_demo_a16w8_costs_more_than_a8w8_and_mixed_lies_between(demo_models, arch):
    _, a8, a16, mixed, _ = demo_models
    e8, e16, em = (estimate_latency(m, arch) for m in (a8, a16, mixed))
    assert e8.ms < em.ms < e16.ms
    assert 1.2 < e16.ms / e8.ms < 2.2  # published w8a16/w8a8 ratios lie around 1.5-2 (docs/latency.md)
    assert em.converts > 0 and em.convert_ms > 0 and e8.converts == 0
    for e in (e8, e16, em):
        assert e.latency.label == f"estimate, HTP v{arch} cost model, HTP + CPU graph I/O"


def test_demo_promotion_costs_are_fast_positive_and_predictive(demo_models):
    q, a8, _, mixed, costs = demo_models
    assert len(costs) > 300 and not costs.isna().any() and (costs > 0).all()
    # The sum of single promotions predicts the mixed plan within the interaction of shared converts.
    promoted = list(costs.sort_values().index[:20])
    predicted = estimate_latency(a8).ms + costs[promoted].sum()
    assert estimate_latency(mixed).ms == pytest.approx(predicted, rel=0.05)
    for tensor in costs.sort_values().index[::100]:
        regenerated = estimate_latency(q.generate(PrecisionPlan.a8w8().promote([tensor]))).ms
        # A regenerated plan goes through the fused-activation post-pass, which can drop a convert pair beside a
        # Relu/Clip that the per-tensor costs still price: they are within 30 % of the regenerated estimate.
        assert costs[tensor] == pytest.approx(regenerated - estimate_latency(a8).ms, rel=0.3, abs=2e-3), tensor


def test_demo_more_promoted_tensors_never_cost_less(demo_models):
    q, a8, a16, _, costs = demo_models
    assert (costs > 0).all()  # from an all-8-bit plan every single promotion costs time
    for order in (list(costs.sort_values().index), list(costs.sort_values(ascending=False).index)):
        estimates = [estimate_latency(a8)]
        for k in (5, 40, 160):
            estimates.append(estimate_latency(q.generate(PrecisionPlan.a8w8().promote(order[:k]))))
        # A bigger set can only save the converts between its members: never more than they cost.
        for earlier, later in zip(estimates, estimates[1:]):
            assert later.ms >= earlier.ms - earlier.convert_ms, (earlier.ms, later.ms, earlier.convert_ms)
        assert estimates[-1].ms > estimates[0].ms
    # Many precision boundaries can cost more than all-16-bit: converts are not free.
    assert estimate_latency(a16).ms > estimate_latency(a8).ms


# ---- against published device measurements ------------------------------------------------------------------
def test_mobilenet_v2_matches_its_published_figures(tmp_path):
    q = quantizer_for(make_mobilenet_v2(), (1, 3, 224, 224), tmp_path)
    a8, a16 = q.generate(PrecisionPlan.a8w8()), q.generate(PrecisionPlan.a16w8())
    # AI Hub, MobileNet-v2 (QNN DLC; benchmarks/data): w8a8, w8a16, float ms on S24 (v75) and S25 (v79).
    for arch, published in (("75", (0.326, 0.572, 0.603)), ("79", (0.223, 0.375, 0.444))):
        ms = [estimate_latency(m, arch).htp_ms for m in (a8, a16, q.float_path)]
        assert ms[0] == pytest.approx(published[0], rel=0.3)
        assert ms[1] / ms[0] == pytest.approx(published[1] / published[0], rel=0.15)
        assert ms[2] / ms[0] == pytest.approx(published[2] / published[0], rel=0.15)


# ---- fusions QNN makes -----------------------------------------------------------------------------------------
def _model(nodes, inits, shape, out_shape) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fusions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_silu_runs_as_one_op_overlapping_its_conv(tmp_path):
    q = Quantizer(prepare_model(onnx.load(str(_silu_model_path(tmp_path)))), FeedList(_silu_feeds()), tmp_path / "q")
    ops = estimate_latency(q.generate(PrecisionPlan.a8w8())).ops.set_index("node")
    assert ops.loc["conv1_sigmoid", "engine"] == "fused" and ops.loc["conv1_sigmoid", "ms"] == 0
    silu = ops.loc["conv1_mul"]
    assert silu["op_type"] == "SiLU" and silu["op_class"] == "transcendental"
    assert silu["hidden_ms"] > 0  # runs on HVX while HMX computes the conv before it
    # A Relu after a conv costs nothing: ORT folds it into the conv's quantization, or QNN fuses it.
    assert "dw_relu" not in ops.index or ops.loc["dw_relu", "engine"] == "fused"


def test_gelu_and_bias_fold_like_qnn(tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, (64, 64)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(64, np.float32), "b"),
             numpy_helper.from_array(np.float32(2 ** 0.5), "sqrt2"), numpy_helper.from_array(np.float32(1), "one"),
             numpy_helper.from_array(np.float32(0.5), "half")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["h"], name="bias"),
             helper.make_node("Div", ["h", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["e1"], name="add1"),
             helper.make_node("Mul", ["h", "e1"], ["g"], name="mul"),
             helper.make_node("Mul", ["g", "half"], ["y"], name="mul_half")]
    model = _model(nodes, inits, [1, 16, 64], [1, 16, 64])
    feeds = [{"x": np.random.default_rng(i).normal(0, 1, (1, 16, 64)).astype(np.float32)} for i in range(2)]
    q = Quantizer(prepare_model(model), FeedList(feeds), tmp_path)
    for path in (q.generate(PrecisionPlan.a8w8()), q.float_path):
        ops = estimate_latency(path).ops
        running = ops[(ops["engine"] != "fused") & (ops["kind"] == "compute")]
        # ORT's preparation may make MatMul+Add a Gemm between reshapes; either way the bias costs nothing and
        # the five element-wise ops of the GELU run as one.
        assert sorted(set(running["op_type"]) - {"Reshape"}) in (["Gelu", "MatMul"], ["Gelu", "Gemm"])
        assert (running["op_type"] == "Gelu").sum() == 1


def _silu_model_path(tmp_path):
    from latency_profile import silu_net

    path = tmp_path / "silu.onnx"
    onnx.save(silu_net(), str(path))
    return path


def _silu_feeds():
    from latency_profile import feeds

    return feeds()


# ---- recalibration on a device's per-op profile ---------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The recorded per-op HTP profile (tests/latency_profile.py) and the model it was recorded on."""
    data = json.loads(PROFILE.read_text())
    model = quantized(tmp_path_factory.mktemp("profiled"))
    if fingerprint(model) != data["model"]:
        pytest.skip("the profiled model changed: re-record with python tests/latency_profile.py")
    return model, OpProfile.from_dict(data["profile"]), data["median_ms"]


def _per_op_error(estimate, profile, total_ms) -> float:
    """Time-weighted mean |log(estimated / profiled)| over the profiled ops that map to the model's ops."""
    ops = estimate.ops[estimate.ops["kind"].isin(["compute", "convert"]) & (estimate.ops["engine"] != "fused")]
    by_node = ops.groupby("node")["ms"].sum()
    costs = np.array([op.cost for op in profile.ops])
    scale = (total_ms - estimate.io_ms - estimate.arch.costs.graph_overhead_us / 1e3) / costs.sum()
    err, weight = 0.0, 0.0
    for op, cost in zip(profile.ops, costs):
        est = sum(by_node.get(n, 0.0) for n in op.onnx_nodes)
        if est > 0 and cost > 0:
            err += cost * abs(np.log(est / (cost * scale)))
            weight += cost
    return err / weight


def test_recalibration_moves_estimates_toward_the_profile(recorded):
    model, profile, total_ms = recorded
    assert profile.source == "emulator" and profile.unit == "cycles"
    before = estimate_latency(model, "75")
    calibration = calibrate([(model, profile, total_ms)], "75", allow_emulator=True)
    after = estimate_latency(model, calibration.arch)
    assert _per_op_error(after, profile, total_ms) < 0.7 * _per_op_error(before, profile, total_ms)
    profiled_htp = total_ms - before.io_ms
    assert abs(np.log(after.htp_ms / profiled_htp)) < abs(np.log(before.htp_ms / profiled_htp))
    assert after.latency.label.startswith("estimate, calibrated on x86_64 host (HTP emulator host time, not device "
                                          "latency), HTP v75 cost model")
    assert after.htp.low_ms < after.htp_ms < after.htp.high_ms
    assert set(calibration.classes["op_class"]) >= {"hmx", "transcendental", "depthwise"}
    assert "calibrated on" in calibration.describe()
    # The promotion costs the search uses follow the calibrated model.
    recal = promotion_costs(model, ["conv1_silu"], calibration.arch)
    assert recal["conv1_silu"] != pytest.approx(promotion_costs(model, ["conv1_silu"], "75")["conv1_silu"])


def test_recalibration_refuses_emulator_time_unless_asked(recorded):
    model, profile, total_ms = recorded
    with pytest.raises(MpstudioError, match="not device latency"):
        calibrate([(model, profile, total_ms)], "75")
    with pytest.raises(MpstudioError, match="at least one"):
        calibrate([], "75")
    without = dataclasses.replace(profile, ops=())
    with pytest.raises(MpstudioError, match="no profiled op"):
        calibrate([(model, without, total_ms)], "75", allow_emulator=True)


# ---- stored with a study ----------------------------------------------------------------------------------------
def test_a_study_keeps_scope_and_interval_and_reads_rows_stored_before_them(tmp_path, single_conv):
    import sqlite3

    from mpstudio.store import AccuracyRecord, StudyStore

    path = tmp_path / "study.sqlite"
    # A store written before scopes and intervals existed: its latency table lacks their columns.
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE latency (id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL, source TEXT NOT NULL,"
                " place TEXT NOT NULL, ms REAL NOT NULL, detail TEXT NOT NULL, created REAL NOT NULL,"
                " UNIQUE (plan_id, source, place))")
    old.execute("INSERT INTO latency (plan_id, source, place, ms, detail, created) VALUES"
                " (1, 'estimate', 'HTP v75 (cost model)', 0.5, 'QDQ', 0)")
    old.commit()
    old.close()
    store = StudyStore(path)
    try:
        first = store.add_plan("h1", "old", "user", {}, 0)
        assert first == 1
        accuracy = AccuracyRecord("cpu", "ORT CPU QDQ", "snr", 30.0, True, 30.0, 1.0, 4, 0.1)
        store.record(first, accuracy)
        stored = store.evaluation(first, "ORT CPU QDQ").latency("estimate")
        assert stored.includes == WITH_CPU_IO and stored.low_ms is None
        assert stored.label == "estimate, HTP v75 cost model, HTP + CPU graph I/O"
        second = store.add_plan("h2", "new", "user", {}, 0)
        estimate = estimate_latency(single_conv[0], "75")
        store.record(second, accuracy, [estimate.latency])
        assert store.evaluation(second, "ORT CPU QDQ").latency("estimate") == estimate.latency
        frame = store.evaluations().set_index("name")
        assert frame.loc["new", "latency_low_ms"] == pytest.approx(estimate.latency.low_ms)
        assert math.isnan(frame.loc["old", "latency_high_ms"])
        assert frame.loc["new", "latency_label"].endswith("HTP + CPU graph I/O")
    finally:
        store.close()
