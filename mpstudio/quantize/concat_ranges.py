"""Concats that join tensors of very different ranges: the joined tensor is quantized on one scale, so an input
much narrower than the others keeps only a few of its steps (a detector's box coordinates in pixels joined with
its class scores in [0, 1]: at 8 bits the scores round to 0 or one step of over a pixel)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..graph import ModelGraph
from ..plan import PrecisionPlan

# An input whose whole range spans fewer steps of the joined tensor than this (4 bits) has lost its values.
MIN_INPUT_STEPS = 16
_SIXTEEN_BIT = ("uint16", "int16")


@dataclass(frozen=True)
class SqueezedInput:
    """One input of a Concat that keeps fewer than MIN_INPUT_STEPS of the joined tensor's steps."""

    node: str
    output: str
    tensor: str
    span: float
    output_span: float
    bits: int

    @property
    def step(self) -> float:
        """The joined tensor's quantization step."""
        return self.output_span / (2 ** self.bits - 1)

    @property
    def steps(self) -> float:
        """How many of those steps the input's range spans."""
        return self.span / self.step


def squeezed_concat_inputs(graph: ModelGraph, spans: Mapping[str, float],
                           plan: PrecisionPlan | None = None) -> list[SqueezedInput]:
    """The Concat inputs that the joined tensor's scale leaves fewer than MIN_INPUT_STEPS steps, at the precision
    `plan` gives the joined tensor (None: 8 bits). `spans` maps a tensor to its calibrated range, widened to hold
    zero as ORT's quantizer widens it; tensors without one are skipped."""
    plan = plan or PrecisionPlan()
    found = []
    for node in graph.nodes.values():
        if node.op_type != "Concat" or not node.outputs or node.outputs[0] not in spans:
            continue
        output = node.outputs[0]
        override = plan.overrides.get(output)
        kind = override.type if override is not None and override.type else plan.activation_type
        bits = 16 if kind in _SIXTEEN_BIT else 8
        for tensor in dict.fromkeys(node.inputs):
            if tensor in spans and spans[output] > 0:
                squeezed = SqueezedInput(node.name, output, tensor, spans[tensor], spans[output], bits)
                if squeezed.steps < MIN_INPUT_STEPS:
                    found.append(squeezed)
    return found


def concat_range_note(squeezed: list[SqueezedInput], outputs=()) -> str:
    """A warning naming the Concats whose narrow inputs lose their values ("" when there are none), model outputs
    first: what happens, why output SNR does not show it, and what to do."""
    if not squeezed:
        return ""
    squeezed = sorted(squeezed, key=lambda s: (s.output not in outputs, s.steps))
    first = squeezed[0]
    where = ", a model output," if first.output in outputs else ""
    rest = squeezed[1:]
    others = (f" ({len(rest)} more such input(s): {', '.join(s.tensor for s in rest[:3])}"
              + (" ..." if len(rest) > 3 else "") + ")") if rest else ""
    wider = 16 if first.bits == 8 else first.bits
    kept = first.steps * (2 ** wider - 1) / (2 ** first.bits - 1)
    keeps = f" (it then keeps {kept:.0f} steps)" if first.bits == 8 else ""
    return (f"warning: {first.output}{where} joins tensors of very different ranges (Concat {first.node}) on one "
            f"{first.bits}-bit scale: {first.tensor} spans {first.span:.4g} of its {first.output_span:.4g}, "
            f"{first.steps:.1f} of its steps of {first.step:.4g}, so its values take at most "
            f"{math.ceil(first.steps) + 1} levels{others}. Output SNR hardly sees it (the wider inputs hold the "
            f"output's power): judge plans with a task metric, and promote {first.output} to uint{wider} in the "
            f"plan{keeps} or make the model output the joined tensors separately.")
