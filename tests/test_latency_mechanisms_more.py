"""Three more switchable mechanisms of the cost formulas (docs/latency.md, "Mechanisms"): a float Concat is written
in place by its producers (`concat_in_place`), and a SiLU after a depthwise convolution overlaps with it
(`silu_after_depthwise`, on by default), and a depthwise convolution's work grows with groups of four taps
(`depthwise_tap_groups`, on by default). Each is compared with the same model where it is off or cannot apply."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR
from onnx import TensorProto, helper, numpy_helper

from mpstudio.latency import estimate_latency
from mpstudio.latency.ops import MECHANISMS


def _model(nodes, consts, inputs, out_shape):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _concat(quantized: bool):
    """Two activations joined on channels; quantized: each through its own QDQ (scales 0.02 and 0.05) and the
    joined tensor through a third (0.05), as a quantizer that does not unify Concat scales writes it."""
    shape = [1, 64, 56, 56]
    consts = {f"s{i}": np.float32(s) for i, s in enumerate((0.02, 0.05, 0.05))}
    consts.update({f"z{i}": np.uint8(128) for i in range(3)})
    nodes, joined = [], ["a", "b"]
    if quantized:
        for i, name in enumerate(("a", "b")):
            nodes += [helper.make_node("QuantizeLinear", [name, f"s{i}", f"z{i}"], [f"{name}_q"], name=f"q{i}"),
                      helper.make_node("DequantizeLinear", [f"{name}_q", f"s{i}", f"z{i}"], [f"{name}_d"],
                                       name=f"dq{i}")]
        joined = ["a_d", "b_d"]
    nodes.append(helper.make_node("Concat", joined, ["c" if quantized else "y"], axis=1, name="concat"))
    if quantized:
        nodes += [helper.make_node("QuantizeLinear", ["c", "s2", "z2"], ["c_q"], name="q2"),
                  helper.make_node("DequantizeLinear", ["c_q", "s2", "z2"], ["y"], name="dq2")]
    return _model(nodes, consts, [("a", shape), ("b", shape)], [1, 128, 56, 56])


def test_float_concat_moves_no_data(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "concat_in_place", False)
    moved = estimate_latency(_concat(quantized=False)).ops.set_index("node").loc["concat"]
    assert moved["engine"] == "dma" and moved["memory_ms"] > 0
    monkeypatch.setitem(MECHANISMS, "concat_in_place", True)
    free = estimate_latency(_concat(quantized=False)).ops.set_index("node").loc["concat"]
    assert free["engine"] == "none" and free["memory_ms"] == 0
    # What remains is the op's fixed cost.
    assert free["ms"] == pytest.approx(free["overhead_ms"]) and free["ms"] < moved["ms"]


def test_quantized_concat_still_moves_its_inputs(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "concat_in_place", True)
    row = estimate_latency(_concat(quantized=True)).ops.set_index("node").loc["concat"]
    assert row["act_type"] == "uint8"
    assert row["engine"] == "dma" and row["memory_ms"] > 0


def _depthwise_silu(through_relu: bool):
    c = 96
    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(0, 0.1, (c, 1, 5, 5)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["d"], group=c, pads=[2, 2, 2, 2], name="dw")]
    source = "d"
    if through_relu:  # a vector op of its own between them: nothing to overlap with
        nodes.append(helper.make_node("Abs", ["d"], ["r"], name="abs"))
        source = "r"
    nodes += [helper.make_node("Sigmoid", [source], ["g"], name="sig"),
              helper.make_node("Mul", [source, "g"], ["y"], name="silu")]
    return _model(nodes, consts, [("x", [1, c, 80, 80])], [1, c, 80, 80])


def test_silu_after_depthwise_overlaps_with_it(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "silu_after_depthwise", True)
    rows = estimate_latency(_depthwise_silu(through_relu=False)).ops.set_index("node")
    assert rows.loc["silu", "op_type"] == "SiLU" and rows.loc["dw", "op_class"] == "depthwise"
    assert rows.loc["silu", "hidden_ms"] > 0
    # The smaller of the two busy times is hidden (overlap <= 1): never more than the SiLU's own.
    assert rows.loc["silu", "ms"] >= rows.loc["silu", "overhead_ms"] - 1e-12
    apart = estimate_latency(_depthwise_silu(through_relu=True)).ops.set_index("node")
    assert apart.loc["silu", "hidden_ms"] == 0


def test_silu_after_depthwise_is_on_by_default_and_can_be_switched_off(monkeypatch):
    assert estimate_latency(_depthwise_silu(through_relu=False)).ops.set_index("node").loc["silu", "hidden_ms"] > 0
    monkeypatch.setitem(MECHANISMS, "silu_after_depthwise", False)
    assert estimate_latency(_depthwise_silu(through_relu=False)).ops.set_index("node").loc["silu", "hidden_ms"] == 0


def test_concat_in_place_is_on_by_default():
    # On since issue 22's second round, with clamp_after_vector (59 -> 56 cross-validated rows outside).
    assert estimate_latency(_concat(quantized=False)).ops.set_index("node").loc["concat", "engine"] == "none"


def test_depthwise_tap_groups_is_on_by_default():
    # On since issue 22 (70 -> 60 cross-validated rows outside: docs/latency.md, "Fit").
    assert MECHANISMS["depthwise_tap_groups"]


def _depthwise(k: int):
    c = 96
    consts = {"w": np.random.default_rng(0).normal(0, 0.1, (c, 1, k, k)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=c, pads=[k // 2] * 4, name="dw")]
    return _model(nodes, consts, [("x", [1, c, 80, 80])], [1, c, 80, 80])


def _dw_compute(k: int) -> float:
    return float(estimate_latency(_depthwise(k)).ops.set_index("node").loc["dw", "compute_ms"])


def test_depthwise_work_grows_with_tap_groups(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "depthwise_tap_groups", False)
    assert _dw_compute(5) / _dw_compute(3) == pytest.approx(25 / 9)
    monkeypatch.setitem(MECHANISMS, "depthwise_tap_groups", True)
    # ceil(25 / 4) + 1 = 8 steps against ceil(9 / 4) + 1 = 4; 7x7: 14 against 4.
    assert _dw_compute(5) / _dw_compute(3) == pytest.approx(2.0)
    assert _dw_compute(7) / _dw_compute(3) == pytest.approx(3.5)
