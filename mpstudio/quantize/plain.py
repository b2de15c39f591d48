"""ORT's own quantization path, recalibrating every time: the baseline the Quantizer's cached ranges beat."""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
from onnxruntime.quantization import quantize_static
from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

from ..data import CalibrationReader, DataSource
from ..graph import ModelGraph
from ..plan import PrecisionPlan
from .calibrate import CALIBRATION_METHODS, weight_form_plan, with_quantized_weights
from .config import qnn_config, quantize_kwargs
from .fusion import fuse_activations
from .ort_patch import ort_quantizer_turn, quiet_ort_logging


def quantize_plain(model_path: str | Path, calibration: DataSource, plan: PrecisionPlan, graph: ModelGraph,
                   out: str | Path, method: str = "minmax") -> Path:
    """ORT's own path, recalibrating every time: `get_qnn_qdq_config` + `quantize` for the weights, ORT's
    calibrator on the float model carrying them, `quantize_static` from those ranges. The baseline to beat.
    Its runs of ORT's quantizer take their turn in the process, unpatched."""
    from onnxruntime.quantization import quantize

    model = onnx.load(str(model_path))
    calibrate_method = CALIBRATION_METHODS[method]
    with tempfile.TemporaryDirectory(prefix="mpstudio-plain-") as tmp:
        reference, carried = Path(tmp) / "weights.onnx", Path(tmp) / "carried.onnx"
        config = qnn_config(model, graph, weight_form_plan(plan), calibrate_method, CalibrationReader(calibration))
        with ort_quantizer_turn(), quiet_ort_logging():
            quantize(str(model_path), str(reference), config)
        onnx.save(with_quantized_weights(model, reference), carried)
        calibrator = create_calibrator(carried, None, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                       calibrate_method=calibrate_method)
        calibrator.collect_data(CalibrationReader(calibration))
        save_tensors_data(calibrator.compute_data(), Path(tmp) / "ranges.json")
        del calibrator
        config = qnn_config(model, graph, plan, calibrate_method)
        with ort_quantizer_turn(), quiet_ort_logging():
            quantize_static(str(model_path), str(out), None, calibration_cache_path=Path(tmp) / "ranges.json",
                            **quantize_kwargs(config))
    fuse_activations(out)
    return Path(out)
