"""The switchable model's parameters: how one edge (a tensor and one node reading it) is quantized, what a
configuration changes from the all-8-bit model, and the switch inputs that carry both into the graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...qdq import Encoding

GRAPH_OUTPUT = ""  # the receiver name of an edge into a graph output
_INT32 = np.iinfo(np.int32)

Edge = tuple[str, str]  # (tensor, receiving node; "" for a graph output)


@dataclass(frozen=True)
class EdgeQuant:
    """How a value is quantized between its producer and one receiver: clipped to [lo, hi], rounded on the
    grid of `first`, then on that of `second` if given (a 16-bit value converted to 8 bits is rounded
    twice). `scale` is the last quantizer's step, the one the receiver's DequantizeLinear carries (and so the
    one a Conv bias is quantized with)."""

    first: Encoding
    lo: float
    hi: float
    scale: float
    second: Encoding | None = None

    @classmethod
    def of(cls, steps: Sequence[Encoding]) -> "EdgeQuant":
        """The value quantized by each of `steps` in turn. Two roundings are kept exactly; of a longer chain
        (a folded activation kept in the graph), the first coarsest one and the finest before it."""
        distinct = [p for i, p in enumerate(steps) if i == 0 or p != steps[i - 1]]
        lo = max(p.clip_range[0] for p in distinct)
        hi = min(p.clip_range[1] for p in distinct)
        if len(distinct) > 2:
            index = max(range(len(distinct)), key=lambda i: (distinct[i].step, -i))
            finer = [p for p in distinct[:index] if p.step < distinct[index].step]
            distinct = ([min(finer, key=lambda p: p.step)] if finer else []) + [distinct[index]]
        return cls(distinct[0], lo, hi, steps[-1].step, distinct[1] if len(distinct) > 1 else None)

    @property
    def params(self) -> Encoding:
        """The coarsest quantization on the way: the precision the receiver gets."""
        return self.first if self.second is None or self.first.step >= self.second.step else self.second

    @property
    def bits(self) -> int:
        return self.params.bits


@dataclass(frozen=True)
class Setting:
    """What one configuration changes from the all-8-bit model: the activation edges (tensor, receiving
    node; "" for a graph output) quantized at 16 bits, the element-wise constants at 16 bits, and every edge
    whose quantization differs from the all-8-bit one (`quant`; when empty, the 16-bit edges take the
    all-16-bit model's parameters)."""

    edges: frozenset[Edge]
    constants: frozenset[str] = frozenset()
    quant: tuple[tuple[Edge, EdgeQuant], ...] = ()


ALL_8 = Setting(frozenset())


@dataclass(frozen=True, eq=False)
class Bias:
    """A Conv/Gemm bias the switchable model can requantize: ORT stores round(bias / (input scale x weight
    scale)) as int32."""

    input: str  # the switch input that replaces its DequantizeLinear
    edge: Edge  # the node's data input
    value: np.ndarray  # float64
    weight_scale: np.ndarray  # float32, per channel or a scalar
    beta: float


def bias_codes(bias: Bias, input_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The int32 codes (as float64) and the float32 step ORT quantizes the bias to for `input_scale`."""
    scale = np.float32(input_scale) * bias.weight_scale * np.float32(bias.beta)
    return np.clip(np.round(bias.value / scale.astype(np.float64)), _INT32.min, _INT32.max), scale


def bias_value(bias: Bias, input_scale: float) -> np.ndarray:
    """The dequantized bias as ORT quantizes it for `input_scale`."""
    q, scale = bias_codes(bias, input_scale)
    return (q.astype(np.float32) * scale).astype(np.float32)


def switch_names(edge: Edge) -> dict[str, str]:
    """The names of one edge's switch inputs and of the values its quantizers write."""
    tensor, receiver = edge
    prefix = f"mpstudio_switch/{tensor}/{receiver or 'output'}/"
    return {"prefix": prefix, "lo": prefix + "lo", "hi": prefix + "hi", "scale": prefix + "scale",
            "zp": prefix + "zero_point", "clipped": prefix + "clipped", "q": prefix + "quantized",
            "value": prefix + "value", "first": prefix + "first", "scale_2": prefix + "scale_2",
            "zp_2": prefix + "zero_point_2", "q_2": prefix + "quantized_2"}


def constant_input(name: str) -> str:
    """The switch input that carries an element-wise constant's value."""
    return f"mpstudio_switch/constant/{name}"


def edge_feed(edge: Edge, quant: EdgeQuant) -> dict[str, np.ndarray]:
    """The switch inputs that make `edge` quantize as `quant`."""
    p = switch_names(edge)
    first, second = quant.first, quant.second or quant.first  # rounding twice on one grid is rounding once
    return {p["lo"]: np.array(quant.lo, np.float32), p["hi"]: np.array(quant.hi, np.float32),
            p["scale"]: np.array(first.step, np.float32),
            p["zp"]: np.array(first.zero - first.qmin, np.uint16),
            p["scale_2"]: np.array(second.step, np.float32),
            p["zp_2"]: np.array(second.zero - second.qmin, np.uint16)}
