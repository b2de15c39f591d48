"""How the HTP rounds the accumulator of a 16-bit Conv or Gemm, written into a QDQ model for ORT's CPU EP.

Measured on the HTP emulator with one-op models (tests/test_runtime_accumulator_rounding.py): a Conv or Gemm whose
input and output are 16-bit activations and whose weights are per-channel int8 (symmetric) does not add its
products, zero-point correction and bias exactly. In units of the accumulator's step (input scale x weight scale),
with q the uint16 input codes (the zero point not subtracted) and w the weight codes, it computes

    256 * (floor(sum(q * w) / 256) + round_half_up(-zero_point * sum(w) / 256) + trunc(bias / 256))

(the product sum shifted right by 8 bits, the zero point's term rounded to the same 256 steps, the int32 bias with
its low 8 bits dropped toward zero), then requantizes that to the output as the graph writes it. Over random
inputs this predicts the HTP's output codes but at 0.1-0.7 % (one step), where the exact sum misses 16-46 %;
depthwise 3x3 and 5x5 (stride 1, or 2 along one axis), regular 3x3 (stride 1 and 2) and 1x1 Convs and Gemm
alike. A depthwise Conv strided along both axes follows neither rule and is left exact. 8-bit activations keep
their sum and bias whole but requantize them with a shifted accumulator and a 12-bit multiplier (`htp_requantize`).

Why it matters: the bias' low bits are a per-channel constant the network carries downstream. On PP-OCRv4's
recognizer at all-16-bit, following this rule in the first depthwise Conv alone takes the CPU's output from 20.5 dB
to 33.4 dB against the HTP's (docs/benchmarks.md).

The rewrite keeps every sum exact in float32: the codes are split as q = 256 * hi + lo and each half is convolved
with the weight codes, so floor(sum(q * w) / 256) = sum(hi * w) + floor(sum(lo * w) / 256) for up to 518 products
per output (255 * 127 * 518 < 2^24); longer sums carry float32's rounding as ORT's own fake-quant sum does.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_SIXTEEN_BIT = (TensorProto.UINT16,)
_SHIFT = 256.0


def graph_links(graph: onnx.GraphProto) -> tuple[dict, dict, dict[str, list]]:
    """A graph's initializers by name, each tensor's producing node, and each tensor's consuming nodes."""
    inits = {i.name: i for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return inits, producers, consumers


FUSED_ACTIVATIONS = ("Relu", "Clip")  # what ORT folds into the op before them (its output range)


def quantizers_after(node, consumers) -> list:
    """The nodes that read `node`'s output past a fused Relu/Clip (each the only reader of the one before):
    in a QDQ model, the QuantizeLinears that write what the op computes."""
    users = consumers.get(node.output[0], [])
    while len(users) == 1 and users[0].op_type in FUSED_ACTIVATIONS:
        users = consumers.get(users[0].output[0], [])
    return users


def rewrite_nodes(graph: onnx.GraphProto, rewrite) -> bool:
    """Replace, in place and in order, each node for which `rewrite(node, inits, producers, consumers, graph)`
    (`graph_links`) returns the nodes computing it instead (None: kept); True when any was replaced."""
    inits, producers, consumers = graph_links(graph)
    changed = False
    for node in list(graph.node):
        added = rewrite(node, inits, producers, consumers, graph)
        if added is None:
            continue
        at = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, extra in enumerate(added):
            graph.node.insert(at + offset, extra)
        changed = True
    return changed


def follow_accumulator_rounding(proto: onnx.ModelProto) -> bool:
    """Rewrite, in place, each 16-bit Conv and Gemm the HTP rounds (see the module docstring) to compute what the
    HTP computes; True when any was rewritten."""
    def rewrite(node, inits, producers, consumers, graph):
        found = _operands(node, inits, producers, consumers) if node.op_type in ("Conv", "Gemm") else None
        return None if found is None else _rewritten_nodes(node, *found, graph)
    return rewrite_nodes(proto.graph, rewrite)


def initializer_array(inits, name):
    """The value of initializer `name` of `inits` (`graph_links`), or None when it is not one."""
    return numpy_helper.to_array(inits[name]) if name in inits else None


def node_attribute(node, name, default):
    """The value of `node`'s attribute `name`, or `default`."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


_array, _attribute = initializer_array, node_attribute


def dequantized_operands(node, inits, producers):
    """(input DequantizeLinear, its zero point, its scale, weight codes, weight scales, weight zero points, bias
    codes, bias scales) of a Conv or Gemm whose input, weight and bias are each dequantized, the weight and bias from
    initializers, or None."""
    if len(node.input) < 3 or not node.input[2]:
        return None
    x_dq, w_dq, b_dq = (producers.get(name) for name in node.input[:3])
    if any(p is None or p.op_type != "DequantizeLinear" or len(p.input) < 3 for p in (x_dq, w_dq, b_dq)):
        return None
    x_zero, x_scale = _array(inits, x_dq.input[2]), _array(inits, x_dq.input[1])
    codes, w_scale, w_zero = (_array(inits, name) for name in w_dq.input[:3])
    bias, b_scale = _array(inits, b_dq.input[0]), _array(inits, b_dq.input[1])
    if any(a is None for a in (x_zero, x_scale, codes, w_scale, w_zero, bias, b_scale)):
        return None
    return x_dq, x_zero, x_scale, codes, w_scale, w_zero, bias, b_scale


def plain_layout(node, codes, channels: int) -> bool:
    """A Conv without auto_pad, not a depthwise strided along both axes (the HTP rounds those another way), or a Gemm
    without transposed input, alpha or beta, whose weight `codes` hold `channels` output channels."""
    if node.op_type == "Conv":
        if codes.shape[0] != channels or _attribute(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            return False
        group = _attribute(node, "group", 1)
        return not (group > 1 and group == channels and min(_attribute(node, "strides", [1])) > 1)
    if (_attribute(node, "transA", 0) or _attribute(node, "alpha", 1.0) != 1.0
            or _attribute(node, "beta", 1.0) != 1.0 or codes.ndim != 2):
        return False
    return codes.shape[0 if _attribute(node, "transB", 0) else 1] == channels


def _operands(node, inits, producers, consumers):
    """(input codes' tensor, input scale, input zero point, weight codes, weight scales, bias codes) of a Conv/Gemm
    the rule covers, or None."""
    found = dequantized_operands(node, inits, producers)
    if found is None:
        return None
    x_dq, x_zero, x_scale, codes, w_scale, w_zero, bias, b_scale = found
    if x_zero.dtype != np.uint16 or x_zero.size != 1 or x_scale.size != 1:
        return None
    if not _sixteen_bit_output(node, consumers, inits):
        return None
    if codes.dtype != np.int8 or np.any(w_zero != 0) or bias.dtype != np.int32 or w_scale.size != bias.size:
        return None
    if not plain_layout(node, codes, bias.size):
        return None
    # the int32 bias is on the accumulator's grid (input scale x weight scale), as ORT's quantizer writes it
    accumulator_step = float(x_scale) * w_scale.astype(np.float64).reshape(-1)
    if not np.allclose(b_scale.astype(np.float64).reshape(-1), accumulator_step, rtol=1e-5, atol=0):
        return None
    return (x_dq.input[0], float(x_scale), int(x_zero), codes, w_scale.astype(np.float64).reshape(-1),
            bias.astype(np.int64))


def _sixteen_bit_output(node, consumers, inits) -> bool:
    users = quantizers_after(node, consumers)
    if not users or any(u.op_type != "QuantizeLinear" or len(u.input) < 3 for u in users):
        return False
    zeros = [inits.get(u.input[2]) for u in users]
    return all(z is not None and z.data_type in _SIXTEEN_BIT for z in zeros)


def _rewritten_nodes(node, x_codes, x_scale, x_zero, codes, w_scale, bias, graph):
    """The nodes computing the HTP's result of `node` from its input's uint16 codes (`x_codes`, what its input's
    DequantizeLinear reads), or None."""
    p = f"{node.name or node.output[0]}/htp_accumulator/"
    channels = bias.size
    if node.op_type == "Conv":
        weight_sums = codes.reshape(channels, -1).astype(np.int64).sum(1)
        shape = [1, channels] + [1] * (codes.ndim - 2)
    else:
        transposed = bool(_attribute(node, "transB", 0))
        weight_sums = codes.astype(np.int64).sum(1 if transposed else 0)
        shape = [channels]
    constant = (np.floor(-x_zero * weight_sums / _SHIFT + 0.5) + np.sign(bias) * (np.abs(bias) // int(_SHIFT)))
    constants = [
        numpy_helper.from_array(np.float32(x_zero), p + "x_zero"),
        numpy_helper.from_array(np.float32(_SHIFT), p + "shift"),
        numpy_helper.from_array(codes.astype(np.float32), p + "w_codes"),
        numpy_helper.from_array(constant.astype(np.float32).reshape(shape), p + "constant"),
        numpy_helper.from_array((_SHIFT * x_scale * w_scale).astype(np.float32).reshape(shape), p + "step"),
    ]
    graph.initializer.extend(constants)
    nodes = [helper.make_node("Cast", [x_codes], [p + "q"], name=p + "Codes", to=TensorProto.FLOAT)]
    codes_in = p + "q"
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv":
        pads = attributes.pop("pads", None)
        if pads and any(pads):
            graph.initializer.append(numpy_helper.from_array(
                np.array([0, 0, *pads[:len(pads) // 2], 0, 0, *pads[len(pads) // 2:]], np.int64), p + "pads"))
            nodes.append(helper.make_node("Pad", [codes_in, p + "pads", p + "x_zero"], [p + "padded"],
                                          name=p + "Pad", mode="constant"))
            codes_in = p + "padded"
    nodes += [
        helper.make_node("Div", [codes_in, p + "shift"], [p + "hi_ratio"], name=p + "HiRatio"),
        helper.make_node("Floor", [p + "hi_ratio"], [p + "hi"], name=p + "Hi"),
        helper.make_node("Mul", [p + "hi", p + "shift"], [p + "hi_codes"], name=p + "HiCodes"),
        helper.make_node("Sub", [codes_in, p + "hi_codes"], [p + "lo"], name=p + "Lo"),
    ]
    op_attributes = {k: v for k, v in attributes.items() if k not in ("alpha", "beta")}
    for half in ("hi", "lo"):
        nodes.append(helper.make_node(node.op_type, [p + half, p + "w_codes"], [p + half + "_sum"],
                                      name=p + half.capitalize() + "Sum", **op_attributes))
    nodes += [
        helper.make_node("Div", [p + "lo_sum", p + "shift"], [p + "lo_ratio"], name=p + "LoRatio"),
        helper.make_node("Floor", [p + "lo_ratio"], [p + "lo_floor"], name=p + "LoFloor"),
        helper.make_node("Add", [p + "hi_sum", p + "lo_floor"], [p + "shifted"], name=p + "Shifted"),
        helper.make_node("Add", [p + "shifted", p + "constant"], [p + "accumulator"], name=p + "Accumulator"),
        helper.make_node("Mul", [p + "accumulator", p + "step"], [node.output[0]], name=p + "Value"),
    ]
    return nodes
