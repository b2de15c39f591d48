"""Reading a generated QDQ model: which float tensor each QuantizeLinear quantizes, with which parameters.

ORT names things predictably: the float op output keeps the tensor's name `T` (or `T_QuantizeLinear_Input`
for a graph output, whose name moves to the DequantizeLinear output), and the DequantizeLinear output that
feeds the consumers is `T_DequantizeLinear_Output` (or `T`). Some float tensors have no counterpart, e.g. a
Conv output whose Relu ORT removed; they are reported as unmatched, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import node_display_name
from .stats import quantize_dequantize

_OUTPUT_SUFFIX = "_QuantizeLinear_Input"
_QTYPE_RANGE = {
    "uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
}


@dataclass(frozen=True)
class QuantParams:
    """Per-tensor quantization parameters of one activation: `q = clip(round(x/scale) + zero_point)`."""

    scale: float
    zero_point: int
    dtype: str  # uint8 / uint16 / int8 / int16

    @property
    def bits(self) -> int:
        return 16 if self.dtype.endswith("16") else 8

    @property
    def qmin(self) -> int:
        return _QTYPE_RANGE[self.dtype][0]

    @property
    def qmax(self) -> int:
        return _QTYPE_RANGE[self.dtype][1]

    @property
    def clip_range(self) -> tuple[float, float]:
        """The float interval this quantizer represents (values outside it saturate)."""
        return ((self.qmin - self.zero_point) * self.scale, (self.qmax - self.zero_point) * self.scale)


@dataclass(frozen=True)
class QdqTensor:
    """The QDQ counterpart of one float tensor: the tensor before quantization, after it, and the parameters."""

    name: str  # the float model's tensor name
    pre: str  # the float op output in the QDQ model
    post: str  # the DequantizeLinear output (quantized value) in the QDQ model
    params: QuantParams
    quantize_node: str


def load(model) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))


def quantized_tensors(model) -> dict[str, QdqTensor]:
    """Float tensor name -> its first quantization in the QDQ model (converts that follow are skipped)."""
    model = load(model)
    inits = {init.name: init for init in model.graph.initializer}
    dq_by_input: dict[str, onnx.NodeProto] = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear":
            dq_by_input[node.input[0]] = node
    dq_outputs = {node.output[0] for node in dq_by_input.values()}
    out: dict[str, QdqTensor] = {}
    for index, node in enumerate(model.graph.node):
        if node.op_type != "QuantizeLinear" or node.input[0] in dq_outputs:
            continue  # a convert re-quantizes an already quantized value
        dq = dq_by_input.get(node.output[0])
        if dq is None or len(node.input) < 3 or node.input[1] not in inits or node.input[2] not in inits:
            continue
        scale = numpy_helper.to_array(inits[node.input[1]])
        zero = numpy_helper.to_array(inits[node.input[2]])
        if scale.size != 1:
            continue  # per-channel activations are not made by this project
        pre = node.input[0]
        stripped = pre.removesuffix(_OUTPUT_SUFFIX)
        name = stripped if dq.output[0] == stripped else pre
        out[name] = QdqTensor(
            name=name,
            pre=pre,
            post=dq.output[0],
            params=QuantParams(float(scale.reshape(())), int(zero.reshape(())), zero.dtype.name),
            quantize_node=node_display_name(node, index),
        )
    return out


def with_outputs(model, names) -> bytes:
    """`model` serialized with `names` (float tensors) as its only graph outputs."""
    copy = onnx.ModelProto()
    copy.CopyFrom(load(model))
    del copy.graph.output[:]
    # The shape is left open: ORT infers it, and QDQ models rarely carry value_info.
    copy.graph.output.extend(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                             for name in dict.fromkeys(names))
    return copy.SerializeToString()


def local_error(x: np.ndarray, params: QuantParams) -> np.ndarray:
    """The error of quantizing `x` alone with `params` (quantized minus float)."""
    return quantize_dequantize(x, params.scale, params.zero_point, params.qmin, params.qmax) - x
