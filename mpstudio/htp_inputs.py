"""How the HTP quantizes a float graph input, for the fake-quant CPU numerics to follow (`htp_input_rounding`).

Measured on the QNN HTP emulator (onnxruntime-qnn, htp_arch 75) with a Q -> DQ -> Transpose -> Q -> DQ model
whose output carries the input's codes, over values spread across the range and values within 1e-3 of a
rounding tie: a uint8 graph input gets `round_half_away(float16(x / scale)) + zero_point` (no mismatch in
46,080 values; ORT's CPU, `round_half_even(x / scale)` in float32, differed at 26 % of them, all near ties);
a uint16 graph input gets `x / scale` computed exactly (float64) and rounded to nearest, ties toward zero (no
mismatch; ORT's float32 division differed at 11 %, and 256 exact ties went toward zero). The float16 step is 1/2048 of the value, so the 8-bit codes move only where x / scale
lies within |x / scale| / 2048 of a tie, but inputs normalized as `pixel / 127.5 - 1` (or any pixel grid
that the calibrated scale matches) lie on ties everywhere: on PP-OCRv4's recognizer 67 % of the input codes
differed, every plan's HTP run saw another image than its CPU run, and the ranking of plans that lie within
a dB of each other followed that difference (docs/benchmarks.md, "The graph input's rounding on the HTP").
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

_EIGHT_BIT = (TensorProto.UINT8, TensorProto.INT8)
_SIXTEEN_BIT = (TensorProto.UINT16, TensorProto.INT16)


def htp_input_rounding(model: str | bytes | onnx.ModelProto) -> str | bytes | onnx.ModelProto | None:
    """`model` with each QuantizeLinear of a float graph input fed the value the HTP rounds that input to (a
    point of its grid, which ORT's QuantizeLinear then maps to the HTP's code); `model` itself when it has
    none. A path or bytes come back as bytes when changed; a ModelProto is changed in place, and the answer
    is then the proto, or None when nothing changed."""
    proto = model if isinstance(model, onnx.ModelProto) else (
        onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model))
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    inputs = {i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT} - set(inits)
    changed = False
    for node in list(graph.node):
        if node.op_type != "QuantizeLinear" or node.input[0] not in inputs:
            continue
        zero = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zero is not None and zero.dims and int(np.prod(zero.dims)) != 1:
            continue  # per-axis input quantization: not what ORT's QNN configuration writes
        bits = TensorProto.UINT8 if zero is None else zero.data_type
        if bits not in _EIGHT_BIT + _SIXTEEN_BIT:
            continue
        name = f"{node.input[0]}_htp_rounded_{node.name or len(graph.node)}"
        added = (_eight_bit if bits in _EIGHT_BIT else _sixteen_bit)(node.input[0], node.input[1], name)
        at = list(graph.node).index(node)
        for offset, extra in enumerate(added):
            graph.node.insert(at + offset, extra)
        node.input[0] = name
        changed = True
    if isinstance(model, onnx.ModelProto):
        return proto if changed else None
    return proto.SerializeToString() if changed else model


def _eight_bit(x: str, scale: str, out: str) -> list:
    """round_half_away(float16(x / scale)) * scale: Div, the float16 round trip, then sign * floor(|v| + 0.5)."""
    p = f"{out}/"
    return [
        helper.make_node("Div", [x, scale], [p + "ratio"], name=p + "Div"),
        helper.make_node("Cast", [p + "ratio"], [p + "half"], to=TensorProto.FLOAT16, name=p + "ToHalf"),
        helper.make_node("Cast", [p + "half"], [p + "value"], to=TensorProto.FLOAT, name=p + "ToFloat"),
        helper.make_node("Abs", [p + "value"], [p + "abs"], name=p + "Abs"),
        helper.make_node("Constant", [], [p + "half_step"], value=helper.make_tensor("", TensorProto.FLOAT, [], [0.5]),
                         name=p + "HalfStep"),
        helper.make_node("Add", [p + "abs", p + "half_step"], [p + "shifted"], name=p + "Add"),
        helper.make_node("Floor", [p + "shifted"], [p + "magnitude"], name=p + "Floor"),
        helper.make_node("Sign", [p + "value"], [p + "sign"], name=p + "Sign"),
        helper.make_node("Mul", [p + "sign", p + "magnitude"], [p + "code"], name=p + "Code"),
        helper.make_node("Mul", [p + "code", scale], [out], name=p + "Mul"),
    ]


def _sixteen_bit(x: str, scale: str, out: str) -> list:
    """round_half_toward_zero(x / scale) * scale in float64: sign * ceil(|v| - 0.5)."""
    p = f"{out}/"
    return [
        helper.make_node("Cast", [x], [p + "x64"], to=TensorProto.DOUBLE, name=p + "XToDouble"),
        helper.make_node("Cast", [scale], [p + "s64"], to=TensorProto.DOUBLE, name=p + "ScaleToDouble"),
        helper.make_node("Div", [p + "x64", p + "s64"], [p + "value"], name=p + "Div"),
        helper.make_node("Abs", [p + "value"], [p + "abs"], name=p + "Abs"),
        helper.make_node("Constant", [], [p + "half_step"], value=helper.make_tensor("", TensorProto.DOUBLE, [], [0.5]),
                         name=p + "HalfStep"),
        helper.make_node("Sub", [p + "abs", p + "half_step"], [p + "shifted"], name=p + "Sub"),
        helper.make_node("Ceil", [p + "shifted"], [p + "magnitude"], name=p + "Ceil"),
        helper.make_node("Sign", [p + "value"], [p + "sign"], name=p + "Sign"),
        helper.make_node("Mul", [p + "sign", p + "magnitude"], [p + "code"], name=p + "Code"),
        helper.make_node("Mul", [p + "code", p + "s64"], [p + "rounded"], name=p + "Mul"),
        helper.make_node("Cast", [p + "rounded"], [out], to=TensorProto.FLOAT, name=p + "ToFloat"),
    ]


def switchable_input_rounding(x: str, scale: str, lo: str, hi: str, out: str) -> list:
    """Nodes writing to `out` the graph input `x` rounded as the HTP rounds it onto the grid of `scale`, for a
    model whose quantization parameters are inputs (the sensitivity engine's switchable model): the width is
    read from the clip range [lo, hi] of that grid (255 steps: 8 bits; 65535: 16 bits)."""
    p = f"{out}/"
    eight, sixteen = _eight_bit(x, scale, p + "eight"), _sixteen_bit(x, scale, p + "sixteen")
    return eight + sixteen + [
        helper.make_node("Sub", [hi, lo], [p + "span"], name=p + "Span"),
        helper.make_node("Div", [p + "span", scale], [p + "steps"], name=p + "Steps"),
        helper.make_node("Constant", [], [p + "eight_bit_steps"],
                         value=helper.make_tensor("", TensorProto.FLOAT, [], [1024.0]), name=p + "EightBitSteps"),
        helper.make_node("Greater", [p + "steps", p + "eight_bit_steps"], [p + "wide"], name=p + "Wide"),
        helper.make_node("Where", [p + "wide", p + "sixteen", p + "eight"], [out], name=p + "Where"),
    ]
