"""Mechanism `batchnorm_before_conv` (docs/latency.md, "Fit"): an fp16 BatchNorm (with the clamp fused into it)
whose every reader is a convolution is applied as those convolutions stage their input: no pass of its own. A
BatchNorm read by anything else, or a quantized one, still runs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_latency_mechanisms_more import _model

from mpstudio.latency import estimate_latency
from mpstudio.latency.ops import MECHANISMS

SHAPE = [1, 64, 56, 56]


def _batchnorm_relu(reader: str):
    """A BatchNorm and a Relu of a graph input (DenseNet's after each join), read by a 1x1 Conv or a MaxPool."""
    channels = SHAPE[1]
    consts = {"gamma": np.ones(channels, np.float32), "beta": np.zeros(channels, np.float32),
              "mean": np.zeros(channels, np.float32), "var": np.ones(channels, np.float32),
              "w": np.full((channels, channels, 1, 1), 0.01, np.float32)}
    nodes = [helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu")]
    if reader == "conv":
        nodes.append(helper.make_node("Conv", ["r", "w"], ["y"], name="conv"))
    else:
        nodes.append(helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[1, 1], name="pool"))
    return _model(nodes, consts, [("x", SHAPE)], SHAPE)


def test_an_fp16_batchnorm_before_a_convolution_runs_in_it(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "batchnorm_before_conv", False)
    off = estimate_latency(_batchnorm_relu("conv"))
    bn_off = off.ops.set_index("node").loc["bn"]
    assert bn_off["engine"] == "hvx" and bn_off["ms"] > 0
    monkeypatch.setitem(MECHANISMS, "batchnorm_before_conv", True)
    on = estimate_latency(_batchnorm_relu("conv"))
    bn_on = on.ops.set_index("node").loc["bn"]
    assert bn_on["engine"] == "fused" and bn_on["ms"] == 0
    assert on.htp_ms == pytest.approx(off.htp_ms - bn_off["ms"])


def test_a_batchnorm_read_by_a_pool_still_runs(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "batchnorm_before_conv", True)
    bn = estimate_latency(_batchnorm_relu("pool")).ops.set_index("node").loc["bn"]
    assert bn["engine"] == "hvx" and bn["ms"] > 0
