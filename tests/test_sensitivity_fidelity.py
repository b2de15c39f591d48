"""The switchable model against the real regenerated QDQ models, run with the same numerics
(`float_qdq_session`: quantization simulated in float on ORT's CPU EP)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR
from mpstudio.data import FeedList
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.sensitivity import SwitchableModel
from mpstudio.sensitivity.isolation import float_qdq_session


def _mechanisms_model() -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv -> hard-swish -> Conv -> Relu -> Conv -> Reshape -> Slice -> Transpose -> swish -> y.

    It holds every way a real plan quantizes an edge differently from "the tensor at 8 or 16 bits": a Clip
    and a Relu ORT folds into the op before them (kept when a convert touches them), biases that follow their
    input's scale, tensors written with their input's parameters (Reshape, Slice, Transpose) whose converts
    use their own range, a Sigmoid whose 16-bit output has QNN's fixed parameters, and 16-bit outputs
    converted back to 8 bits (rounded twice).
    """
    rng = np.random.default_rng(3)

    def weight(name, shape, std=0.3):
        return numpy_helper.from_array(rng.normal(0, std, shape).astype(np.float32), name)

    def value(name, data, dtype=np.float32):
        return numpy_helper.from_array(np.array(data, dtype), name)

    inits = [weight("w1", (8, 3, 3, 3)), weight("b1", (8,), 0.1), weight("w2", (8, 8, 3, 3), 0.15),
             weight("b2", (8,), 0.1), weight("w3", (8, 8, 1, 1)), weight("b3", (8,), 0.2), value("three", 3.0),
             value("zero", 0.0), value("six", 6.0), value("shape", [1, 2, 4, 64], np.int64),
             value("start", [0], np.int64), value("end", [1], np.int64), value("axis", [1], np.int64)]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], name="/a/conv1", pads=[1, 1, 1, 1]),
        node("Add", ["c1", "three"], ["c1_3"], name="/a/add3"),
        node("Clip", ["c1_3", "zero", "six"], ["gate"], name="/a/clip"),
        node("Mul", ["c1", "gate"], ["hs6"], name="/a/mul"),
        node("Div", ["hs6", "six"], ["hs"], name="/a/div"),
        node("Conv", ["hs", "w2", "b2"], ["c2"], name="/b/conv2", pads=[1, 1, 1, 1]),
        node("Relu", ["c2"], ["r2"], name="/b/relu"),
        node("Conv", ["r2", "w3", "b3"], ["c3"], name="/b/conv3"),
        node("Reshape", ["c3", "shape"], ["rs"], name="/c/reshape"),
        node("Slice", ["rs", "start", "end", "axis"], ["sl"], name="/c/slice"),
        node("Transpose", ["sl"], ["tr"], name="/c/transpose", perm=[0, 1, 3, 2]),
        node("Sigmoid", ["tr"], ["sg"], name="/c/sigmoid"),
        node("Mul", ["tr", "sg"], ["y"], name="/c/swish"),
    ]
    graph = helper.make_graph(nodes, "mechanisms",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 64, 4])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def mechanisms(tmp_path_factory):
    prepared = prepare_model(_mechanisms_model())
    quantizer = Quantizer(prepared, FeedList(_feeds(6, seed=0)), tmp_path_factory.mktemp("mechanisms"))
    return quantizer, SwitchableModel.from_quantizer(quantizer)


def _largest_difference(quantizer, switchable, plan, config, samples) -> float:
    real = float_qdq_session(quantizer.generate(plan))
    return max(float(np.max(np.abs(real.run(None, s)[0] - switchable.run(s, config)[0]))) for s in samples)


def test_every_single_promotion_and_demotion_matches_its_regenerated_model(mechanisms):
    quantizer, switchable = mechanisms
    samples = _feeds(4, seed=9)
    # Within two 16-bit steps of the output; the mechanisms above each move outputs by 8-bit steps (about
    # 0.02 here) when they are missed.
    tolerance = 2 * switchable.params_16["y"].step
    assert set(switchable.tensors) >= {"gate", "r2", "c3", "rs", "sl", "sg"}
    for tensor in switchable.tensors:
        promoted = _largest_difference(quantizer, switchable, PrecisionPlan.a8w8().promote([tensor]), [tensor], samples)
        assert promoted <= tolerance, f"promoting {tensor}: {promoted}"
        others = set(switchable.tensors) - {tensor}
        demoted = _largest_difference(quantizer, switchable, PrecisionPlan.a16w8().promote([tensor], to="uint8"),
                                      others, samples)
        assert demoted <= tolerance, f"demoting {tensor}: {demoted}"
    assert _largest_difference(quantizer, switchable, PrecisionPlan.a16w8(), switchable.tensors, samples) <= tolerance


def test_promotions_resolve_the_way_ort_writes_them(mechanisms):
    _, switchable = mechanisms
    a8 = switchable.params_8
    # Promoting the Mul's output converts the Mul's inputs to 16 bits. The Clip ORT folds into the Add before
    # it then stays in the graph, behind the Add's 8-bit output: the Mul reads 8-bit values on a 16-bit grid.
    gate = dict(switchable.setting(["hs6"]).quant)[("gate", "/a/mul")]
    assert gate.bits == 8 and gate.params.step == pytest.approx(a8["gate"].step)
    assert gate.scale < a8["gate"].step / 200
    # conv3's bias follows the scale its input arrives with.
    assert any(b.edge == ("r2", "/b/conv3") for b in switchable._biases)
    feed = switchable.parameter_feed(switchable.setting(["r2"]))
    assert "mpstudio_switch/bias/b3" in feed
    # Promoting c3 makes the Reshape write rs at 16 bits with c3's parameters; the Slice reads it converted
    # to 8 bits with rs's own range, rounded twice.
    rs = dict(switchable.setting(["c3"]).quant)[("rs", "/c/slice")]
    assert rs.first.bits == 16 and rs.second is not None and rs.second.bits == 8 and rs.bits == 8


def test_demo_promotions_match_their_regenerated_models(demo, demo_quantizer):
    # The tensors whose isolation scores disagreed most with the naive loop before the switchable model
    # followed ORT's folding, shared parameters, biases, opset and kernels.
    switchable = SwitchableModel.from_quantizer(demo_quantizer)
    sample = demo.evaluation.sample(0)
    for tensor in ("p2o.Clip.49", "depthwise_conv2d_11.tmp_0", "depthwise_conv2d_4.tmp_0"):
        real = float_qdq_session(demo_quantizer.generate(PrecisionPlan.a8w8().promote([tensor])))
        np.testing.assert_array_equal(switchable.run(sample, [tensor])[0], real.run(None, sample)[0], tensor)
