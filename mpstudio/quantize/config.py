"""ORT's QNN quantization configuration for a plan (`get_qnn_qdq_config` with the plan's overrides), and the
arguments `quantize_static` takes from it."""

from __future__ import annotations

from typing import Mapping

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

from ..errors import MpstudioError
from ..graph import ModelGraph
from ..plan import PrecisionPlan
from ..qdq import Encoding
from .overrides import init_overrides, pin_overrides
from .resolution import QUANT_TYPES, sixteen_bit_constants


def qnn_config(model: onnx.ModelProto, graph: ModelGraph, plan: PrecisionPlan, method=CalibrationMethod.MinMax,
               calibration_data_reader=None, pinned: Mapping[str, Encoding] | None = None):
    """ORT's StaticQuantConfig for `plan`, made by `get_qnn_qdq_config` so the result is valid for QNN.

    A second pass gives the constant operand of an element-wise op the 16-bit type when ORT's converts
    make that op compute at 16 bits in an 8-bit plan: HTP rejects such a node with an 8-bit constant
    (the graph fails to finalize). `pinned` (imported encodings, `Quantizer.pinned`) fixes the scale and
    zero point of each tensor the plan still quantizes to the pinned type and granularity.
    """
    overrides = init_overrides(plan, graph)

    def make(overrides):
        try:
            return get_qnn_qdq_config(
                model,
                calibration_data_reader,
                calibrate_method=method,
                activation_type=QUANT_TYPES[plan.activation_type],
                weight_type=QUANT_TYPES[plan.weight_type],
                per_channel=plan.per_channel,
                weight_symmetric=plan.weight_symmetric,
                init_overrides=overrides,
            )
        except Exception as exc:
            raise MpstudioError(f"ORT could not make a QNN configuration for {plan.summary()}: {exc}") from exc

    config = make(overrides)
    matched = sixteen_bit_constants(graph, plan, config.extra_options.get("TensorQuantOverrides", {}))
    if matched:
        config = make({**overrides, **matched})
    if pinned:  # on the resolved overrides, which reproduce the same model when fed back
        config = make(pin_overrides(config.extra_options.get("TensorQuantOverrides", {}), plan, graph, pinned))
    return config


def quantize_kwargs(config) -> dict:
    """`quantize_static`'s keyword arguments from a StaticQuantConfig (`qnn_config`)."""
    return {
        "quant_format": QuantFormat.QDQ,
        "activation_type": config.activation_type,
        "weight_type": config.weight_type,
        "op_types_to_quantize": config.op_types_to_quantize,
        "nodes_to_exclude": config.nodes_to_exclude,
        "per_channel": config.per_channel,
        "use_external_data_format": config.use_external_data_format,
        "calibrate_method": config.calibrate_method,
        "extra_options": config.extra_options,
    }
