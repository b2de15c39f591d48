"""Which type each node reads each tensor in once ORT's QNN configuration has resolved a plan: the one
place that shadows ORT's type resolution (its converts at 8/16-bit boundaries, the Relu/Clip it folds into
the op before them, as `folding` says which, and the element-wise constants HTP wants at the width their op
computes in)."""

from __future__ import annotations

from onnxruntime.quantization import QuantType

from ..graph import WEIGHT, ModelGraph
from ..plan import PrecisionPlan

QUANT_TYPES = {
    "int4": QuantType.QInt4,
    "uint8": QuantType.QUInt8,
    "int8": QuantType.QInt8,
    "uint16": QuantType.QUInt16,
    "int16": QuantType.QInt16,
}
SIXTEEN_BIT = (QuantType.QUInt16, QuantType.QInt16)  # the quant types of a 16-bit tensor
# Element-wise ops whose constant operand must share the activation's bit width on HTP.
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu", "Where", "Equal", "Greater", "Less",
               "GreaterOrEqual", "LessOrEqual", "Concat"}
# Activations ORT's QDQ quantizer folds into the op before them (the op then writes their output directly).


def activation_bits(quant_type: QuantType) -> int:
    """8 or 16: the width of an activation quantized to `quant_type`."""
    return 16 if quant_type in SIXTEEN_BIT else 8


class ResolvedTypes:
    """Which type each tensor has, and which type each consumer reads it in, after ORT's converts.

    `resolved` is the `TensorQuantOverrides` that `get_qnn_qdq_config` returns: a tensor's entry gives the
    type its producer writes; a `convert` entry gives the type its `recv_nodes` (all consumers if none
    are named) read it in.
    """

    def __init__(self, resolved: dict, default: QuantType):
        self.resolved, self.default = resolved, default

    def produced(self, tensor: str) -> QuantType:
        entries = self.resolved.get(tensor)
        return entries[0].get("quant_type", self.default) if entries else self.default

    def converted(self, tensor: str, node: str) -> QuantType | None:
        """The type `node` receives `tensor` in through a convert, or None when it reads the produced value."""
        entries = self.resolved.get(tensor)
        convert = entries[0].get("convert") if entries else None
        if convert and (not convert.get("recv_nodes") or node in convert["recv_nodes"]):
            return convert.get("quant_type", self.default)
        return None

    def has_convert(self, tensor: str) -> bool:
        entries = self.resolved.get(tensor)
        return bool(entries and entries[0].get("convert"))

    def received(self, tensor: str, node: str) -> QuantType:
        converted = self.converted(tensor, node)
        return converted if converted is not None else self.produced(tensor)

    def keeps_folded_activation(self, activation_input: str, activation_output: str) -> bool:
        """Whether a Relu/Clip that ORT folds into the op before it stays in the graph under this resolution:
        ORT folds it only while no convert touches its input or output."""
        return self.has_convert(activation_input) or self.has_convert(activation_output)


def sixteen_bit_constants(graph: ModelGraph, plan: PrecisionPlan, resolved: dict) -> dict[str, list[dict]]:
    """Constant operands of element-wise nodes that compute at 16 bits in an 8-bit-activation plan."""
    if plan.activation_type in ("uint16", "int16"):
        return {}
    types = ResolvedTypes(resolved, QUANT_TYPES[plan.activation_type])
    extra: dict[str, list[dict]] = {}
    for node in graph.nodes.values():
        if node.op_type not in ELEMENTWISE:
            continue
        tensors = [graph.tensors.get(name) for name in node.inputs if name]
        constants = [t.name for t in tensors if t is not None and t.kind == WEIGHT and t.name not in plan.overrides]
        if not constants:
            continue
        seen = {types.received(t.name, node.name) for t in tensors if t is not None and t.is_activation}
        seen |= {types.produced(name) for name in node.outputs if name}
        wide = [t for t in seen if t in SIXTEEN_BIT]
        if wide:
            for name in constants:
                extra[name] = [{"quant_type": wide[0]}]
    return extra
