"""Export a precision plan: ORT TensorQuantOverrides JSON, QNN/AIMET encodings JSON, the QDQ model, a context binary.

Every file is checked against the model it describes before `export_plan` returns: the encodings cover every
quantized tensor of the QDQ model with its values, the overrides name real tensors with the model's types.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import onnx
from onnxruntime.quantization import QuantType

from .data import Cancelled, Progress
from .errors import MpstudioError
from .folding import FOLDED_ACTIVATIONS
from .graph import BIAS, INPUT, OUTPUT, ACTIVATION, WEIGHT, ModelGraph, unknown_name_message
from .plan import PrecisionPlan
from .quantize import CALIBRATION_METHODS, QUANT_TYPES, Quantizer, qnn_config
from . import encodings as encodings_format
from .export_aimet import encodings_cannot_carry
from .export_reproduce import (build_context, check_context_model, copy_atomic, htp_weights, readme_text,
                               reproduction_notes, write_bytes, write_text)
from . import qdq
from .qdq import INTEGER_TYPES, Encoding, QuantizedTensor

FORMATS = ("ort", "qnn", "model", "float", "context")
QUANT_TYPE_NAMES: dict[str, QuantType] = {q.name: q for q in QuantType}
_QUANT_TYPE_OF_DTYPE = {INTEGER_TYPES[q.tensor_type][0]: q for q in QuantType if q.tensor_type in INTEGER_TYPES}
ENCODING_BITWIDTHS = encodings_format.BITWIDTHS


def quant_type_of(encoding: Encoding) -> QuantType | None:
    """ORT's QuantType for an encoding's element type (None for int32, the bias type, which has none)."""
    return _QUANT_TYPE_OF_DTYPE.get(encoding.dtype)


def read_quantized_tensors(qdq_model) -> dict[str, QuantizedTensor]:
    """Every quantized tensor of a QDQ model made by ORT's quantizer, keyed by the float model's tensor name."""
    return qdq.quantized_tensors(qdq_model)


# ---- QNN/AIMET encodings JSON ----------------------------------------------------------------------------
def qnn_encodings(qdq_model, version: str = encodings_format.DEFAULT_VERSION, *, biases: bool = True) -> dict[str, Any]:
    """The QNN/AIMET encodings (the format of `qnn-onnx-converter --quantization_overrides`) of a QDQ model, in
    AIMET's `version` "1.0.0" (lists of `{name, dtype, enc_type, bw, is_sym, scale[], offset[]}`) or "0.6.1"
    (the older dict form).

    Every quantized tensor is covered, under the float model's name, with the values stored in the model.
    A converted activation carries the encoding its producer writes; the converter inserts its own converts
    where consumers differ (see docs/export.md). Without `biases`, the int32 biases are left out, as AIMET's
    HTP configurations write them: QNN derives them from the input and weight scales, as ORT did.
    """
    tensors = [t for t in read_quantized_tensors(qdq_model).values() if biases or t.encoding.dtype != "int32"]
    return encodings_format.write(((t.name, t.kind, t.encoding) for t in tensors), version)


def validate_encodings(encodings: Any, qdq_model, *, require_biases: bool = False) -> None:
    """Raise MpstudioError listing every problem of an encodings file in either version (1.0.0 or the dict form):
    schema (keys, types, scale > 0, offsets in range, bit widths, min/max of the dict form) and coverage (every
    quantized tensor of `qdq_model` in the right section, with its bit width, channel count and values; the int32
    biases may be left out, since QNN derives them from the input and weight scales, unless `require_biases`)."""
    parsed, problems = encodings_format.parse(encodings)
    if not isinstance(encodings, Mapping):
        raise MpstudioError(problems[0])
    tensors = read_quantized_tensors(qdq_model)
    listed = encodings_format.names(encodings)
    for kind, section in encodings_format.SECTIONS.items():
        if section not in encodings:
            continue
        for name in listed[section]:
            where = f"{section}[{name!r}]"
            tensor = tensors.get(name)
            if tensor is None:
                problems.append(unknown_name_message("quantized tensor", name, tensors) + f" ({where})")
                continue
            if tensor.kind != kind:
                right = encodings_format.SECTIONS[tensor.kind]
                problems.append(f"{where}: the model quantizes {name!r} as a {tensor.kind}; it belongs in {right}")
                continue
            entry = parsed.entries.get(name)
            if entry is not None and entry.kind == kind:
                problems += _entry_against_model(where, entry, tensor)
        for tensor in tensors.values():
            optional = not require_biases and tensor.encoding.dtype == "int32"
            if tensor.kind == kind and tensor.name not in listed[section] and not optional:
                problems.append(f"{section} lacks {tensor.name!r}, a tensor the model quantizes to "
                                f"{tensor.encoding.dtype} (QNN would recalibrate it)")
    _raise_if(problems, "the encodings do not match the model")


def _entry_against_model(where: str, entry: encodings_format.FileEncoding, tensor: QuantizedTensor) -> list[str]:
    expected = tensor.encoding
    if entry.encoding is None:
        return [f"{where} is float, but the model quantizes it to {expected.dtype}"]
    channels = len(expected.scale)
    if entry.channels != channels:
        axis = f" along axis {expected.axis}" if expected.axis is not None else ""
        return [f"{where} has {entry.channels} encoding(s); the model quantizes it with {channels}{axis}"]
    got = entry.encoding
    if got.bits != expected.bits:
        return [f"{where} has bitwidth {got.bits}, but the model quantizes it to {expected.dtype}"]
    problems = []
    for index, (scale, offset, want_scale, want_offset) in enumerate(
            zip(got.scale, got.offsets, expected.scale, expected.offsets)):
        at = f"{where}[{index}]" if channels > 1 else where
        if offset != want_offset or not math.isclose(scale, want_scale, rel_tol=1e-6):
            problems.append(f"{at} has scale {scale!r}, offset {offset!r}; the model has scale {want_scale!r}, "
                            f"offset {want_offset!r}")
    return problems


# ---- ORT TensorQuantOverrides JSON -----------------------------------------------------------------------
_OVERRIDE_KEYS = {"quant_type", "scale", "zero_point", "symmetric", "reduce_range", "axis", "rmin", "rmax", "convert"}
_CONVERT_KEYS = {"quant_type", "scale", "zero_point", "symmetric", "rmin", "rmax", "recv_nodes"}
_NOT_WITH_SCALE = ("symmetric", "reduce_range", "rmin", "rmax")  # ORT refuses these next to scale/zero_point


def qnn_config_arguments(plan: PrecisionPlan) -> dict[str, Any]:
    """The defaults `get_qnn_qdq_config` needs beside the overrides to reproduce `plan`."""
    return {
        "activation_type": QUANT_TYPES[plan.activation_type],
        "weight_type": QUANT_TYPES[plan.weight_type],
        "per_channel": plan.per_channel,
        "weight_symmetric": plan.weight_symmetric,
    }


def ort_overrides(quantizer: Quantizer, plan: PrecisionPlan, *, with_parameters: bool = False) -> dict[str, list[dict]]:
    """The TensorQuantOverrides mpstudio quantizes `plan` with, JSON-ready (`quant_type` as the QuantType name).

    These are the overrides after `get_qnn_qdq_config` resolved them (converts at 8/16-bit boundaries, the
    16-bit constants of element-wise ops); fed back as `init_overrides` with `qnn_config_arguments(plan)` and
    the same calibration they reproduce the model. With `with_parameters`, every activation's scale and zero
    point (and its convert's) are pinned to the generated model's, so any calibration data reproduces it.
    """
    plan.validate(quantizer.graph)
    config = qnn_config(quantizer.prepared.model, quantizer.graph, plan, CALIBRATION_METHODS[quantizer.method],
                        pinned=quantizer.pinned(plan))
    overrides = _jsonable(config.extra_options.get("TensorQuantOverrides", {}))
    if with_parameters:
        _pin_parameters(overrides, read_quantized_tensors(quantizer.generate(plan)), quantizer.graph)
    return dict(sorted(overrides.items()))


def _pin_parameters(overrides: dict[str, list[dict]], tensors: Mapping[str, QuantizedTensor], graph: ModelGraph) -> None:
    for tensor in tensors.values():
        if tensor.kind != qdq.ACTIVATION:
            continue  # weights and biases follow from the weights and the pinned activation scales
        if tensor.name not in graph.tensors:
            raise MpstudioError(f"the QDQ model quantizes {tensor.name!r}, which the float model lacks; "
                                "its parameters cannot be pinned")
        entries = overrides.setdefault(tensor.name, [{}])
        entry = entries[0]
        _set_parameters(entry, tensor.encoding)
        if tensor.converts:
            if len(tensor.converts) > 1 or "convert" not in entry:
                raise MpstudioError(f"{tensor.name!r} is converted in the model in a way the overrides do not "
                                    "describe; export without pinned parameters")
            _set_parameters(entry["convert"], tensor.converts[0])
    # An activation the model fused into the op before it (no quantizer between them) is pinned at the input
    # too, so ORT's Q/DQ pair there matches the activation's and mpstudio's post-pass can drop it again.
    for tensor in tensors.values():
        source = graph.tensors[tensor.name].producer if tensor.kind == qdq.ACTIVATION else None
        node = graph.nodes.get(source) if source else None
        fused = node.inputs[0] if node is not None and node.op_type in FOLDED_ACTIVATIONS and node.inputs else None
        if fused and fused not in tensors and fused in graph.tensors and graph.tensors[fused].is_activation:
            _set_parameters(overrides.setdefault(fused, [{}])[0], tensor.encoding)


def _set_parameters(entry: dict, encoding: Encoding) -> None:
    for key in _NOT_WITH_SCALE:
        entry.pop(key, None)
    entry["quant_type"] = quant_type_of(encoding).name
    entry["scale"] = encoding.scale[0]
    entry["zero_point"] = encoding.zero_point[0]


def _jsonable(value: Any) -> Any:
    if isinstance(value, QuantType):
        return value.name
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.item() if value.size == 1 else value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_ort_overrides(source: str | os.PathLike | Mapping, graph: ModelGraph | None = None) -> dict[str, list[dict]]:
    """TensorQuantOverrides from a JSON file (or an already parsed dict), ready for `get_qnn_qdq_config(
    init_overrides=...)`: QuantType values, `recv_nodes` as sets, scales and zero points as numpy arrays.

    With `graph` (the float model's), tensor and node names are checked against it too.
    """
    raw, origin = encodings_format.read_json(source, "overrides", "overrides")
    problems = _override_problems(raw, graph)
    _raise_if(problems, f"{origin} holds invalid TensorQuantOverrides")
    return {tensor: [_loaded_entry(entry) for entry in entries] for tensor, entries in raw.items()}


def _loaded_entry(entry: Mapping) -> dict:
    out = dict(entry)
    quant_type = _quant_type(out.get("quant_type"))
    if quant_type is not None:
        out["quant_type"] = quant_type
    if "scale" in out:
        out["scale"] = np.array(out["scale"], dtype=np.float32)
        zero_dtype = onnx.helper.tensor_dtype_to_np_dtype(quant_type.tensor_type) if quant_type else np.int64
        out["zero_point"] = np.array(out["zero_point"], dtype=zero_dtype)
    if "convert" in out:
        convert = _loaded_entry(out["convert"])
        if "recv_nodes" in convert:
            convert["recv_nodes"] = set(convert["recv_nodes"])
        out["convert"] = convert
    return out


def _quant_type(value: Any) -> QuantType | None:
    if value is None or isinstance(value, QuantType):
        return value
    return QUANT_TYPE_NAMES.get(value) if isinstance(value, str) else None


def validate_ort_overrides(overrides: Any, graph: ModelGraph, qdq_model=None, *, pinned: bool = False) -> None:
    """Raise MpstudioError listing every problem of TensorQuantOverrides (JSON form or loaded form).

    Against `graph` (the float model): tensors and receiving nodes exist, keys and values are ones ORT takes.
    Against `qdq_model` (optional): each quant_type, convert type, axis and pinned scale/zero point is the
    model's. With `pinned`, every activation the model quantizes must have its parameters pinned.
    """
    problems = _override_problems(overrides, graph)
    if not problems and qdq_model is not None:
        problems = _override_model_problems(overrides, read_quantized_tensors(qdq_model), pinned)
    _raise_if(problems, "the overrides do not match the model")


def _override_problems(raw: Any, graph: ModelGraph | None) -> list[str]:
    if not isinstance(raw, Mapping):
        return ["TensorQuantOverrides must be a JSON object of {tensor: [{\"quant_type\": \"QUInt16\", ...}]}"]
    problems: list[str] = []
    for tensor, entries in raw.items():
        info = None
        if graph is not None:
            info = graph.tensors.get(tensor)
            if info is None:
                problems.append(unknown_name_message("tensor", tensor, graph.tensors))
                continue
            if info.kind not in (INPUT, ACTIVATION, OUTPUT, WEIGHT, BIAS) or info.dtype not in ("float32", "float16"):
                problems.append(f"{tensor!r} is a {info.kind} of type {info.dtype}, which is not quantized")
                continue
        if not isinstance(entries, list) or not entries or not all(isinstance(e, Mapping) for e in entries):
            problems.append(f"{tensor!r}: overrides must be a non-empty list of objects (one, or one per channel)")
            continue
        is_param = info is not None and info.kind in (WEIGHT, BIAS)
        for index, entry in enumerate(entries):
            where = f"{tensor!r}" if len(entries) == 1 else f"{tensor!r}[{index}]"
            problems += _entry_problems(where, entry, _OVERRIDE_KEYS)
            if "convert" in entry:
                problems += _convert_problems(where, tensor, entry, info, graph)
            if "reduce_range" in entry and info is not None and not is_param:
                problems.append(f"{where}: reduce_range applies to weights only")
        axis = entries[0].get("axis")
        if len(entries) > 1 and axis is None:
            problems.append(f"{tensor!r} has {len(entries)} entries but no 'axis' in the first: per-channel overrides "
                            "name their axis")
        if axis is not None:
            problems += _axis_problems(tensor, entries, axis, info)
    return problems


def _entry_problems(where: str, entry: Mapping, allowed: set[str]) -> list[str]:
    problems = []
    unknown = sorted(set(entry) - allowed)
    if unknown:
        problems.append(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(sorted(allowed))}")
    quant_type = entry.get("quant_type")
    if quant_type is not None and _quant_type(quant_type) is None:
        close = difflib.get_close_matches(str(quant_type), list(QUANT_TYPE_NAMES), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problems.append(f"{where}: unknown quant_type {quant_type!r}; {hint}use one of {', '.join(QUANT_TYPE_NAMES)}")
    if ("scale" in entry) != ("zero_point" in entry):
        problems.append(f"{where}: give both scale and zero_point, or neither")
    if "scale" in entry:
        scale = _number(entry["scale"])
        if scale is None or not scale > 0 or not math.isfinite(scale):
            problems.append(f"{where}: scale must be a positive number, got {entry['scale']!r}")
        zero = _number(entry.get("zero_point"))
        qt = _quant_type(quant_type)
        if zero is None or zero != int(zero):
            problems.append(f"{where}: zero_point must be an integer, got {entry.get('zero_point')!r}")
        elif qt is not None and qt.tensor_type in INTEGER_TYPES:
            _, bits, qmin = INTEGER_TYPES[qt.tensor_type]
            if not qmin <= zero <= qmin + 2 ** bits - 1:
                problems.append(f"{where}: zero_point {int(zero)} is outside the range of {qt.name}")
        clash = [k for k in _NOT_WITH_SCALE if k in entry]
        if clash:
            problems.append(f"{where}: {', '.join(clash)} cannot be given with scale and zero_point")
    if ("rmin" in entry) != ("rmax" in entry):
        problems.append(f"{where}: give both rmin and rmax, or neither")
    elif "rmin" in entry:
        low, high = _number(entry["rmin"]), _number(entry["rmax"])
        if low is None or high is None or not low <= high:
            problems.append(f"{where}: rmin and rmax must be numbers with rmin <= rmax")
    for key in ("symmetric", "reduce_range"):
        if key in entry and not isinstance(entry[key], (bool, np.bool_)):
            problems.append(f"{where}: {key} must be true or false, got {entry[key]!r}")
    return problems


def _convert_problems(where: str, tensor: str, entry: Mapping, info, graph: ModelGraph | None) -> list[str]:
    convert = entry["convert"]
    if not isinstance(convert, Mapping):
        return [f"{where}: convert must be an object like {{\"quant_type\": \"QUInt16\", \"recv_nodes\": [...]}}"]
    if info is not None and info.kind in (WEIGHT, BIAS):
        return [f"{where}: convert applies to activations only, and {tensor!r} is a {info.kind}"]
    problems = _entry_problems(f"{where} convert", convert, _CONVERT_KEYS)
    if "quant_type" not in convert:
        problems.append(f"{where}: convert must name its quant_type")
    elif convert.get("quant_type") == entry.get("quant_type") and entry.get("quant_type") is not None:
        problems.append(f"{where}: convert's quant_type must differ from the tensor's")
    receivers = convert.get("recv_nodes")
    if receivers is not None:
        if isinstance(receivers, str) or not isinstance(receivers, Iterable):
            problems.append(f"{where}: recv_nodes must be a list of node names")
        elif graph is not None:
            for node in receivers:
                if node not in graph.nodes:
                    problems.append(f"{where}: recv_nodes: " + unknown_name_message("node", str(node), graph.nodes))
                elif info is not None and node not in info.consumers:
                    problems.append(f"{where}: recv_nodes: node {node!r} does not read {tensor!r}")
    return problems


def _axis_problems(tensor: str, entries: list, axis: Any, info) -> list[str]:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        return [f"{tensor!r}: axis must be an integer, got {axis!r}"]
    if info is None:
        return []
    if info.kind not in (WEIGHT, BIAS):
        return [f"{tensor!r}: per-channel overrides (axis) apply to weights only, not to the {info.kind} it is"]
    shape = info.shape or ()
    if not -len(shape) <= axis < len(shape):
        return [f"{tensor!r}: axis {axis} is out of range for a tensor of rank {len(shape)}"]
    channels = shape[axis]
    if len(entries) > 1 and len(entries) != channels:
        return [f"{tensor!r}: {len(entries)} per-channel entries for {channels} channels along axis {axis}"]
    return []


def _override_model_problems(raw: Mapping, tensors: Mapping[str, QuantizedTensor], pinned: bool) -> list[str]:
    problems = []
    for name, entries in raw.items():
        tensor = tensors.get(name)
        if tensor is None:
            continue  # a tensor ORT folded away (e.g. a Conv output whose Relu it removed) keeps its override
        entry = entries[0]
        problems += _entry_model_problems(repr(name), entry, tensor.encoding, entries)
        convert = entry.get("convert")
        if isinstance(convert, Mapping):
            if not tensor.converts:
                problems.append(f"{name!r}: the overrides convert it, but the model does not")
            else:
                problems += _entry_model_problems(f"{name!r} convert", convert, tensor.converts[0], [convert])
        elif tensor.converts:
            problems.append(f"{name!r}: the model converts it to {tensor.converts[0].dtype}, but the overrides do not")
    if pinned:
        for tensor in tensors.values():
            entry = (raw.get(tensor.name) or [{}])[0]
            if tensor.kind == qdq.ACTIVATION and "scale" not in entry:
                problems.append(f"{tensor.name!r}: the model quantizes it, but its scale and zero point are not pinned")
    return problems


def _entry_model_problems(where: str, entry: Mapping, encoding: Encoding, entries: list) -> list[str]:
    problems = []
    quant_type = _quant_type(entry.get("quant_type"))
    if quant_type is not None and quant_type_of(encoding) is not None and quant_type != quant_type_of(encoding):
        problems.append(f"{where}: quant_type {quant_type.name}, but the model quantizes it to {encoding.dtype}")
    axis = entry.get("axis")
    if axis is not None and encoding.axis is not None and axis != encoding.axis:
        problems.append(f"{where}: axis {axis}, but the model quantizes it along axis {encoding.axis}")
    if "scale" in entry:
        scales = [_number(e.get("scale")) for e in entries]
        zeros = [_number(e.get("zero_point")) for e in entries]
        if len(scales) == 1 and len(encoding.scale) > 1:
            scales, zeros = scales * len(encoding.scale), zeros * len(encoding.scale)
        if [np.float32(s) for s in scales] != [np.float32(s) for s in encoding.scale] or \
                [int(z) for z in zeros] != list(encoding.zero_point):
            problems.append(f"{where}: pinned scale/zero_point differ from the model's "
                            f"({encoding.scale[0]!r}, {encoding.zero_point[0]})")
    return problems


def _number(value: Any) -> float | None:
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    return None


_raise_if = encodings_format.raise_if


# ---- writing an export -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportResult:
    """The files one export wrote (None: that format was not asked for)."""

    directory: Path
    plan: Path
    overrides: Path | None = None
    encodings: Path | None = None
    model: Path | None = None
    float_model: Path | None = None
    context: Path | None = None
    htp_model: Path | None = None  # the QDQ model with the weights the HTP computes with, when they differ
    readme: Path | None = None  # the notes below, as <name>.README.md
    tensors: int = 0  # quantized tensors of the QDQ model, every one covered by the encodings
    notes: tuple[str, ...] = ()  # which file reproduces what, and what to pass for it

    def paths(self) -> list[Path]:
        """The written files, in the order above."""
        return [p for p in (self.plan, self.overrides, self.encodings, self.model, self.float_model, self.context,
                            self.htp_model, self.readme) if p is not None]


def export_name(plan: PrecisionPlan) -> str:
    """A file-name stem for the plan: its name made safe; without one, the name the studio and the study show
    for it and the start of its hash ("a8w8+5x16-43166552"), which tells apart two plans promoting as many."""
    stem = _safe_stem(plan.name)
    return stem or f"{_safe_stem(plan.short_name)}-{plan.hash[:8]}"


def _safe_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+_-]+", "_", name).strip("._")


def export_plan(
    quantizer: Quantizer,
    plan: PrecisionPlan,
    out_dir: str | os.PathLike,
    formats: Iterable[str] = ("ort", "qnn", "model"),
    *,
    agent=None,
    provider_options: Mapping[str, object] | None = None,
    with_parameters: bool = True,
    encodings_biases: bool = False,
    encodings_version: str = encodings_format.DEFAULT_VERSION,
    name: str | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> ExportResult:
    """Write `plan`'s files to `out_dir`; each JSON file is checked against the model before it is written.

    `<name>.plan.json` always; `<name>.overrides.json` ("ort"), `<name>.encodings.json` ("qnn"),
    `<name>.qdq.onnx` ("model"), `<name>.float.onnx` ("float": the prepared float model whose tensor names
    the overrides and encodings use, the input for qnn-onnx-converter), and `<name>.ctx.onnx` ("context",
    built on `agent`, an AgentClient, with `provider_options`). Files are written whole or not at all.
    With "model", `<name>.htp.qdq.onnx` too when the HTP requantizes some weights (the model the study scored),
    and `<name>.README.md` says which file reproduces what (`ExportResult.notes`). `with_parameters` pins every
    activation's scale and zero point in the overrides, so ORT's quantizer reproduces the model on any data.
    `encodings_version` is AIMET's "1.0.0" (the default) or "0.6.1" (the older dict form); `encodings_biases`
    writes the int32 biases too (AIMET's HTP configurations refuse them under strict loading).
    """
    formats = _checked_formats(formats, encodings_version, agent)
    plan.validate(quantizer.graph)
    stem = name or export_name(plan)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = _ExportSteps(2 + len(formats), progress, cancel)
    steps.advance(f"quantizing {plan.summary()}")
    qdq_path = quantizer.generate(plan, cancel=cancel)
    qdq_model = qdq.load(qdq_path)
    tensors = read_quantized_tensors(qdq_model)
    paths: dict[str, Path] = {"plan": out / f"{stem}.plan.json"}
    steps.advance("writing the plan")
    write_text(paths["plan"], plan.dumps() + "\n")
    paths.update(_write_formats(formats, quantizer, plan, qdq_path, qdq_model, out, stem, steps, agent=agent,
                                provider_options=provider_options, with_parameters=with_parameters,
                                encodings_version=encodings_version, encodings_biases=encodings_biases))
    notes = _write_reproduction(plan, out, stem, paths, qdq_path, pinned=with_parameters, biases=encodings_biases)
    if progress:
        progress(steps.total, steps.total, f"exported {plan.summary()} to {out}")
    return ExportResult(directory=out, tensors=len(tensors), notes=tuple(notes), **paths)


def _write_reproduction(plan: PrecisionPlan, out: Path, stem: str, paths: dict[str, Path], qdq_path: Path, *,
                        pinned: bool, biases: bool) -> list[str]:
    """Beside the QDQ model, the one with the HTP's weights when they differ; `<name>.README.md` with the notes."""
    weights = htp_weights(qdq_path) if "model" in paths else None
    if weights is not None:
        paths["htp_model"] = out / f"{stem}.htp.qdq.onnx"
        write_bytes(paths["htp_model"], weights.model)
    gaps = encodings_cannot_carry(qdq_path, biases=biases) if "encodings" in paths else []
    notes = reproduction_notes(plan, stem, paths, pinned=pinned, weights=weights, encodings_gaps=gaps)
    if notes:
        paths["readme"] = out / f"{stem}.README.md"
        write_text(paths["readme"], readme_text(plan, notes))
    return notes


def _checked_formats(formats: Iterable[str], encodings_version: str, agent) -> tuple[str, ...]:
    """The asked-for formats, once each; unknown ones, an unknown encodings version or a context without an
    agent are errors."""
    formats = tuple(dict.fromkeys(formats))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise MpstudioError(f"unknown export format(s) {unknown}; use any of {', '.join(FORMATS)}")
    encodings_format.check_version(encodings_version)
    if "context" in formats and agent is None:
        raise MpstudioError("a context binary is built on an agent: give agent=AgentClient(...) or LocalAgent().client")
    return formats


class _ExportSteps:
    """An export's progress, one step per file; checks cancellation before each."""

    def __init__(self, total: int, progress: Progress | None, cancel: threading.Event | None):
        self.total = total
        self.step = 0
        self._progress = progress
        self._cancel = cancel

    def advance(self, message: str) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled("export cancelled")
        if self._progress:
            self._progress(self.step, self.total, message)
        self.step += 1


def _write_formats(formats: tuple[str, ...], quantizer: Quantizer, plan: PrecisionPlan, qdq_path: Path, qdq_model,
                   out: Path, stem: str, steps: _ExportSteps, *, agent, provider_options, with_parameters: bool,
                   encodings_version: str, encodings_biases: bool) -> dict[str, Path]:
    """Write each asked-for format but the plan; their paths by `ExportResult` field."""
    paths: dict[str, Path] = {}
    if "ort" in formats:
        steps.advance("writing the ORT overrides")
        text = json.dumps(ort_overrides(quantizer, plan, with_parameters=with_parameters), indent=2) + "\n"
        validate_ort_overrides(json.loads(text), quantizer.graph, qdq_model, pinned=with_parameters)
        paths["overrides"] = out / f"{stem}.overrides.json"
        write_text(paths["overrides"], text)
    if "qnn" in formats:
        steps.advance("writing the QNN encodings")
        text = json.dumps(qnn_encodings(qdq_model, encodings_version, biases=encodings_biases), indent=2) + "\n"
        validate_encodings(json.loads(text), qdq_model, require_biases=encodings_biases)
        paths["encodings"] = out / f"{stem}.encodings.json"
        write_text(paths["encodings"], text)
    if "model" in formats:
        steps.advance("copying the QDQ model")
        paths["model"] = out / f"{stem}.qdq.onnx"
        copy_atomic(qdq_path, paths["model"])
    if "float" in formats:
        steps.advance("copying the float model")
        paths["float_model"] = out / f"{stem}.float.onnx"
        copy_atomic(quantizer.float_path, paths["float_model"])
    if "context" in formats:
        steps.advance("building the context binary on the agent")
        paths["context"] = out / f"{stem}.ctx.onnx"
        build_context(agent, qdq_path, paths["context"], provider_options)
    return paths
