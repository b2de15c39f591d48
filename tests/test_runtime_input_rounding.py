"""The fake-quant CPU numerics quantize a float graph input as the HTP does (runtime.htp_input_rounding)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import IR, output_codes, requires_qnn
from onnx import TensorProto, helper, numpy_helper

from mpstudio.data import FeedList
from mpstudio.runtime import htp_input_rounding
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.runtime import create_session

SHAPE = [1, 3, 24, 40]


def passthrough(bits: int) -> tuple[bytes, float, int]:
    """x -> Q -> DQ -> Transpose -> Q -> DQ with one encoding: the output carries the input's codes on both
    backends (a Transpose of on-grid values is exact). Scale 2/255 (2/65535) puts `pixel / 127.5 - 1` on ties."""
    dtype, zero = (np.uint8, 128) if bits == 8 else (np.uint16, 32768)
    scale = np.float32(2 / (255 if bits == 8 else 65535))
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s"), numpy_helper.from_array(np.array(zero, dtype), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Transpose", ["xd"], ["t"], perm=[0, 1, 3, 2]),
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"]),
             helper.make_node("DequantizeLinear", ["tq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "passthrough", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR)
    return model.SerializeToString(), float(scale), zero


def hard_inputs(bits: int, seed: int = 0) -> np.ndarray:
    """Pixel-normalized values (every one a rounding tie), values within 1e-3 steps of a tie, and random ones."""
    rng = np.random.default_rng(seed)
    levels, zero = (255, 128) if bits == 8 else (65535, 32768)
    scale = 2 / levels
    n = int(np.prod(SHAPE))
    pixels = rng.integers(0, 256, n) / 127.5 - 1
    codes = rng.integers(-zero, levels - zero, n)
    near = (codes + 0.5 + rng.normal(0, 1e-3, n)) * scale
    spread = (codes + rng.random(n)) * scale
    pick = rng.integers(0, 3, n)
    return np.choose(pick, [pixels, near, spread]).astype(np.float32).reshape(SHAPE)


def codes(model: bytes, x: np.ndarray, scale: float, **session) -> np.ndarray:
    return output_codes(model, {"x": x}, scale, output="y", **session)


@pytest.mark.parametrize("bits", [8, 16])
def test_cpu_codes_follow_the_measured_rule(bits):
    model, scale, _ = passthrough(bits)
    x = hard_inputs(bits)
    ratio = x.astype(np.float64) / np.float32(scale)
    if bits == 8:  # float16, then half away from zero
        half = (x / np.float32(scale)).astype(np.float16).astype(np.float64)
        expected = np.sign(half) * np.floor(np.abs(half) + 0.5)
    else:  # exact, ties toward zero
        expected = np.sign(ratio) * np.ceil(np.abs(ratio) - 0.5)
    expected = np.clip(expected, -128 if bits == 8 else -32768, 127 if bits == 8 else 32767)
    got = codes(model, x, scale).transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(got, expected)
    # ORT's own rounding (basic numerics) differs on these inputs: the rule is not a no-op
    assert np.mean(codes(model, x, scale, numerics="basic").transpose(0, 1, 3, 2) != expected) > 0.05


def test_models_without_a_float_input_quantization_are_left_alone():
    inits = [numpy_helper.from_array(np.ones((1, 3, 2, 2), np.float32), "c")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "plain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR).SerializeToString()
    assert htp_input_rounding(model) is model


@requires_qnn
@pytest.mark.htp
@pytest.mark.parametrize("bits", [8, 16])
def test_cpu_input_codes_match_the_htp(bits):
    model, scale, _ = passthrough(bits)
    x = hard_inputs(bits, seed=1)
    htp = codes(model, x, scale, backend="htp", provider_options={"htp_arch": "75"})
    np.testing.assert_array_equal(codes(model, x, scale), htp)
    assert np.mean(codes(model, x, scale, numerics="basic") != htp) > 0.05  # the old numerics missed


def pixel_conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    weight = rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, *SHAPE[2:]])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


@requires_qnn
@pytest.mark.htp
def test_a_plan_on_pixel_normalized_images_matches_the_htp(tmp_path):
    """A Conv calibrated on `pixel / 127.5 - 1` images: its input encoding is 2/255 around 128, every input a
    tie. With the HTP's input rounding the CPU's output codes differ from the HTP's by its kernel's rounding
    only (at most one step, rarely); ORT's rounding moved half the inputs and many outputs by several steps."""
    rng = np.random.default_rng(9)
    images = [(rng.integers(0, 256, SHAPE) / 127.5 - 1).astype(np.float32) for _ in range(3)]
    images[0].flat[:2] = [-1.0, 1.0]  # the calibrated range is exactly [-1, 1]
    feeds = FeedList({"x": image} for image in images)
    quantizer = Quantizer(prepare_model(pixel_conv_model()), feeds, tmp_path)
    path = str(quantizer.generate(PrecisionPlan(weight_type="int8", per_channel=True)))
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
    step = float(inits[out.input[1]])
    session = create_session(path, "htp", {"htp_arch": "75"})
    cpu, basic = create_session(path), create_session(path, numerics="basic")
    new, old = [], []
    for feed in feeds.feeds():
        htp = session.run(["y"], feed)[0]
        new.append(np.round((htp - cpu.run(["y"], feed)[0]) / step))
        old.append(np.round((htp - basic.run(["y"], feed)[0]) / step))
    new, old = np.abs(np.stack(new)), np.abs(np.stack(old))
    assert new.max() <= 1 and np.mean(new > 0) < 0.05, (new.max(), np.mean(new > 0))
    assert old.max() >= 2 and np.mean(old > 0) > 4 * np.mean(new > 0), (old.max(), np.mean(old > 0))
