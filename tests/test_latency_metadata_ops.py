"""Mechanism `metadata_ops_free` (on since issue 22's third round; docs/latency.md, "Fit"): an op that moves no data
(a Reshape, Flatten, Squeeze…, a float Concat its producers write in place) never runs on the HTP, so it has no fixed
cost; an op that moves data keeps its own."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_latency_mechanisms_more import _concat, _model

from mpstudio.latency import estimate_latency
from mpstudio.latency.ops import MECHANISMS


def _reshape_between_convs():
    """Conv -> Reshape (the same elements, another shape) -> Reshape back -> Conv, float."""
    rng = np.random.default_rng(0)
    consts = {"w0": rng.normal(0, 0.05, (64, 64, 1, 1)).astype(np.float32),
              "w1": rng.normal(0, 0.05, (64, 64, 1, 1)).astype(np.float32),
              "flat": np.array([1, 64, 56 * 56], dtype=np.int64), "back": np.array([1, 64, 56, 56], dtype=np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0"),
             helper.make_node("Reshape", ["c0", "flat"], ["r0"], name="flatten"),
             helper.make_node("Reshape", ["r0", "back"], ["r1"], name="unflatten"),
             helper.make_node("Conv", ["r1", "w1"], ["y"], name="conv1")]
    return _model(nodes, consts, [("x", [1, 64, 56, 56])], [1, 64, 56, 56])


def test_a_reshape_has_no_fixed_cost(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "metadata_ops_free", False)
    off = estimate_latency(_reshape_between_convs())
    monkeypatch.setitem(MECHANISMS, "metadata_ops_free", True)
    on = estimate_latency(_reshape_between_convs())
    rows_off, rows_on = off.ops.set_index("node"), on.ops.set_index("node")
    reshapes = ["flatten", "unflatten"]
    assert (rows_off.loc[reshapes, "engine"] == "none").all()
    # Without the mechanism each reshape pays the fixed cost of an op; with it, nothing.
    assert (rows_off.loc[reshapes, "overhead_ms"] > 0).all() and (rows_off.loc[reshapes, "memory_ms"] == 0).all()
    assert (rows_on.loc[reshapes, "ms"] == 0).all()
    # The convolutions, which move data, keep their cost; the model is cheaper by the reshapes' fixed costs.
    convs = ["conv0", "conv1"]
    assert rows_on.loc[convs, "ms"].to_numpy() == pytest.approx(rows_off.loc[convs, "ms"].to_numpy())
    assert on.htp_ms == pytest.approx(off.htp_ms - rows_off.loc[reshapes, "ms"].sum())


def test_a_float_concat_in_place_has_no_fixed_cost_and_a_quantized_one_keeps_it(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "concat_in_place", True)
    costs = {}
    for free in (False, True):
        monkeypatch.setitem(MECHANISMS, "metadata_ops_free", free)
        for quantized in (False, True):
            costs[free, quantized] = estimate_latency(_concat(quantized)).ops.set_index("node").loc["concat"]
    assert costs[False, False]["engine"] == "none" and costs[False, False]["overhead_ms"] > 0
    assert costs[True, False]["ms"] == 0
    # A quantized Concat requantizes and moves its inputs: it runs, and pays its fixed cost either way.
    assert costs[True, True]["engine"] == "dma"
    assert costs[True, True]["overhead_ms"] > 0
    assert costs[True, True]["overhead_ms"] == pytest.approx(costs[False, True]["overhead_ms"])


def test_switched_on_by_default():
    # On since issue 22's third round (53 -> 50 cross-validated rows outside: docs/latency.md, "Fit").
    assert MECHANISMS["metadata_ops_free"]
