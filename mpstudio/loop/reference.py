"""The float model's side of a study: its outputs on the evaluation data (what output SNR and many metrics compare
with) and its own task metric (what targets like "float-1%" are relative to), each computed once and kept in
the study's `reference/` folder."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from ..cache import exclusive
from ..data import DataSource, Progress, TaskMetric
from ..metric_terms import check_user_terms
from ..metrics import MetricSpec
from ..quantize import Quantizer
from .folder import atomic_write

FLOAT_METRIC_FILE = "metric.json"  # in reference/: the float model's own task metric


class FloatReference:
    """The float model's outputs and metric for the study in `folder` (computed once per study, kept on disk and
    in this object)."""

    def __init__(self, folder: Path, quantizer: Quantizer, data: DataSource):
        self.folder, self.quantizer, self.data = folder, quantizer, data
        self._outputs: list[dict[str, np.ndarray]] | None = None

    def outputs(self, progress: Progress | None = None, cancel=None) -> list[dict[str, np.ndarray]]:
        """The float model's outputs on the evaluation data (ONNX Runtime on CPU)."""
        if self._outputs is not None:
            return self._outputs
        folder = self.folder / "reference"
        marker = folder / "complete"
        if not marker.exists():
            from .inprocess import run_outputs

            self.folder.mkdir(parents=True, exist_ok=True)
            with exclusive(self.folder / ".reference.lock"):  # another process may be writing them too
                if not marker.exists():
                    outputs = run_outputs(self.quantizer.float_path, self.data, "cpu", None, progress, cancel)
                    shutil.rmtree(folder, ignore_errors=True)
                    folder.mkdir(parents=True)
                    for i, out in enumerate(outputs):
                        np.savez(folder / f"{i:06d}.npz", **out)
                    marker.write_text(str(len(outputs)))
        self._outputs = [dict(np.load(p, allow_pickle=False)) for p in sorted(folder.glob("*.npz"))]
        return self._outputs

    def metric_value(self, spec: MetricSpec, metric: Callable[[], TaskMetric | None],
                     progress: Progress | None = None, cancel: threading.Event | None = None) -> float | None:
        """The float model's `spec` metric (`metric()` builds it, only when it is not kept yet); None for output
        SNR, whose reference is the float model itself."""
        if spec.kind == "output":
            return None
        path = self.folder / "reference" / FLOAT_METRIC_FILE
        key = spec.to_json()
        if path.exists():
            try:
                saved = json.loads(path.read_text())
                if saved.get("metric") == key:
                    return float(saved["value"])
            except (ValueError, KeyError, TypeError):
                pass  # damaged: computed again below
        task_metric = metric()
        references = self.outputs(progress, cancel)
        value = float(task_metric(references, references))
        check_user_terms(spec, references, value)  # before it is kept: a study is not made on terms of another metric
        atomic_write(path, json.dumps({"metric": key, "value": value, "source": "float model on ORT CPU",
                                       "samples": len(references)}) + "\n")
        return value

    def stored_metric_value(self, spec: MetricSpec) -> float | None:
        """The float model's `spec` metric when `metric_value` has computed it (never computes it)."""
        path = self.folder / "reference" / FLOAT_METRIC_FILE
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return float(saved["value"]) if saved.get("metric") == spec.to_json() else None
