"""Mechanism `vector_add_folds` (issue 22's third round; docs/latency.md, "Fit"): an Add of a matrix op's output
and an activation of one value per output column (an attention mask [1, 1, 1, S] after the query-key MatMul) is a
bias the matrix unit's output stage adds as it writes; an Add of two whole tensors (a residual) still runs on the
vector unit."""

from __future__ import annotations

import pytest
from onnx import helper
from test_latency_mechanisms_more import _model

from mpstudio.latency import estimate_latency
from mpstudio.latency.ops import MECHANISMS

HEADS, TOKENS, DEPTH = 12, 128, 64


def _scores_plus(other_shape):
    """Query [1, H, S, D] x key^T [1, H, D, S] -> scores [1, H, S, S], + an activation of `other_shape`, Softmax."""
    scores = [1, HEADS, TOKENS, TOKENS]
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Add", ["s", "m"], ["a"], name="mask"),
             helper.make_node("Softmax", ["a"], ["y"], axis=-1, name="softmax")]
    inputs = [("q", [1, HEADS, TOKENS, DEPTH]), ("kt", [1, HEADS, DEPTH, TOKENS]), ("m", other_shape)]
    return _model(nodes, {}, inputs, scores)


@pytest.mark.parametrize("other_shape, folds", [([1, 1, 1, TOKENS], True), ([1, HEADS, TOKENS, TOKENS], False)])
def test_an_add_of_one_value_per_output_column_folds_into_the_matrix_op(monkeypatch, other_shape, folds):
    monkeypatch.setitem(MECHANISMS, "vector_add_folds", False)
    off = estimate_latency(_scores_plus(other_shape))
    monkeypatch.setitem(MECHANISMS, "vector_add_folds", True)
    on = estimate_latency(_scores_plus(other_shape))
    add_off, add_on = off.ops.set_index("node").loc["mask"], on.ops.set_index("node").loc["mask"]
    assert add_off["engine"] == "hvx" and add_off["ms"] > 0
    if folds:
        # The mask is the MatMul's bias: no vector pass over the 12 x 128 x 128 scores, no op of its own.
        assert add_on["engine"] == "fused" and add_on["ms"] == 0
        assert on.htp_ms == pytest.approx(off.htp_ms - add_off["ms"])
    else:
        # A whole tensor added (a residual) is no bias: the vector unit adds it, as without the mechanism.
        assert add_on["engine"] == "hvx" and add_on["ms"] == pytest.approx(add_off["ms"])
    # The MatMul and the Softmax are priced as before.
    for node in ("qk", "softmax"):
        assert on.ops.set_index("node").loc[node, "ms"] == pytest.approx(off.ops.set_index("node").loc[node, "ms"])


def test_switched_on_by_default():
    # On since issue 22's third round (50 -> 49 cross-validated rows outside), with channels_last_transpose
    # (49 -> 48): docs/latency.md, "Fit".
    assert MECHANISMS["vector_add_folds"] and MECHANISMS["channels_last_transpose"]
