"""A study on disk: one model, its data and metric, and every evaluated plan with its results.

`Study` is the face: it ties the prepared model and data (this module), the results store
(`mpstudio.store`), where plans run (`mpstudio.runners`) and the task metric (`mpstudio.metrics`). A study
killed at any moment reopens with every finished evaluation intact; `mpstudio.search.resume` runs what it
left pending.

Layout::

    study.json  study.sqlite  model.onnx  data/calibration/  data/evaluation/  imported/ (encodings of imported plans)
    cache/ (calibration, generated models)  reference/ (float outputs, the float model's metric)  sensitivity/  exports/
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from .cache import exclusive
from .data import Cancelled, DataSource, NpzFolder, Progress, TaskMetric, check_feeds
from .errors import MpstudioError
from .metrics import OUTPUT_SNR, MetricSpec, output_agreement
from .model import PreparedModel, prepare_model
from .plan import PrecisionPlan
from .quantize import Quantizer
from .runners import runner_for
from .runtime import BACKENDS
from .store import DB_FILE, EVALUATION_COLUMNS, AccuracyRecord, Evaluation, StudyStore

STUDY_FORMAT = 1
STUDY_FILE = "study.json"
# The number of accuracy results the store has committed, written beside it: a store that holds fewer was
# damaged (e.g. its write-ahead log was deleted before it was folded in).
RESULTS_FILE = "results.count"
PROFILES_DIR = "profiles"  # per-op profiles of device runs, one folder per device
CALIBRATION_FILE = "calibration.json"  # the cost model's scales refitted on a device
FLOAT_METRIC_FILE = "metric.json"  # in reference/: the float model's own task metric
_CONFIG_KEYS = {"format": int, "inputs": list, "metric": dict}


def pareto_mask(accuracy: Sequence[float], latency: Sequence[float], higher_is_better: bool) -> np.ndarray:
    """True for the points no other point dominates (as accurate or better and as fast or faster, and
    strictly better in one). Equal points are all kept; NaNs are never on the front."""
    acc = np.asarray(accuracy, dtype=np.float64)
    lat = np.asarray(latency, dtype=np.float64)
    if not higher_is_better:
        acc = -acc
    valid = np.isfinite(acc) & np.isfinite(lat)
    mask = np.zeros(len(acc), dtype=bool)
    # Sweep by latency (then accuracy, best first); a point is on the front when it beats the best accuracy
    # seen at strictly lower latency, or ties the front point at the same latency.
    order = sorted(np.flatnonzero(valid), key=lambda i: (lat[i], -acc[i]))
    best = -np.inf
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and lat[order[j]] == lat[order[i]]:
            j += 1
        group = order[i:j]
        top = acc[group[0]]
        if top > best:
            for k in group:
                if acc[k] == top:
                    mask[k] = True
            best = top
        i = j
    return mask


class Study:
    """Plans evaluated on one model with one metric, kept in a folder (see the module docstring)."""

    def __init__(self, folder: Path, config: dict, prepared: PreparedModel, calibration: DataSource,
                 evaluation: DataSource, metric: TaskMetric | None):
        self.folder = folder
        self.config = config
        self.prepared = prepared
        self.calibration = calibration
        self.evaluation_data = evaluation
        self.metric_spec = MetricSpec.from_json(config["metric"])
        self._metric = metric
        self.htp_arch = str(config.get("htp_arch", "75"))
        self.quantizer = Quantizer(prepared, calibration, folder / "cache", config.get("calibration_method", "minmax"))
        self.quantizer.encodings_dir = folder / "imported"  # the encodings imported plans keep (not a cache)
        self.store = StudyStore(folder / DB_FILE)
        self._check_complete()
        self._references: list[dict[str, np.ndarray]] | None = None
        self._sensitivity = None

    # ---- creating and opening ----
    @classmethod
    def create(cls, folder: str | Path, model, calibration: DataSource, evaluation: DataSource | None = None,
               metric: TaskMetric | MetricSpec | None = None, *, input_shapes: dict | None = None,
               htp_arch: str = "75", calibration_method: str = "minmax", name: str | None = None,
               calibration_samples: int | None = None, evaluation_samples: int | None = None,
               progress: Progress | None = None, allow_fallback: bool = False) -> "Study":
        """A new study in `folder` (which must not hold one already): prepares the model and copies the data in.

        `model` is a path or a PreparedModel; `evaluation` defaults to `calibration`. `metric` is a
        TaskMetric (kept for this process; reopen with `Study.open(folder, metric=...)`), a MetricSpec, or
        None for output SNR and cosine against the float model (`mpstudio.metrics.metric_spec` names one by
        `module:function` or a built-in name, stored so that any process can evaluate it). Two processes
        creating the same study make one: the second waits and opens it.

        `calibration_samples` / `evaluation_samples` keep only the first N samples of each: every plan of a
        study is scored on the same data, so these counts belong to the study, not to a search.

        A model with nodes QNN HTP cannot run (after preparation's rewrites) is refused, naming them, unless
        `allow_fallback`: then HTP evaluations run those nodes on ORT's CPU EP, and every HTP accuracy and
        latency of the study says "HTP + N nodes on CPU".
        """
        folder = Path(folder)
        if (folder / STUDY_FILE).exists():
            raise MpstudioError(f"{folder} already holds a study; open it with Study.open (mpstudio study show)")
        prepared = model if isinstance(model, PreparedModel) else prepare_model(model, input_shapes)
        if not prepared.qnn_ready and not allow_fallback:
            raise MpstudioError(prepared.fallback_refusal())
        evaluation = evaluation if evaluation is not None else calibration
        for what, count in (("calibration", calibration_samples), ("evaluation", evaluation_samples)):
            if count is not None and count < 1:
                raise MpstudioError(f"{what}_samples must be at least 1, not {count}")
        calibration = calibration.head(calibration_samples) if calibration_samples else calibration
        evaluation = evaluation.head(evaluation_samples) if evaluation_samples else evaluation
        for what, source in (("calibration", calibration), ("evaluation", evaluation)):
            if len(source) == 0:
                raise MpstudioError(f"the {what} data is empty; give at least one sample")
            check_feeds(source, prepared.inputs, limit=1)
        spec, task_metric = _metric_parts(metric)
        folder.mkdir(parents=True, exist_ok=True)
        with exclusive(folder / ".create.lock"):
            if not (folder / STUDY_FILE).exists():  # else another process made it while this one waited
                _write_study(folder, prepared, calibration, evaluation, {
                    "format": STUDY_FORMAT,
                    "name": name or Path(prepared.source).stem,
                    "model_source": str(prepared.source),
                    "model_sha256": prepared.sha256,
                    "inputs": [spec_.name for spec_ in prepared.inputs],
                    "metric": spec.to_json(),
                    "htp_arch": str(htp_arch),
                    "calibration_method": calibration_method,
                    "samples": {"calibration": len(calibration), "evaluation": len(evaluation),
                                "total": len(calibration) + len(evaluation)},
                    "created": time.time(),
                    **({"allow_fallback": True, "cpu_fallback_nodes": list(prepared.fallback_nodes)}
                       if allow_fallback and not prepared.qnn_ready else {}),
                }, progress)
        return cls.open(folder, metric=task_metric)

    @classmethod
    def open(cls, folder: str | Path, *, metric: TaskMetric | None = None) -> "Study":
        """Reopen a study from its folder: data, metric, every stored result and any pending work."""
        folder = Path(folder)
        config = _read_config(folder)
        prepared = prepare_model(folder / "model.onnx", optimize=False, rewrite=False)
        inputs = config["inputs"]
        calibration = NpzFolder(folder / "data" / "calibration", inputs)
        evaluation = NpzFolder(folder / "data" / "evaluation", inputs)
        # A metric stored by reference is imported when a plan is evaluated, so a study whose metric module is
        # not on this process's path still opens and shows its results.
        spec = MetricSpec.from_json(config["metric"])
        if metric is None and spec.kind not in ("python", "reference"):
            metric = spec.build(prepared)
        return cls(folder, config, prepared, calibration, evaluation, metric)

    @classmethod
    def demo(cls, folder: str | Path | None = None, *, calibration_lines: int = 100, evaluation_lines: int = 100,
             progress: Progress | None = None) -> "Study":
        """The built-in demo (PP-OCRv4 text-line recognizer, CER) as a study; reopened when it exists."""
        from .cache import cache_root
        from .demos.ocr import load_demo

        folder = Path(folder) if folder else cache_root() / "studies" / f"demo-{calibration_lines}-{evaluation_lines}"
        if (folder / STUDY_FILE).exists():
            return cls.open(folder)
        demo = load_demo(calibration_lines, evaluation_lines)
        spec = MetricSpec("ctc_cer", demo.metric.name, demo.metric.higher_is_better,
                          {"references": list(demo.texts)})
        return cls.create(folder, demo.model, demo.calibration, demo.evaluation, spec, name="demo: " + demo.name,
                          progress=progress)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Study":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Study({str(self.folder)!r}, {self.name!r}, {len(self.plans())} plans)"

    # ---- what the study is ----
    @property
    def name(self) -> str:
        return self.config.get("name", self.folder.name)

    @property
    def graph(self):
        return self.prepared.graph

    @property
    def cpu_fallback_nodes(self) -> tuple[str, ...]:
        """The nodes HTP evaluations run on ORT's CPU EP (a study created with allow_fallback); () for most."""
        if not self.config.get("allow_fallback"):
            return ()
        return tuple(self.config.get("cpu_fallback_nodes") or self.prepared.fallback_nodes)

    @property
    def metric(self) -> TaskMetric | None:
        return self._metric

    def task_metric(self) -> TaskMetric | None:
        """The metric plans are scored with (None: output SNR); a metric stored by reference is imported now,
        with a clear error when this process cannot import it or a Python metric was not given again."""
        if self._metric is None and self.metric_spec.kind != "output":
            self._metric = self.metric_spec.build(self.prepared)
        return self._metric

    def float_value(self, progress: Progress | None = None, cancel: threading.Event | None = None) -> float | None:
        """The task metric of the float model itself (ONNX Runtime on CPU, the evaluation data): what targets
        like "float-1%" are relative to. None for output SNR, whose reference is the float model itself.
        Computed once and kept in `reference/metric.json`."""
        if self.metric_spec.kind == "output":
            return None
        path = self.folder / "reference" / FLOAT_METRIC_FILE
        key = self.metric_spec.to_json()
        if path.exists():
            try:
                saved = json.loads(path.read_text())
                if saved.get("metric") == key:
                    return float(saved["value"])
            except (ValueError, KeyError, TypeError):
                pass  # damaged: computed again below
        metric = self.task_metric()
        references = self.float_outputs(progress, cancel)
        value = float(metric(references, references))
        _atomic_write(path, json.dumps({"metric": key, "value": value, "source": "float model on ORT CPU",
                                        "samples": len(references)}) + "\n")
        return value

    def stored_float_value(self) -> float | None:
        """The float model's metric when `float_value` has computed it (never computes it)."""
        path = self.folder / "reference" / FLOAT_METRIC_FILE
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return float(saved["value"]) if saved.get("metric") == self.metric_spec.to_json() else None

    @property
    def metric_name(self) -> str:
        return self.metric_spec.name

    @property
    def higher_is_better(self) -> bool:
        return self.metric_spec.higher_is_better

    # ---- plans ----
    def add_plan(self, plan: PrecisionPlan, origin: str = "user") -> int:
        """Store `plan` (validated against the model) and return its id; a plan already stored keeps its id."""
        plan.validate(self.graph, self.htp_arch)
        known = self.store.plan_id(plan.hash)
        if known is not None:
            return known
        sixteen_bit = len(plan.sixteen_bit_activations(self.graph))
        return self.store.add_plan(plan.hash, plan.name or _default_name(plan, sixteen_bit), origin, plan.to_json(),
                                   sixteen_bit)

    def plan(self, plan_id: int | str) -> PrecisionPlan:
        """A stored plan by id or hash (or a unique hash prefix)."""
        row = self.store.plan_row(plan_id)
        if row is None:
            known = ", ".join(str(i) for i in self.plans()["plan_id"].head(20))
            raise MpstudioError(f"this study has no plan {plan_id!r}; its plans are: {known or 'none yet'}")
        data, name = row
        return PrecisionPlan.from_json(data if data.get("name") else {**data, "name": name})

    def import_plan(self, source, *, name: str | None = None):
        """Import a QDQ model (AIMET's or any) or an AIMET/QNN encodings file (1.0.0 or the dict form) as a plan
        that keeps its scales and zero points; returns an `importer.ImportedPlan` (see mpstudio.importer)."""
        from .importer import import_plan

        return import_plan(self, source, name=name)

    def plan_id(self, plan: PrecisionPlan) -> int | None:
        return self.store.plan_id(plan.hash)

    def plans(self) -> pd.DataFrame:
        """Columns: plan_id, plan_hash, name, origin, sixteen_bit, created."""
        return self.store.plans()

    # ---- evaluation ----
    def accuracy_source(self, backend: str, runner=None) -> str:
        """Where `backend` runs for `runner`, e.g. "HTP emulator on host"; "... + N nodes on CPU" when this
        study's HTP runs leave nodes to the CPU (allow_fallback)."""
        source = runner_for(runner).source(backend)
        cpu = len(self.cpu_fallback_nodes)
        return f"{source} + {cpu} nodes on CPU" if backend == "htp" and cpu else source

    def evaluate(self, plan: PrecisionPlan, backend: str = "cpu", runner=None, *, origin: str = "user",
                 measure_latency: bool = True, profile: bool | None = None, progress: Progress | None = None,
                 cancel: threading.Event | None = None, partial: Callable | None = None,
                 first_samples: int | None = None) -> Evaluation:
        """Accuracy of `plan` on the evaluation data, with its latency; stored in the study at once.

        `runner` is None (this process: ORT's CPU QDQ run, or the local HTP backend), an AgentClient or an
        AgentPool (the samples spread over its agents). With an agent on `htp`, the latency of one sample
        is measured there too (`measured` on a device, `emulator` on an x86_64 host). The cost model's
        estimate is always stored. A plan already evaluated from the same source is not run again.

        On a device (an agent whose HTP is a real NPU) the run is also profiled per op (`profile` None: on a
        device only; True: on the emulator too), the profile kept in the study, and the cost model recalibrated
        on that device's profiles (`recalibrate`).

        With `partial`, the evaluation streams: it runs a seeded random `first_samples` (default
        `preview.FIRST_SAMPLES`) first, then chunks that double what has run, and calls `partial` with a
        `preview.PartialAccuracy` (value and interval so far) after each chunk but the last. Partial values are
        not stored; the stored result is always the one on every sample.
        """
        if backend not in BACKENDS:
            raise MpstudioError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        runs = runner_for(runner)
        plan_id = self.add_plan(plan, origin)
        source = self.accuracy_source(backend, runs)
        fallback = backend == "htp" and bool(self.cpu_fallback_nodes)
        found = self.store.evaluation(plan_id, source)
        if found is not None:
            return found
        metric = self.task_metric()
        started = time.perf_counter()
        path = self.quantizer.generate(plan, progress, cancel)
        options = {"htp_arch": self.htp_arch} if backend == "htp" else None
        run_kwargs = {"allow_cpu_fallback": True} if fallback else {}
        if partial is not None:
            # The cost model reads the new model while the first samples run (ORT releases the GIL).
            estimating = _Background(self._estimate, path) if measure_latency else None
            outputs = self._streamed_outputs(plan, path, runs, backend, options, source, estimating, partial,
                                             first_samples, progress, cancel, run_kwargs)
            estimate = estimating.result() if estimating is not None else None
        else:
            estimate = self._estimate(path) if measure_latency else None
            outputs = runs.outputs(path, self.evaluation_data, backend, options, progress, cancel, **run_kwargs)
        references = self.float_outputs(progress, cancel)
        snr, cosine = output_agreement(references, outputs)
        value = metric(outputs, references) if metric is not None else snr
        record = AccuracyRecord(backend, source, self.metric_name, float(value), self.higher_is_better, snr, cosine,
                                len(self.evaluation_data), time.perf_counter() - started)
        latencies = []
        if measure_latency:
            latencies.append(estimate)
            measured = profiled = None
            if backend == "htp" and runs.agent is not None:
                profile = runs.on_device if profile is None else profile
                measured, profiled = runs.measure(path, self.evaluation_data.sample(0), {"htp_arch": self.htp_arch},
                                                  profile, **({"allow_cpu_fallback": True} if fallback else {}))
                if measured is not None and fallback:
                    measured = measured.with_cpu_nodes(len(self.cpu_fallback_nodes))
                latencies.append(measured)
        self.store.record(plan_id, record, latencies)
        self._count_results()
        # A run with nodes on the CPU times more than the HTP's profile shows: no cost-model fit on it.
        if measure_latency and measured is not None and profiled is not None and not fallback:
            self._keep_profile(plan_id, measured, profiled)
            self.recalibrate(measured.where, allow_emulator=not measured.is_device_latency)
        stored = self.store.evaluation(plan_id, source)
        assert stored is not None
        return dataclasses.replace(stored, cached=False)

    def _streamed_outputs(self, plan, path, runs, backend, options, source, estimating, partial, first_samples,
                          progress, cancel, run_kwargs) -> list:
        """The evaluation's outputs in sample order, run in `preview.stream_order` chunks, with a
        `PartialAccuracy` passed to `partial` after each chunk but the last."""
        from .data import Subset
        from .preview import FIRST_SAMPLES, PartialAccuracy, sample_terms, stream_order

        data = self.evaluation_data
        total = len(data)
        terms = sample_terms(self.metric_spec, self.prepared, self.float_outputs(progress, cancel))
        if terms is None:  # a metric of the whole set only: nothing to show before the end
            return runs.outputs(path, data, backend, options, progress, cancel, **run_kwargs)
        outputs: dict[int, dict] = {}
        for chunk in stream_order(total, first_samples or FIRST_SAMPLES):
            offset = len(outputs)

            def step(done, _total, message, offset=offset):
                if progress:
                    progress(offset + done, total, message)
            got = runs.outputs(path, Subset(data, chunk, f"{data.name}[stream]"), backend, options, step, cancel,
                               **run_kwargs)
            outputs.update(zip(chunk, got))
            if len(outputs) < total:
                indices = sorted(outputs)
                value, low, high = terms.partial([outputs[i] for i in indices], indices, total)
                estimate = estimating.result() if estimating is not None else None
                partial(PartialAccuracy(plan.hash, self.metric_name, value, low, high, len(indices), total, source,
                                        estimate))
        return [outputs[i] for i in range(total)]

    def predict(self, plan: PrecisionPlan, report=None, accuracy_source: str | None = None,
                evaluated: pd.DataFrame | None = None):
        """`plan`'s accuracy predicted from the sensitivity report (default: the one this study holds, if the
        analysis ran) and its cost-model latency, before any run: a `preview.PlanPrediction`. `evaluated`: this
        study's evaluations when the caller has them at hand (`evaluations()` or `front("estimate")`)."""
        from .preview import predict_plan

        if report is None and self._sensitivity is not None:
            report = self._sensitivity[1]
        return predict_plan(self, plan, report, accuracy_source, evaluated=evaluated)

    def baselines(self, backend: str = "cpu", runner=None, progress: Progress | None = None,
                  cancel: threading.Event | None = None) -> dict[str, Evaluation]:
        """The all-8-bit (a8w8) and all-16-bit-activation (a16w8) plans, evaluated."""
        out = {}
        for plan in (PrecisionPlan.a8w8(name="a8w8"), PrecisionPlan.a16w8(name="a16w8")):
            out[plan.name] = self.evaluate(plan, backend, runner, origin="baseline", progress=progress, cancel=cancel)
        return out

    def estimate(self, plan: PrecisionPlan):
        """The cost model's latency of `plan` (generates its QDQ model; stores the estimate when the plan is stored)."""
        latency = self._estimate(self.quantizer.generate(plan))
        plan_id = self.plan_id(plan)
        if plan_id is not None and latency is not None:
            self.store.record_latency(plan_id, latency)
        return latency

    # ---- jobs: pending work that survives a kill ----
    def submit(self, plan: PrecisionPlan, backend: str = "cpu", *, origin: str = "user",
               search_id: int | None = None) -> int:
        """Queue an evaluation of `plan`; `run_pending` (or `mpstudio.search.resume`) runs it. Returns the job id."""
        return self.store.submit(self.add_plan(plan, origin), backend, search_id)

    def jobs(self) -> pd.DataFrame:
        """Columns: job_id, plan_id, backend, status (pending/running/done/failed), search_id, error."""
        return self.store.jobs()

    def run_pending(self, runner=None, *, progress: Progress | None = None, cancel: threading.Event | None = None,
                    on_result: Callable[[Evaluation], None] | None = None) -> list[Evaluation]:
        """Run every pending job, one after another (each result committed as it finishes)."""
        results = []
        while (job_id := self.store.claim_job()) is not None:
            evaluation = self.run_job(job_id, runner, progress=progress, cancel=cancel, claimed=True)
            results.append(evaluation)
            if on_result:
                on_result(evaluation)
        return results

    def run_job(self, job_id: int, runner=None, *, progress: Progress | None = None,
                cancel: threading.Event | None = None, claimed: bool = False) -> Evaluation:
        """Run one queued evaluation; a cancelled job goes back to pending, a failed one records its error."""
        if not claimed and not self.store.claim_job(job_id):
            raise MpstudioError(f"job {job_id} is not pending (another process may be running it)")
        plan_id, backend = self.store.job(job_id)
        try:
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled before the evaluation started")
            evaluation = self.evaluate(self.plan(plan_id), backend, runner, progress=progress, cancel=cancel)
        except Cancelled:
            self.store.finish_job(job_id, "pending", None)
            raise
        except BaseException as exc:
            self.store.finish_job(job_id, "failed", str(exc) or type(exc).__name__)
            raise
        self.store.finish_job(job_id, "done", None)
        return evaluation

    # ---- searches (their spec and state; mpstudio.search runs them) ----
    def start_search(self, spec: dict) -> int:
        """Record a search; an unfinished search with the same spec is continued instead of duplicated."""
        return self.store.start_search(spec)

    def finish_search(self, search_id: int, status: str, result: dict | None) -> None:
        self.store.finish_search(search_id, status, result)

    def searches(self) -> pd.DataFrame:
        """Columns: search_id, spec (dict), status (running/done/cancelled/failed/interrupted), result."""
        return self.store.searches()

    # ---- reading results ----
    def evaluations(self) -> pd.DataFrame:
        """Every evaluated plan with its accuracy and latency (`store.EVALUATION_COLUMNS`; one row per accuracy
        source and latency source, so a plan measured on a device appears once with its estimate, once measured)."""
        return self.store.evaluations()

    def front(self, latency_source: str = "estimate", accuracy_source: str | None = None) -> pd.DataFrame:
        """The evaluations with a `pareto` column: True on the accuracy/latency front of that latency source.

        One accuracy source is used, so CPU and HTP accuracies are never mixed on one front. By default it is
        the one with the most plans; for measured and emulator latency, which only HTP runs give, the HTP
        accuracy of those same runs when there is one.
        """
        frame = self.evaluations()
        frame = frame[frame["latency_source"] == latency_source]
        if accuracy_source is None and len(frame):
            counts = frame["accuracy_source"].value_counts()
            on_htp = [s for s in counts.index if s.startswith("HTP")]
            accuracy_source = on_htp[0] if on_htp and latency_source != "estimate" else counts.index[0]
        frame = frame[frame["accuracy_source"] == accuracy_source].copy()
        if latency_source == "measured" and frame["latency_where"].nunique() > 1:
            # One device per front: each device's latencies are their own axis.
            frame = frame[frame["latency_where"] == frame["latency_where"].value_counts().index[0]]
        frame["pareto"] = pareto_mask(frame["value"], frame["latency_ms"], self.higher_is_better)
        return frame.sort_values(["latency_ms", "value"]).reset_index(drop=True)

    def cross_checks(self, latency_source: str = "estimate", front: pd.DataFrame | None = None) -> pd.DataFrame:
        """Plans of `front(latency_source)` (pass it when you have it) that another accuracy source scored too
        (e.g. a search's HTP confirmation of plans the front has from the CPU). Columns: plan_id, name,
        latency_ms, value (the front's source), other_value, other_source."""
        columns = ["plan_id", "name", "latency_ms", "value", "other_value", "other_source"]
        front = self.front(latency_source) if front is None else front
        if front.empty:
            return pd.DataFrame(columns=columns)
        frame = self.evaluations()
        others = frame[(frame["latency_source"] == latency_source)
                       & (frame["accuracy_source"] != front["accuracy_source"].iloc[0])]
        merged = front[["plan_id", "name", "latency_ms", "value"]].merge(
            others[["plan_id", "value", "accuracy_source"]].rename(
                columns={"value": "other_value", "accuracy_source": "other_source"}), on="plan_id")
        return merged.drop_duplicates(["plan_id", "other_source"])[columns].reset_index(drop=True)

    def summary(self, latency_source: str = "estimate") -> str:
        """A plain-text table of every evaluation and the front, for `mpstudio study show`."""
        lines = [f"study {self.name} ({self.folder})",
                 f"metric: {self.metric_spec.describe()} ({'higher' if self.higher_is_better else 'lower'} is better); "
                 f"evaluation samples: {len(self.evaluation_data)}; target HTP v{self.htp_arch}"]
        frame = self.front(latency_source)
        if frame.empty:
            lines.append(f"no evaluations with {latency_source} latency yet")
            return "\n".join(lines)
        lines.append(f"accuracy from {frame['accuracy_source'].iloc[0]}; latency: {frame['latency_label'].iloc[0]}")
        float_value = self.stored_float_value()
        if float_value is not None:
            lines.append(f"float model (ORT CPU): {self.metric_name} {float_value:.4f}")
        show = frame[["plan_id", "name", "origin", "sixteen_bit", "value", "latency_ms", "pareto"]].copy()
        if frame["latency_low_ms"].notna().any():  # an estimate's interval, beside it
            show.insert(6, "interval (ms)", [f"{lo:.3f}-{hi:.3f}" if lo == lo else "-"
                                             for lo, hi in zip(frame["latency_low_ms"], frame["latency_high_ms"])])
        show["pareto"] = show["pareto"].map({True: "*", False: ""})
        show = show.rename(columns={"value": self.metric_name, "latency_ms": "latency (ms)", "pareto": "front",
                                    "sixteen_bit": "16-bit"})
        lines.append(show.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        lines.append(f"{int(frame['pareto'].sum())} plan(s) on the front; * marks them")
        checks = self.cross_checks(latency_source, frame)
        for source, rows in checks.groupby("other_source", sort=False):
            lines.append(f"also scored on {source}: " + "; ".join(
                f"plan {r.plan_id} {r.name} {r.other_value:.4f} ({r.value:.4f} above)" for r in rows.itertuples()))
        return "\n".join(lines)

    # ---- sensitivity, cached in the study ----
    def sensitivity(self, *, samples: int = 32, isolation_samples: int = 8, progress: Progress | None = None,
                    cancel: threading.Event | None = None, exhaustive: bool = False, on_partial=None,
                    workers: int | None = None, plan: PrecisionPlan | None = None):
        """The sensitivity report of `plan` (default the all-8-bit plan) on the calibration data (computed once,
        then loaded): each tensor scored and isolated against that plan, e.g. a8w8 with per-channel weights.

        Progressive (`sensitivity.analyze_progressive`): partial reports reach `on_partial` as they come, in
        worker processes (`workers`, default one per core), isolating only the tensors that can change a
        decision; `exhaustive=True` isolates every tensor (`sensitivity.analyze`)."""
        from .sensitivity import SensitivityReport, analyze, analyze_progressive
        from .sensitivity.progressive import ENGINE_VERSION

        base = "a8w8" if plan is None or plan.hash == PrecisionPlan.a8w8().hash else f"plan-{plan.hash[:12]}"
        name = f"{base}-{samples}-{isolation_samples}" + ("" if exhaustive else f"-p{ENGINE_VERSION}")
        folder = self.folder / "sensitivity" / name
        if self._sensitivity is not None and self._sensitivity[0] == folder:
            return self._sensitivity[1]
        if (folder / "ranking.csv").exists():
            report = SensitivityReport.load(folder)
        elif exhaustive:
            data = self.calibration.head(samples)
            report = analyze(self.quantizer, data, plan, isolation_samples=isolation_samples, progress=progress,
                             cancel=cancel)
            report.save(folder)
        else:
            report = analyze_progressive(self.quantizer, self.calibration.head(samples), plan,
                                         isolation_samples=isolation_samples, htp_arch=self.htp_arch,
                                         workers=workers, cache_dir=self.folder / "sensitivity" / "values",
                                         on_partial=on_partial, progress=progress, cancel=cancel)
            report.save(folder)
        self._sensitivity = (folder, report)
        return report

    def float_outputs(self, progress: Progress | None = None, cancel=None) -> list[dict[str, np.ndarray]]:
        """The float model's outputs on the evaluation data (computed once, kept in `reference/`)."""
        if self._references is not None:
            return self._references
        folder = self.folder / "reference"
        marker = folder / "complete"
        if not marker.exists():
            from .evaluate import run_outputs

            self.folder.mkdir(parents=True, exist_ok=True)
            with exclusive(self.folder / ".reference.lock"):  # another process may be writing them too
                if not marker.exists():
                    outputs = run_outputs(self.quantizer.float_path, self.evaluation_data, "cpu", None, progress,
                                          cancel)
                    shutil.rmtree(folder, ignore_errors=True)
                    folder.mkdir(parents=True)
                    for i, out in enumerate(outputs):
                        np.savez(folder / f"{i:06d}.npz", **out)
                    marker.write_text(str(len(outputs)))
        self._references = [dict(np.load(p, allow_pickle=False)) for p in sorted(folder.glob("*.npz"))]
        return self._references

    # ---- internals ----
    def _estimate(self, path: Path):
        from .latency import estimate_latency

        try:
            latency = estimate_latency(path, htp_arch=self.cost_arch).latency
        except MpstudioError:
            return None  # the cost model cannot read this model; the accuracy still counts
        cpu = len(self.cpu_fallback_nodes)
        return latency.with_cpu_nodes(cpu) if cpu else latency

    # ---- the cost model, recalibrated on a device's profiles ----
    @property
    def cost_arch(self):
        """The HtpArch the study's estimates use: the study's architecture, recalibrated on a device when
        `recalibrate` has run (its estimates then say "calibrated on <device>")."""
        from .latency import htp_arch

        if getattr(self, "_cost_arch", None) is None:
            base = htp_arch(self.htp_arch)
            path = self.folder / CALIBRATION_FILE
            if path.exists():
                saved = json.loads(path.read_text())
                base = dataclasses.replace(base, scales=dict(saved["scales"]), calibrated_on=saved["calibrated_on"])
            self._cost_arch = base
        return self._cost_arch

    def profiles(self) -> pd.DataFrame:
        """Per-op profiles kept from device runs. Columns: plan_id, device, total_ms, path."""
        rows = []
        for path in sorted((self.folder / PROFILES_DIR).glob("*/*.json")):
            saved = json.loads(path.read_text())
            rows.append({"plan_id": saved["plan_id"], "device": saved["device"], "total_ms": saved["total_ms"],
                         "path": path})
        return pd.DataFrame(rows, columns=["plan_id", "device", "total_ms", "path"])

    def recalibrate(self, device: str | None = None, *, allow_emulator: bool = False):
        """Refit the cost model to the per-op profiles this study keeps of `device` (default: the device with
        the most), use it for every estimate from now on, and re-estimate every stored plan. Emulator
        profiles are host time: used only with `allow_emulator`, and the label says so. Returns the
        `latency.Calibration`."""
        from .agent.protocol import OpProfile
        from .latency import calibrate, htp_arch

        kept = self.profiles()
        if kept.empty:
            raise MpstudioError("this study keeps no per-op profiles yet: evaluate plans on a device's agent "
                                "(backend htp) first")
        device = device or kept["device"].value_counts().index[0]
        chosen = kept[kept["device"] == device]
        if chosen.empty:
            raise MpstudioError(f"no profiles of {device!r}; this study has profiles of: "
                                f"{', '.join(sorted(kept['device'].unique()))}")
        runs = [(self.quantizer.generate(self.plan(int(row.plan_id))),
                 OpProfile.from_dict(json.loads(Path(row.path).read_text())["profile"]), float(row.total_ms))
                for row in chosen.itertuples()]
        calibration = calibrate(runs, htp_arch(self.htp_arch), allow_emulator=allow_emulator)
        _atomic_write(self.folder / CALIBRATION_FILE, json.dumps(
            {"calibrated_on": calibration.arch.calibrated_on, "scales": dict(calibration.arch.scales),
             "device": device, "plans": calibration.plans}, indent=2) + "\n")
        self._cost_arch = calibration.arch
        for plan_id in self.plans()["plan_id"]:
            latency = self._estimate(self.quantizer.generate(self.plan(int(plan_id))))
            if latency is not None:
                self.store.record_latency(int(plan_id), latency)
        return calibration

    def _keep_profile(self, plan_id: int, measured, profile) -> None:
        folder = self.folder / PROFILES_DIR / _slug(measured.where)
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(folder / f"{plan_id}.json", json.dumps(
            {"plan_id": plan_id, "device": measured.where, "source": measured.source, "total_ms": measured.ms,
             "profile": profile.to_dict()}) + "\n")

    def _count_results(self) -> None:
        _atomic_write(self.folder / RESULTS_FILE, f"{self.store.result_count()}\n")

    def _check_complete(self) -> None:
        """Refuse a store that holds fewer results than were committed to it."""
        path = self.folder / RESULTS_FILE
        try:
            expected = int(path.read_text().strip()) if path.exists() else 0
        except ValueError:
            return  # a damaged count says nothing; the store itself is the truth
        have = self.store.result_count()
        if have < expected:
            raise MpstudioError(
                f"the study store {self.folder / DB_FILE} holds {have} of the {expected} results committed to it: its "
                f"write-ahead log ({DB_FILE}-wal) was probably deleted or not copied with it. Restore that file beside "
                f"it, or delete {RESULTS_FILE} to accept the results that remain")


class _Background:
    """`fn(*args)` run in a thread; `result()` waits for it (and raises what it raised)."""

    def __init__(self, fn, *args):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn, args):
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _metric_parts(metric) -> tuple[MetricSpec, TaskMetric | None]:
    """(what the study stores, the metric this process evaluates with) of a TaskMetric, MetricSpec or None."""
    if isinstance(metric, MetricSpec):
        return metric, None
    if metric is None:
        return MetricSpec(), None
    return getattr(metric, "spec", None) or MetricSpec("python", metric.name, metric.higher_is_better), metric


def _write_study(folder: Path, prepared: PreparedModel, calibration: DataSource, evaluation: DataSource,
                 config: dict, progress: Progress | None) -> None:
    """Write a study's files into `folder`, `study.json` last (its presence marks a complete study)."""
    tmp = folder / f".creating-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        prepared.save(tmp / "model.onnx")
        for i, (what, source) in enumerate((("calibration", calibration), ("evaluation", evaluation))):
            if progress:
                progress(i, 2, f"copying {what} data")
            source.save_npz(tmp / "data" / what)
        for item in tmp.iterdir():
            target = folder / item.name
            if target.is_dir():  # left by a creation that was killed before study.json was written
                shutil.rmtree(target)
            os.replace(item, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for stale in folder.glob(".creating*"):  # other killed creations
        shutil.rmtree(stale, ignore_errors=True)
    _atomic_write(folder / STUDY_FILE, json.dumps(config, indent=2) + "\n")
    if progress:
        progress(2, 2, "study created")


def _read_config(folder: Path) -> dict:
    """`study.json` of `folder`, checked enough that a damaged one gives a message, not a traceback."""
    path = folder / STUDY_FILE
    if not path.exists():
        raise MpstudioError(f"{folder} is not a study folder (no {STUDY_FILE}); create one with "
                            "`mpstudio search MODEL --data DIR --study DIR` or Study.create")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise MpstudioError(f"{path} is not text; the study's description is damaged") from None
    except json.JSONDecodeError as exc:
        raise MpstudioError(f"{path} is not valid JSON ({exc.msg}); the study's description is damaged") from exc
    if not isinstance(config, dict):
        raise MpstudioError(f"{path} must hold a JSON object; the study's description is damaged")
    if config.get("format") != STUDY_FORMAT:
        raise MpstudioError(f"{path} has format {config.get('format')!r}; this mpstudio reads format {STUDY_FORMAT}")
    wrong = [f"{key} ({kind.__name__})" for key, kind in _CONFIG_KEYS.items() if not isinstance(config.get(key), kind)]
    if wrong or not all(isinstance(name, str) for name in config["inputs"]):
        raise MpstudioError(f"{path} lacks or mistypes {', '.join(wrong) or 'inputs (names)'}; the study's "
                            "description is damaged")
    if not (folder / "model.onnx").exists():
        raise MpstudioError(f"{folder} has no model.onnx; the study is incomplete")
    return config


def _default_name(plan: PrecisionPlan, sixteen_bit: int) -> str:
    base = plan.base_name + ("-pc" if plan.per_channel else "")
    n16 = sixteen_bit if plan.activation_type == "uint8" else 0
    return f"{base}+{n16}x16" if n16 else (base if not plan.overrides else f"{base}+{len(plan.overrides)}ov")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80] or "device"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")  # threads and processes write too
    tmp.write_text(text)
    os.replace(tmp, path)


__all__ = ["Study", "Evaluation", "MetricSpec", "pareto_mask", "EVALUATION_COLUMNS", "BACKENDS", "OUTPUT_SNR", "STUDY_FILE",
           "DB_FILE"]
