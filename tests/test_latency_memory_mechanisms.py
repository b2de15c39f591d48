"""Two memory mechanisms of the cost formulas (docs/latency.md, "Mechanisms"). `channel_blocks`: an image-like
activation takes its channels padded to blocks of 32 in memory; with `channel_block_lanes` the vector unit processes
the padded elements too; a graph input and an attention tensor that no spatial op touches keep their element
counts. `vtcm_partial_spill`: the part of a working set the usable VTCM holds moves at its rate, the rest at the DDR
rate."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR
from onnx import TensorProto, helper, numpy_helper

from mpstudio.latency import estimate_latency
from mpstudio.latency.depth import blocked_elements
from mpstudio.latency.ops import MECHANISMS


def _shallow_net():
    """A grey 1x1x96x128 image, a 3x3 convolution to 16 channels, a Sigmoid (an HVX op of its own: not fused),
    a 1x1 convolution to 48 channels."""
    rng = np.random.default_rng(0)
    consts = {"w1": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
              "w2": rng.standard_normal((48, 16, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Sigmoid", ["a"], ["s"], name="sigmoid"),
             helper.make_node("Conv", ["s", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 96, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 48, 96, 128])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _attention():
    """Scores of a 4-D attention tensor [1, 4, 64, 16] x [1, 4, 16, 64]: axis 1 is heads, not channels."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["q", "k"], ["y"], name="scores")], "m",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 4, 64, 16]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 4, 16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 64, 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_blocked_elements_pad_the_channel_axis():
    assert blocked_elements((1, 1, 96, 128)) == 32 * 96 * 128
    assert blocked_elements((1, 48, 8, 8)) == 64 * 8 * 8
    assert blocked_elements((2, 64, 4, 4, 4)) == 2 * 64 * 64
    assert blocked_elements((1, None, 8, 8)) is None


def test_low_depth_maps_move_their_padded_bytes(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "shallow_input", False)  # the graph input's own mechanism: latency.shallow
    monkeypatch.setitem(MECHANISMS, "channel_blocks", False)
    off = estimate_latency(_shallow_net()).ops.set_index("node")
    monkeypatch.setitem(MECHANISMS, "channel_blocks", True)
    on = estimate_latency(_shallow_net()).ops.set_index("node")
    pixels, fp16 = 96 * 128, 2
    # conv1 reads the graph input as it comes (one channel) and writes 16 channels held as 32.
    assert off.loc["conv1", "act_bytes"] == (1 + 16) * pixels * fp16
    assert on.loc["conv1", "act_bytes"] == (1 + 32) * pixels * fp16
    # The Sigmoid reads and writes a padded map; its vector work stays the 16 real channels' unless the lanes
    # mechanism is on too.
    assert on.loc["sigmoid", "act_bytes"] == 2 * 32 * pixels * fp16
    assert on.loc["sigmoid", "compute_ms"] == pytest.approx(off.loc["sigmoid", "compute_ms"])
    assert on.loc["conv2", "act_bytes"] == (32 + 64) * pixels * fp16
    assert on.loc["conv2", "memory_ms"] > off.loc["conv2", "memory_ms"]
    monkeypatch.setitem(MECHANISMS, "channel_block_lanes", True)
    lanes = estimate_latency(_shallow_net()).ops.set_index("node")
    assert lanes.loc["sigmoid", "compute_ms"] == pytest.approx(2 * off.loc["sigmoid", "compute_ms"])
    assert lanes.loc["sigmoid", "act_bytes"] == on.loc["sigmoid", "act_bytes"]


def test_a_model_file_is_read_again_when_the_mechanisms_change(monkeypatch, tmp_path):
    """The parse of a model file is cached while the file is unchanged; it reads the mechanisms switched on (here
    the padded channel blocks), so switching one reads the file again rather than reusing the old parse."""
    import onnx

    path = tmp_path / "shallow.onnx"
    onnx.save(_shallow_net(), path)
    monkeypatch.setitem(MECHANISMS, "shallow_input", False)
    monkeypatch.setitem(MECHANISMS, "channel_blocks", False)
    off = estimate_latency(path).ops.set_index("node")
    monkeypatch.setitem(MECHANISMS, "channel_blocks", True)
    on = estimate_latency(path).ops.set_index("node")
    pixels, fp16 = 96 * 128, 2
    assert off.loc["conv1", "act_bytes"] == (1 + 16) * pixels * fp16
    assert on.loc["conv1", "act_bytes"] == (1 + 32) * pixels * fp16


def test_an_attention_tensor_is_not_padded(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "channel_blocks", False)
    off = estimate_latency(_attention()).ops.set_index("node").loc["scores"]
    monkeypatch.setitem(MECHANISMS, "channel_blocks", True)
    on = estimate_latency(_attention()).ops.set_index("node").loc["scores"]
    assert on["act_bytes"] == off["act_bytes"] == (2 * 4 * 64 * 16 + 4 * 64 * 64) * 2


def _big_add():
    """An Add of two fp16 maps of 8 MiB each: a working set of 24 MiB, beyond any generation's VTCM."""
    shape = [1, 64, 256, 256]
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add")], "m",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_partial_spill_moves_what_vtcm_holds_at_its_rate(monkeypatch):
    from mpstudio.latency import htp_arch

    arch = htp_arch("75")
    ddr = arch.ddr_gbs * arch.costs.memory_efficiency * 1e9
    moved = 3 * 64 * 256 * 256 * 2
    usable = arch.vtcm_mb * 2**20 / 2
    monkeypatch.setitem(MECHANISMS, "vtcm_partial_spill", False)
    off = estimate_latency(_big_add(), arch).ops.set_index("node").loc["add"]
    assert off["memory_ms"] == pytest.approx(moved / ddr * 1e3)
    monkeypatch.setitem(MECHANISMS, "vtcm_partial_spill", True)
    on = estimate_latency(_big_add(), arch).ops.set_index("node").loc["add"]
    assert on["memory_ms"] == pytest.approx((usable / (arch.costs.vtcm_factor * ddr) + (moved - usable) / ddr) * 1e3)
    assert on["memory_ms"] < off["memory_ms"]
