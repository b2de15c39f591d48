"""Mechanism `batchnorm_split` (on by default; docs/latency.md, "Fit"): a quantized BatchNorm that nothing before
it folds runs as a multiply and an add, a second vector pass with a fixed cost of its own; an fp16 one stays one
multiply-add."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_latency_mechanisms_more import _model

from mpstudio.latency import estimate_latency
from mpstudio.latency.ops import MECHANISMS

SHAPE = [1, 64, 56, 56]


def _batchnorm(quantized: bool):
    """A BatchNorm, then a Relu, of a graph input (as DenseNet's after a join); quantized: QDQ around both."""
    channels = SHAPE[1]
    consts = {"gamma": np.ones(channels, np.float32), "beta": np.zeros(channels, np.float32),
              "mean": np.zeros(channels, np.float32), "var": np.ones(channels, np.float32)}
    consts.update({f"s{i}": np.float32(0.02) for i in range(3)})
    consts.update({f"z{i}": np.uint8(128) for i in range(3)})
    nodes, x = [], "x"
    if quantized:
        nodes += [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["x_q"], name="q0"),
                  helper.make_node("DequantizeLinear", ["x_q", "s0", "z0"], ["x_d"], name="dq0")]
        x = "x_d"
    nodes.append(helper.make_node("BatchNormalization", [x, "gamma", "beta", "mean", "var"],
                                  ["n" if quantized else "b"], name="bn"))
    if quantized:
        nodes += [helper.make_node("QuantizeLinear", ["n", "s1", "z1"], ["n_q"], name="q1"),
                  helper.make_node("DequantizeLinear", ["n_q", "s1", "z1"], ["b"], name="dq1")]
    nodes.append(helper.make_node("Relu", ["b"], ["r" if quantized else "y"], name="relu"))
    if quantized:
        nodes += [helper.make_node("QuantizeLinear", ["r", "s2", "z2"], ["r_q"], name="q2"),
                  helper.make_node("DequantizeLinear", ["r_q", "s2", "z2"], ["y"], name="dq2")]
    return _model(nodes, consts, [("x", SHAPE)], SHAPE)


def test_a_quantized_batchnorm_adds_a_second_vector_pass(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "batchnorm_split", False)
    off = estimate_latency(_batchnorm(quantized=True))
    assert "bn shift" not in set(off.ops["node"])
    monkeypatch.setitem(MECHANISMS, "batchnorm_split", True)
    on = estimate_latency(_batchnorm(quantized=True))
    shift = on.ops.set_index("node").loc["bn shift"]
    # An 8-bit add over the BatchNorm's output, read and written once, with its own fixed cost.
    assert shift["engine"] == "hvx" and shift["op_class"] == "arith" and shift["act_type"] == "uint8"
    assert shift["elements"] == int(np.prod(SHAPE)) and shift["overhead_ms"] > 0
    assert on.htp_ms == pytest.approx(off.htp_ms + shift["ms"])


def test_an_fp16_batchnorm_stays_one_op(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "batchnorm_split", True)
    assert "bn shift" not in set(estimate_latency(_batchnorm(quantized=False)).ops["node"])


def test_switched_on_by_default():
    assert MECHANISMS["batchnorm_split"]
