"""The fake-quant CPU numerics requantize an 8-bit Conv's or Gemm's accumulator as the HTP does
(runtime.htp_accumulator_rounding, mpstudio.htp_requantize): the accumulator shifted right to about 1/16 of an output
step with half its dropped step added back, times a multiplier of 12 significant bits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import IR, output_codes, requires_qnn
from onnx import TensorProto, helper, numpy_helper

from mpstudio.htp_requantize import add_constants, requantize_constants
from mpstudio.runtime import create_session, htp_accumulator_rounding

CASES = {
    "depthwise 3x3": dict(op="Conv", channels=16, group=16, kernel=3),
    "depthwise 5x5": dict(op="Conv", channels=16, group=16, kernel=5),
    "depthwise 3x3, stride (2, 1)": dict(op="Conv", channels=16, group=16, kernel=3, stride=(2, 1)),
    "regular 3x3": dict(op="Conv", channels=8, group=1, kernel=3),
    "regular 3x3, stride 2": dict(op="Conv", channels=8, group=1, kernel=3, stride=2),
    "pointwise": dict(op="Conv", channels=16, group=1, kernel=1),
    "pointwise, Relu": dict(op="Conv", channels=16, group=1, kernel=1, relu=True),
    "pointwise, per-tensor int8 weights": dict(op="Conv", channels=16, group=1, kernel=1, weights="per-tensor"),
    "pointwise, uint8 asymmetric weights": dict(op="Conv", channels=16, group=1, kernel=1, weights="uint8"),
    "pointwise, uint8 weights the HTP widens": dict(op="Conv", channels=16, group=1, kernel=1, weights="uint8-wide"),
    "depthwise 3x3, uint8 weights the HTP widens": dict(op="Conv", channels=16, group=16, kernel=3,
                                                        weights="uint8-wide"),
    "gemm": dict(op="Gemm", channels=32),
}


def one_op(op="Conv", channels=16, group=1, kernel=3, stride=1, relu=False, weights="per-channel", seed=0):
    """x -> Q -> DQ -> Conv/Gemm (int8 weights, int32 bias) [-> Relu] -> Q -> DQ at 8 bits, the output encoding
    fitted to the exact result, as ORT's quantizer writes a layer's (multipliers near 2^-12); and an input."""
    rng = np.random.default_rng(seed)
    x_scale, x_zero = 0.05, 133
    shape_w = (channels, channels // group, kernel, kernel) if op == "Conv" else (channels, channels)
    if weights.startswith("uint8"):  # ORT's QNN default: uint8 per tensor around a zero point
        w_zero = np.uint8(rng.integers(100, 156))
        centred = rng.integers(-120, 100, shape_w).astype(np.float64)
        if weights == "uint8-wide":  # some channels reach beyond int8 of the zero point: the HTP widens their step
            for channel in rng.choice(channels, channels // 3, replace=False):
                centred[channel] *= rng.uniform(1.2, 1.9)
        codes = np.clip(np.round(centred) + int(w_zero), 0, 255).astype(np.uint8)
        w_scale = np.float32(rng.uniform(0.005, 0.05))
        w_zeros = w_zero
    else:
        codes = rng.integers(-127, 128, shape_w).astype(np.int8)
        w_scale = (rng.uniform(0.005, 0.05, channels) if weights == "per-channel"
                   else np.full(1, rng.uniform(0.005, 0.05))).astype(np.float32)
        w_zeros = np.zeros(w_scale.size, np.int8)
        if weights == "per-tensor":
            w_scale, w_zeros = w_scale[0], w_zeros[0]
    bias = rng.integers(-300_000, 300_000, channels).astype(np.int32)
    shape = [1, channels, 12, 12] if op == "Conv" else [6, channels]
    x = ((rng.integers(0, 256, shape) - x_zero) * x_scale).astype(np.float32)
    node = (helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], group=group, pads=[kernel // 2] * 4,
                             kernel_shape=[kernel, kernel], strides=list(np.broadcast_to(stride, 2))) if op == "Conv"
            else helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"], transB=1))

    def model(y_scale, y_zero):
        inits = [numpy_helper.from_array(np.asarray(a), n) for a, n in [
            (np.float32(x_scale), "sx"), (np.uint8(x_zero), "zx"), (codes, "wq"), (w_scale, "sw"),
            (w_zeros, "zw"), (bias, "bq"), ((np.float32(x_scale) * np.asarray(w_scale, np.float32)), "sb"),
            (np.zeros(np.size(w_scale), np.int32).reshape(np.shape(w_scale)), "zb"), (np.float32(y_scale), "so"),
            (np.uint8(y_zero), "zo")]]
        axis = {"axis": 0} if np.size(w_scale) > 1 else {}
        nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
                 helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
                 helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], **axis),
                 helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], **axis), node]
        if relu:
            node.output[0] = "conv"
            nodes.append(helper.make_node("Relu", ["conv"], ["y"]))
        nodes += [helper.make_node("QuantizeLinear", ["y", "so", "zo"], ["yq"]),
                  helper.make_node("DequantizeLinear", ["yq", "so", "zo"], ["out"])]
        graph = helper.make_graph(nodes, "one_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR)

    unquantized = model(1.0, 0)
    del unquantized.graph.node[-2:]
    unquantized.graph.output[0].name = "y"
    y = create_session(unquantized.SerializeToString(), numerics="basic").run(None, {"x": x})[0]
    low, high = min(0.0, float(np.percentile(y, 0.5))), max(0.0, float(np.percentile(y, 99.5)))
    y_scale = (high - low) / 255
    return model(y_scale, int(np.clip(np.round(-low / y_scale), 0, 255))).SerializeToString(), x, y_scale


def codes(model: bytes, x: np.ndarray, step: float, **session) -> np.ndarray:
    return output_codes(model, {"x": x}, step, **session)


@requires_qnn
@pytest.mark.htp
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_codes_follow_the_htp(case):
    model, x, step = one_op(**CASES[case])
    htp = codes(model, x, step, backend="htp", provider_options={"htp_arch": "75"})
    cpu = codes(model, x, step)
    # widened weights are rounded onto the HTP's grid by runtime.htp_weight_grid, which leaves a few codes off
    assert np.mean(cpu != htp) < (0.003 if "widens" in case else 0.001) and np.abs(cpu - htp).max() <= 1, case
    # ORT's exact requantization differs on these: the rule is not a no-op
    assert np.mean(codes(model, x, step, numerics="basic") != htp) > 0.005, case


def test_the_rewrite_computes_the_measured_rule_exactly():
    """The rewritten model's codes are those of the integer rule, computed here in int64."""
    model, x, step = one_op(channels=16, group=1, kernel=1, seed=3)
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load_from_string(model).graph.initializer}
    weights, w_scale, bias = inits["wq"].astype(np.int64)[:, :, 0, 0], inits["sw"].astype(np.float64), inits["bq"]
    x_scale = float(inits["sx"])  # x is (code - zx) x sx: divided by sx, the centred codes
    y_scale, y_zero = float(inits["so"]), int(inits["zo"])
    q = np.round(x[0] / np.float32(x_scale)).astype(np.int64)  # the centred codes
    accumulator = np.einsum("oc,chw->ohw", weights, q) + bias[:, None, None]
    step, multiplier = requantize_constants(x_scale, w_scale, y_scale)
    shift = np.round(-np.log2(step)).astype(np.int64)  # step = 2^-shift; the shift is right when negative
    assert np.all(shift < 0)  # layers' multipliers near 2^-12 drop 8 bits
    shifted = np.right_shift(accumulator, -shift[:, None, None])  # arithmetic: floor
    expected = np.clip(np.floor((shifted + 0.5) * multiplier[:, None, None] + 0.5) + y_zero, 0, 255)
    got = codes(model, x, step=y_scale)[0] + y_zero
    assert np.array_equal(got, expected)


def test_twelve_bit_multiplier():
    """2^k x M keeps 12 significant bits: its mantissa (times 2^11) is an integer in [2048, 4096]."""
    step, multiplier = requantize_constants(0.05, np.array([0.013, 0.0037, 0.021]), 0.31)
    mantissa = multiplier / 2.0 ** np.floor(np.log2(multiplier)) * 2048
    assert np.array_equal(mantissa, np.round(mantissa)) and np.all((mantissa >= 2048) & (mantissa <= 4096))
    assert np.all(step * 0.05 * np.array([0.013, 0.0037, 0.021]) / 0.31 >= 1 / 16)


@pytest.mark.parametrize("kwargs", [dict(op="Conv", channels=16, group=16, kernel=3, stride=2)],
                         ids=["depthwise strided along both axes"])
def test_what_the_rule_does_not_cover_is_left_alone(kwargs):
    model, _, _ = one_op(**kwargs)
    assert htp_accumulator_rounding(model, requantize=True) is model


ADD_CASES = {
    "same shapes": dict(),
    "broadcast per channel": dict(b_shape=[1, 8, 1, 1]),
    "a constant operand": dict(constant=True),
    "an input scale far below the other": dict(ratio=0.05),
    "an output range ten times the sum's": dict(output_range=10.0),
    "an output range below the sum's": dict(output_range=0.4),
    "16-bit": dict(bits=16),
    "16-bit, broadcast per channel": dict(bits=16, b_shape=[1, 8, 1, 1]),
    "16-bit, a constant operand": dict(bits=16, constant=True),
    "16-bit, an input scale far below the other": dict(bits=16, ratio=0.05),
    "16-bit, an output range ten times the sum's": dict(bits=16, output_range=10.0),
    "16-bit, an output range below the sum's": dict(bits=16, output_range=0.4),
    "16-bit, a one-element constant": dict(bits=16, b_shape=[1], constant=True),
}


def add_model(b_shape=(1, 8, 16, 16), constant=False, ratio=None, bits=8, output_range=1.0, seed=0):
    """a, b -> Q -> DQ -> Add -> Q -> DQ at `bits` bits, random encodings, the output's fitted to the sum's range
    times `output_range`; the inputs (b's codes an initializer when `constant`)."""
    rng = np.random.default_rng(seed)
    dtype, top = (np.uint8, 255) if bits == 8 else (np.uint16, 65535)
    a_scale, a_zero = float(rng.uniform(0.01, 0.1)) * 255 / top, int(rng.integers(0, top + 1))
    b_scale = a_scale * (ratio if ratio else float(rng.uniform(0.3, 3))), int(rng.integers(0, top + 1))
    b_scale, b_zero = b_scale
    a = ((rng.integers(0, top + 1, (1, 8, 16, 16)) - a_zero) * np.float32(a_scale)).astype(np.float32)
    b_codes = rng.integers(0, top + 1, b_shape).astype(dtype)
    total = (a + (b_codes.astype(np.float32) - b_zero) * np.float32(b_scale)).ravel()
    low, high = min(0.0, float(np.percentile(total, 1))), max(0.0, float(np.percentile(total, 99)))
    y_scale = (high - low) / top * output_range
    y_zero = int(np.clip(np.round(-low / y_scale), 0, top))
    inits = [numpy_helper.from_array(np.asarray(v), n) for v, n in [
        (np.float32(a_scale), "sa"), (dtype(a_zero), "za"), (np.float32(b_scale), "sb"), (dtype(b_zero), "zb"),
        (np.float32(y_scale), "so"), (dtype(y_zero), "zo")]]
    nodes = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["ad"])]
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, 16, 16])]
    feeds = {"a": a}
    if constant:
        inits.append(numpy_helper.from_array(b_codes, "bq"))
    else:
        nodes.append(helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["bq"]))
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape)))
        feeds["b"] = ((b_codes.astype(np.float32) - b_zero) * np.float32(b_scale)).astype(np.float32)
    nodes += [helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"]),
              helper.make_node("Add", ["ad", "bd"], ["y"]),
              helper.make_node("QuantizeLinear", ["y", "so", "zo"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "so", "zo"], ["out"])]
    graph = helper.make_graph(nodes, "add", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR)
    return model.SerializeToString(), feeds, y_scale


@requires_qnn
@pytest.mark.htp
@pytest.mark.parametrize("case", list(ADD_CASES))
def test_cpu_add_codes_follow_the_htp(case):
    mismatch = []
    for seed in range(3):
        model, feeds, step = add_model(**ADD_CASES[case], seed=seed)
        htp = output_codes(model, feeds, step, backend="htp", provider_options={"htp_arch": "75"})
        cpu = output_codes(model, feeds, step)
        # (a 16-bit one-element constant: one code of 2,048 one step off in one of three seeds, as yet unexplained)
        allowed = 0.001 if "one-element" in case else 0.0
        assert np.mean(cpu != htp) <= allowed and np.abs(cpu - htp).max() <= 1, (case, seed, np.mean(cpu != htp))
        mismatch.append(np.mean(output_codes(model, feeds, step, numerics="basic") != htp))
    assert max(mismatch) > 0.001, case  # the exact sum differs: the rule is not a no-op


@requires_qnn
@pytest.mark.htp
def test_an_add_of_a_one_element_constant_is_left_exact():
    """x + 3 in a hard-swish: the HTP adds an 8-bit one-element constant exactly, and the rewrite leaves it so (at
    16 bits it follows the rule: ADD_CASES)."""
    for seed in range(3):
        model, feeds, step = add_model(b_shape=[1], constant=True, seed=seed)
        assert htp_accumulator_rounding(model, requantize=True) is model
        htp = output_codes(model, feeds, step, backend="htp", provider_options={"htp_arch": "75"})
        assert np.array_equal(output_codes(model, feeds, step, numerics="basic"), htp)


def test_sixteen_bit_add_multipliers_stay_below_two_to_the_fifteen():
    """The 16-bit Add's step 2^-s: the finest up to 2^-16 that keeps both multipliers below 2^15."""
    for a, b in [(0.2, 0.18), (0.99, 0.1), (1.02, 0.5), (2.38, 0.97), (0.012, 0.011)]:
        m_a, m_b, _, shift = add_constants(a, 0, b, 0, 1.0, 0, bits=16)
        assert max(m_a, m_b) < 2 ** 15 and (shift == 2 ** 16 or max(a, b) * shift * 2 >= 2 ** 15 - 0.5), (a, b)
