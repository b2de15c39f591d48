"""Mechanism `concat_requantize` (on by default; docs/latency.md, "Fit"): a quantized Concat first requantizes its
inputs to its output's scale in an HVX pass of its own; a float Concat needs none."""

from __future__ import annotations

import pytest
from test_latency_mechanisms_more import _concat

from mpstudio.latency import estimate_latency
from mpstudio.latency.ops import MECHANISMS


def test_a_quantized_concat_requantizes_its_inputs_when_switched_on(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "concat_requantize", False)
    off = estimate_latency(_concat(quantized=True))
    assert "Requantize" not in set(off.ops["op_type"])
    monkeypatch.setitem(MECHANISMS, "concat_requantize", True)
    on = estimate_latency(_concat(quantized=True))
    row = on.ops[on.ops["op_type"] == "Requantize"].iloc[0]
    # Both inputs' elements (2 x 64 x 56 x 56) through the vector unit at 8 bits, read and written once.
    assert row["engine"] == "hvx" and row["op_class"] == "convert" and row["act_type"] == "uint8"
    assert row["elements"] == 2 * 64 * 56 * 56 and row["act_bytes"] == 2 * 2 * 64 * 56 * 56
    assert on.htp_ms == pytest.approx(off.htp_ms + row["ms"])
    # The Concat itself still moves its inputs.
    assert on.ops.set_index("node").loc["concat", "ms"] == pytest.approx(off.ops.set_index("node").loc["concat", "ms"])


def test_a_float_concat_needs_no_requantization(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "concat_requantize", True)
    assert "Requantize" not in set(estimate_latency(_concat(quantized=False)).ops["op_type"])


def test_switched_on_by_default():
    assert MECHANISMS["concat_requantize"]
