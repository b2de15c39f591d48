"""Biases a plan's QDQ model clips: ORT's quantizer writes a Conv's or Gemm's bias as int32 codes on the grid
input scale x weight scale, and a bias wider than 2^31 of those steps saturates. A narrow input at 16 bits (a range
of 1e-4 over 65535 steps) times an 8-bit weight's scale makes steps of about 1e-12, which hold biases up to a few
thousandths: a classifier's bias of 0.06 is cut to 0.0016, and the logits lose it. ORT widens the weight's scale to
fit the bias only for symmetric weights (int8 or int16, zero point 0: per-channel int8 weights); a uint8 per-tensor
weight (a8w8, a16w8) keeps the clipped bias, and the HTP computes with it as written."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

_INT32_MAX = float(np.iinfo(np.int32).max)
_BIASED = ("Conv", "ConvTranspose", "Gemm")


@dataclass(frozen=True)
class ClippedBias:
    """A node whose int32 bias saturates: `channels` of its `size` bias values lie beyond what the codes hold."""

    node: str
    op_type: str
    largest: float  # the largest |bias| of the float model
    holds: float  # the largest |bias| the int32 codes hold (2^31 steps; the smallest over channels)
    channels: int
    size: int


def clipped_biases(qdq: onnx.ModelProto, float_model: onnx.ModelProto) -> list[ClippedBias]:
    """The Conv, ConvTranspose and Gemm nodes of `qdq` whose int32 bias cannot hold `float_model`'s bias (nodes
    matched by name)."""
    initializers = {t.name: t for t in qdq.graph.initializer}
    producer = {name: node for node in qdq.graph.node for name in node.output}
    float_nodes = {node.name: node for node in float_model.graph.node if node.name}
    float_inits = {t.name: t for t in float_model.graph.initializer}
    found = []
    for node in qdq.graph.node:
        original = float_nodes.get(node.name)
        if node.op_type not in _BIASED or len(node.input) < 3 or original is None or len(original.input) < 3:
            continue
        dequantize = producer.get(node.input[2])
        if dequantize is None or dequantize.op_type != "DequantizeLinear" or original.input[2] not in float_inits:
            continue
        codes, scale = (initializers.get(name) for name in dequantize.input[:2])
        if codes is None or scale is None or codes.data_type != onnx.TensorProto.INT32:
            continue
        bias = numpy_helper.to_array(float_inits[original.input[2]]).astype(np.float64).ravel()
        steps = np.broadcast_to(numpy_helper.to_array(scale).astype(np.float64).ravel(), bias.shape)
        beyond = np.abs(bias) > _INT32_MAX * steps
        if beyond.any():
            found.append(ClippedBias(node.name, node.op_type, float(np.abs(bias).max()),
                                     float(_INT32_MAX * steps[beyond].min()), int(beyond.sum()), bias.size))
    return found


def clipped_bias_note(clipped: list[ClippedBias], plan_name: str) -> str:
    """A warning naming the biases `plan_name`'s model clips ("" when none)."""
    if not clipped:
        return ""
    shown = "; ".join(f"{c.node} ({c.op_type}): {c.channels} of {c.size} values beyond {c.holds:.3g}, up to "
                      f"{c.largest:.3g}" for c in clipped[:3]) + (" ..." if len(clipped) > 3 else "")
    return (f"warning: {plan_name} clips the int32 bias of {len(clipped)} node(s): {shown}. ORT's quantizer writes a "
            "bias on the grid input scale x weight scale, too fine here (a narrow input, at 16 bits most of all), and "
            "widens the weight's scale to fit it only for symmetric weights: per-channel int8 weights (a8w8-pc, "
            "a16w8-pc, --weights per-channel, or \"per_channel\": true in the plan) keep the bias; the HTP "
            "computes with the clipped bias as written.")


__all__ = ["ClippedBias", "clipped_biases", "clipped_bias_note"]
