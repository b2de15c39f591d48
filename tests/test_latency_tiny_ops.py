"""Mechanism `tiny_ops` (on by default since issue 22; docs/latency.md, "Fit"): an op whose operands fit one 64 KB
tile pays a quarter of the fixed per-op cost; a larger op pays all of it."""

from __future__ import annotations

import pytest
from conftest import IR
from onnx import TensorProto, helper

from mpstudio.latency import estimate_latency
from mpstudio.latency.features import TINY_BYTES, TINY_SHARE
from mpstudio.latency.ops import MECHANISMS


def _add(side: int):
    """Two float [1, 16, side, side] activations added (fp16 on the HTP: 3 x 16 x side^2 x 2 bytes moved)."""
    shape = [1, 16, side, side]
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "m",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("a", "b")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


@pytest.mark.parametrize("side, tiny", [(8, True), (64, False)])
def test_only_an_op_within_one_tile_pays_less_fixed_cost(monkeypatch, side, tiny):
    assert (3 * 16 * side * side * 2 <= TINY_BYTES) == tiny
    monkeypatch.setitem(MECHANISMS, "tiny_ops", False)
    off = estimate_latency(_add(side)).ops.set_index("node").loc["add"]
    monkeypatch.setitem(MECHANISMS, "tiny_ops", True)
    on = estimate_latency(_add(side)).ops.set_index("node").loc["add"]
    assert on["overhead_ms"] == pytest.approx(off["overhead_ms"] * (TINY_SHARE if tiny else 1.0))
    assert on["compute_ms"] == pytest.approx(off["compute_ms"]) and on["memory_ms"] == pytest.approx(off["memory_ms"])


def test_switched_on_by_default():
    # On since issue 22 (60 -> 59 cross-validated rows outside with depthwise_tap_groups: docs/latency.md, "Fit").
    assert MECHANISMS["tiny_ops"]
