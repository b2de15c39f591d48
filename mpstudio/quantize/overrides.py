"""A plan's per-tensor choices as ORT's TensorQuantOverrides: its type overrides (with the channel axis of
per-channel weights), the ones HTP needs besides, and imported encodings pinned onto the resolved ones."""

from __future__ import annotations

import copy
from typing import Mapping

import numpy as np
from onnx import helper

from ..errors import MpstudioError
from ..graph import ModelGraph
from ..plan import PrecisionPlan
from ..qdq import Encoding
from ..folding import folded_activation_input
from .resolution import QUANT_TYPES

RANGE_OPTIONS = ("symmetric", "reduce_range", "rmin", "rmax")  # ORT refuses them next to scale and zero_point


def init_overrides(plan: PrecisionPlan, graph: ModelGraph) -> dict[str, list[dict]]:
    """The plan's overrides as `get_qnn_qdq_config`'s `init_overrides` (ORT TensorQuantOverrides)."""
    overrides: dict[str, list[dict]] = {}
    for tensor, override in plan.overrides.items():
        info = graph.tensor(tensor)
        entry: dict = {}
        if override.type is not None:
            entry["quant_type"] = QUANT_TYPES[override.type]
        if not info.is_activation:
            entry.update(_weight_entry(plan, graph, tensor, override))
        if entry:
            overrides[tensor] = [entry]
    for tensor, entries in list(overrides.items()):
        upstream = folded_activation_input(graph, tensor)
        if upstream is not None and upstream not in plan.overrides:
            overrides[upstream] = [dict(entries[0])]
    overrides.update(_unsigned_norm_scales(plan, graph))
    return overrides


def _weight_entry(plan: PrecisionPlan, graph: ModelGraph, tensor: str, override) -> dict:
    """The symmetry and channel axis of one weight's override."""
    entry: dict = {}
    weight_type = override.type or plan.weight_type
    symmetric = override.symmetric
    if symmetric is None and override.type is not None:
        symmetric = weight_type.startswith("int")  # signed weights are symmetric on HTP
    if symmetric is not None:
        entry["symmetric"] = symmetric
    per_channel = override.per_channel
    if per_channel is None and weight_type == "int4":
        per_channel = True  # 16 levels for a whole tensor are rarely enough: per channel unless asked
    if per_channel is None and plan.per_channel:
        per_channel = default_per_channel(graph, tensor)
    if per_channel:
        entry["axis"] = weight_axis(graph, tensor)
    return entry


def _unsigned_norm_scales(plan: PrecisionPlan, graph: ModelGraph) -> dict[str, list[dict]]:
    """Overrides that keep a LayerNormalization's scale unsigned (asymmetric) when the plan's weights are
    signed: QNN HTP rejects a LayerNormalization whose scale is int8 or int16 (the node falls back to the CPU,
    measured on onnxruntime-qnn 2.7), while its Conv, MatMul and Gemm weights take signed types. A per-tensor
    override of the scale in the plan is kept as it is."""
    if not plan.weight_type.startswith("int"):
        return {}
    unsigned = QUANT_TYPES["u" + plan.weight_type]
    out = {}
    for node in graph.nodes.values():
        if node.op_type != "LayerNormalization" or len(node.inputs) < 2:
            continue
        scale = node.inputs[1]
        info = graph.tensors.get(scale)
        if info is not None and not info.is_activation and scale not in plan.overrides:
            out[scale] = [{"quant_type": unsigned, "symmetric": False}]
    return out


def weight_axis(graph: ModelGraph, tensor: str) -> int:
    """The output-channel axis of a weight, from the op that consumes it."""
    info = graph.tensor(tensor)
    rank = len(info.shape or ())
    for consumer in info.consumers:
        node = graph.nodes[consumer]
        if node.op_type == "Conv" and node.inputs[1] == tensor:
            return 0
        if node.op_type == "ConvTranspose" and node.inputs[1] == tensor:
            return 1
        if node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1 and node.inputs[1] == tensor:
            trans_b = node.attributes.get("transB", 0) if node.op_type == "Gemm" else 0
            return 0 if trans_b else max(rank - 1, 0)
    raise MpstudioError(
        f"{tensor!r} is not the weight of a Conv, ConvTranspose, MatMul or Gemm, so it has no channel axis for "
        "per-channel quantization; quantize it per tensor"
    )


def default_per_channel(graph: ModelGraph, tensor: str) -> bool:
    """Whether a plan's global `per_channel` quantizes this weight per channel."""
    # ORT's global per_channel covers Conv and ConvTranspose weights only.
    return any(graph.nodes[c].op_type in ("Conv", "ConvTranspose") for c in graph.tensor(tensor).consumers)


def pin_overrides(resolved: dict[str, list[dict]], plan: PrecisionPlan, graph: ModelGraph,
                  pinned: Mapping[str, Encoding]) -> dict[str, list[dict]]:
    """`resolved` (the TensorQuantOverrides `get_qnn_qdq_config` returned for `plan`) with the scale and zero
    point of each pinned tensor added where the tensor keeps the pinned type and granularity: on the tensor's
    own entry when its producer writes that type, on its convert when ORT converts it to that type for some
    consumers (ORT decides where a plan's widths meet), nowhere when the plan has changed it since."""
    out = copy.deepcopy(resolved)
    default_activation = QUANT_TYPES[plan.activation_type]
    for name, encoding in pinned.items():
        info = graph.tensors.get(name)
        quant_type = QUANT_TYPES.get(encoding.dtype)
        if info is None or quant_type is None:
            continue
        zero_dtype = helper.tensor_dtype_to_np_dtype(quant_type.tensor_type)
        parameters = [{"quant_type": quant_type, "scale": np.array(scale, dtype=np.float32),
                       "zero_point": np.array(zero, dtype=zero_dtype)}
                      for scale, zero in zip(encoding.scale, encoding.zero_point)]
        entries = out.get(name) or [{}]
        if info.is_activation:
            if _pin_activation(entries[0], quant_type, default_activation, parameters[0]):
                out[name] = entries
            continue
        override = plan.overrides.get(name)
        kind = (override.type if override else None) or plan.weight_type
        per_channel = override.per_channel if override and override.per_channel is not None else (
            plan.per_channel and default_per_channel(graph, name))
        if kind != encoding.dtype or per_channel != encoding.per_channel:
            continue
        first = {k: v for k, v in entries[0].items() if k not in RANGE_OPTIONS + ("scale", "zero_point")}
        out[name] = [{**(first if i == 0 else {}), **p} for i, p in enumerate(parameters)]
        if encoding.per_channel:
            out[name][0]["axis"] = encoding.axis
    return out


def _pin_activation(entry: dict, quant_type, default_activation, parameters: dict) -> bool:
    """Put `parameters` on an activation's entry, or on its convert, where that has the pinned type; whether
    it went anywhere."""
    if entry.get("quant_type", default_activation) == quant_type:
        _without_range_options(entry).update(parameters)
    elif isinstance(entry.get("convert"), dict) and entry["convert"].get("quant_type") == quant_type:
        _without_range_options(entry["convert"]).update(parameters)
    else:
        return False
    return True


def _without_range_options(entry: dict) -> dict:
    for key in RANGE_OPTIONS:
        entry.pop(key, None)
    return entry
