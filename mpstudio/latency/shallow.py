"""Mechanism `shallow_input` (docs/latency.md, "Fit"): how the HTP takes a shallow image (a graph input of at most
four channels: grey, RGB, RGBA) into its first convolution, by precision.

- 8-bit: a shallow-input convolution packs the kernel's taps and the few channels into the matrix unit's depth
  (a 3x3 kernel over one or three channels is 9 or 27 deep, one block of 32), so its MACs are padded once over
  channels x taps, not per channel to a block of 32 for every tap; the image stays packed in memory.
- 16-bit and fp16: no such convolution. The image is converted into the HTP's layout of channel blocks first (a
  data mover writing every pixel padded to a block of 32 channels), and the first convolution reads it so: a
  one-channel 480x640 image moves 32x its bytes twice, an RGB one 10.7x.

Only graph inputs: an inner tensor of few channels has its own mechanism (`channel_blocks`, latency.depth).
"""

from __future__ import annotations

import dataclasses
import math

from .depth import CHANNEL_BLOCK, SHALLOW
from .ops import MECHANISMS, TYPE_BITS, HtpOp


def _blocks(n: int) -> int:
    return int(math.ceil(max(n, 1) / CHANNEL_BLOCK) * CHANNEL_BLOCK)


def shallow_inputs(ops: list[HtpOp], qops, shapes: dict, graph_inputs) -> list[HtpOp]:
    """Apply mechanism `shallow_input` to the convolutions of `ops` that read a shallow graph-input image: repack an
    8-bit one's MACs, and for a 16-bit or fp16 one pad its input's bytes and return the layout conversion before it
    (the ops to add). `qops` are the QDQ reader's ops (their nodes name `ops`), `shapes` keyed by QDQ value name.
    Nothing unless the mechanism is on; the 8-bit repacking only with `shallow_input_packing` too."""
    if not MECHANISMS["shallow_input"]:
        return []
    by_node = {op.node: op for op in ops if op.kind == "compute"}
    inputs = set(graph_inputs)
    converted: dict[str, HtpOp] = {}
    for qop in qops:
        op = by_node.get(qop.name)
        if op is None or qop.op_type != "Conv" or op.engine != "hmx" or len(qop.node.input) < 2:
            continue
        reads = [(i, o) for i, o in enumerate(qop.activations) if o.tensor in inputs]
        shape, weight = (shapes.get(reads[0][1].value) if reads else None), shapes.get(qop.node.input[1])
        if not reads or not shape or len(shape) not in (4, 5) or not weight or any(d is None for d in shape):
            continue
        channels = int(shape[1])
        if channels > SHALLOW or int(weight[1]) != channels:  # a grouped first convolution is not shallow
            continue
        slot, operand = reads[0]
        name, dtype, elements = op.inputs[slot]
        taps = int(math.prod(int(d) for d in weight[2:]))
        if TYPE_BITS.get(dtype, 16) <= 8:
            packed = MECHANISMS["shallow_input_packing"] and len(shape) == 4
            op.shallow = (slot, channels, taps, packed)
            if packed:
                op.hmx_macs = op.hmx_macs // (_blocks(channels) * taps) * _blocks(channels * taps)
            continue
        convert = _to_channel_blocks(op, slot, channels)
        converted.setdefault(convert.inputs[0][0], convert)
    return list(converted.values())


def _to_channel_blocks(op: HtpOp, slot: int, channels: int) -> HtpOp:
    """Pad `op`'s input `slot` (a shallow image) to channel blocks; the layout conversion that writes it so."""
    name, dtype, elements = op.inputs[slot]
    padded = elements // channels * _blocks(channels)
    op.inputs[slot] = (name, dtype, padded)
    return HtpOp(f"{name} to channel blocks", "LayoutConvert", "dma", [(name, dtype, elements)],
                 [(f"{name} (channel blocks)", dtype, padded)], cls="dma")


def widened(op: HtpOp) -> list[HtpOp]:
    """An 8-bit convolution that read a shallow graph-input image (`op.shallow` set), as the HTP runs it once its
    input is promoted to 16 bits: the layout conversion and the convolution reading the padded image, its MACs
    unpacked (latency.promotion prices a promotion with them). Types are set by the caller's pricing."""
    slot, channels, taps, packed = op.shallow
    wide = dataclasses.replace(op, inputs=list(op.inputs), shallow=())
    if packed:
        wide.hmx_macs = op.hmx_macs // _blocks(channels * taps) * (_blocks(channels) * taps)
    return [_to_channel_blocks(wide, slot, channels), wide]
