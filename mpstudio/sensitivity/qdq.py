"""Reading a generated QDQ model: which float tensor each QuantizeLinear quantizes, with which parameters.

ORT names things predictably: the float op output keeps the tensor's name `T` (or `T_QuantizeLinear_Input`
for a graph output, whose name moves to the DequantizeLinear output), and the DequantizeLinear output that
feeds the consumers is `T_DequantizeLinear_Output` (or `T`). Some float tensors have no counterpart, e.g. a
Conv output whose Relu ORT removed; they are reported as unmatched, not guessed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import node_display_name
from .stats import quantize_dequantize

# ORT's names in a QDQ model: a graph output T is written by its op as T + GRAPH_OUTPUT_SUFFIX (the last
# DequantizeLinear writes T); the value consumers read is T + DEQUANTIZED_SUFFIX.
GRAPH_OUTPUT_SUFFIX = "_QuantizeLinear_Input"
DEQUANTIZED_SUFFIX = "_DequantizeLinear_Output"


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
        return int(np.iinfo(self.dtype).min)

    @property
    def qmax(self) -> int:
        return int(np.iinfo(self.dtype).max)

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
        stripped = pre.removesuffix(GRAPH_OUTPUT_SUFFIX)
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


@dataclass(frozen=True)
class TensorParams:
    """Tensor -> the parameters ORT computes for it from its own range, at 8 and at 16 bits: as its producer
    writes it (`written_*`, with QNN's fixed 16-bit Sigmoid/Tanh parameters) and for a convert to that width
    (`convert_*`: a convert entry carries the type alone, so its parameters come from the range alone)."""

    written_8: Mapping[str, QuantParams]
    written_16: Mapping[str, QuantParams]
    convert_8: Mapping[str, QuantParams]
    convert_16: Mapping[str, QuantParams]


def ort_tensor_params(float_model: onnx.ModelProto, calibration_path, config,
                      range_only: bool = False) -> dict[str, QuantParams]:
    """Tensor -> the parameters ORT's QDQ quantizer computes for it from its own calibrated range under `config`
    (a StaticQuantConfig from `quantize.qnn_config`), before any tensor takes another's parameters.

    A shared tensor (the output of a Reshape, Transpose, Slice, AveragePool ...) is written with its input's
    parameters, but a convert of it is made from these. They come from ORT's quantizer itself, set up as
    `quantize_static` sets it up, so range adjustments (a Relu/Clip input takes the output's range, a Softmax
    output spans [0, 1]) and QNN's fixed 16-bit Sigmoid/Tanh parameters are ORT's own; `range_only` drops
    fixed parameters from the overrides, as for a convert.
    """
    from onnxruntime.quantization.calibrate import load_tensors_data
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
    from onnxruntime.quantization.quant_utils import save_and_reload_model_with_shape_infer, update_opset_version
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    extra = dict(config.extra_options or {})
    if range_only:
        extra["TensorQuantOverrides"] = {
            name: [{k: v for k, v in entry.items() if k not in ("scale", "zero_point")} for entry in entries]
            for name, entries in extra.get("TensorQuantOverrides", {}).items()}
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # ORT logs advice (opset updates) at WARNING on the root logger
    try:
        model = save_and_reload_model_with_shape_infer(float_model)
        model = update_opset_version(model, config.weight_type, config.activation_type,
                                     tensor_quant_overrides=extra.get("TensorQuantOverrides"),
                                     block_size=extra.get("BlockSize", 0))
        op_types = list(config.op_types_to_quantize or set(QLinearOpsRegistry) | set(QDQRegistry))
        quantizer = QDQQuantizer(model, config.per_channel, False, config.weight_type, config.activation_type,
                                 load_tensors_data(str(calibration_path)), [], list(config.nodes_to_exclude or []),
                                 op_types, extra)
    finally:
        root.setLevel(level)
    out: dict[str, QuantParams] = {}
    for name, params in quantizer.quantization_params.items():
        original = params.original
        dtype = helper.tensor_dtype_to_np_dtype(original["quant_type"]).name
        out[name] = QuantParams(float(np.asarray(original["scale"]).reshape(())),
                                int(np.asarray(original["zero_point"]).reshape(())), dtype)
    return out
