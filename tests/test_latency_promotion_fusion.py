"""Promotion costs price the fusions a promotion breaks: an activation fused into (or overlapping with) the op
before it at 8 bits runs as an op of its own once a convert stands between them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR
from onnx import TensorProto, helper, numpy_helper

from mpstudio.data import FeedList
from mpstudio.latency import estimate_latency, promotion_costs
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer

SHAPE = (1, 32, 16, 16)


def _leaky_silu_model():
    """x -> Conv -> c -> LeakyRelu -> m -> m * Sigmoid(m) -> y -> Conv -> out: at 8 bits the LeakyRelu fuses into
    the first Conv and the SiLU overlaps with it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, (32, 32, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, (32, 32, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c"], ["m"], name="leaky", alpha=0.1),
             helper.make_node("Sigmoid", ["m"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["m", "s"], ["y"], name="silu"),
             helper.make_node("Conv", ["y", "w2"], ["out"], name="conv2")]
    graph = helper.make_graph(nodes, "leaky_silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


@pytest.fixture(scope="module")
def leaky_silu(tmp_path_factory):
    feeds = [{"x": np.random.default_rng(i).normal(0, 1, SHAPE).astype(np.float32)} for i in range(2)]
    q = Quantizer(prepare_model(_leaky_silu_model()), FeedList(feeds), tmp_path_factory.mktemp("leaky-silu"))
    return q, q.generate(PrecisionPlan.a8w8())


def _running(ops, node):
    return ops[(ops["node"] == node) & (ops["kind"] == "compute")].iloc[0]


def test_the_8_bit_plan_fuses_the_leaky_relu_and_overlaps_the_silu(leaky_silu):
    _, a8 = leaky_silu
    ops = estimate_latency(a8).ops
    assert _running(ops, "leaky")["engine"] == "fused"
    silu = _running(ops, "silu")
    assert silu["op_type"] == "SiLU" and silu["hidden_ms"] > 0


@pytest.mark.parametrize("arch", ["73", "75", "79"])
def test_promotion_costs_price_the_fusions_a_promotion_breaks(leaky_silu, arch):
    q, a8 = leaky_silu
    tensors = ["c", "m", "s", "y"]
    costs = promotion_costs(a8, tensors, arch, graph=q.graph)
    base = estimate_latency(a8, arch).ms
    for tensor in tensors:
        regenerated = estimate_latency(q.generate(PrecisionPlan.a8w8().promote([tensor])), arch)
        assert costs[tensor] == pytest.approx(regenerated.ms - base, rel=0.02), tensor
        ops = regenerated.ops
        if tensor == "m":  # the LeakyRelu computes at 16 bits behind a convert: an op of its own, and the SiLU with it
            assert _running(ops, "leaky")["engine"] == "hvx" and _running(ops, "silu")["hidden_ms"] == 0
        if tensor == "s":  # the SiLU computes at 16 bits, the Conv at 8: no overlap across the convert
            assert _running(ops, "leaky")["engine"] == "fused" and _running(ops, "silu")["hidden_ms"] == 0
        if tensor == "c":  # the Conv and the LeakyRelu at 16 bits, the SiLU at 8: the LeakyRelu still fuses
            assert _running(ops, "leaky")["engine"] == "fused" and _running(ops, "silu")["hidden_ms"] == 0
        if tensor == "y":  # the SiLU and the second Conv at 16 bits, the first Conv at 8
            assert _running(ops, "leaky")["engine"] == "fused" and _running(ops, "silu")["hidden_ms"] == 0
