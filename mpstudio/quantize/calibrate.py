"""Activation ranges: ORT's calibrator run over a data source in bounded chunks, the ranges kept on disk per
key, and the float model carrying a plan's quantized weights that the ranges are measured on."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization.calibrate import TensorsData, create_calibrator, load_tensors_data, save_tensors_data

from ..cache import exclusive
from ..data import CalibrationReader, DataSource, Progress
from ..errors import MpstudioError, brief
from ..plan import PrecisionPlan
from ..qdq import QUANTIZED_INITIALIZER_SUFFIX, dequantize, read

CALIBRATION_METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
# Bounds calibration memory: ranges are merged every this many samples instead of at the end.
CALIBRATION_CHUNK = 16
# The narrowest range ORT quantizes a tensor for QNN with (`get_qnn_qdq_config`'s "MinimumRealRange"): a tensor
# whose calibrated range is narrower is quantized on this one, its values a few steps at most.
QNN_MINIMUM_RANGE = 1e-4
# Narrow ranges on this share of the activations (or on a model output) are worth a warning: a dead channel's
# tensor is narrow in any model, most of a model's tensors only when its data or its weights are off.
NARROW_SHARE = 0.05
# Stands for "the float model's own ranges" where a plan names the ranges to use.
FLOAT_RANGES = object()


@dataclass(frozen=True)
class CalibrationCache:
    """Where the ranges of one (model, calibration data, method) live, and how they were made."""

    path: Path
    key: str
    method: str
    samples: int
    seconds: float


def weight_form(plan: PrecisionPlan) -> str:
    """What of `plan` its activation ranges depend on: the default weight type, per-channel and symmetry."""
    return (f"weights {plan.weight_type} {'per-channel' if plan.per_channel else 'per-tensor'} "
            f"{'symmetric' if plan.weight_symmetric else 'asymmetric'}")


def weight_form_plan(plan: PrecisionPlan) -> PrecisionPlan:
    """The plan of `plan`'s weight form alone (no overrides): the one whose weights its ranges are measured with."""
    return PrecisionPlan(weight_type=plan.weight_type, per_channel=plan.per_channel,
                         weight_symmetric=plan.weight_symmetric)


def with_quantized_weights(float_model: onnx.ModelProto, qdq_path: str | Path) -> onnx.ModelProto:
    """`float_model` with every weight the QDQ model at `qdq_path` quantizes replaced by the value it dequantizes
    to (per tensor or per channel), so a calibration run on it sees each activation as the quantized weights
    make it. Biases stay float: their int32 step is far below any activation's."""
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
        codes = numpy_helper.to_array(quantized.initializers[dq.input[0]])
        encoding = tensor.encoding
        value = dequantize(codes, encoding.scale, encoding.zero_point, encoding.axis)
        init.CopyFrom(numpy_helper.from_array(value.reshape(tuple(init.dims)), init.name))
    return out


def scratch_lock(model_path: Path):
    """The lock of ORT's scratch files beside `model_path` ("<model>-inferred.onnx", which both its calibrator and
    `quantize_static` write and delete there): one process and one thread on a model file at a time."""
    return exclusive(Path(f"{model_path}.calibrate.lock"))


def collect_ranges(model_path: Path, calibration: DataSource, inputs, method: str, progress: Progress | None,
                   cancel: threading.Event | None, message: str):
    """ORT's ranges of every float tensor of the model at `model_path` over `calibration` (calibration method
    `method`), and how many samples they were collected on."""
    if len(calibration) == 0:
        raise MpstudioError(f"{calibration.name} holds no samples to calibrate with")
    reader = CalibrationReader(calibration, progress, cancel, message, inputs)
    # ORT's calibrator writes and deletes "<model>-inferred.onnx" beside the model: one process at a time. Its
    # augmented model goes beside it too, not to the system's temporary folder, where a killed run would leave it.
    with scratch_lock(model_path), \
            tempfile.TemporaryDirectory(prefix=".calibrating-", dir=Path(model_path).parent) as tmp:
        calibrator = create_calibrator(
            model_path,
            None,  # every float tensor: ranges must serve any plan
            augmented_model_path=str(Path(tmp) / "augmented.onnx"),
            calibrate_method=CALIBRATION_METHODS[method],
        )
        try:
            # Chunks bound memory: ORT's calibrator merges ranges at the end of each collect_data.
            # (Its own max_intermediate_outputs option drops every full chunk unmerged.)
            while not reader.exhausted:
                reader.start_chunk(CALIBRATION_CHUNK)
                calibrator.collect_data(reader)
            ranges = calibrator.compute_data()
        except MpstudioError:
            raise
        except Exception as exc:
            raise MpstudioError(f"calibration failed: {brief(exc)}") from exc
        finally:
            del calibrator
    return ranges, reader.count


def cached_ranges(directory: Path, key: str, method: str) -> CalibrationCache | None:
    """The ranges kept under `key` in `directory`, or None."""
    path = directory / f"{key}.json"
    meta_path = path.with_suffix(".meta.json")
    if path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return CalibrationCache(path, key, method, meta["samples"], meta["seconds"])
    return None


def store_ranges(directory: Path, key: str, ranges, samples: int, seconds: float, method: str) -> CalibrationCache:
    """Keep `ranges` under `key` in `directory` (with how they were made)."""
    path = directory / f"{key}.json"
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
        json.dumps({"samples": samples, "seconds": seconds, "method": method}))
    os.replace(meta_path.with_name(meta_path.name + unique), meta_path)
    return CalibrationCache(path, key, method, samples, seconds)


def tensor_spans(cache: CalibrationCache, names) -> dict[str, float]:
    """The calibrated range of each tensor of `names` that has one, widened to hold zero as ORT's quantizer widens
    it: what its steps divide."""
    ranges = load_tensors_data(str(cache.path)).data
    spans = {}
    for name in names:
        if name in ranges:
            low, high = ranges[name].range_value
            spans[name] = max(float(np.max(high)), 0.0) - min(float(np.min(low)), 0.0)
    return spans


def narrow_tensors(cache: CalibrationCache, names, spans: dict[str, float] | None = None) -> list[str]:
    """The tensors of `names` whose calibrated range (`tensor_spans`, read from `cache` unless given) is narrower
    than the minimum range ORT quantizes for QNN, in `names`' order; tensors without a range are skipped."""
    spans = tensor_spans(cache, names) if spans is None else spans
    return [name for name in names if name in spans and spans[name] < QNN_MINIMUM_RANGE]


def narrow_range_note(narrow: list[str], total: int, outputs=()) -> str:
    """A warning when the narrow ranges (`narrow_tensors`) are more than a dead channel's ("" otherwise): how
    many, which, what follows and what to check."""
    at_output = [name for name in outputs if name in narrow]
    if not narrow or (len(narrow) < NARROW_SHARE * total and not at_output):
        return ""
    named = ", ".join(narrow[:3]) + (" ..." if len(narrow) > 3 else "")
    where = f" (the model output {', '.join(at_output[:2])} among them)" if at_output else ""
    return (f"warning: {len(narrow)} of {total} activation tensors{where} span less than {QNN_MINIMUM_RANGE:g} over "
            f"the calibration data: {named}. ORT quantizes each for QNN on a range of {QNN_MINIMUM_RANGE:g}, so its "
            "values round to a few steps and its scores read near 0 dB. Check that the data is preprocessed as the "
            "model expects (scale, normalization); a model with random weights needs trained statistics (e.g. "
            "BatchNorm's) or its activations vanish.")
