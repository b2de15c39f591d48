"""Mechanism `shallow_input` (latency.shallow; measured in docs/latency.md, "Fit"): a graph-input image of at most
four channels enters its first convolution packed in 8 bits (with `shallow_input_packing`: taps and channels share
the matrix unit's depth) and converted to channel blocks of 32 in 16 bits and fp16 (a data mover writing the padded
image, which the convolution reads)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR
from onnx import TensorProto, helper, numpy_helper

from mpstudio.latency import estimate_latency
from mpstudio.latency.ops import MECHANISMS

PIXELS = 96 * 128


def _grey_conv(bits: int = 0, channels: int = 1):
    """A 1 x `channels` x 96 x 128 image, a 3x3 convolution to 16 channels; `bits` 8 or 16: through QDQ (the
    input, the weight in 8 bits, the output), 0: float."""
    rng = np.random.default_rng(0)
    consts = {"w": rng.standard_normal((16, channels, 3, 3)).astype(np.float32)}
    nodes, x, w, y = [], "x", "w", "y"
    if bits:
        act = np.uint16 if bits == 16 else np.uint8
        consts.update(s=np.float32(0.01), z=act(0), ws=np.float32(0.02), wz=np.uint8(128),
                      wq=np.clip(np.round(consts.pop("w") / 0.02) + 128, 0, 255).astype(np.uint8))
        nodes += [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
                  helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
                  helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw")]
        x, w, y = "xd", "wd", "c"
    nodes.append(helper.make_node("Conv", [x, w], [y], pads=[1, 1, 1, 1], name="conv"))
    if bits:
        nodes += [helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"], name="qy"),
                  helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["y"], name="dqy")]
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 96, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 96, 128])],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR)
    return model


def _ops(model, on: bool, packing: bool, monkeypatch):
    monkeypatch.setitem(MECHANISMS, "shallow_input", on)
    monkeypatch.setitem(MECHANISMS, "shallow_input_packing", packing)
    return estimate_latency(model).ops.set_index("node")


def test_switched_on_by_default():
    # On since it and concat_requantize left 70 of 256 cross-validated rows outside against 94 (docs/latency.md).
    assert MECHANISMS["shallow_input"] and MECHANISMS["shallow_input_packing"]


@pytest.mark.parametrize("bits", [0, 16])
def test_a_wide_grey_image_is_converted_to_channel_blocks(monkeypatch, bits):
    off = _ops(_grey_conv(bits), False, False, monkeypatch)
    on = _ops(_grey_conv(bits), True, False, monkeypatch)
    assert "LayoutConvert" not in set(off["op_type"])
    convert = on[on["op_type"] == "LayoutConvert"].iloc[0]
    width = 2  # uint16 and fp16 alike
    # The converter reads the one-channel image and writes it padded to 32 channels; the convolution reads that.
    assert convert["engine"] == "dma" and convert["act_bytes"] == (1 + 32) * PIXELS * width
    assert off.loc["conv", "act_bytes"] == (1 + 16) * PIXELS * width
    assert on.loc["conv", "act_bytes"] == (32 + 16) * PIXELS * width
    assert on.loc["conv", "macs"] == off.loc["conv", "macs"]
    if not bits:  # the fp32 -> fp16 cast of the float graph input still reads the image as it comes
        cast = on[on["op_type"] == "Cast"].iloc[0]
        assert cast["act_bytes"] == PIXELS * (4 + 2)
    assert on["ms"].sum() > off["ms"].sum() + convert["ms"] * 0.99


def test_an_8_bit_grey_image_is_packed_not_converted(monkeypatch):
    off = _ops(_grey_conv(8), False, False, monkeypatch)
    wide_only = _ops(_grey_conv(8), True, False, monkeypatch)
    packed = _ops(_grey_conv(8), True, True, monkeypatch)
    assert "LayoutConvert" not in set(packed["op_type"]) and "LayoutConvert" not in set(wide_only["op_type"])
    assert wide_only.loc["conv", "compute_ms"] == off.loc["conv", "compute_ms"]
    # Nine taps of one channel share one block of 32 instead of nine blocks of 32: a ninth of the matrix work.
    assert packed.loc["conv", "compute_ms"] == pytest.approx(off.loc["conv", "compute_ms"] / 9)
    assert packed.loc["conv", "act_bytes"] == off.loc["conv", "act_bytes"]


def test_a_deep_input_is_left_alone(monkeypatch):
    off = _ops(_grey_conv(16, channels=8), False, False, monkeypatch)
    on = _ops(_grey_conv(16, channels=8), True, True, monkeypatch)
    assert "LayoutConvert" not in set(on["op_type"])
    assert on.loc["conv", "act_bytes"] == off.loc["conv", "act_bytes"]
