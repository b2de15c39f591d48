"""The fake-quant CPU numerics compute uint8 asymmetric per-tensor weights as the HTP does (runtime.htp_weight_grid)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import IR, requires_qnn
from onnx import TensorProto, helper, numpy_helper

from mpstudio.data import FeedList
from mpstudio.loop.inprocess import run_outputs
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.runtime import htp_weight_grid

# In units of the per-tensor weight scale ORT picks for these weights (0.1, zero point 109): one channel spans
# -109 .. 146 (PP-OCRv4 det's first depthwise Conv has such a channel), so w - zero point leaves int8; the
# others stay within it.
WIDE = [-2, -3, 7, -109, -44, 146, -9, -8, 21]


def conv_model(depthwise: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    channels = 4
    shape = (channels, 1 if depthwise else channels, 3, 3)
    weight = rng.integers(-20, 21, shape).astype(np.float32)
    weight[0] = 0
    weight[0, 0] = np.reshape(WIDE, (3, 3))
    weight *= 0.1
    bias = rng.normal(0, 0.5, channels).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1],
                            group=channels if depthwise else 1)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 16, 16])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def image_feeds(count: int, channels: int = 4) -> FeedList:
    """Smooth inputs (4x4 blocks of one value, like the flat regions of a text image): a weight's error then
    moves whole regions the same way instead of averaging out."""
    rng = np.random.default_rng(7)
    feeds = []
    for _ in range(count):
        blocks = rng.uniform(1, 3, (1, channels, 4, 4)).astype(np.float32)
        feeds.append({"x": np.kron(blocks, np.ones((1, 1, 4, 4), np.float32))})
    return FeedList(feeds)


def channel_offsets(path, feeds: FeedList, numerics: str | None) -> np.ndarray:
    """Mean HTP - CPU difference per output channel, in 8-bit steps of the output's range."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
    step = float(inits[out.input[1]]) * (256 if inits[out.input[2]].dtype == np.uint16 else 1)
    htp = run_outputs(path, feeds, "htp", {"htp_arch": "75"}, workers=1)
    if numerics is None:
        cpu = run_outputs(path, feeds, "cpu")
    else:
        from mpstudio.runtime import create_session
        session = create_session(path, numerics=numerics)
        cpu = [{"y": session.run(["y"], feed)[0]} for feed in feeds.feeds()]
    diff = np.stack([(h["y"] - c["y"]) / step for h, c in zip(htp, cpu)])
    return diff.mean(axis=(0, 1, 3, 4))


@pytest.mark.parametrize("depthwise", [True, False], ids=["depthwise", "conv"])
def test_uint8_asymmetric_weights_rewritten_only_where_they_leave_int8(tmp_path, depthwise):
    feeds = image_feeds(4)
    quantizer = Quantizer(prepare_model(conv_model(depthwise)), feeds, tmp_path)
    a8w8 = quantizer.generate(PrecisionPlan.a8w8())
    zero_point = next(numpy_helper.to_array(i) for i in onnx.load(a8w8).graph.initializer if i.name == "w_zero_point")
    assert zero_point.dtype == np.uint8 and int(zero_point) == 109
    rewritten = onnx.load_from_string(htp_weight_grid(str(a8w8)))
    grid = next(numpy_helper.to_array(i) for i in rewritten.graph.initializer if i.name.endswith("_scale")
                and i.name.startswith("w_quantized_htp_grid"))
    # only the wide channel gets a coarser grid (146 / 127 of the weight scale); the others keep theirs
    np.testing.assert_allclose(grid / grid[1], [146 / 127, 1, 1, 1], rtol=1e-6)
    # int8 symmetric weights (per channel or per tensor) always fit: nothing to rewrite
    for plan in (PrecisionPlan(weight_type="int8", per_channel=True), PrecisionPlan(weight_type="int8")):
        path = str(quantizer.generate(plan))
        assert htp_weight_grid(path) == path
    # the same weights between an 8-bit input and a 16-bit output: the HTP keeps them exact, and so does the CPU
    mixed = mixed_width_model(numpy_helper.to_array(next(i for i in rewritten.graph.initializer
                                                         if i.name == "w_quantized")))
    assert htp_weight_grid(mixed) == mixed


def mixed_width_model(codes: np.ndarray) -> bytes:
    """A QDQ Conv with `codes` as uint8 weights (scale 0.1, zero point 109), uint8 input and uint16 output."""
    channels = codes.shape[0]
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "xs"), numpy_helper.from_array(np.array(129, np.uint8), "xz"),
             numpy_helper.from_array(codes, "wq"), numpy_helper.from_array(np.array(0.1, np.float32), "ws"),
             numpy_helper.from_array(np.array(109, np.uint8), "wz"), numpy_helper.from_array(np.array(1e-3, np.float32), "ys"),
             numpy_helper.from_array(np.array(32768, np.uint16), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1],
                              group=channels if codes.shape[1] == 1 else 1),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR).SerializeToString()


@requires_qnn
@pytest.mark.htp
@pytest.mark.parametrize("depthwise", [True, False], ids=["depthwise", "conv"])
@pytest.mark.parametrize("plan", [PrecisionPlan.a8w8(), PrecisionPlan.a16w8()], ids=["a8w8", "a16w8"])
def test_cpu_matches_htp_per_channel_with_uint8_asymmetric_weights(tmp_path, depthwise, plan):
    feeds = image_feeds(6)
    quantizer = Quantizer(prepare_model(conv_model(depthwise)), feeds, tmp_path)
    path = quantizer.generate(plan)
    exact = channel_offsets(path, feeds, "basic")  # ORT's CPU with the weights as the graph writes them
    assert abs(exact[0]) > 0.5, exact  # the wide channel is more than half an 8-bit step off
    after = channel_offsets(path, feeds, None)  # the default CPU numerics (fake-quant)
    assert np.abs(after).max() < 0.1, after
