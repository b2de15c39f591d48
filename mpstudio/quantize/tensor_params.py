"""The quantization parameters ORT's QDQ quantizer computes for each tensor from its own calibrated range,
read from ORT's quantizer itself (for the isolation engine's converts and shared parameters)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import helper

from ..qdq import Encoding
from .ort_patch import ort_quantizer_turn, quiet_ort_logging


@dataclass(frozen=True)
class TensorParams:
    """Tensor -> the parameters ORT computes for it from its own range, at 8 and at 16 bits: as its producer
    writes it (`written_*`, with QNN's fixed 16-bit Sigmoid/Tanh parameters) and for a convert to that width
    (`convert_*`: a convert entry carries the type alone, so its parameters come from the range alone)."""

    written_8: Mapping[str, Encoding]
    written_16: Mapping[str, Encoding]
    convert_8: Mapping[str, Encoding]
    convert_16: Mapping[str, Encoding]


def ort_tensor_params(float_model: onnx.ModelProto, calibration_path, config,
                      range_only: bool = False) -> dict[str, Encoding]:
    """Tensor -> the parameters ORT's QDQ quantizer computes for it from its own calibrated range under `config`
    (a StaticQuantConfig from `qnn_config`), before any tensor takes another's parameters.

    A shared tensor (the output of a Reshape, Transpose, Slice, AveragePool ...) is written with its input's
    parameters, but a convert of it is made from these. They come from ORT's quantizer itself, set up as
    `quantize_static` sets it up, so range adjustments (a Relu/Clip input takes the output's range, a Softmax
    output spans [0, 1]) and QNN's fixed 16-bit Sigmoid/Tanh parameters are ORT's own; `range_only` drops
    fixed parameters from the overrides, as for a convert. Takes its turn at ORT's quantizer.
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
    # ORT logs advice (opset updates) at WARNING on the root logger
    with ort_quantizer_turn(), quiet_ort_logging():
        model = save_and_reload_model_with_shape_infer(float_model)
        model = update_opset_version(model, config.weight_type, config.activation_type,
                                     tensor_quant_overrides=extra.get("TensorQuantOverrides"),
                                     block_size=extra.get("BlockSize", 0))
        op_types = list(config.op_types_to_quantize or set(QLinearOpsRegistry) | set(QDQRegistry))
        quantizer = QDQQuantizer(model, config.per_channel, False, config.weight_type, config.activation_type,
                                 load_tensors_data(str(calibration_path)), [], list(config.nodes_to_exclude or []),
                                 op_types, extra)
    out: dict[str, Encoding] = {}
    for name, params in quantizer.quantization_params.items():
        original = params.original
        dtype = helper.tensor_dtype_to_np_dtype(original["quant_type"]).name
        out[name] = Encoding.per_tensor(float(np.asarray(original["scale"]).reshape(())),
                                        int(np.asarray(original["zero_point"]).reshape(())), dtype)
    return out
