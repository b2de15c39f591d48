"""Two switchable mechanisms of the cost formulas (docs/latency.md, "Mechanisms"): a LayerNorm costs the same
instructions per vector in every type (`layernorm_plain`), where a Softmax keeps the transcendental factors of 16 bits
and fp16; and an op's fixed cost is set up while the op before it works (`overhead_overlaps`). Each is compared with
the same model where it is off."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR
from onnx import TensorProto, helper, numpy_helper

from mpstudio.latency import COSTS, HTP_ARCHS, estimate_latency
from mpstudio.latency.ops import MECHANISMS


def _norms(width: int = 768, tokens: int = 384):
    """A float [1, tokens, width] activation through a LayerNormalization, and a Softmax over the same shape."""
    shape = [1, tokens, width]
    consts = {"g": np.ones(width, np.float32), "b": np.zeros(width, np.float32)}
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, name="ln"),
             helper.make_node("Softmax", ["n"], ["y"], axis=-1, name="softmax")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _compute(node: str) -> tuple[str, float]:
    row = estimate_latency(_norms()).ops.set_index("node").loc[node]
    return row["op_class"], float(row["compute_ms"])


def test_layernorm_loses_the_transcendental_factor_in_fp16(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "layernorm_plain", False)
    cls_off, ln_off = _compute("ln")
    _, softmax_off = _compute("softmax")
    assert cls_off == "normalize"
    monkeypatch.setitem(MECHANISMS, "layernorm_plain", True)
    cls_on, ln_on = _compute("ln")
    _, softmax_on = _compute("softmax")
    assert cls_on == "layernorm"
    # The float model computes in fp16: the LayerNorm drops exactly the fp16 transcendental factor ...
    assert ln_off / ln_on == pytest.approx(COSTS.transcendental_fp16)
    # ... and a Softmax over the same elements keeps it.
    assert softmax_on == pytest.approx(softmax_off)
    assert softmax_on / ln_on == pytest.approx(COSTS.transcendental_fp16)


def _adds(side: int, count: int = 4):
    """A chain of `count` float Adds of [1, 32, side, side] activations."""
    shape = [1, 32, side, side]
    nodes, x = [], "x"
    for i in range(count):
        nodes.append(helper.make_node("Add", [x, "b"], [f"a{i}" if i < count - 1 else "y"], name=f"add{i}"))
        x = f"a{i}"
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                                           for n in ("x", "b")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


@pytest.mark.parametrize("side", [4, 256])
def test_fixed_cost_overlaps_with_the_work(monkeypatch, side):
    monkeypatch.setitem(MECHANISMS, "tiny_ops", False)  # every op pays the whole fixed cost here
    monkeypatch.setitem(MECHANISMS, "overhead_overlaps", False)
    off = estimate_latency(_adds(side)).ops.set_index("node").loc["add1"]
    monkeypatch.setitem(MECHANISMS, "overhead_overlaps", True)
    on = estimate_latency(_adds(side)).ops.set_index("node").loc["add1"]
    busy = max(off["compute_ms"], off["memory_ms"])
    fixed = HTP_ARCHS["75"].costs.op_cycles / (HTP_ARCHS["75"].clock_ghz * 1e9) * 1e3
    assert off["ms"] == pytest.approx(busy + fixed)
    # The longer of the two counts: a tiny op pays its fixed cost, a large one only its work.
    assert on["ms"] == pytest.approx(max(busy, fixed))
    assert (on["ms"] == pytest.approx(fixed)) == (side == 4)


def test_layernorm_plain_on_and_overhead_overlaps_off_by_default():
    # layernorm_plain: on since issue 22's third round (46 -> 37 cross-validated rows outside: docs/latency.md, "Fit").
    assert MECHANISMS["layernorm_plain"] and not MECHANISMS["overhead_overlaps"]
