"""Per-weight precision: int4 plans (JSON, validation, generation, HTP), the cost model's weight prices, and a
search that picks each weight's precision with the activations."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR, make_conv_model, conv_feeds, qnn_available, requires_qnn
from mpstudio import qdq
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.latency import estimate_latency, weight_costs
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan, TensorOverride
from mpstudio.quantize import Quantizer
from mpstudio.search import apply_steps, mixed_base, search
from mpstudio.sensitivity.weight_isolation import matrix_weights, weight_isolation
from mpstudio.study import Study

WIDTH = 1024


def make_mlp_model(layers: int = 4, seed: int = 0) -> onnx.ModelProto:
    """x[1,1024] -> `layers` x (/fcI/MatMul -> /fcI/Relu) -> /head/MatMul -> y[1,16], where fc3's weight is the
    sensitive one.

    Weights are uniform (int4 per channel keeps them to about 23 dB each), except fc3.weight: its first row is 40 while
    the rest are N(0, 0.1), and the input it meets in that row is always 0 (fc2's first column is zero, so
    its Relu output is 0). Per channel, int8 steps of 40/127 round nearly every real value to zero, int4 worse;
    int16 keeps them. By its own SNR the weight quantizes well at 8 bits (the 40s dominate its power), so
    only a measure at the outputs tells.
    """
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    previous = "x"
    for i in range(layers):
        bound = np.sqrt(3 / WIDTH)
        w = rng.uniform(-bound, bound, (WIDTH, WIDTH)).astype(np.float32)
        if i == 1:
            w[:, 0] = 0.0  # fc3 reads a dead input 0
        if i == 2:
            w = rng.normal(0, 0.1, (WIDTH, WIDTH)).astype(np.float32)
            w[0, :] = 40.0
        inits.append(numpy_helper.from_array(w, f"fc{i + 1}.weight"))
        nodes += [helper.make_node("MatMul", [previous, f"fc{i + 1}.weight"], [f"fc{i + 1}_out"], name=f"/fc{i + 1}/MatMul"),
                  helper.make_node("Relu", [f"fc{i + 1}_out"], [f"relu{i + 1}_out"], name=f"/fc{i + 1}/Relu")]
        previous = f"relu{i + 1}_out"
    head = rng.uniform(-np.sqrt(3 / WIDTH), np.sqrt(3 / WIDTH), (WIDTH, 16)).astype(np.float32)
    inits.append(numpy_helper.from_array(head, "head.weight"))
    nodes.append(helper.make_node("MatMul", [previous, "head.weight"], ["y"], name="/head/MatMul"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def mlp_feeds(n: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, WIDTH)).astype(np.float32)} for _ in range(n)]


def make_gemv_model(size: int = 1024, seed: int = 0) -> onnx.ModelProto:
    """x[1,size] -> /fc/MatMul(size x size) -> y: one big weight read once per inference (memory-bound)."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(0, 0.05, (size, size)).astype(np.float32), "fc.weight")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="/fc/MatMul")], "gemv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], initializer=[weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


@pytest.fixture
def mlp_quantizer(tmp_path):
    onnx.save(make_mlp_model(), tmp_path / "mlp.onnx")
    return Quantizer(prepare_model(tmp_path / "mlp.onnx"), FeedList(mlp_feeds(8)), tmp_path / "cache")


@pytest.fixture
def conv_quantizer(tmp_path):
    onnx.save(make_conv_model(), tmp_path / "conv.onnx")
    return Quantizer(prepare_model(tmp_path / "conv.onnx"), FeedList(conv_feeds(4)), tmp_path / "cache-conv")


def test_int4_plans_round_trip_and_are_checked(conv_quantizer, tmp_path):
    graph = conv_quantizer.graph
    plan = PrecisionPlan(weight_type="int8", per_channel=True).with_overrides(
        {"conv1.weight": "int4", "conv2.weight": TensorOverride("int4", per_channel=False)}, name="w4")
    plan.validate(graph, htp_arch=68)
    again = PrecisionPlan.load(plan.save(tmp_path / "plan.json"))
    assert again == plan and again.hash == plan.hash
    assert json.loads((tmp_path / "plan.json").read_text())["overrides"]["conv1.weight"] == {"type": "int4"}
    assert "2 int4" in plan.summary()
    scaled = helper.make_graph(
        [helper.make_node("Mul", ["x", "gain"], ["scaled"], name="/Mul"),
         helper.make_node("MatMul", ["scaled", "w"], ["y"], name="/MatMul")], "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(np.full((4,), 0.5, np.float32), "gain"),
                     numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")])
    onnx.save(helper.make_model(scaled, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR),
              tmp_path / "scaled.onnx")
    scaled_graph = prepare_model(tmp_path / "scaled.onnx").graph
    PrecisionPlan().with_overrides({"w": "int4"}).validate(scaled_graph)
    with pytest.raises(MpstudioError, match="int4 is for the weights of.*feeds Mul"):
        PrecisionPlan().with_overrides({"gain": "int4"}).validate(scaled_graph)  # an element-wise constant
    with pytest.raises(MpstudioError, match="cannot be int4"):
        PrecisionPlan().with_overrides({"conv1_out": "int4"}).validate(graph)
    with pytest.raises(MpstudioError, match="symmetric"):
        PrecisionPlan().with_overrides({"conv1.weight": TensorOverride("int4", symmetric=False)}).validate(graph)
    with pytest.raises(MpstudioError, match="set per weight"):
        PrecisionPlan(weight_type="int4")
    with pytest.raises(MpstudioError, match="unknown type 'int3'"):
        PrecisionPlan.from_json({"overrides": {"conv1.weight": {"type": "int3"}}})


def test_generation_gives_each_weight_its_type(mlp_quantizer):
    plan = PrecisionPlan(weight_type="int8", per_channel=True).with_overrides({
        "fc1.weight": "int4",
        "fc2.weight": TensorOverride("int8", per_channel=True),
        "fc3.weight": TensorOverride("int16", per_channel=True), "relu3_out": "uint16",
        "fc4.weight": TensorOverride("int4", per_channel=False),
    })
    params = qdq.read(mlp_quantizer.generate(plan)).params()
    got = {name: (params[name].encoding.dtype, params[name].encoding.axis) for name in
           ("fc1.weight", "fc2.weight", "fc3.weight", "fc4.weight", "head.weight")}
    assert got == {"fc1.weight": ("int4", 1), "fc2.weight": ("int8", 1), "fc3.weight": ("int16", 1),
                   "fc4.weight": ("int4", None), "head.weight": ("int8", None)}
    assert all(zp == 0 for zp in params["fc1.weight"].encoding.zero_point)  # symmetric
    # HTP computes a 16-bit weight at 16 bits only: without its activation the plan is refused up front.
    with pytest.raises(MpstudioError, match="computes at 8 bits"):
        mlp_quantizer.generate(PrecisionPlan().with_overrides({"fc3.weight": "int16"}))


@requires_qnn
def test_int4_weights_run_on_htp_without_fallback(mlp_quantizer, conv_quantizer):
    from mpstudio.runtime import create_session

    cases = [(conv_quantizer, {"conv1.weight": "int4", "conv2.weight": "int4"}, conv_feeds(1)[0]),
             (mlp_quantizer, {w: "int4" for w in matrix_weights(mlp_quantizer.graph)}, mlp_feeds(1)[0])]
    for quantizer, overrides, feed in cases:
        path = quantizer.generate(PrecisionPlan(weight_type="int8", per_channel=True).with_overrides(overrides))
        assert {p.encoding.dtype for n, p in qdq.read(path).params().items() if n in overrides} == {"int4"}
        reference = create_session(path, "cpu").run(None, feed)[0]
        # CPU fallback is disabled: a node HTP cannot take would fail the session.
        for arch in ("68", "75"):
            got = create_session(path, "htp", {"htp_arch": arch}).run(None, feed)[0]
            assert np.abs(got - reference).max() <= 0.05 * np.abs(reference).max() + 1e-6


def test_cost_model_prices_weight_precision(tmp_path):
    onnx.save(make_gemv_model(), tmp_path / "gemv.onnx")
    rng = np.random.default_rng(0)
    quantizer = Quantizer(prepare_model(tmp_path / "gemv.onnx"),
                          FeedList([{"x": rng.normal(size=(1, 1024)).astype(np.float32)} for _ in range(2)]),
                          tmp_path / "cache")
    plans = {"int4": {"fc.weight": "int4"}, "int8": {"fc.weight": TensorOverride("int8", per_channel=True)},
             "int16": {"fc.weight": TensorOverride("int16", per_channel=True), "y": "uint16", "x": "uint16"}}
    ms = {k: estimate_latency(quantizer.generate(PrecisionPlan().with_overrides(v))).htp_ms for k, v in plans.items()}
    assert ms["int4"] < ms["int8"] < ms["int16"]
    base = quantizer.generate(PrecisionPlan().with_overrides(plans["int8"]))
    costs = weight_costs(base, {"fc.weight": "int4"})
    assert costs["fc.weight"] < 0  # half the bytes
    up = weight_costs(base, {"fc.weight": "int16"}, activation_type="uint16")["fc.weight"]
    assert up > 0 and np.isnan(weight_costs(base, {"y": "int8"})["y"])
    # The step from int4 to int8 costs what the int8 model costs more.
    w4 = quantizer.generate(PrecisionPlan().with_overrides(plans["int4"]))
    assert weight_costs(w4, {"fc.weight": "int8"})["fc.weight"] == pytest.approx(ms["int8"] - ms["int4"], rel=1e-6)


def test_weight_isolation_sees_what_the_weights_own_snr_misses(mlp_quantizer):
    from mpstudio.sensitivity import weight_scores

    graph = mlp_quantizer.graph
    frame = weight_isolation(mlp_quantizer.float_path, graph, FeedList(mlp_feeds(4))).set_index("tensor")
    own = weight_scores(mlp_quantizer.prepared.model, graph).set_index("tensor")
    assert list(frame.index) == matrix_weights(graph) == ["fc1.weight", "fc2.weight", "fc3.weight", "fc4.weight",
                                                          "head.weight"]
    assert own.loc["fc3.weight", "snr_pc_8"] > 20  # "fine" by its own SNR ...
    assert frame.loc["fc3.weight", "output_snr_8"] < 10  # ... ruinous at the outputs
    assert frame.loc["fc3.weight", "output_snr_16"] > 40
    benign = frame.drop("fc3.weight")
    assert (benign["output_snr_4"] > 20).all() and (benign["output_snr_8"] > benign["output_snr_4"] + 15).all()


def test_mixed_search_keeps_int4_and_puts_int16_on_the_sensitive_weight(tmp_path):
    onnx.save(make_mlp_model(), tmp_path / "mlp.onnx")
    with Study.create(tmp_path / "study", tmp_path / "mlp.onnx", FeedList(mlp_feeds(16)),
                      FeedList(mlp_feeds(16, seed=7))) as study:
        result = search(study, 12.0, weights="mixed", max_evaluations=10)
        # Neither baseline reaches 12 dB: their per-tensor uint8 weights lose fc3 as well.
        assert all(e.value < 12.0 for e in result.baselines.values())
        assert result.reached and result.recommended.value >= 12.0
        plan = study.plan(result.recommended.plan_id)
        types = {w: plan.overrides[w].type for w in matrix_weights(study.graph)}
        assert types["fc3.weight"] == "int16" and plan.overrides["relu3_out"].type == "uint16"
        assert sum(t == "int4" for t in types.values()) >= 3  # int4 stays where it does little harm
        # ... and its bytes pay for the 16-bit weight: no dearer than all-8-bit by the cost model.
        a8 = result.baselines["a8w8"].latency("estimate").ms
        assert result.recommended.latency("estimate").ms <= a8
        assert "fc3.weight:int16" in result.order[:3]
        assert result.path[2].name == "a8w4-pc"  # the walk starts from int4 weights
        assert apply_steps(mixed_base(study.graph), []).overrides == mixed_base(study.graph).overrides
        if qnn_available():  # the pick runs on HTP as it is (CPU fallback disabled)
            from mpstudio.runtime import create_session

            session = create_session(study.quantizer.generate(plan), "htp", {"htp_arch": study.htp_arch})
            assert session.run(None, mlp_feeds(1)[0])[0].shape == (1, 16)
