"""A study on disk: one model, its data and metric, and every evaluated plan with its results.

`Study` is the face: it wires the prepared model and data to the rooms of `mpstudio.loop` (one plan's
evaluation, predictions, the front, the job queue, the float reference, the sensitivity reports, the cost
model and its recalibration, the folder's files) and the results store (`mpstudio.store`). A study killed at
any moment reopens with every finished evaluation intact; `mpstudio.search.resume` runs what it left pending.

Layout::

    study.json  study.sqlite  model.onnx  data/calibration/  data/evaluation/  imported/ (encodings of imported plans)
    cache/ (calibration, generated models)  reference/ (float outputs, the float model's metric)  sensitivity/  exports/
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from .data import DataSource, Progress, TaskMetric
from .errors import MpstudioError
from .loop import comparison
from .loop import front as fronts
from .loop.build_failures import BuildFailed, BuildFailures
from .loop.cost_model import CALIBRATION_FILE, CostModel
from .loop.evaluation import PlanEvaluation, Scoring
from .loop.folder import RESULTS_FILE, STUDY_FILE, STUDY_FORMAT, ResultCount, create_study, open_study
from .loop.front import pareto_mask
from .loop.jobs import JobQueue
from .loop.recalibration import PROFILES_DIR, keep_profile, read_profiles, recalibrate
from .loop.reference import FLOAT_METRIC_FILE, FloatReference
from .loop.runners import Target, runner_for
from .loop.sensitivity_cache import SensitivityCache
from .loop.summary import summary_text
from .metrics import OUTPUT_SNR, MetricSpec
from .model import PreparedModel
from .plan import PrecisionPlan
from .progress_lines import LineProgress
from .quantize import Quantizer
from .runtime import BACKENDS
from .sources import superseded_source
from .store import DB_FILE, EVALUATION_COLUMNS, Evaluation, StudyStore
from .store_builds import BuildRows
from .study_records import StudyRecords


class Study(StudyRecords):
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
        self.result_count = ResultCount(folder, self.store)
        self.result_count.check()
        self.float_reference = FloatReference(folder, self.quantizer, evaluation)
        self.sensitivity_reports = SensitivityCache(folder, self.quantizer, calibration, self.htp_arch)
        self.cost_model = CostModel(folder, self.htp_arch, len(self.cpu_fallback_nodes))

    # ---- creating and opening ----
    @classmethod
    def create(cls, folder: str | Path, model, calibration: DataSource, evaluation: DataSource | None = None,
               metric: TaskMetric | MetricSpec | None = None, *, input_shapes: dict | None = None,
               htp_arch: str = "75", calibration_method: str = "minmax", name: str | None = None,
               calibration_samples: int | None = None, evaluation_samples: int | None = None,
               progress: Progress | None = None, allow_fallback: bool = False, quiet: bool = False) -> "Study":
        """A new study in `folder` (which must not hold one already): prepares the model and copies the data in.

        `model` is a path or a PreparedModel; `evaluation` defaults to `calibration`. `metric` is a metric's name
        as `--metric` takes it ("cosine", "top1", "mypkg.scores:accuracy"; stored, so any process can evaluate it),
        a MetricSpec (`metrics.metric_spec`, for arguments), a TaskMetric (kept for this process; reopen with
        `Study.open(folder, metric=...)`), or None for output SNR and cosine against the float model. Two
        processes creating the same study make one: the second waits and opens it. `calibration_samples` /
        `evaluation_samples` keep the first N samples of each (every plan of a study is scored on the same data).
        A model with nodes QNN HTP cannot run is refused, naming them, unless `allow_fallback`: then HTP runs put
        them on ORT's CPU EP, and every HTP accuracy and latency of the study says "HTP + N nodes on CPU".
        Progress goes to `progress(done, total, message)`, else to stderr as plain lines unless `quiet`.
        """
        folder = Path(folder)
        progress = progress if progress is not None or quiet else LineProgress()
        task_metric = create_study(folder, model, calibration, evaluation, metric, input_shapes=input_shapes,
                                   htp_arch=htp_arch, calibration_method=calibration_method, name=name,
                                   calibration_samples=calibration_samples, evaluation_samples=evaluation_samples,
                                   progress=progress, allow_fallback=allow_fallback)
        return cls.open(folder, metric=task_metric)

    @classmethod
    def open(cls, folder: str | Path, *, metric: TaskMetric | None = None) -> "Study":
        """Reopen a study from its folder: data, metric, every stored result and any pending work."""
        folder = Path(folder)
        return cls(folder, *open_study(folder, metric))

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
        return self.float_reference.metric_value(self.metric_spec, self.task_metric, progress, cancel)

    def stored_float_value(self) -> float | None:
        """The float model's metric when `float_value` has computed it (never computes it)."""
        return self.float_reference.stored_metric_value(self.metric_spec)

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
        name = plan.name or _unique(_default_name(plan, sixteen_bit), set(self.store.plans()["name"]))
        return self.store.add_plan(plan.hash, name, origin, plan.to_json(), sixteen_bit)

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

    def resolve_plan(self, plan: PrecisionPlan | int | str) -> PrecisionPlan:
        """The plan `plan` names: itself, a stored plan's id, name or hash prefix, a baseline, a plan JSON file."""
        from .diverge import resolve_plan

        return resolve_plan(self, plan)

    def plan_id(self, plan: PrecisionPlan) -> int | None:
        return self.store.plan_id(plan.hash)

    def plans(self) -> pd.DataFrame:
        """Columns: plan_id, plan_hash, name, origin, sixteen_bit, created."""
        return self.store.plans()

    # ---- evaluation ----
    def accuracy_source(self, backend: str, runner=None) -> str:
        """Where `backend` runs for `runner`, e.g. "HTP emulator on host"; "... + N nodes on CPU" when this
        study's HTP runs leave nodes to the CPU (allow_fallback)."""
        return self._target(backend, runner_for(runner)).source

    def evaluate(self, plan: PrecisionPlan | int | str, backend: str = "cpu", runner=None, *, origin: str = "user",
                 measure_latency: bool = True, profile: bool | None = None, progress: Progress | None = None,
                 cancel: threading.Event | None = None, partial: Callable | None = None,
                 first_samples: int | None = None, versus: PrecisionPlan | int | None = None) -> Evaluation:
        """Accuracy of `plan` on the evaluation data, with its latency; stored in the study at once.

        `plan` is a PrecisionPlan, or what `mpstudio evaluate --plan` takes: a stored plan's id or name, a baseline
        (a8w8, a16w8, a8w8-pc, a16w8-pc) or a plan JSON file.
        `runner` is None (this process: ORT's CPU QDQ run, or the local HTP backend), an AgentClient or an
        AgentPool (the samples spread over its agents). With an agent on `htp`, one sample's latency is measured
        there too (`measured` on a device, `emulator` on an x86_64 host); the cost model's estimate is always
        stored. A plan already evaluated from the same source is not run again. On a device the run is also
        profiled per op (`profile` None: on a device only; True: on the emulator too), the profile kept and the
        cost model recalibrated on that device's profiles (`recalibrate`).

        With `partial`, the evaluation streams: a seeded random `first_samples` (default
        `preview.FIRST_SAMPLES`) first, then chunks doubling what has run, with a `preview.PartialAccuracy` passed
        to `partial` after each chunk but the last. Only the result on every sample is stored. With `versus` (a
        plan or plan id evaluated on the same source), each partial value carries its paired difference from that
        plan on the same samples (`PartialAccuracy.paired`, a `loop.uncertainty.PairedDifference`).

        A plan the HTP cannot build raises `loop.build_failures.BuildFailed` (an MpstudioError) and is stored as a
        result (`build_failures`); it is not built again until the toolchain changes.
        """
        if backend not in BACKENDS:
            raise MpstudioError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        runs = runner_for(runner)
        plan = self.resolve_plan(plan)
        plan_id = self.add_plan(plan, origin)
        target = self._target(backend, runs)
        found = self.store.evaluation(plan_id, target.source)
        if found is not None:
            return found
        builds = BuildFailures(BuildRows(self.store))
        if backend == "htp" and (known := builds.known(plan_id, target)) is not None:
            raise BuildFailed(known, known=True)
        evaluation = PlanEvaluation(self.quantizer, self.evaluation_data, self.float_reference,
                                    Scoring(self.metric_spec, self.prepared, self.task_metric()), self.cost_model,
                                    self.store, self.result_count, self._profiled)
        with builds.building(plan_id, self.store.plan_row(plan_id)[1], target, lambda: self._failed_build(plan)):
            return evaluation.run(plan, plan_id, target, measure_latency=measure_latency, profile=profile,
                                  progress=progress, cancel=cancel, partial=partial, first_samples=first_samples,
                                  versus=comparison.named_terms(self.store, self._id(versus), target.source))

    def predict(self, plan: PrecisionPlan, report=None, accuracy_source: str | None = None,
                evaluated: pd.DataFrame | None = None):
        """`plan`'s accuracy predicted from the sensitivity report (default: the one this study holds, if the
        analysis ran) and its cost-model latency, before any run: a `preview.PlanPrediction`. `evaluated`: this
        study's evaluations when the caller has them at hand (`evaluations()` or `front("estimate")`)."""
        from .preview import predict_plan

        report = self.sensitivity_reports.latest if report is None else report
        return predict_plan(self, plan, report, accuracy_source, evaluated=evaluated)

    def baselines(self, backend: str = "cpu", runner=None, progress: Progress | None = None,
                  cancel: threading.Event | None = None) -> dict[str, Evaluation]:
        """The all-8-bit (a8w8) and all-16-bit-activation (a16w8) plans, evaluated."""
        return {plan.name: self.evaluate(plan, backend, runner, origin="baseline", progress=progress, cancel=cancel)
                for plan in (PrecisionPlan.a8w8(name="a8w8"), PrecisionPlan.a16w8(name="a16w8"))}

    def estimate(self, plan: PrecisionPlan):
        """The cost model's latency of `plan` (generates its QDQ model; stores the estimate when the plan is stored)."""
        latency = self.cost_model.estimate(self.quantizer.generate(plan))
        plan_id = self.plan_id(plan)
        if plan_id is not None and latency is not None:
            self.store.record_latency(plan_id, latency)
        return latency

    # ---- jobs and searches: pending work that survives a kill (`loop.jobs`) ----
    @property
    def job_queue(self) -> JobQueue:  # made per use: a queue held here would tie the study into a reference cycle
        return JobQueue(self.store, self.add_plan, self.plan, self.evaluate)

    def submit(self, plan: PrecisionPlan, backend: str = "cpu", *, origin: str = "user",
               search_id: int | None = None) -> int:
        """Queue an evaluation of `plan`; `run_pending` (or `mpstudio.search.resume`) runs it. Returns the job id."""
        return self.job_queue.submit(plan, backend, origin=origin, search_id=search_id)

    def jobs(self) -> pd.DataFrame:
        """Columns: job_id, plan_id, backend, status (pending/running/done/failed), search_id, error."""
        return self.job_queue.jobs()

    def run_pending(self, runner=None, *, progress: Progress | None = None, cancel: threading.Event | None = None,
                    on_result: Callable[[Evaluation], None] | None = None) -> list[Evaluation]:
        """Run every pending job, one after another (each result committed as it finishes)."""
        return self.job_queue.run_pending(runner, progress=progress, cancel=cancel, on_result=on_result)

    def run_job(self, job_id: int, runner=None, *, progress: Progress | None = None,
                cancel: threading.Event | None = None, claimed: bool = False) -> Evaluation:
        """Run one queued evaluation; a cancelled job goes back to pending, a failed one records its error."""
        return self.job_queue.run_job(job_id, runner, progress=progress, cancel=cancel, claimed=claimed)

    def start_search(self, spec: dict) -> int:
        """Record a search; an unfinished search with the same spec is continued instead of duplicated."""
        return self.job_queue.start_search(spec)

    def finish_search(self, search_id: int, status: str, result: dict | None) -> None:
        self.job_queue.finish_search(search_id, status, result)

    def searches(self) -> pd.DataFrame:
        """Columns: search_id, spec (dict), status (running/done/cancelled/failed/interrupted), result."""
        return self.job_queue.searches()

    # ---- reading results (`loop.front`, `loop.summary`) ----
    def evaluations(self) -> pd.DataFrame:
        """Every evaluated plan with its accuracy and latency (`store.EVALUATION_COLUMNS`; one row per accuracy
        source and latency source, so a plan measured on a device appears once with its estimate, once measured)."""
        return self.store.evaluations()

    def front(self, latency_source: str = "estimate", accuracy_source: str | None = None) -> pd.DataFrame:
        """The evaluations of `latency_source` and one accuracy source with a `pareto` column: True on the
        accuracy/latency front (`loop.front.front` says which accuracy source by default)."""
        return fronts.front(self.evaluations(), latency_source, accuracy_source, self.higher_is_better,
                            superseded_source)

    def cross_checks(self, latency_source: str = "estimate", front: pd.DataFrame | None = None) -> pd.DataFrame:
        """Plans of `front(latency_source)` (pass it when you have it) another accuracy source scored too, e.g. a
        search's HTP check of CPU front plans (`loop.front.cross_checks`, `loop.front.CROSS_CHECK_COLUMNS`)."""
        front = self.front(latency_source) if front is None else front
        if front.empty:  # nothing to check: the store is not read again
            return pd.DataFrame(columns=fronts.CROSS_CHECK_COLUMNS)
        return fronts.cross_checks(front, self.evaluations(), latency_source, superseded_source)

    def summary(self, latency_source: str = "estimate") -> str:
        """A plain-text table of every evaluation and the front, for `mpstudio study show`."""
        front = self.front(latency_source)
        return summary_text(self.name, self.folder, self.metric_spec, len(self.evaluation_data), self.htp_arch, front,
                            self.cross_checks(latency_source, front), self.stored_float_value() if len(front) else None,
                            latency_source, self.build_failures())

    # ---- the study's caches: sensitivity reports, the float model's outputs ----
    def sensitivity(self, *, samples: int = 32, isolation_samples: int = 8, progress: Progress | None = None,
                    cancel: threading.Event | None = None, exhaustive: bool = False, on_partial=None,
                    workers: int | None = None, plan: PrecisionPlan | None = None, quiet: bool = False):
        """The sensitivity report of `plan` (default all-8-bit) on the calibration data, computed once then loaded:
        each tensor scored and isolated against that plan. Progressive (`sensitivity.analyze_progressive`; partial
        reports reach `on_partial`; `workers` processes, default one per core), or `exhaustive=True`: every tensor
        isolated (`sensitivity.analyze`). Progress goes to `progress(done, total, message)`, else to stderr as plain
        lines unless `quiet` (the analysis can take many minutes on a model of some size)."""
        progress = progress if progress is not None or quiet else LineProgress()
        return self.sensitivity_reports.report(samples=samples, isolation_samples=isolation_samples,
                                               progress=progress, cancel=cancel, exhaustive=exhaustive,
                                               on_partial=on_partial, workers=workers, plan=plan)

    def float_outputs(self, progress: Progress | None = None, cancel=None) -> list[dict[str, np.ndarray]]:
        """The float model's outputs on the evaluation data (computed once, kept in `reference/`)."""
        return self.float_reference.outputs(progress, cancel)

    # ---- the cost model, recalibrated on a device's profiles (`loop.cost_model`, `loop.recalibration`) ----
    @property
    def cost_arch(self):
        """The HtpArch the study's estimates use: the study's architecture, recalibrated on a device when
        `recalibrate` has run (its estimates then say "calibrated on <device>")."""
        return self.cost_model.arch

    def profiles(self) -> pd.DataFrame:
        """Per-op profiles kept from device runs. Columns: plan_id, device, total_ms, path."""
        return read_profiles(self.folder)

    def recalibrate(self, device: str | None = None, *, allow_emulator: bool = False):
        """Refit the cost model to this study's per-op profiles of `device` (default: the one with the most), use it
        from now on and re-estimate every stored plan; returns the `latency.Calibration`. Emulator profiles are host
        time: used only with `allow_emulator`, and the label says so."""
        return recalibrate(self.folder, self.cost_model, self.store,
                           lambda plan_id: self.quantizer.generate(self.plan(plan_id)), device,
                           allow_emulator=allow_emulator)

    # ---- internals ----
    def _target(self, backend: str, runs) -> Target:
        return Target.of(backend, runs, self.htp_arch, len(self.cpu_fallback_nodes))

    def _profiled(self, plan_id: int, measured, profile) -> None:
        """A device run's per-op profile: kept, and the cost model refitted on that device's profiles."""
        keep_profile(self.folder, plan_id, measured, profile)
        self.recalibrate(measured.where, allow_emulator=not measured.is_device_latency)


def _unique(name: str, taken: set) -> str:
    """`name`, or `name#2`, `name#3`... when another plan of the study has it (two different plans that promote
    three tensors each are not both "a8w8+3x16")."""
    if name not in taken:
        return name
    return next(f"{name}#{n}" for n in range(2, len(taken) + 3) if f"{name}#{n}" not in taken)


def _default_name(plan: PrecisionPlan, sixteen_bit: int) -> str:
    base = plan.base_name + ("-pc" if plan.per_channel else "")
    n16 = sixteen_bit if plan.activation_type == "uint8" else 0
    return f"{base}+{n16}x16" if n16 else (base if not plan.overrides else f"{base}+{len(plan.overrides)}ov")


__all__ = ["Study", "Evaluation", "MetricSpec", "pareto_mask", "EVALUATION_COLUMNS", "BACKENDS", "OUTPUT_SNR", "STUDY_FILE",
           "DB_FILE", "RESULTS_FILE", "STUDY_FORMAT", "PROFILES_DIR", "CALIBRATION_FILE", "FLOAT_METRIC_FILE"]
