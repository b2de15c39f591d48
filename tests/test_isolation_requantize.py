"""The switchable model follows the HTP's requantization (`htp_requantize`) as the regenerated plans' CPU numerics
do: Conv and Gemm at 8 bits, an Add of two activations and an Add of a constant at 8 or 16 bits, each covered in
some plans and not in others, with the scales and zero points each plan gives them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR
from mpstudio import runtime
from mpstudio.data import FeedList
from mpstudio.loop.runners import CPU_SOURCE
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.sensitivity import SwitchableModel
from mpstudio.sensitivity.isolation import float_qdq_session
from mpstudio.sources import superseded_source


def _residual_model() -> onnx.ModelProto:
    """x[1,4,6,6] -> Conv -> Relu -> Conv -> Add(residual) -> Add(constant [1,4,1,1]) -> Reshape -> Gemm -> y."""
    rng = np.random.default_rng(5)

    def init(name, shape, std=0.3, dtype=np.float32):
        return numpy_helper.from_array(rng.normal(0, std, shape).astype(dtype), name)

    inits = [init("w1", (4, 4, 3, 3)), init("b1", (4,), 0.1), init("w2", (4, 4, 3, 3), 0.2), init("b2", (4,), 0.1),
             init("offset", (1, 4, 1, 1), 0.5), init("wg", (144, 10), 0.1), init("bg", (10,), 0.1),
             numpy_helper.from_array(np.array([1, 144], np.int64), "shape")]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], name="/conv1", pads=[1, 1, 1, 1]),
        node("Relu", ["c1"], ["r1"], name="/relu1"),
        node("Conv", ["r1", "w2", "b2"], ["c2"], name="/conv2", pads=[1, 1, 1, 1]),
        node("Add", ["c2", "c1"], ["res"], name="/residual"),
        node("Add", ["res", "offset"], ["shifted"], name="/offset"),
        node("Reshape", ["shifted", "shape"], ["flat"], name="/flatten"),
        node("Gemm", ["flat", "wg", "bg"], ["y"], name="/gemm"),
    ]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 4, 6, 6)).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    quantizer = Quantizer(prepare_model(_residual_model()), FeedList(_feeds(6, seed=0)),
                          tmp_path_factory.mktemp("residual"))
    return quantizer, SwitchableModel.from_quantizer(quantizer)


def _configurations(switchable):
    """Every single promotion from all-8-bit and demotion from all-16-bit: (plan, the tensors at 16 bits)."""
    for tensor in switchable.tensors:
        yield PrecisionPlan.a8w8().promote([tensor]), [tensor]
        yield PrecisionPlan.a16w8().promote([tensor], to="uint8"), set(switchable.tensors) - {tensor}


def _mismatches(quantizer, switchable, samples) -> list[str]:
    out = []
    for plan, sixteen in _configurations(switchable):
        real = float_qdq_session(quantizer.generate(plan))
        if any(not np.array_equal(real.run(None, s)[0], switchable.run(s, sixteen)[0]) for s in samples):
            out.append(plan.name)
    return out


def test_the_switchable_model_computes_the_regenerated_plans_requantization(residual):
    quantizer, switchable = residual
    rules = {rule.prefix.split("/")[-2] for rule in switchable._requantize.rules}
    assert rules == {"c1", "c2", "res", "shifted", "y_QuantizeLinear_Input"}
    assert _mismatches(quantizer, switchable, _feeds(3, seed=9)) == []


def test_without_the_rules_the_switchable_model_misses_the_plans(residual, monkeypatch):
    quantizer, _ = residual
    monkeypatch.setattr(runtime, "FOLLOW_HTP_REQUANTIZATION", False)
    plain = SwitchableModel.from_quantizer(quantizer)
    monkeypatch.setattr(runtime, "FOLLOW_HTP_REQUANTIZATION", True)
    assert not plain._requantize.rules
    assert len(_mismatches(quantizer, plain, _feeds(3, seed=9))) > len(plain.tensors)


def test_a_configuration_switches_only_the_rules_it_touches(residual):
    _, switchable = residual
    feed = switchable.parameter_feed(switchable.setting(["res"]))
    # the residual Add's output at 16 bits takes its operands to 16 bits: both Adds follow the 16-bit rule, with
    # multipliers below 2^15 and their own constants; the constant Add reads its 16-bit constant's step
    assert not any(name.endswith("/on") for name in feed)
    for add in ("res", "shifted"):
        prefix = f"mpstudio_switch/requantize/{add}/"
        assert max(feed[prefix + "m_a"], feed[prefix + "m_b"]) < 2 ** 15 <= feed[prefix + "shift"] * 2
    default_step = switchable._requantize.defaults["mpstudio_switch/requantize/shifted/b_step"]
    assert 0 < feed["mpstudio_switch/requantize/shifted/b_step"] < default_step / 200
    assert not any(name.startswith("mpstudio_switch/requantize/c2/") for name in feed)
    assert switchable.parameter_feed(switchable.setting([])) == {}


def test_results_of_the_numerics_before_requantization_are_superseded():
    assert superseded_source("ORT CPU QDQ (fake-quant, HTP weights, input rounding and accumulators)")
    assert superseded_source("ORT CPU QDQ (fake-quant, HTP weights, input rounding, accumulators and requantization)")
    assert not superseded_source(CPU_SOURCE)
