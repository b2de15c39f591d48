"""Calibrate once per weight form, then regenerate a QNN-valid QDQ model for any precision plan from the cached ranges.

Activation ranges are calibrated with the weights already quantized, as the HTP runs them: ORT's calibrator runs
the float model, ORT quantizes the weights in the plan's weight form (type, per-channel, symmetry) from those
ranges, and the calibrator runs again on the float model carrying those weights. They are kept on disk per weight
form; each plan is then quantized by ORT's `get_qnn_qdq_config` (converts at 8/16-bit boundaries) and
`quantize_static` reading them, and `fuse_activations` leaves no Q/DQ between an op and the Relu/Clip HTP fuses
into it. Generated models are cached by plan hash.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization import base_quantizer as _ort_base_quantizer
from onnxruntime.quantization import onnx_model as _ort_onnx_model
from onnxruntime.quantization import qdq_quantizer as _ort_qdq_quantizer
from onnxruntime.quantization.calibrate import TensorsData, create_calibrator, save_tensors_data
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

from .cache import exclusive
from .data import CalibrationReader, DataSource, Progress
from .errors import MpstudioError, brief
from .graph import ACTIVATION, WEIGHT, ModelGraph
from .model import PreparedModel
from .plan import PrecisionPlan
from .qdq import Encoding

QUANT_TYPES = {
    "int4": QuantType.QInt4,
    "uint8": QuantType.QUInt8,
    "int8": QuantType.QInt8,
    "uint16": QuantType.QUInt16,
    "int16": QuantType.QInt16,
}
CALIBRATION_METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
# Names generated models in the cache with the plan hash: bump it whenever a plan generates differently.
# 3: activation ranges calibrated with the plan's weights quantized (see the module docstring).
GENERATOR_VERSION = 3
# ONNX Runtime versions whose quantizer internals `_fast_ort_quantizer` was checked against (patched and
# unpatched runs write the same model; tests/test_quantize.py checks it on the installed version). On any
# other version ORT's own code runs unpatched: slower on big models, never different.
PATCHED_ORT_VERSIONS = ("1.31", "1.32")


def toolchain() -> dict[str, str]:
    """The versions of the tools that make a QDQ model: a cache made by other versions is not reused."""
    import onnxruntime

    from importlib import metadata

    versions = {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__}
    try:
        versions["onnxruntime-qnn"] = metadata.version("onnxruntime-qnn")
    except metadata.PackageNotFoundError:
        pass
    return versions


def toolchain_key() -> str:
    text = json.dumps(toolchain(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def ort_patch_applies(version: str | None = None) -> bool:
    """Whether the quantizer speed-up is used with this ORT version (`MPSTUDIO_ORT_PATCH=0` turns it off)."""
    import onnxruntime

    if os.environ.get("MPSTUDIO_ORT_PATCH", "1") == "0":
        return False
    major_minor = ".".join((version or onnxruntime.__version__).split(".")[:2])
    return major_minor in PATCHED_ORT_VERSIONS
# Bounds calibration memory: ranges are merged every this many samples instead of at the end.
_CALIBRATION_CHUNK = 16


@dataclass(frozen=True)
class CalibrationCache:
    """Where the ranges of one (model, calibration data, method) live, and how they were made."""

    path: Path
    key: str
    method: str
    samples: int
    seconds: float


class Quantizer:
    """Regenerates QDQ models of one prepared float model for any PrecisionPlan.

    `cache_dir` holds `float.onnx`, `calibration/<key>.json` and `models/<plan hash>.onnx`.
    """

    def __init__(
        self,
        prepared: PreparedModel,
        calibration: DataSource,
        cache_dir: str | Path,
        method: str = "minmax",
    ):
        if method not in CALIBRATION_METHODS:
            raise MpstudioError(f"unknown calibration method {method!r}; use one of {', '.join(CALIBRATION_METHODS)}")
        self.prepared, self.calibration, self.method = prepared, calibration, method
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.float_path = self.cache_dir / "float" / f"{prepared.sha256[:16]}.onnx"
        if not self.float_path.exists():
            prepared.save(self.float_path)
        self._lock = threading.Lock()
        self._caches: dict[str, CalibrationCache] = {}
        self._data_key: str | None = None
        # Imported encodings that plans pin their parameters to (`PrecisionPlan.encodings` names one).
        self.encodings_dir = self.cache_dir / "encodings"

    @property
    def graph(self) -> ModelGraph:
        return self.prepared.graph

    # ---- calibration -----------------------------------------------------------------------------------
    def calibration_key(self, plan: PrecisionPlan | None = None) -> str:
        """The key of the ranges `plan` is quantized from (None: the default plan's, as a8w8 and a16w8 use):
        the model, the calibration data, the method, the toolchain and the plan's weight form. Generated models
        are cached under it too (the data's fingerprint, which reads every sample, is computed once)."""
        if self._data_key is None:
            self._data_key = self.calibration.fingerprint()
        form = "float" if plan is _FLOAT_RANGES else weight_form(plan or PrecisionPlan())
        text = f"{self.prepared.sha256}|{self._data_key}|{self.method}|{toolchain_key()}|{form}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def calibrate(self, progress: Progress | None = None, cancel: threading.Event | None = None,
                  plan: PrecisionPlan | None = None) -> CalibrationCache:
        """Ranges for every float tensor with the weights quantized in `plan`'s weight form (None: the default
        plan's), computed once per weight form and cached on disk."""
        with self._lock:
            key = self.calibration_key(plan)
            if key in self._caches:
                return self._caches[key]
            cached = self._cached_calibration(key)
            if cached is not None:
                self._caches[key] = cached
                return cached
            started = time.perf_counter()
            float_ranges = self._calibrate_float(progress, cancel)
            carried = self._calibration_model(plan, float_ranges)
            ranges, samples = self._collect_ranges(carried, progress, cancel, "calibrating with quantized weights")
            self._caches[key] = self._store_calibration(key, ranges, samples,
                                                        float_ranges.seconds + time.perf_counter() - started)
            return self._caches[key]

    def calibration_model(self, plan: PrecisionPlan | None = None) -> Path:
        """The float model carrying the weights of `plan`'s weight form quantized (None: the default plan's): the
        model its activation ranges are calibrated on, so the values a tensor's range was measured on. Scores that
        quantize a tensor's values with those ranges must read them here: a float tensor can exceed a range that
        quantized weights shrink (a channel whose weights round to zero), and would look clipped where the QDQ
        model never clips."""
        with self._lock:
            return self._calibration_model(plan, self._calibrate_float(None, None))

    def _calibration_model(self, plan: PrecisionPlan | None, float_ranges: CalibrationCache) -> Path:
        out = self.cache_dir / "float" / f"{self.prepared.sha256[:16]}-weights-{self.calibration_key(plan)}.onnx"
        if out.exists():
            return out
        with tempfile.TemporaryDirectory(prefix="mpstudio-calib-") as tmp:
            reference = Path(tmp) / "weights.onnx"
            self._quantize(_weight_form_plan(plan or PrecisionPlan()), float_ranges, reference)
            unique = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            onnx.save(with_quantized_weights(onnx.load(self.float_path), reference), unique)
            os.replace(unique, out)  # another process may be making the same file
        return out

    def _calibrate_float(self, progress, cancel) -> CalibrationCache:
        """The float model's own ranges (the first pass, which quantizes the weights of the second)."""
        key = self.calibration_key(_FLOAT_RANGES)
        cached = self._cached_calibration(key)
        if cached is None:
            started = time.perf_counter()
            ranges, samples = self._collect_ranges(self.float_path, progress, cancel, "calibrating")
            cached = self._store_calibration(key, ranges, samples, time.perf_counter() - started)
        return cached

    def _cached_calibration(self, key: str) -> CalibrationCache | None:
        path = self.cache_dir / "calibration" / f"{key}.json"
        meta_path = path.with_suffix(".meta.json")
        if path.exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            return CalibrationCache(path, key, self.method, meta["samples"], meta["seconds"])
        return None

    def _collect_ranges(self, model_path: Path, progress, cancel, message: str):
        if len(self.calibration) == 0:
            raise MpstudioError(f"{self.calibration.name} holds no samples to calibrate with")
        reader = CalibrationReader(self.calibration, progress, cancel, message, self.prepared.inputs)
        with tempfile.TemporaryDirectory(prefix="mpstudio-calib-") as tmp:
            calibrator = create_calibrator(
                model_path,
                None,  # every float tensor: ranges must serve any plan
                augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                calibrate_method=CALIBRATION_METHODS[self.method],
            )
            try:
                # Chunks bound memory: ORT's calibrator merges ranges at the end of each collect_data.
                # (Its own max_intermediate_outputs option drops every full chunk unmerged.)
                while not reader.exhausted:
                    reader.start_chunk(_CALIBRATION_CHUNK)
                    calibrator.collect_data(reader)
                ranges = calibrator.compute_data()
            except MpstudioError:
                raise
            except Exception as exc:
                raise MpstudioError(f"calibration failed: {brief(exc)}") from exc
            finally:
                del calibrator
        return ranges, reader.count

    def _store_calibration(self, key: str, ranges, samples: int, seconds: float) -> CalibrationCache:
        path = self.cache_dir / "calibration" / f"{key}.json"
        meta_path = path.with_suffix(".meta.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written beside and renamed: another process may be calibrating the same study at the same time.
        unique = f".{os.getpid()}.{threading.get_ident()}.tmp"
        # ORT's calibrator lists tensors in set order, which changes from process to process: sorted, the file
        # is the same bytes for the same ranges.
        ranges = TensorsData(ranges.calibration_method, dict(sorted(ranges.data.items())))
        save_tensors_data(ranges, path.with_name(path.name + unique))
        os.replace(path.with_name(path.name + unique), path)
        meta_path.with_name(meta_path.name + unique).write_text(
            json.dumps({"samples": samples, "seconds": seconds, "method": self.method}))
        os.replace(meta_path.with_name(meta_path.name + unique), meta_path)
        return CalibrationCache(path, key, self.method, samples, seconds)

    def _quantize(self, plan: PrecisionPlan, cache: CalibrationCache, out: Path) -> None:
        config = qnn_config(self.prepared.model, self.graph, plan, CALIBRATION_METHODS[self.method],
                            pinned=self.pinned(plan))
        # ORT's quantizer writes scratch files beside the float model: one process quantizes at a time.
        with exclusive(self.cache_dir / ".quantize.lock"), _fast_ort_quantizer(), _quiet_ort_logging():
            quantize_static(self.float_path, out, None, calibration_cache_path=cache.path, **_quantize_kwargs(config))
        fuse_activations(out)

    # ---- regeneration ------------------------------------------------------------------------------------
    def model_path(self, plan: PrecisionPlan) -> Path:
        # Keyed by the calibration too, so one cache folder shared by two models (or two data sets) never
        # hands one's QDQ model to the other.
        return self.cache_dir / "models" / f"g{GENERATOR_VERSION}-{self.calibration_key(plan)}-{plan.hash}.onnx"

    def generate(self, plan: PrecisionPlan, progress: Progress | None = None, cancel=None) -> Path:
        """The QDQ model file for `plan` (made from the cached ranges, or taken from the model cache)."""
        plan.validate(self.graph)
        out = self.model_path(plan)
        if out.exists():
            return out
        cache = self.calibrate(progress, cancel, plan)
        if progress:
            progress(0, 1, f"quantizing {plan.summary()}")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.stem}.{os.getpid()}.{threading.get_ident()}.onnx")
        try:
            self._quantize(plan, cache, tmp)
        except MpstudioError:
            tmp.unlink(missing_ok=True)
            raise
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            raise MpstudioError(f"quantizing {plan.summary()} failed: {brief(exc)}") from exc
        os.replace(tmp, out)
        out.with_suffix(".plan.json").write_text(plan.dumps() + "\n")
        if progress:
            progress(1, 1, f"quantized {plan.summary()}")
        return out

    # ---- imported encodings ------------------------------------------------------------------------------
    def save_pinned(self, tensors: Mapping[str, Encoding]) -> str:
        """Keep imported encodings (float tensor -> Encoding, per-channel ones with their axis); returns the
        key a plan names them by (`PrecisionPlan.encodings`)."""
        data = {name: {"dtype": e.dtype, "scale": list(e.scale), "zero_point": list(e.zero_point), "axis": e.axis}
                for name, e in sorted(tensors.items())}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        path = self.encodings_dir / f"{key}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(text + "\n")
            os.replace(tmp, path)
        return key

    def pinned(self, plan: PrecisionPlan) -> dict[str, Encoding] | None:
        """The imported encodings `plan` pins its parameters to (None for a calibrated plan)."""
        if not plan.encodings:
            return None
        path = self.encodings_dir / f"{plan.encodings}.json"
        if not path.exists():
            raise MpstudioError(f"plan {plan.name or plan.hash} keeps imported encodings {plan.encodings}, which are "
                                f"not in {self.encodings_dir}; import the file again (mpstudio import)")
        data = json.loads(path.read_text())
        return {name: Encoding(e["dtype"], tuple(e["scale"]), tuple(e["zero_point"]), e["axis"])
                for name, e in data.items()}


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
            entry = entries[0]
            if entry.get("quant_type", default_activation) == quant_type:
                _without_range_options(entry).update(parameters[0])
            elif isinstance(entry.get("convert"), dict) and entry["convert"].get("quant_type") == quant_type:
                _without_range_options(entry["convert"]).update(parameters[0])
            else:
                continue
            out[name] = entries
            continue
        override = plan.overrides.get(name)
        kind = (override.type if override else None) or plan.weight_type
        per_channel = override.per_channel if override and override.per_channel is not None else (
            plan.per_channel and _default_per_channel(graph, name))
        if kind != encoding.dtype or per_channel != encoding.per_channel:
            continue
        first = {k: v for k, v in entries[0].items() if k not in _RANGE_OPTIONS + ("scale", "zero_point")}
        out[name] = [{**(first if i == 0 else {}), **p} for i, p in enumerate(parameters)]
        if encoding.per_channel:
            out[name][0]["axis"] = encoding.axis
    return out


_RANGE_OPTIONS = ("symmetric", "reduce_range", "rmin", "rmax")  # ORT refuses them next to scale and zero_point


def _without_range_options(entry: dict) -> dict:
    for key in _RANGE_OPTIONS:
        entry.pop(key, None)
    return entry


# Stands for "the float model's own ranges" where a plan names the ranges to use.
_FLOAT_RANGES = object()


def weight_form(plan: PrecisionPlan) -> str:
    """What of `plan` its activation ranges depend on: the default weight type, per-channel and symmetry."""
    return (f"weights {plan.weight_type} {'per-channel' if plan.per_channel else 'per-tensor'} "
            f"{'symmetric' if plan.weight_symmetric else 'asymmetric'}")


def _weight_form_plan(plan: PrecisionPlan) -> PrecisionPlan:
    return PrecisionPlan(weight_type=plan.weight_type, per_channel=plan.per_channel,
                         weight_symmetric=plan.weight_symmetric)


def with_quantized_weights(float_model: onnx.ModelProto, qdq_path: str | Path) -> onnx.ModelProto:
    """`float_model` with every weight the QDQ model at `qdq_path` quantizes replaced by the value it dequantizes
    to (per tensor or per channel), so a calibration run on it sees each activation as the quantized weights
    make it. Biases stay float: their int32 step is far below any activation's."""
    from .qdq import QUANTIZED_INITIALIZER_SUFFIX, read

    quantized = read(qdq_path)
    params = quantized.params()
    out = onnx.ModelProto()
    out.CopyFrom(float_model)
    for init in out.graph.initializer:
        tensor = params.get(init.name)
        if tensor is None or tensor.encoding.bits > 16:
            continue
        dq = next((n for n in quantized.consumers.get(init.name + QUANTIZED_INITIALIZER_SUFFIX, ())
                   if n.op_type == "DequantizeLinear"), None)
        if dq is None:
            continue
        codes = numpy_helper.to_array(quantized.initializers[dq.input[0]]).astype(np.int64)
        encoding = tensor.encoding
        scale = np.asarray(encoding.scale, np.float32)
        zero = np.asarray(encoding.zero_point, np.int64)
        if encoding.axis is not None:
            shape = [1] * codes.ndim
            shape[encoding.axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        value = ((codes - zero).astype(np.float32) * scale).astype(np.float32)
        init.CopyFrom(numpy_helper.from_array(value.reshape(tuple(init.dims)), init.name))
    return out


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
    matched = _sixteen_bit_constants(graph, plan, config.extra_options.get("TensorQuantOverrides", {}))
    if matched:
        config = make({**overrides, **matched})
    if pinned:  # on the resolved overrides, which reproduce the same model when fed back
        config = make(pin_overrides(config.extra_options.get("TensorQuantOverrides", {}), plan, graph, pinned))
    return config


# Element-wise ops whose constant operand must share the activation's bit width on HTP.
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu", "Where", "Equal", "Greater", "Less",
                "GreaterOrEqual", "LessOrEqual", "Concat"}
SIXTEEN_BIT = (QuantType.QUInt16, QuantType.QInt16)  # the quant types of a 16-bit tensor


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
    out: dict[str, Encoding] = {}
    for name, params in quantizer.quantization_params.items():
        original = params.original
        dtype = helper.tensor_dtype_to_np_dtype(original["quant_type"]).name
        out[name] = Encoding.per_tensor(float(np.asarray(original["scale"]).reshape(())),
                                        int(np.asarray(original["zero_point"]).reshape(())), dtype)
    return out


def _sixteen_bit_constants(graph: ModelGraph, plan: PrecisionPlan, resolved: dict) -> dict[str, list[dict]]:
    """Constant operands of element-wise nodes that compute at 16 bits in an 8-bit-activation plan."""
    if plan.activation_type in ("uint16", "int16"):
        return {}
    types = ResolvedTypes(resolved, QUANT_TYPES[plan.activation_type])
    extra: dict[str, list[dict]] = {}
    for node in graph.nodes.values():
        if node.op_type not in _ELEMENTWISE:
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


def init_overrides(plan: PrecisionPlan, graph: ModelGraph) -> dict[str, list[dict]]:
    """The plan's overrides as `get_qnn_qdq_config`'s `init_overrides` (ORT TensorQuantOverrides)."""
    overrides: dict[str, list[dict]] = {}
    for tensor, override in plan.overrides.items():
        info = graph.tensor(tensor)
        entry: dict = {}
        if override.type is not None:
            entry["quant_type"] = QUANT_TYPES[override.type]
        if not info.is_activation:
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
                per_channel = _default_per_channel(graph, tensor)
            if per_channel:
                entry["axis"] = weight_axis(graph, tensor)
        if entry:
            overrides[tensor] = [entry]
    for tensor, entries in list(overrides.items()):
        upstream = _folded_activation_input(graph, tensor)
        if upstream is not None and upstream not in plan.overrides:
            overrides[upstream] = [dict(entries[0])]
    overrides.update(_unsigned_norm_scales(plan, graph))
    return overrides


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


# Activations ORT's QDQ quantizer folds into the op before them (the op then writes their output directly).
_FOLDED_ACTIVATIONS = ("Relu", "Clip")


def _folded_activation_input(graph: ModelGraph, tensor: str) -> str | None:
    """The input of the Relu/Clip that produces `tensor`, when ORT folds that activation into its producer.

    ORT removes such an activation only when its input and output share their quantization, so an override
    on the output alone would leave the producer's output at the default type behind a convert: the
    promotion would change almost nothing. The override has to cover both.
    """
    producer = graph.tensors[tensor].producer
    node = graph.nodes.get(producer) if producer else None
    if node is None or node.op_type not in _FOLDED_ACTIVATIONS or not node.inputs:
        return None
    upstream = graph.tensors.get(node.inputs[0])
    if upstream is None or upstream.kind != ACTIVATION or len(upstream.consumers) != 1:
        return None
    return upstream.name


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


def _default_per_channel(graph: ModelGraph, tensor: str) -> bool:
    # ORT's global per_channel covers Conv and ConvTranspose weights only.
    return any(graph.nodes[c].op_type in ("Conv", "ConvTranspose") for c in graph.tensor(tensor).consumers)


def _quantize_kwargs(config) -> dict:
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


def quantize_plain(model_path: str | Path, calibration: DataSource, plan: PrecisionPlan, graph: ModelGraph,
                   out: str | Path, method: str = "minmax") -> Path:
    """ORT's own path, recalibrating every time: `get_qnn_qdq_config` + `quantize` for the weights, ORT's
    calibrator on the float model carrying them, `quantize_static` from those ranges. The baseline to beat."""
    from onnxruntime.quantization import quantize

    model = onnx.load(str(model_path))
    calibrate_method = CALIBRATION_METHODS[method]
    with tempfile.TemporaryDirectory(prefix="mpstudio-plain-") as tmp:
        reference, carried = Path(tmp) / "weights.onnx", Path(tmp) / "carried.onnx"
        config = qnn_config(model, graph, _weight_form_plan(plan), calibrate_method, CalibrationReader(calibration))
        with _quiet_ort_logging():
            quantize(str(model_path), str(reference), config)
        onnx.save(with_quantized_weights(model, reference), carried)
        calibrator = create_calibrator(carried, None, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                       calibrate_method=calibrate_method)
        calibrator.collect_data(CalibrationReader(calibration))
        save_tensors_data(calibrator.compute_data(), Path(tmp) / "ranges.json")
        del calibrator
        config = qnn_config(model, graph, plan, calibrate_method)
        with _quiet_ort_logging():
            quantize_static(str(model_path), str(out), None, calibration_cache_path=Path(tmp) / "ranges.json",
                            **_quantize_kwargs(config))
    fuse_activations(out)
    return Path(out)


# Ops HTP fuses a following Relu/Clip into (AIMET's supergroups): no quantizer belongs between them.
_FUSING_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"}


def fuse_activations(path: str | Path) -> int:
    """Remove the Q/DQ pair ORT leaves between an op and the Relu/Clip after it, and the activation itself,
    where that changes no value: the pair has the activation output's encoding and that encoding's range lies
    inside the activation's bounds (so saturating to it is the activation). ORT folds such activations itself
    unless a convert touches their input or output (mixed plans); this finishes the job. Rewrites the model
    at `path` in place when anything changes; returns how many activations were removed."""
    model = onnx.load(str(path))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}

    def constant(name):
        return numpy_helper.to_array(inits[name]) if name in inits else None

    def encoding(q):
        scale, zero = constant(q.input[1]), constant(q.input[2]) if len(q.input) > 2 else None
        if scale is None or zero is None or scale.size != 1:
            return None
        return float(scale.reshape(())), int(zero.reshape(())), zero.dtype

    removed, dropped = 0, set()
    for act in list(graph.node):
        if act.op_type not in _FOLDED_ACTIVATIONS or not act.input:
            continue
        dq = producer.get(act.input[0])
        q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        op = producer.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
        after = consumers.get(act.output[0], [])
        if op is None or op.op_type not in _FUSING_OPS or act.output[0] in outputs or not after:
            continue
        if len(consumers.get(q.output[0], [])) != 1 or len(consumers.get(dq.output[0], [])) != 1 \
                or len(consumers.get(q.input[0], [])) != 1 or q.input[0] in outputs:
            continue
        mine = encoding(q)
        if mine is None or any(n.op_type != "QuantizeLinear" or encoding(n) != mine for n in after):
            continue
        scale, zero, dtype = mine
        info = np.iinfo(dtype)
        low, high = (info.min - zero) * scale, (info.max - zero) * scale
        if act.op_type == "Relu":
            bounds = (0.0, np.inf)
        else:
            values = [constant(name) if name else None for name in list(act.input[1:3]) + [None] * 2][:2]
            attrs = {a.name: a.f for a in act.attribute}
            bounds = (float(values[0]) if values[0] is not None else attrs.get("min", -np.inf),
                      float(values[1]) if values[1] is not None else attrs.get("max", np.inf))
            if any(name and name not in inits for name in act.input[1:3]):
                continue
        if low < bounds[0] - 1e-6 * max(1.0, abs(bounds[0])) or high > bounds[1] + 1e-6 * max(1.0, abs(bounds[1])):
            continue
        op.output[list(op.output).index(q.input[0])] = act.output[0]
        producer[act.output[0]] = op
        dropped.update(id(n) for n in (q, dq, act))
        removed += 1
    if not removed:
        return 0
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for n in graph.node for name in n.input}
    unused = [i for i in graph.initializer if i.name not in used]
    for init in unused:
        graph.initializer.remove(init)
    onnx.save(model, str(path))
    return removed


# ---- ORT quantizer speed-ups -----------------------------------------------------------------------------
# ORT's QDQ quantizer looks initializers up by a full list scan and rewires consumers by visiting every
# input of every node, once per quantized tensor: quadratic in model size. These replacements return the
# same results (tests compare generated models with ORT's own output, tensor by tensor): a name index over
# the initializer list, kept valid by watching its length and dropped on every removal, and a C-level
# membership test before touching a node's inputs.


class _InitializerIndex:
    """Name -> initializer for one repeated field, extended as the quantizer appends to it."""

    def __init__(self):
        self.container = None
        self.length = 0
        self.by_name: dict = {}

    def lookup(self, name, container):
        if self.container is None or len(container) < self.length:
            self.container, self.length, self.by_name = container, 0, {}
        if len(container) > self.length:
            for index in range(self.length, len(container)):
                item = container[index]
                self.by_name.setdefault(item.name, item)
            self.length = len(container)
        item = self.by_name.get(name)
        if item is not None and item.name != name:  # renamed in place: rebuild once
            self.container = None
            return self.lookup(name, container)
        return item


_indexes = threading.local()  # per thread: id(container) -> _InitializerIndex (holding the container)


def _index_for(container) -> _InitializerIndex:
    table = _indexes.__dict__.setdefault("table", {})
    index = table.get(id(container))
    if index is None or index.container is not container:
        index = table[id(container)] = _InitializerIndex()
    return index


def _forget_indexes() -> None:
    _indexes.__dict__["table"] = {}


def _find_by_name(item_name, item_list):
    if isinstance(item_list, (list, tuple)) or _patch_depth == 0:
        return next((item for item in item_list if item.name == item_name), None)
    return _index_for(item_list).lookup(item_name, item_list)


def _get_initializer(self, name):
    return _find_by_name(name, self.model.graph.initializer)


def _forget_index(method):
    def wrapper(*args, **kwargs):
        _forget_indexes()
        return method(*args, **kwargs)

    return wrapper


def _replace_input_of_all_nodes(self, old_input_name, new_input_name):
    for node in self.model.graph.node:
        if old_input_name in node.input:
            for j, name in enumerate(node.input):
                if name == old_input_name:
                    node.input[j] = new_input_name


_patch_lock = threading.RLock()
_patch_depth = 0
_originals: dict = {}
_REMOVERS = ("remove_initializer", "remove_initializers", "clean_initializers", "remove_unused_constant")


@contextlib.contextmanager
def _fast_ort_quantizer():
    """ORT's quantizer with its name lookups indexed (it scans every initializer for each of them, which is
    quadratic on big models), on the ORT versions the patch is checked against; ORT's own code otherwise."""
    global _patch_depth
    if not ort_patch_applies():
        yield
        return
    model_cls = _ort_onnx_model.ONNXModel
    with _patch_lock:
        if _patch_depth == 0:
            _originals.update(
                qdq=_ort_qdq_quantizer.find_by_name,
                base=_ort_base_quantizer.find_by_name,
                model=_ort_onnx_model.find_by_name,
                replace=model_cls.replace_input_of_all_nodes,
                get_initializer=model_cls.get_initializer,
                removers={name: getattr(model_cls, name) for name in _REMOVERS if hasattr(model_cls, name)},
            )
            _ort_qdq_quantizer.find_by_name = _find_by_name
            _ort_base_quantizer.find_by_name = _find_by_name
            _ort_onnx_model.find_by_name = _find_by_name
            model_cls.replace_input_of_all_nodes = _replace_input_of_all_nodes
            model_cls.get_initializer = _get_initializer
            for name, method in _originals["removers"].items():
                setattr(model_cls, name, _forget_index(method))
        _patch_depth += 1
    _forget_indexes()
    try:
        yield
    finally:
        _forget_indexes()
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                _ort_qdq_quantizer.find_by_name = _originals["qdq"]
                _ort_base_quantizer.find_by_name = _originals["base"]
                _ort_onnx_model.find_by_name = _originals["model"]
                model_cls.replace_input_of_all_nodes = _originals["replace"]
                model_cls.get_initializer = _originals["get_initializer"]
                for name, method in _originals["removers"].items():
                    setattr(model_cls, name, method)


@contextlib.contextmanager
def _quiet_ort_logging():
    """ORT's quantization tools log advice at WARNING on the root logger; keep a user's terminal clean."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
