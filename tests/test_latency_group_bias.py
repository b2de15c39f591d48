"""Two switchable mechanisms of the cost formulas (issue 22, fourth round; docs/latency.md, "Fit"): a grouped convolution packs
groups narrower than the matrix unit's channel block of 32 into one block (`group_packing`), and a constant Add after
a Gemm or MatMul folds into its output stage only when it is one value per output column (`bias_per_column`)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_latency_mechanisms_more import _model

from mpstudio.latency import estimate_latency
from mpstudio.latency.ops import MECHANISMS


def _grouped_conv(width: int, group_width: int):
    """A 3x3 convolution of `width` channels in groups of `group_width` (ResNeXt's 32 x 4d block: 128 in groups of 4)."""
    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(0, 0.05, (width, group_width, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=width // group_width, pads=[1] * 4)]
    return _model(nodes, consts, [("x", [1, width, 56, 56])], [1, width, 56, 56])


@pytest.mark.parametrize("group_width, saving", [(4, 8), (8, 4), (16, 2), (32, 1)])
def test_narrow_groups_share_a_channel_block(monkeypatch, group_width, saving):
    costs = {}
    for packing in (False, True):
        monkeypatch.setitem(MECHANISMS, "group_packing", packing)
        row = estimate_latency(_grouped_conv(128, group_width)).ops.set_index("node").loc["conv"]
        assert row["engine"] == "hmx"
        costs[packing] = row["compute_ms"]
    # Without packing each group fills a 32 x 32 tile alone: (32 / g)^2 its MACs; packed, 32 / g groups share one
    # tile on its diagonal: 32 / g its MACs. A group of 32 fills its tile either way.
    assert costs[False] / costs[True] == pytest.approx(saving)


def test_a_depthwise_convolution_is_not_packed(monkeypatch):
    rows = {}
    for packing in (False, True):
        monkeypatch.setitem(MECHANISMS, "group_packing", packing)
        rows[packing] = estimate_latency(_grouped_conv(128, 1)).ops.set_index("node").loc["conv"]
    assert rows[True]["engine"] == "hvx" and rows[True]["ms"] == pytest.approx(rows[False]["ms"])


def _matmul_plus_constant(constant_shape):
    """Scores [1, 12, 64, 64] = query x key^T (two activations), + a constant of `constant_shape`, then Softmax."""
    heads, tokens, depth = 12, 64, 64
    rng = np.random.default_rng(1)
    consts = {"c": rng.normal(0, 0.02, constant_shape).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Add", ["s", "c"], ["a"], name="bias"),
             helper.make_node("Softmax", ["a"], ["y"], axis=-1, name="softmax")]
    inputs = [("q", [1, heads, tokens, depth]), ("kt", [1, heads, depth, tokens])]
    return _model(nodes, consts, inputs, [1, heads, tokens, tokens])


@pytest.mark.parametrize("constant_shape, folds", [([64], True), ([1, 12, 64, 64], False)])
def test_only_a_bias_of_one_value_per_column_folds(monkeypatch, constant_shape, folds):
    rows = {}
    for on in (False, True):
        monkeypatch.setitem(MECHANISMS, "bias_per_column", on)
        rows[on] = estimate_latency(_matmul_plus_constant(constant_shape))
    add_off, add_on = (rows[on].ops.set_index("node").loc["bias"] for on in (False, True))
    # Without the mechanism every constant Add after a matrix op folds into it.
    assert add_off["engine"] == "fused" and add_off["ms"] == 0
    if folds:
        assert add_on["engine"] == "fused" and add_on["ms"] == 0
        assert rows[True].htp_ms == pytest.approx(rows[False].htp_ms)
    else:
        # A relative position bias [1, 12, S, S] is no bias of the output stage: a vector Add reading the constant.
        assert add_on["engine"] == "hvx" and add_on["ms"] > 0 and add_on["weight_bytes"] > 0
        assert rows[True].htp_ms > rows[False].htp_ms


def test_a_relative_position_bias_runs_as_its_own_add_by_default():
    row = estimate_latency(_matmul_plus_constant([1, 12, 64, 64])).ops.set_index("node").loc["bias"]
    assert row["engine"] == "hvx" and row["ms"] > 0


def test_switched_as_measured():
    # bias_per_column on (35 -> 34 cross-validated rows outside); group_packing off: it brings ResNeXt's four rows
    # in, but the refit moves more of the other architectures' rows out (35 -> 39): docs/latency.md, "Fit".
    assert MECHANISMS["bias_per_column"] and not MECHANISMS["group_packing"]
