"""How the HTP requantizes an 8-bit Conv's or Gemm's accumulator and adds two 8-bit or two 16-bit tensors,
written into a QDQ model for ORT's CPU EP.

Measured on the HTP emulator with one-op models (tests/test_runtime_requantize_rounding.py): a Conv or Gemm whose
input and output are 8-bit activations and whose weights are int8 codes (symmetric, per channel or per tensor,
or uint8 per tensor around a zero point, within int8 of it) does not requantize its int32 accumulator exactly.
With acc = sum((q - input zero point) * w) + bias in units of the accumulator's step (input scale x weight
scale) and M = input scale x weight scale / output scale (per output channel), write M = m * 2^e with m in
[1, 2). The HTP computes the output code as

    floor((floor(acc / 2^k) + 1/2) * 2^k * M12 + 1/2) + output zero point,   k = -e - 4

where M12 is M rounded to 12 significant bits: the accumulator shifted right by k bits (its low bits dropped,
then half of the dropped step added back) and multiplied by a 12-bit multiplier. For the small multipliers of
real layers (M around 2^-12) k is 8: the accumulator keeps a step of about 1/16 output step, so the exact sum's
codes differ from the HTP's at 1-4 % of the outputs (one step, near rounding ties); this rule predicts every one
of them over random regular, depthwise (3x3, 5x5, stride 1 or 2 along one axis) and pointwise Convs and Gemms.
A depthwise Conv strided along both axes requantizes exactly (as the 16-bit rule's exception) and is left so.

An 8-bit Add of two 8-bit operands (codes q_a, q_b; A, B their scales over the output scale) computes, with
2^s = 2^(13 - e) for e the exponent of A + B (at most 2^15), integer multipliers m_a = round(A * 2^s), m_b = round(B * 2^s) and
the zero points' constant kept to 256 of those steps, c = 256 * round((z_y * 2^s - z_a * m_a - z_b * m_b) / 256):

    floor((q_a * m_a + q_b * m_b + c) / 2^s + 1/2)

(every code of 6 x 65,536 operand pairs, where the exact sum misses 0.03-0.8 %; broadcast and constant operands
alike). An Add of a one-element constant (hard-swish's x + 3) is exact on the HTP and is left so.

A 16-bit Add (both operands and the output uint16) computes the same form with 16-bit multipliers: 2^s is the
largest power of two up to 2^16 that keeps the larger of round(A * 2^s) and round(B * 2^s) below 2^15, and the
constant is exact, c = round(z_y * 2^s - z_a * m_a - z_b * m_b); one-element constants included (every code of
random one-op models at output scales of 0.4-50 times the sum's range, broadcast, constant and one-element
operands, B/A from 0.05 to 20, where the exact sum misses 13-80 % by one step; at B/A = 0.001, 0.1 % of codes
stay off). An Add whose operands and output differ in width is left exact, as the HTP computes it but for a code
in thousands.

Why it matters: one step at 2 % of a layer's outputs is far inside the quantization noise, but a network whose
output turns on a few borderline samples (PaddleOCR's text-direction classifier: an 8-bit MobileNetV3 with
hard-swish and squeeze-excite gates) carries those steps to the class probability, and the plans' order on the
CPU then follows its own rounding instead of the HTP's (docs/benchmarks.md).

The rewrite computes the accumulator from the input's uint8 codes (one Cast where its DequantizeLinear reads
them) and the weight and bias codes in float32, exact for sums below 2^24, then the shift and the multiplier in
float64, and writes the output value on its grid (code x scale) for the QuantizeLinear that follows.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .htp_accumulator import initializer_array as _array
from .htp_accumulator import dequantized_operands, plain_layout, quantizers_after, rewrite_nodes

_MULTIPLIER_BITS = 12
_EXTRA_BITS = 4
_ADD_BITS = 13  # an 8-bit Add's multipliers: 2^(13 - e) for e the exponent of their sum
_ADD_MAX_SHIFT = 15  # at steps of 2^-15 at most (an output scale over the operands' sum)
_ADD_CONSTANT_STEP = 256.0  # its constant (zero points) is kept to 256 of those steps
_ADD16_MULTIPLIER = 2 ** 15  # a 16-bit Add's multipliers stay below 2^15
_ADD16_MAX_SHIFT = 16  # at steps of 2^-16 at most
_ACTIVATION_TYPES = {np.dtype(np.uint8): 8, np.dtype(np.uint16): 16}


def follow_requantize_rounding(proto: onnx.ModelProto) -> bool:
    """Rewrite, in place, each 8-bit Conv and Gemm and each 8-bit or 16-bit Add the HTP requantizes (see the
    module docstring) to compute what the HTP computes; True when any was rewritten."""
    def rewrite(node, inits, producers, consumers, graph):
        if node.op_type in ("Conv", "Gemm"):
            found = conv_operands(node, inits, producers, consumers)
            return None if found is None else _rewritten_nodes(node, *found, graph)
        if node.op_type == "Add":
            found = add_operands(node, inits, producers, consumers)
            return None if found is None else _add_nodes(node, *found, graph)
        return None
    return rewrite_nodes(proto.graph, rewrite)


def _output_encoding(node, inits, consumers, dtype=np.uint8) -> tuple[float, int] | None:
    """(scale, zero point) of the one per-tensor `dtype` encoding all QuantizeLinears after `node` (through a fused
    Relu/Clip) write, or None."""
    users = quantizers_after(node, consumers)
    if not users or any(u.op_type != "QuantizeLinear" or len(u.input) < 3 for u in users):
        return None
    encodings = set()
    for u in users:
        scale, zero = _array(inits, u.input[1]), _array(inits, u.input[2])
        if scale is None or zero is None or zero.dtype != dtype or scale.size != 1 or zero.size != 1:
            return None
        encodings.add((float(scale.reshape(-1)[0]), int(zero.reshape(-1)[0])))
    return encodings.pop() if len(encodings) == 1 else None


def conv_operands(node, inits, producers, consumers):
    """(input codes' tensor, input scale, input zero point, weight codes, weight scales, bias codes, output scale)
    of a Conv/Gemm the rule covers, or None."""
    found = dequantized_operands(node, inits, producers)
    if found is None:
        return None
    x_dq, x_zero, x_scale, codes, w_scale, w_zero, bias, b_scale = found
    if x_zero.dtype != np.uint8 or x_zero.size != 1 or x_scale.size != 1:
        return None
    if bias.dtype != np.int32:
        return None
    if codes.dtype == np.uint8 and w_zero.size == 1 and w_scale.size == 1:
        # a uint8 per-tensor weight (ORT's QNN default) the HTP takes as it is: its codes around the zero point
        codes = codes.astype(np.int64) - int(w_zero.reshape(-1)[0])
        if codes.min() < -128 or codes.max() > 127:
            return None  # requantized by the HTP (runtime.htp_weight_grid writes what it computes with)
    elif codes.dtype != np.int8 or np.any(w_zero != 0):
        return None
    output = _output_encoding(node, inits, consumers)
    if output is None:
        return None
    channels = bias.size
    if not plain_layout(node, codes, channels):
        return None  # (a depthwise Conv strided along both axes requantizes exactly on the HTP)
    if w_scale.size not in (1, channels):
        return None
    w_scale = np.broadcast_to(w_scale.astype(np.float64).reshape(-1), channels)
    if b_scale.size not in (1, channels):
        return None
    bias = accumulator_bias(bias, b_scale, float(x_scale), w_scale)
    if bias is None:
        return None
    return (x_dq.input[0], float(x_scale), int(x_zero), codes, w_scale, bias, output[0])


def accumulator_bias(codes: np.ndarray, b_scale: np.ndarray, x_scale: float, w_scale: np.ndarray
                     ) -> np.ndarray | None:
    """The int32 bias `codes` (stored with step `b_scale`) in accumulator steps (input scale x the HTP's weight
    scale per channel), float64; None when they are not exact in float32."""
    channels = w_scale.size
    # ORT's quantizer writes the int32 bias on the accumulator's grid (input scale x weight scale); where the HTP's
    # weight grid (runtime.htp_weight_grid) widened a channel's weight scale, the HTP takes the bias onto the wider
    # grid, rounded to nearest (one-op models with widened channels: 0.07 % of codes off, as with any rounding)
    accumulator_step = np.float64(np.float32(x_scale)) * w_scale
    ratio = np.broadcast_to(np.asarray(b_scale, np.float64).reshape(-1), channels) / accumulator_step
    codes = np.asarray(codes, np.float64)
    bias = np.where(np.isclose(ratio, 1.0, rtol=1e-5, atol=0), codes, np.round(codes * ratio))
    return None if np.abs(bias).max(initial=0) >= 2 ** 24 else bias  # (beyond: not exact in float32)


def requantize_constants(x_scale: float, w_scale: np.ndarray, y_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel: the HTP's accumulator shift step 2^k and the multiplier from a shifted step to output
    steps (2^k x M rounded to 12 significant bits), both float64."""
    multiplier = np.float64(np.float32(x_scale)) * np.asarray(w_scale, np.float64) / np.float64(np.float32(y_scale))
    exponent = np.floor(np.log2(multiplier))
    rounded = np.round(multiplier / 2.0 ** exponent * 2.0 ** (_MULTIPLIER_BITS - 1)) \
        * 2.0 ** (exponent - _MULTIPLIER_BITS + 1)
    step = 2.0 ** (-exponent - _EXTRA_BITS)
    return step, step * rounded


def _rewritten_nodes(node, x_codes, x_scale, x_zero, codes, w_scale, bias, y_scale, graph):
    """The nodes computing the HTP's output value of `node` (on its output grid) from its input's uint8 codes."""
    p = f"{node.name or node.output[0]}/htp_requantize/"
    channels = bias.size
    shape = [1, channels] + [1] * (codes.ndim - 2) if node.op_type == "Conv" else [channels]
    step, multiplier = requantize_constants(x_scale, w_scale, y_scale)
    graph.initializer.extend([
        numpy_helper.from_array(np.float32(x_zero), p + "x_zero"),
        numpy_helper.from_array(codes.astype(np.float32), p + "w_codes"),
        numpy_helper.from_array(bias.astype(np.float32), p + "b_codes"),
        numpy_helper.from_array(step.reshape(shape), p + "step"),
        numpy_helper.from_array(multiplier.reshape(shape), p + "multiplier"),
        numpy_helper.from_array(np.float64(0.5), p + "half"),
        numpy_helper.from_array(np.float64(y_scale), p + "y_scale"),
    ])
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return [
        helper.make_node("Cast", [x_codes], [p + "q"], name=p + "Codes", to=TensorProto.FLOAT),
        helper.make_node("Sub", [p + "q", p + "x_zero"], [p + "centred"], name=p + "Centred"),
        # zero padding of the centred codes is the zero point's padding of the codes, as the HTP pads
        helper.make_node(node.op_type, [p + "centred", p + "w_codes", p + "b_codes"], [p + "sum"],
                         name=p + "Sum", **attributes),
        *requantized_value_nodes(p, node.output[0]),
    ]


def requantized_value_nodes(p: str, output: str) -> list[onnx.NodeProto]:
    """The nodes from a Conv's or Gemm's float32 accumulator `p`sum (in accumulator steps) to its output value
    `output` (float32, on the output grid): shifted by `p`step, multiplied by `p`multiplier, rounded, times
    `p`y_scale (`p`half is one half, in float64)."""
    return [
        helper.make_node("Cast", [p + "sum"], [p + "accumulator"], name=p + "Accumulator", to=TensorProto.DOUBLE),
        helper.make_node("Div", [p + "accumulator", p + "step"], [p + "ratio"], name=p + "Ratio"),
        helper.make_node("Floor", [p + "ratio"], [p + "shifted"], name=p + "Shifted"),
        helper.make_node("Add", [p + "shifted", p + "half"], [p + "centre"], name=p + "Centre"),
        helper.make_node("Mul", [p + "centre", p + "multiplier"], [p + "steps"], name=p + "Steps"),
        helper.make_node("Add", [p + "steps", p + "half"], [p + "biased"], name=p + "RoundUp"),
        helper.make_node("Floor", [p + "biased"], [p + "code"], name=p + "Code"),
        helper.make_node("Mul", [p + "code", p + "y_scale"], [p + "value64"], name=p + "Value"),
        helper.make_node("Cast", [p + "value64"], [output], name=p + "ToFloat", to=TensorProto.FLOAT),
    ]


# ---- Add ---------------------------------------------------------------------------------------------------------
def add_operands(node, inits, producers, consumers, exact_constants: bool = True):
    """((codes' tensor, scale, zero point) of both inputs, (output scale, zero point), bits) of an 8-bit or 16-bit
    Add the rule covers, or None; an 8-bit Add of a one-element constant too unless `exact_constants`."""
    if len(node.input) != 2:
        return None
    inputs, types = [], set()
    for name in node.input:
        dq = producers.get(name)
        if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 3:
            return None
        scale, zero = _array(inits, dq.input[1]), _array(inits, dq.input[2])
        if scale is None or zero is None or zero.dtype not in _ACTIVATION_TYPES or scale.size != 1 or zero.size != 1:
            return None
        types.add(zero.dtype)
        inputs.append((dq.input[0], float(scale.reshape(-1)[0]), int(zero.reshape(-1)[0])))
    if len(types) != 1:
        return None  # operands of two widths: the HTP's sum is the exact one (but for a code in thousands)
    dtype = types.pop()
    bits = _ACTIVATION_TYPES[dtype]
    if exact_constants and bits == 8 and any(one_element_constant(codes, inits) for codes, _, _ in inputs):
        return None  # an 8-bit one-element constant (hard-swish's + 3) is added exactly on the HTP
    output = _output_encoding(node, inits, consumers, dtype)
    return None if output is None else (inputs, output, bits)


def one_element_constant(codes: str, inits) -> bool:
    """Whether an Add operand's codes are a one-element initializer."""
    return codes in inits and int(np.prod(inits[codes].dims)) == 1


def add_constants(a_scale: float, a_zero: int, b_scale: float, b_zero: int, y_scale: float, y_zero: int,
                  bits: int = 8):
    """The HTP's integer Add of two `bits`-bit operands: (multiplier of a's codes, of b's codes, constant, 2^s)
    with the output code floor((q_a * m_a + q_b * m_b + constant) / 2^s + 1/2)."""
    a, b = (np.float64(np.float32(v)) / np.float64(np.float32(y_scale)) for v in (a_scale, b_scale))
    if bits == 16:
        shift, constant_step = add16_shift(max(a, b)), 1.0  # an exact constant
    else:
        shift = 2.0 ** min(_ADD_MAX_SHIFT, _ADD_BITS - np.floor(np.log2(a + b)))
        constant_step = _ADD_CONSTANT_STEP
    m_a, m_b = np.round(a * shift), np.round(b * shift)
    constant = constant_step * np.round((y_zero * shift - a_zero * m_a - b_zero * m_b) / constant_step)
    return float(m_a), float(m_b), float(constant), float(shift)


def add16_shift(larger: float) -> float:
    """A 16-bit Add's 2^s: the largest power of two up to 2^16 with round(`larger` x 2^s) below 2^15."""
    exponent = _ADD16_MAX_SHIFT
    while np.round(larger * 2.0 ** exponent) >= _ADD16_MULTIPLIER:
        exponent -= 1
    return 2.0 ** exponent


def _add_nodes(node, inputs, output, bits, graph):
    """The nodes computing the HTP's output value of an 8-bit or 16-bit Add (on its output grid) from its inputs'
    codes."""
    p = f"{node.name or node.output[0]}/htp_requantize/"
    (a, a_scale, a_zero), (b, b_scale, b_zero) = inputs
    y_scale, y_zero = output
    m_a, m_b, constant, shift = add_constants(a_scale, a_zero, b_scale, b_zero, y_scale, y_zero, bits)
    graph.initializer.extend(numpy_helper.from_array(np.float64(v), p + n) for v, n in [
        (m_a, "m_a"), (m_b, "m_b"), (constant + 0.5 * shift - y_zero * shift, "constant"), (shift, "shift"),
        (y_scale, "y_scale")])
    return [
        helper.make_node("Cast", [a], [p + "qa"], name=p + "CodesA", to=TensorProto.DOUBLE),
        helper.make_node("Cast", [b], [p + "qb"], name=p + "CodesB", to=TensorProto.DOUBLE),
        helper.make_node("Mul", [p + "qa", p + "m_a"], [p + "ta"], name=p + "TermA"),
        helper.make_node("Mul", [p + "qb", p + "m_b"], [p + "tb"], name=p + "TermB"),
        *added_value_nodes(p, node.output[0]),
    ]


def added_value_nodes(p: str, output: str) -> list[onnx.NodeProto]:
    """The nodes from an Add's two terms `p`ta and `p`tb (codes times their multipliers, float64) to its
    output value `output` (float32, on the output grid), with `p`constant, `p`shift and `p`y_scale."""
    return [
        helper.make_node("Add", [p + "ta", p + "tb"], [p + "sum"], name=p + "Sum"),
        # + 1/2 output step and - the output zero point, in 2^-s steps: floor gives the code minus the zero point
        helper.make_node("Add", [p + "sum", p + "constant"], [p + "biased"], name=p + "Constant"),
        helper.make_node("Div", [p + "biased", p + "shift"], [p + "ratio"], name=p + "Ratio"),
        helper.make_node("Floor", [p + "ratio"], [p + "code"], name=p + "Code"),
        helper.make_node("Mul", [p + "code", p + "y_scale"], [p + "value64"], name=p + "Value"),
        helper.make_node("Cast", [p + "value64"], [output], name=p + "ToFloat", to=TensorProto.FLOAT),
    ]
