"""An op's work from its tensor shapes: the multiply-accumulates of matrix ops (padded to the matrix unit's
channel blocks) and the vector elements of everything else, with the engine and cost class that runs it."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from .ops import (DEFAULT_CLASS, HVX_CLASS, LAYER_NORMS, LAYOUT_OPS, MECHANISMS, MOVER_OPS, POOL_OPS,
                  REDUCE_OPS, HtpOp)

_HMX_DEPTH = 32  # HTP stores activations in channel blocks of 32; HMX works on whole blocks


def _pad(n: int, to: int = _HMX_DEPTH) -> int:
    return int(math.ceil(max(n, 1) / to) * to)


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def shape_work(op: HtpOp, node: onnx.NodeProto, shapes: dict, weights, image_like: bool = True) -> None:
    """MACs and HVX work of `op` from its shapes; `image_like`: an operand is an image-like activation
    (`latency.depth.image_tensors`), which the HTP holds channels-last."""
    out_shape = shapes.get(node.output[0])
    out_n = op.outputs[0][2]
    t = node.op_type
    if t in LAYOUT_OPS:
        op.engine, op.cls = "none", "layout"
        return
    if (t == "Transpose" and MECHANISMS["channels_last_transpose"] and image_like
            and _channels_last_only(node, shapes)):
        # The HTP keeps image-like activations channels-last: a permutation of one that only moves the channel axis
        # to or from the end is the layout the tensor already has (QNN's converter drops it), metadata only. An
        # attention tensor's [B, S, H, D] -> [B, H, D, S] has the same permutation and moves data.
        op.engine, op.cls = "none", "layout"
        return
    if t in MOVER_OPS:
        op.engine, op.cls = "dma", "dma"
        return
    if t in ("Conv", "ConvTranspose") and len(node.input) > 1:
        _conv_work(op, node, shapes, out_shape)
        return
    if t in ("Gemm", "MatMul"):
        a = shapes.get(node.input[0])
        if not a or out_n is None:
            op.engine, op.cls = "hmx", "hmx"
            return
        k = a[-2] if (t == "Gemm" and _attr(node, "transA", 0)) else a[-1]
        k = int(k or 1)
        n = int(out_shape[-1] or 1) if out_shape else 1
        op.macs = int(out_n) * k
        op.engine, op.cls = "hmx", "hmx"
        op.hmx_macs = int(out_n // max(n, 1)) * _pad(n) * _pad(k)
        op.out_channels = n
        return
    if t in REDUCE_OPS:
        op.cls, op.work = "reduce", op.inputs[0][2] if op.inputs else out_n
        return
    if t in POOL_OPS:
        kernel = int(np.prod(_attr(node, "kernel_shape", [1]), dtype=np.int64))
        op.cls, op.work = "pool", out_n * kernel
        return
    op.cls, op.work = HVX_CLASS.get(t, DEFAULT_CLASS), out_n
    if t in LAYER_NORMS and MECHANISMS["layernorm_plain"]:
        # Mean, variance and scaling are multiply-adds over the row, with one reciprocal square root per row: the
        # same instructions per element in every type (no look-up to lose at 16 bits), only wider lanes.
        op.cls = "layernorm"
    if t in ("Div", "Pow") and len(op.inputs) == 1 and weights:
        op.cls = "arith"  # by a constant: a multiply by its reciprocal, a square


def _conv_work(op: HtpOp, node: onnx.NodeProto, shapes: dict, out_shape) -> None:
    """MACs and engine of a Conv or ConvTranspose (`shape_work`)."""
    t = node.op_type
    w = shapes.get(node.input[1])
    group = int(_attr(node, "group", 1))
    if not w or not out_shape or any(d is None for d in out_shape):
        op.engine, op.cls = "hmx", "hmx"
        return
    kernel = int(np.prod(w[2:], dtype=np.int64)) if len(w) > 2 else 1
    if t == "Conv":
        cout, cin_g = int(w[0]), int(w[1])
        spatial = int(np.prod(out_shape[2:], dtype=np.int64)) if len(out_shape) > 2 else 1
        batch = int(out_shape[0] or 1)
        op.macs = batch * cout * spatial * cin_g * kernel
        cout_g = cout // max(group, 1)
        if group > 1 and cin_g == 1:
            # depthwise (or channel-multiplier) convolution: HVX multiply-accumulate
            op.engine, op.cls, op.work = "hvx", "depthwise", op.macs
            if MECHANISMS["depthwise_tap_groups"]:
                # One HVX multiply-reduce takes four taps per lane, plus one load/store step per output
                # vector: work grows with ceil(taps / 4) + 1, not with the taps (in units of 4 MACs).
                op.work = op.macs // max(kernel, 1) * 4 * (math.ceil(kernel / 4) + 1)
            return
        op.engine, op.cls = "hmx", "hmx"
        # Mechanism `group_packing`: groups narrower than a channel block share one (a block-diagonal weight tile).
        packed = (_HMX_DEPTH // max(cout_g, cin_g, 1)
                  if group > 1 and max(cout_g, cin_g) < _HMX_DEPTH and MECHANISMS["group_packing"] else 1)
        op.hmx_macs = (batch * math.ceil(group / packed) * _pad(packed * cout_g) * spatial * _pad(packed * cin_g)
                       * kernel)
    else:
        in_shape = shapes.get(node.input[0])
        cin, cout_g = int(w[0]), int(w[1])
        spatial_in = int(np.prod(in_shape[2:], dtype=np.int64)) if in_shape and len(in_shape) > 2 else 1
        batch = int(in_shape[0] or 1) if in_shape else 1
        op.macs = batch * cin * spatial_in * cout_g * kernel
        op.engine, op.cls = "hmx", "hmx"
        op.hmx_macs = batch * group * _pad(cin // max(group, 1)) * spatial_in * _pad(cout_g) * kernel


_CHANNEL_MOVES = ([0, 2, 3, 1], [0, 3, 1, 2])  # NCHW -> NHWC and back


def _channels_last_only(node: onnx.NodeProto, shapes: dict) -> bool:
    """Whether a Transpose of a 4-D activation only moves channels between axis 1 and the last axis."""
    shape = shapes.get(node.input[0]) if node.input else None
    return shape is not None and len(shape) == 4 and list(_attr(node, "perm", [])) in _CHANNEL_MOVES
