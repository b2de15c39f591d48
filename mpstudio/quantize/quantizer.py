"""The Quantizer: one prepared float model's calibration (per weight form, cached on disk) and the QDQ models
it regenerates from those ranges for any precision plan, cached by plan hash."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping

import onnx
from onnxruntime.quantization import quantize_static

from ..cache import exclusive
from ..data import DataSource, Progress
from ..errors import MpstudioError, brief
from ..graph import ModelGraph
from ..model import PreparedModel
from ..plan import PrecisionPlan
from ..qdq import Encoding
from .calibrate import (CALIBRATION_METHODS, FLOAT_RANGES, CalibrationCache, cached_ranges, collect_ranges,
                        narrow_range_note, narrow_tensors, scratch_lock, store_ranges, tensor_spans, weight_form,
                        weight_form_plan, with_quantized_weights)
from .bias_clip import clipped_bias_note, clipped_biases
from .concat_ranges import concat_range_note, squeezed_concat_inputs
from .config import qnn_config, quantize_kwargs
from .fusion import fuse_activations
from .unfold import set_weight_codes, unfold_imported
from .ort_patch import fast_ort_quantizer, quiet_ort_logging
from .versions import GENERATOR_VERSION, toolchain_key


class Quantizer:
    """Regenerates QDQ models of one prepared float model for any PrecisionPlan.

    `cache_dir` holds `float.onnx`, `calibration/<key>.json` and `models/<plan hash>.onnx`. Its runs of
    ORT's quantizer take their turn in the process (`ort_patch`): callers need no lock of their own.
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
        form = "float" if plan is FLOAT_RANGES else weight_form(plan or PrecisionPlan())
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
            cached = cached_ranges(self._ranges_dir, key, self.method)
            if cached is not None:
                self._caches[key] = cached
                return cached
            started = time.perf_counter()
            float_ranges = self._calibrate_float(progress, cancel)
            carried = self._calibration_model(plan, float_ranges)
            ranges, samples = self._collect_ranges(carried, progress, cancel, "calibrating with quantized weights")
            self._caches[key] = store_ranges(self._ranges_dir, key, ranges, samples,
                                             float_ranges.seconds + time.perf_counter() - started, self.method)
            return self._caches[key]

    def calibration_model(self, plan: PrecisionPlan | None = None) -> Path:
        """The float model carrying the weights of `plan`'s weight form quantized (None: the default plan's): the
        model its activation ranges are calibrated on, so the values a tensor's range was measured on. Scores that
        quantize a tensor's values with those ranges must read them here: a float tensor can exceed a range that
        quantized weights shrink (a channel whose weights round to zero), and would look clipped where the QDQ
        model never clips."""
        with self._lock:
            return self._calibration_model(plan, self._calibrate_float(None, None))

    def range_note(self, plan: PrecisionPlan | None = None) -> str:
        """The warnings `plan`'s calibrated ranges (None: the default plan's) call for, one per line ("" when none):
        many activations spanning less than QNN's minimum range (`calibrate.narrow_range_note`), and Concats whose
        narrow inputs keep a few steps of the joined tensor's scale at `plan`'s precision
        (`concat_ranges.concat_range_note`); with a `plan`, also the int32 biases its model clips (`bias_note`).
        Calibrates if needed."""
        names = self.graph.activations()
        cache = self.calibrate(plan=plan)
        spans = tensor_spans(cache, names)
        outputs = [o.name for o in self.prepared.model.graph.output]
        narrow = narrow_tensors(cache, names, spans)
        notes = (narrow_range_note(narrow, len(names), outputs),
                 concat_range_note(squeezed_concat_inputs(self.graph, spans, plan), outputs),
                 self.bias_note(plan) if plan is not None else "")
        return "\n".join(note for note in notes if note)

    def bias_note(self, plan: PrecisionPlan) -> str:
        """A warning naming the Conv/Gemm biases `plan`'s QDQ model clips to what its int32 codes hold ("" when
        none; `bias_clip`). Generates the model if needed."""
        clipped = clipped_biases(onnx.load(self.generate(plan)), self.prepared.model)
        return clipped_bias_note(clipped, plan.name or plan.summary())

    def squeezed_concats(self, plan: PrecisionPlan | None = None) -> list:
        """The Concat inputs that the joined tensor's scale leaves a few steps at `plan`'s precision (None: the
        default plan), from `plan`'s calibrated ranges (`concat_ranges.squeezed_concat_inputs`)."""
        spans = tensor_spans(self.calibrate(plan=plan), self.graph.activations())
        return squeezed_concat_inputs(self.graph, spans, plan)

    @property
    def _ranges_dir(self) -> Path:
        return self.cache_dir / "calibration"

    def _calibration_model(self, plan: PrecisionPlan | None, float_ranges: CalibrationCache) -> Path:
        out = self.cache_dir / "float" / f"{self.prepared.sha256[:16]}-weights-{self.calibration_key(plan)}.onnx"
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".weights-", dir=out.parent) as tmp:  # a killed run leaves it here
            reference = Path(tmp) / "weights.onnx"
            self._quantize(weight_form_plan(plan or PrecisionPlan()), float_ranges, reference)
            unique = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            onnx.save(with_quantized_weights(onnx.load(self.float_path), reference), unique)
            os.replace(unique, out)  # another process may be making the same file
        return out

    def _calibrate_float(self, progress, cancel) -> CalibrationCache:
        """The float model's own ranges (the first pass, which quantizes the weights of the second)."""
        key = self.calibration_key(FLOAT_RANGES)
        cached = cached_ranges(self._ranges_dir, key, self.method)
        if cached is None:
            started = time.perf_counter()
            ranges, samples = self._collect_ranges(self.float_path, progress, cancel, "calibrating")
            cached = store_ranges(self._ranges_dir, key, ranges, samples, time.perf_counter() - started, self.method)
        return cached

    def _collect_ranges(self, model_path: Path, progress, cancel, message: str):
        return collect_ranges(model_path, self.calibration, self.prepared.inputs, self.method, progress, cancel,
                              message)

    def _quantize(self, plan: PrecisionPlan, cache: CalibrationCache, out: Path) -> None:
        pinned = self.pinned(plan)
        config = qnn_config(self.prepared.model, self.graph, plan, CALIBRATION_METHODS[self.method], pinned=pinned)
        # ORT's quantizer writes scratch files beside the float model: one process quantizes at a time (and,
        # patched process-wide, one thread: `fast_ort_quantizer` holds the turn).
        with exclusive(self.cache_dir / ".quantize.lock"), scratch_lock(self.float_path), fast_ort_quantizer(), \
                quiet_ort_logging():
            quantize_static(self.float_path, out, None, calibration_cache_path=cache.path, **quantize_kwargs(config))
        fuse_activations(out)
        if pinned:
            unfold_imported(out, self.prepared.model, self.graph, pinned)
            set_weight_codes(out, self.pinned_codes(plan))

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
    def save_pinned(self, tensors: Mapping[str, Encoding],
                    codes: Mapping[str, tuple[list[int], list[int]]] | None = None) -> str:
        """Keep imported encodings (float tensor -> Encoding, per-channel ones with their axis); returns the
        key a plan names them by (`PrecisionPlan.encodings`). `codes`: weight -> (flat indices, integer codes)
        the source computes with where ORT's quantizer rounds otherwise; the plan's model takes them."""
        data = {name: {"dtype": e.dtype, "scale": list(e.scale), "zero_point": list(e.zero_point), "axis": e.axis}
                for name, e in sorted(tensors.items())}
        for name, (indices, values) in (codes or {}).items():
            data[name]["codes"] = {"index": [int(i) for i in indices], "value": [int(v) for v in values]}
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

    def pinned_codes(self, plan: PrecisionPlan) -> dict[str, tuple[list[int], list[int]]]:
        """The weight codes an imported plan takes from its source (weight -> flat indices, codes)."""
        path = self.encodings_dir / f"{plan.encodings}.json"
        if not plan.encodings or not path.exists():
            return {}
        return {name: (e["codes"]["index"], e["codes"]["value"])
                for name, e in json.loads(path.read_text()).items() if "codes" in e}
