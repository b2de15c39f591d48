"""The fake-quant CPU numerics round a 16-bit Conv's or Gemm's accumulator as the HTP does
(runtime.htp_accumulator_rounding): the product sum shifted right by 8 bits, the int32 bias' low 8 bits dropped."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import IR, output_codes, requires_qnn
from onnx import TensorProto, helper, numpy_helper

from mpstudio.runtime import create_session, htp_accumulator_rounding

CASES = {
    "depthwise 3x3": dict(op="Conv", channels=16, group=16, kernel=3),
    "depthwise 5x5": dict(op="Conv", channels=16, group=16, kernel=5),
    "depthwise 3x3, stride (2, 1)": dict(op="Conv", channels=16, group=16, kernel=3, stride=(2, 1)),
    "regular 3x3": dict(op="Conv", channels=8, group=1, kernel=3),
    "regular 3x3, stride 2": dict(op="Conv", channels=8, group=1, kernel=3, stride=2),
    "pointwise": dict(op="Conv", channels=16, group=1, kernel=1),
    "gemm": dict(op="Gemm", channels=32),
}


def one_op(op="Conv", channels=16, group=1, kernel=3, stride=1, bits=16, seed=0):
    """x -> Q -> DQ -> Conv/Gemm (per-channel int8 weights, int32 bias) -> Q -> DQ, its input zero point off the
    middle of the range (34127, as a recognizer's), the output encoding fitted to the exact result; and an input."""
    rng = np.random.default_rng(seed)
    code_type, top = (np.uint16, 65535) if bits == 16 else (np.uint8, 255)
    x_scale, x_zero = (1e-3, 34127) if bits == 16 else (0.05, 133)
    w_scale = rng.uniform(0.005, 0.05, channels).astype(np.float32)
    weights = rng.integers(-127, 128, (channels, channels // group, kernel, kernel) if op == "Conv"
                           else (channels, channels)).astype(np.int8)
    bias = rng.integers(-300_000, 300_000, channels).astype(np.int32)
    shape = [1, channels, 12, 12] if op == "Conv" else [6, channels]
    x = ((rng.integers(0, top + 1, shape) - x_zero) * x_scale).astype(np.float32)
    node = (helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], group=group, pads=[kernel // 2] * 4,
                             kernel_shape=[kernel, kernel], strides=list(np.broadcast_to(stride, 2))) if op == "Conv"
            else helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"], transB=1))

    def model(y_scale, y_zero):
        inits = [numpy_helper.from_array(np.asarray(a), n) for a, n in [
            (np.float32(x_scale), "sx"), (code_type(x_zero), "zx"), (weights, "wq"), (w_scale, "sw"),
            (np.zeros(channels, np.int8), "zw"), (bias, "bq"), ((np.float32(x_scale) * w_scale), "sb"),
            (np.zeros(channels, np.int32), "zb"), (np.float32(y_scale), "so"), (code_type(y_zero), "zo")]]
        nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
                 helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
                 helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
                 helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], axis=0), node,
                 helper.make_node("QuantizeLinear", ["y", "so", "zo"], ["yq"]),
                 helper.make_node("DequantizeLinear", ["yq", "so", "zo"], ["out"])]
        graph = helper.make_graph(nodes, "one_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR)

    unquantized = model(1.0, 0)  # its float output fits the output encoding
    del unquantized.graph.node[-2:]
    unquantized.graph.output[0].name = "y"
    y = create_session(unquantized.SerializeToString(), numerics="basic").run(None, {"x": x})[0]
    low, high = min(0.0, float(np.percentile(y, 0.5))), max(0.0, float(np.percentile(y, 99.5)))
    y_scale = (high - low) / top
    return model(y_scale, int(np.clip(np.round(-low / y_scale), 0, top))).SerializeToString(), x, y_scale


def codes(model: bytes, x: np.ndarray, step: float, **session) -> np.ndarray:
    return output_codes(model, {"x": x}, step, **session)


@requires_qnn
@pytest.mark.htp
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_codes_follow_the_htp(case):
    model, x, step = one_op(**CASES[case])
    htp = codes(model, x, step, backend="htp", provider_options={"htp_arch": "75"})
    cpu = codes(model, x, step)
    assert np.mean(cpu != htp) < 0.01 and np.abs(cpu - htp).max() <= 1, case
    # ORT's exact sum differs on these: the rule is not a no-op
    assert np.mean(codes(model, x, step, numerics="basic") != htp) > 0.1, case


def test_the_rewrite_computes_the_measured_rule_exactly():
    """The rewritten model's codes are those of the integer rule, computed here in int64."""
    model, x, step = one_op(channels=16, group=16, kernel=3, seed=3)
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load_from_string(model).graph.initializer}
    weights, w_scale, bias = inits["wq"].astype(np.int64)[:, 0], inits["sw"].astype(np.float64), inits["bq"]
    x_scale, x_zero = float(inits["sx"]), int(inits["zx"])
    y_scale, y_zero = float(inits["so"]), int(inits["zo"])
    q = np.pad(np.round(x[0] / np.float32(x_scale)).astype(np.int64) + x_zero, ((0, 0), (1, 1), (1, 1)),
               constant_values=x_zero)
    sums = sum(q[:, i:i + 12, j:j + 12] * weights[:, i, j, None, None] for i in range(3) for j in range(3))
    shifted = (np.floor_divide(sums, 256) + np.floor(-x_zero * weights.reshape(16, -1).sum(1) / 256 + 0.5)[:, None, None]
               + (np.sign(bias) * (np.abs(bias) // 256))[:, None, None])
    expected = np.clip(np.round(256 * shifted * x_scale * w_scale[:, None, None] / y_scale) + y_zero, 0, 65535)
    got = codes(model, x, step)[0] + y_zero
    assert np.mean(got != expected) < 0.002 and np.abs(got - expected).max() <= 1  # float32 requantization ties


def test_what_the_rule_does_not_cover_is_left_alone():
    model, _, _ = one_op(op="Conv", channels=16, group=16, kernel=3, stride=2)  # depthwise strided along both axes
    assert htp_accumulator_rounding(model) is model
    # 8-bit activations follow another rule (tests/test_runtime_requantize_rounding.py)
