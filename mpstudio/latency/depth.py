"""Mechanisms `channel_blocks` and `channel_block_lanes` (both off: measured in docs/latency.md, "Fit"): the HTP
keeps an image-like activation (rank 4 or 5, channels on axis 1 in ONNX) in channel blocks of 32, in every type
(QNN HTP guideline "Avoid low depth activations"), so a tensor of C channels takes ceil(C / 32) x 32 channels of
memory: a 16-channel map moves twice its elements' bytes, a 48-channel one 4/3. The matrix unit's MACs are padded
the same way already (`latency.work`); `channel_blocks` pads the bytes the roofline's memory term moves, and
`channel_block_lanes` the elements vector ops process too.

Which tensors have that layout: the inputs and outputs of spatial ops (convolutions, pools, resize, batch norm,
depth/space moves), and what element-wise ops and data movers make of them (a residual Add, a SiLU, a Concat
over channels keep the layout). A 4-D attention tensor [batch, heads, tokens, depth] never touches a spatial op
and keeps its element count.
"""

from __future__ import annotations

import math

from .ops import HVX_CLASS, MOVER_OPS

CHANNEL_BLOCK = 32
SHALLOW = 4  # an image of at most this many channels is packed densely, not padded to a block
# Ops whose activations the HTP holds channels-last in channel blocks (QNN converts them from NCHW).
SPATIAL_OPS = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
               "Resize", "Upsample", "BatchNormalization", "InstanceNormalization", "DepthToSpace",
               "SpaceToDepth"}
# Ops that pass the layout of an image-like input on to their output (element-wise, same rank; data movers
# that keep the rank). Transpose and Reshape are left out: they change what axis 1 means.
_CARRIERS = (set(HVX_CLASS) - {"Softmax", "LogSoftmax", "LayerNormalization"}) | (
    MOVER_OPS - {"Transpose", "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements"})


def image_tensors(qops, shapes: dict, graph_inputs=()) -> set[str]:
    """The float-model names of the image-like activations: those the HTP holds channels-last in channel blocks.
    `qops` are the QDQ reader's ops in graph order, `shapes` keyed by QDQ value name. A graph input is not: it
    arrives in the caller's dense layout. Nor is an image of at most four channels (grey, RGB, RGBA: a first
    convolution's input, a super-resolution net's output image), which the HTP packs densely instead of padding to
    a block (its shallow-input convolutions read it so)."""
    blocked: set[str] = set()

    def image_like(operand) -> bool:
        shape = shapes.get(operand.value) or shapes.get(operand.tensor)
        return shape is not None and len(shape) in (4, 5) and shape[1] is not None and shape[1] > SHALLOW

    operands = [([o for o in q.activations if image_like(o)], [o for o in q.outputs if image_like(o)], q.op_type)
                for q in qops]
    for acts, outs, op_type in operands:
        if op_type in SPATIAL_OPS or (op_type in _CARRIERS and any(o.tensor in blocked for o in acts)):
            blocked.update(o.tensor for o in acts + outs)
    for acts, outs, op_type in reversed(operands):  # what an element-wise op feeds a convolution, it reads so
        if op_type in _CARRIERS and any(o.tensor in blocked for o in outs):
            blocked.update(o.tensor for o in acts + outs)
    return blocked - set(graph_inputs)


def blocked_elements(shape) -> int | None:
    """Elements of an image-like tensor with its channels (axis 1) padded to whole blocks of 32."""
    if shape is None or len(shape) < 2 or any(d is None for d in shape):
        return None
    channels = int(shape[1])
    padded = int(math.ceil(max(channels, 1) / CHANNEL_BLOCK) * CHANNEL_BLOCK)
    return int(math.prod(int(d) for d in shape)) // max(channels, 1) * padded
