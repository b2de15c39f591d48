"""A study on disk: one model, its data and metric, and every evaluated plan with its results.

A study folder holds `study.json` (what the study is), `study.sqlite` (plans, accuracy and latency results,
pending jobs and searches; SQLite in WAL mode, each result committed when it is measured), the prepared
model, the data as `.npz` folders, and the quantizer's cache (calibration ranges, generated models). A study
killed at any moment reopens with every finished evaluation intact; `resume()` runs the pending jobs.

Layout::

    study.json  study.sqlite  model.onnx  data/calibration/  data/evaluation/
    cache/ (calibration, generated models)  reference/ (float outputs)  sensitivity/  exports/
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from .data import Cancelled, DataSource, NpzFolder, Progress, TaskMetric, check_feeds
from .errors import MpstudioError
from .model import PreparedModel, prepare_model
from .plan import PrecisionPlan
from .quantize import Quantizer

STUDY_FORMAT = 1
STUDY_FILE = "study.json"
DB_FILE = "study.sqlite"
OUTPUT_SNR = "output SNR (dB)"
BACKENDS = ("cpu", "htp")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id INTEGER PRIMARY KEY, hash TEXT UNIQUE NOT NULL, name TEXT NOT NULL, origin TEXT NOT NULL,
    plan_json TEXT NOT NULL, sixteen_bit INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS accuracy (
    id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL REFERENCES plans(id), backend TEXT NOT NULL,
    source TEXT NOT NULL, metric TEXT NOT NULL, value REAL NOT NULL, higher_is_better INTEGER NOT NULL,
    snr_db REAL, cosine REAL, samples INTEGER NOT NULL, seconds REAL NOT NULL, created REAL NOT NULL,
    UNIQUE (plan_id, source));
CREATE TABLE IF NOT EXISTS latency (
    id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL REFERENCES plans(id), source TEXT NOT NULL,
    place TEXT NOT NULL, ms REAL NOT NULL, detail TEXT NOT NULL, created REAL NOT NULL,
    UNIQUE (plan_id, source, place));
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL REFERENCES plans(id), backend TEXT NOT NULL,
    status TEXT NOT NULL, search_id INTEGER, owner TEXT, error TEXT, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS searches (
    id INTEGER PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL, result TEXT, created REAL NOT NULL,
    updated REAL NOT NULL);
"""

# Columns of `Study.evaluations()`: one row per (plan, accuracy source), with the plan's latencies.
#   plan_id, plan_hash, name, origin, sixteen_bit (activation tensors at 16 bits), backend (cpu/htp),
#   accuracy_source (e.g. "ORT CPU QDQ", "HTP emulator on <host>", "HTP on <device>"), metric, value,
#   higher_is_better, snr_db, cosine (outputs against the float model), samples, seconds,
#   latency_ms, latency_source (estimate/measured/emulator), latency_where, latency_label,
#   plus `estimate_ms` (the cost model, always present when latency.py could read the model).
EVALUATION_COLUMNS = [
    "plan_id", "plan_hash", "name", "origin", "sixteen_bit", "backend", "accuracy_source", "metric", "value",
    "higher_is_better", "snr_db", "cosine", "samples", "seconds", "latency_ms", "latency_source",
    "latency_where", "latency_label", "estimate_ms", "created",
]


# ---- metrics that a study can store and rebuild ----------------------------------------------------------
@dataclass(frozen=True)
class MetricSpec:
    """How a study rebuilds its task metric when reopened: a kind and its arguments (JSON).

    Kinds: "output" (output SNR against the float model, the default), "ctc_cer" (character error rate of
    a CTC text recognizer: `references` and the model's `character` metadata), "python" (a metric given in
    Python; pass it again to `Study.open(metric=...)` to evaluate more plans).
    """

    kind: str = "output"
    name: str = OUTPUT_SNR
    higher_is_better: bool = True
    args: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "higher_is_better": self.higher_is_better, "args": self.args}

    @classmethod
    def from_json(cls, data: dict) -> "MetricSpec":
        return cls(data.get("kind", "output"), data.get("name", OUTPUT_SNR), bool(data.get("higher_is_better", True)),
                   dict(data.get("args") or {}))


def _build_metric(spec: MetricSpec, prepared: PreparedModel) -> TaskMetric | None:
    if spec.kind == "output":
        return None
    if spec.kind == "ctc_cer":
        from .demos.ocr import cer_metric, ctc_charset

        return cer_metric(tuple(spec.args["references"]), ctc_charset(prepared))
    raise MpstudioError(
        f"this study's metric {spec.name!r} was given in Python; open it with Study.open(folder, metric=...) "
        "to evaluate more plans (stored results can be read without it)"
    )


# ---- results --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evaluation:
    """One plan's accuracy from one source, with the latencies known for that plan."""

    plan_id: int
    plan_hash: str
    name: str
    backend: str
    accuracy_source: str
    metric: str
    value: float
    higher_is_better: bool
    snr_db: float | None
    cosine: float | None
    samples: int
    seconds: float
    latencies: tuple = ()  # of latency.Latency
    cached: bool = False  # True when the study already had this result

    def latency(self, source: str = "estimate"):
        return next((lat for lat in self.latencies if lat.source == source), None)

    def describe(self) -> str:
        lat = ", ".join(str(lat) for lat in self.latencies) or "no latency"
        return f"{self.name}: {self.metric} {self.value:.4f} [{self.accuracy_source}]; {lat}"


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


# ---- the study ------------------------------------------------------------------------------------------
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
        self._lock = threading.RLock()
        self._db = _connect(folder / DB_FILE)
        self._references: list[dict[str, np.ndarray]] | None = None
        self._sensitivity = None
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._release_orphaned_jobs()

    # ---- creating and opening ----
    @classmethod
    def create(cls, folder: str | Path, model, calibration: DataSource, evaluation: DataSource | None = None,
               metric: TaskMetric | MetricSpec | None = None, *, input_shapes: dict | None = None,
               htp_arch: str = "75", calibration_method: str = "minmax", name: str | None = None,
               progress: Progress | None = None) -> "Study":
        """A new study in `folder` (which must not hold one already): prepares the model and copies the data in.

        `model` is a path or a PreparedModel; `evaluation` defaults to `calibration`. `metric` is a
        TaskMetric (kept for this process; reopen with `Study.open(folder, metric=...)`), a MetricSpec, or
        None for output SNR and cosine against the float model.
        """
        folder = Path(folder)
        if (folder / STUDY_FILE).exists():
            raise MpstudioError(f"{folder} already holds a study; open it with Study.open (mpstudio study show)")
        prepared = model if isinstance(model, PreparedModel) else prepare_model(model, input_shapes)
        if not prepared.qnn_ready:
            raise MpstudioError(f"the model cannot run fully on QNN HTP:\n{prepared.report()}")
        evaluation = evaluation if evaluation is not None else calibration
        for what, source in (("calibration", calibration), ("evaluation", evaluation)):
            if len(source) == 0:
                raise MpstudioError(f"the {what} data is empty; give at least one sample")
            check_feeds(source, prepared.inputs, limit=1)
        if isinstance(metric, MetricSpec):
            spec, task_metric = metric, None
        elif metric is None:
            spec, task_metric = MetricSpec(), None
        else:
            spec = getattr(metric, "spec", None) or MetricSpec("python", metric.name, metric.higher_is_better)
            task_metric = metric
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / ".creating"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        prepared.save(tmp / "model.onnx")
        total = len(calibration) + len(evaluation)
        for i, (what, source) in enumerate((("calibration", calibration), ("evaluation", evaluation))):
            if progress:
                progress(i, 2, f"copying {what} data")
            source.save_npz(tmp / "data" / what)
        config = {
            "format": STUDY_FORMAT,
            "name": name or Path(prepared.source).stem,
            "model_source": str(prepared.source),
            "model_sha256": prepared.sha256,
            "inputs": [spec_.name for spec_ in prepared.inputs],
            "metric": spec.to_json(),
            "htp_arch": str(htp_arch),
            "calibration_method": calibration_method,
            "samples": {"calibration": len(calibration), "evaluation": len(evaluation), "total": total},
            "created": time.time(),
        }
        for item in tmp.iterdir():
            target = folder / item.name
            if target.is_dir():  # left by a creation that was killed before study.json was written
                shutil.rmtree(target)
            os.replace(item, target)
        tmp.rmdir()
        _atomic_write(folder / STUDY_FILE, json.dumps(config, indent=2) + "\n")
        if progress:
            progress(2, 2, "study created")
        study = cls.open(folder, metric=task_metric)
        return study

    @classmethod
    def open(cls, folder: str | Path, *, metric: TaskMetric | None = None) -> "Study":
        """Reopen a study from its folder: data, metric, every stored result and any pending work."""
        folder = Path(folder)
        path = folder / STUDY_FILE
        if not path.exists():
            raise MpstudioError(f"{folder} is not a study folder (no {STUDY_FILE}); create one with "
                                "`mpstudio search MODEL --data DIR --study DIR` or Study.create")
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise MpstudioError(f"{path} is not valid JSON ({exc.msg}); the study's description is damaged") from exc
        if config.get("format") != STUDY_FORMAT:
            raise MpstudioError(f"{path} has format {config.get('format')!r}; this mpstudio reads format {STUDY_FORMAT}")
        prepared = prepare_model(folder / "model.onnx", optimize=False)
        inputs = config["inputs"]
        calibration = NpzFolder(folder / "data" / "calibration", inputs)
        evaluation = NpzFolder(folder / "data" / "evaluation", inputs)
        spec = MetricSpec.from_json(config["metric"])
        if metric is None and spec.kind != "python":
            metric = _build_metric(spec, prepared)
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
        with self._lock:
            self._db.close()

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
    def metric(self) -> TaskMetric | None:
        return self._metric

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
        with self._lock, self._transaction() as db:
            row = db.execute("SELECT id FROM plans WHERE hash = ?", (plan.hash,)).fetchone()
            if row:
                return int(row[0])
            sixteen_bit = len(plan.sixteen_bit_activations(self.graph))
            name = plan.name or _default_name(plan, sixteen_bit)
            cursor = db.execute(
                "INSERT INTO plans (hash, name, origin, plan_json, sixteen_bit, created) VALUES (?, ?, ?, ?, ?, ?)",
                (plan.hash, name, origin, json.dumps(plan.to_json()), sixteen_bit, time.time()))
            return int(cursor.lastrowid)

    def plan(self, plan_id: int | str) -> PrecisionPlan:
        """A stored plan by id or hash (or a unique hash prefix)."""
        with self._lock:
            if isinstance(plan_id, (int, np.integer)) or str(plan_id).isdigit():
                row = self._db.execute("SELECT plan_json, name FROM plans WHERE id = ?", (int(plan_id),)).fetchone()
            else:
                rows = self._db.execute("SELECT plan_json, name FROM plans WHERE hash LIKE ?",
                                        (f"{plan_id}%",)).fetchall()
                if len(rows) > 1:
                    raise MpstudioError(f"plan hash prefix {plan_id!r} is ambiguous ({len(rows)} plans); give more of it")
                row = rows[0] if rows else None
        if row is None:
            known = ", ".join(str(i) for i in self.plans()["plan_id"].head(20))
            raise MpstudioError(f"this study has no plan {plan_id!r}; its plans are: {known or 'none yet'}")
        plan = PrecisionPlan.from_json(json.loads(row[0]))
        return plan if plan.name else PrecisionPlan.from_json({**plan.to_json(), "name": row[1]})

    def plan_id(self, plan: PrecisionPlan) -> int | None:
        with self._lock:
            row = self._db.execute("SELECT id FROM plans WHERE hash = ?", (plan.hash,)).fetchone()
        return int(row[0]) if row else None

    def plans(self) -> pd.DataFrame:
        """Columns: plan_id, plan_hash, name, origin, sixteen_bit, created."""
        with self._lock:
            return pd.read_sql_query(
                "SELECT id AS plan_id, hash AS plan_hash, name, origin, sixteen_bit, created FROM plans ORDER BY id",
                self._db)

    # ---- evaluation ----
    def accuracy_source(self, backend: str, runner=None) -> str:
        if backend == "cpu":
            return "ORT CPU QDQ"
        if runner is None:
            from .runtime import htp_is_emulated

            return f"HTP emulator on {socket.gethostname()}" if htp_is_emulated() else f"HTP on {socket.gethostname()}"
        info = _runner_info(runner)
        return f"HTP emulator on {info.device}" if info.htp_emulated else f"HTP on {info.device}"

    def evaluate(self, plan: PrecisionPlan, backend: str = "cpu", runner=None, *, origin: str = "user",
                 measure_latency: bool = True, progress: Progress | None = None,
                 cancel: threading.Event | None = None) -> Evaluation:
        """Accuracy of `plan` on the evaluation data, with its latency; stored in the study at once.

        `runner` is None (this process: ORT's CPU QDQ run, or the local HTP backend), an AgentClient or an
        AgentPool (the samples spread over its agents). With an agent on `htp`, the latency of one sample
        is measured there too (`measured` on a device, `emulator` on an x86_64 host). The cost model's
        estimate is always stored. A plan already evaluated from the same source is not run again.
        """
        if backend not in BACKENDS:
            raise MpstudioError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        plan_id = self.add_plan(plan, origin)
        source = self.accuracy_source(backend, runner)
        found = self._evaluation(plan_id, source)
        if found is not None:
            return found
        metric = self._metric
        if metric is None and self.metric_spec.kind != "output":
            _build_metric(self.metric_spec, self.prepared)  # raises: the Python metric must be given again
        started = time.perf_counter()
        path = self.quantizer.generate(plan, progress, cancel)
        outputs = self._run(path, backend, runner, progress, cancel)
        snr, cosine = self._output_agreement(outputs, progress, cancel)
        value = metric(outputs) if metric is not None else snr
        seconds = time.perf_counter() - started
        latencies = []
        if measure_latency:
            latencies.append(self._estimate(path))
            if backend == "htp" and runner is not None:
                latencies.append(self._measure(path, runner))
        with self._lock, self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO accuracy (plan_id, backend, source, metric, value, higher_is_better, snr_db,"
                " cosine, samples, seconds, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (plan_id, backend, source, self.metric_name, float(value), int(self.higher_is_better), snr, cosine,
                 len(self.evaluation_data), seconds, time.time()))
            for lat in latencies:
                if lat is not None:
                    self._store_latency(db, plan_id, lat)
        stored = self._evaluation(plan_id, source)
        assert stored is not None
        return dataclasses.replace(stored, cached=False)

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
            with self._lock, self._transaction() as db:
                self._store_latency(db, plan_id, latency)
        return latency

    # ---- jobs: pending work that survives a kill ----
    def submit(self, plan: PrecisionPlan, backend: str = "cpu", *, origin: str = "user",
               search_id: int | None = None) -> int:
        """Queue an evaluation of `plan`; `run_pending` (or `resume`) runs it. Returns the job id."""
        plan_id = self.add_plan(plan, origin)
        now = time.time()
        with self._lock, self._transaction() as db:
            row = db.execute("SELECT id FROM jobs WHERE plan_id = ? AND backend = ? AND status IN ('pending', 'running')",
                             (plan_id, backend)).fetchone()
            if row:
                return int(row[0])
            return int(db.execute(
                "INSERT INTO jobs (plan_id, backend, status, search_id, created, updated) VALUES (?, ?, 'pending', ?, ?, ?)",
                (plan_id, backend, search_id, now, now)).lastrowid)

    def jobs(self) -> pd.DataFrame:
        """Columns: job_id, plan_id, backend, status (pending/running/done/failed), search_id, error."""
        with self._lock:
            return pd.read_sql_query("SELECT id AS job_id, plan_id, backend, status, search_id, error, created, updated"
                                     " FROM jobs ORDER BY id", self._db)

    def run_pending(self, runner=None, *, progress: Progress | None = None, cancel: threading.Event | None = None,
                    on_result: Callable[[Evaluation], None] | None = None) -> list[Evaluation]:
        """Run every pending job, one after another (each result committed as it finishes)."""
        results = []
        while (job_id := self._claim_job()) is not None:
            evaluation = self.run_job(job_id, runner, progress=progress, cancel=cancel, claimed=True)
            results.append(evaluation)
            if on_result:
                on_result(evaluation)
        return results

    def run_job(self, job_id: int, runner=None, *, progress: Progress | None = None,
                cancel: threading.Event | None = None, claimed: bool = False) -> Evaluation:
        """Run one queued evaluation; a cancelled job goes back to pending, a failed one records its error."""
        if not claimed and not self._claim_job(job_id):
            raise MpstudioError(f"job {job_id} is not pending (another process may be running it)")
        with self._lock:
            plan_id, backend = self._db.execute("SELECT plan_id, backend FROM jobs WHERE id = ?", (job_id,)).fetchone()
        try:
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled before the evaluation started")
            evaluation = self.evaluate(self.plan(plan_id), backend, runner, progress=progress, cancel=cancel)
        except Cancelled:
            self._finish_job(job_id, "pending", None)
            raise
        except BaseException as exc:
            self._finish_job(job_id, "failed", str(exc) or type(exc).__name__)
            raise
        self._finish_job(job_id, "done", None)
        return evaluation

    def resume(self, runner=None, *, progress: Progress | None = None, cancel: threading.Event | None = None):
        """Finish what a killed process left: pending jobs, then unfinished searches."""
        results = self.run_pending(runner, progress=progress, cancel=cancel)
        from .search import resume_searches

        return results, resume_searches(self, runner, progress=progress, cancel=cancel)

    # ---- searches (their spec and state; search.py runs them) ----
    def start_search(self, spec: dict) -> int:
        """Record a search; an unfinished search with the same spec is continued instead of duplicated."""
        text = json.dumps(spec, sort_keys=True)
        now = time.time()
        with self._lock, self._transaction() as db:
            row = db.execute("SELECT id FROM searches WHERE spec = ? AND status != 'done' ORDER BY id DESC LIMIT 1",
                             (text,)).fetchone()
            if row:
                db.execute("UPDATE searches SET status = 'running', updated = ? WHERE id = ?", (now, row[0]))
                return int(row[0])
            return int(db.execute("INSERT INTO searches (spec, status, created, updated) VALUES (?, 'running', ?, ?)",
                                  (text, now, now)).lastrowid)

    def finish_search(self, search_id: int, status: str, result: dict | None) -> None:
        with self._lock, self._transaction() as db:
            db.execute("UPDATE searches SET status = ?, result = ?, updated = ? WHERE id = ?",
                       (status, json.dumps(result) if result is not None else None, time.time(), search_id))

    def searches(self) -> pd.DataFrame:
        """Columns: search_id, spec (dict), status (running/done/cancelled/failed), result (dict or None)."""
        with self._lock:
            frame = pd.read_sql_query("SELECT id AS search_id, spec, status, result, created, updated FROM searches"
                                      " ORDER BY id", self._db)
        frame["spec"] = frame["spec"].map(json.loads)
        frame["result"] = frame["result"].map(lambda r: json.loads(r) if r else None)
        return frame

    # ---- reading results ----
    def evaluations(self) -> pd.DataFrame:
        """Every evaluated plan with its accuracy and latency (EVALUATION_COLUMNS; one row per accuracy source
        and latency source, so a plan measured on a device appears once with its estimate, once measured)."""
        with self._lock:
            frame = pd.read_sql_query(
                """SELECT p.id AS plan_id, p.hash AS plan_hash, p.name, p.origin, p.sixteen_bit, a.backend,
                          a.source AS accuracy_source, a.metric, a.value, a.higher_is_better, a.snr_db, a.cosine,
                          a.samples, a.seconds, l.ms AS latency_ms, l.source AS latency_source,
                          l.place AS latency_where, e.ms AS estimate_ms, a.created
                   FROM accuracy a JOIN plans p ON p.id = a.plan_id
                   LEFT JOIN latency l ON l.plan_id = a.plan_id
                   LEFT JOIN latency e ON e.plan_id = a.plan_id AND e.source = 'estimate'
                   ORDER BY a.created, l.source""", self._db)
        frame["higher_is_better"] = frame["higher_is_better"].astype(bool)
        frame["latency_label"] = [_latency_label(s, w) for s, w in zip(frame["latency_source"], frame["latency_where"])]
        return frame[EVALUATION_COLUMNS]

    def front(self, latency_source: str = "estimate", accuracy_source: str | None = None) -> pd.DataFrame:
        """The evaluations with a `pareto` column: True on the accuracy/latency front of that latency source.

        One accuracy source is used (default: the one with the most plans), so CPU and HTP accuracies are
        never mixed on one front.
        """
        frame = self.evaluations()
        frame = frame[frame["latency_source"] == latency_source]
        if accuracy_source is None and len(frame):
            accuracy_source = frame["accuracy_source"].value_counts().index[0]
        frame = frame[frame["accuracy_source"] == accuracy_source].copy()
        if latency_source == "measured" and frame["latency_where"].nunique() > 1:
            # One device per front: each device's latencies are their own axis.
            frame = frame[frame["latency_where"] == frame["latency_where"].value_counts().index[0]]
        frame["pareto"] = pareto_mask(frame["value"], frame["latency_ms"], self.higher_is_better)
        return frame.sort_values(["latency_ms", "value"]).reset_index(drop=True)

    def summary(self, latency_source: str = "estimate") -> str:
        """A plain-text table of every evaluation and the front, for `mpstudio study show`."""
        lines = [f"study {self.name} ({self.folder})",
                 f"metric: {self.metric_name} ({'higher' if self.higher_is_better else 'lower'} is better); "
                 f"evaluation samples: {len(self.evaluation_data)}; target HTP v{self.htp_arch}"]
        frame = self.front(latency_source)
        if frame.empty:
            lines.append(f"no evaluations with {latency_source} latency yet")
            return "\n".join(lines)
        lines.append(f"accuracy from {frame['accuracy_source'].iloc[0]}; latency: {frame['latency_label'].iloc[0]}")
        show = frame[["plan_id", "name", "origin", "sixteen_bit", "value", "latency_ms", "pareto"]].copy()
        show["pareto"] = show["pareto"].map({True: "*", False: ""})
        show = show.rename(columns={"value": self.metric_name, "latency_ms": "latency (ms)", "pareto": "front",
                                    "sixteen_bit": "16-bit"})
        lines.append(show.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        lines.append(f"{int(frame['pareto'].sum())} plan(s) on the front; * marks them")
        return "\n".join(lines)

    # ---- sensitivity, cached in the study ----
    def sensitivity(self, *, samples: int = 32, isolation_samples: int = 8, progress: Progress | None = None,
                    cancel: threading.Event | None = None):
        """The sensitivity report of the all-8-bit plan on the calibration data (computed once, then loaded)."""
        from .sensitivity import SensitivityReport, analyze

        folder = self.folder / "sensitivity" / f"a8w8-{samples}-{isolation_samples}"
        if self._sensitivity is not None and self._sensitivity[0] == folder:
            return self._sensitivity[1]
        if (folder / "ranking.csv").exists():
            report = SensitivityReport.load(folder)
        else:
            data = self.calibration.head(samples)
            report = analyze(self.quantizer, data, isolation_samples=isolation_samples, progress=progress,
                             cancel=cancel)
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

            outputs = run_outputs(self.quantizer.float_path, self.evaluation_data, "cpu", None, progress, cancel)
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for i, out in enumerate(outputs):
                np.savez(folder / f"{i:06d}.npz", **out)
            marker.write_text(str(len(outputs)))
        self._references = [dict(np.load(p, allow_pickle=False)) for p in sorted(folder.glob("*.npz"))]
        return self._references

    # ---- internals ----
    def _run(self, path: Path, backend: str, runner, progress, cancel) -> list[dict[str, np.ndarray]]:
        if runner is None:
            from .evaluate import run_outputs

            options = {"htp_arch": self.htp_arch} if backend == "htp" else None
            return run_outputs(path, self.evaluation_data, backend, options, progress, cancel)
        feeds = list(self.evaluation_data.feeds())
        options = {"htp_arch": self.htp_arch} if backend == "htp" else {}
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled before the run started")
        if progress:
            progress(0, len(feeds), f"running {path.stem[:8]} on {backend} over the agent")
        if hasattr(runner, "map"):
            results = runner.map(path, feeds, backend=backend, provider_options=options)
        else:
            results = []
            for i, feed in enumerate(feeds):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"cancelled after {i} of {len(feeds)} samples")
                results.append(runner.run(path, feed, backend=backend, provider_options=options))
                if progress:
                    progress(i + 1, len(feeds), f"running {path.stem[:8]} on {backend} over the agent")
        return [dict(r.outputs) for r in results]

    def _output_agreement(self, outputs, progress, cancel) -> tuple[float, float]:
        """SNR (dB) and cosine of all outputs against the float model's, over the evaluation data.

        Sums are over float64 copies: a study's score is computed once per plan, so exactness wins over the
        float32 streaming the sensitivity engine needs for every tensor.
        """
        signal = noise = dot = test = 0.0
        for ref, out in zip(self.float_outputs(progress, cancel), outputs):
            for name, r in ref.items():
                r = r.astype(np.float64).ravel()
                o = np.asarray(out[name], dtype=np.float64).ravel()
                signal += float(r @ r)
                noise += float((o - r) @ (o - r))
                dot += float(r @ o)
                test += float(o @ o)
        snr = 10 * np.log10(signal / noise) if noise > 0 else float("inf")
        cosine = dot / np.sqrt(signal * test) if signal > 0 and test > 0 else float("nan")
        return float(min(snr, 200.0)), float(cosine)

    def _estimate(self, path: Path):
        from .latency import estimate_latency

        try:
            return estimate_latency(path, htp_arch=self.htp_arch).latency
        except MpstudioError:
            return None  # the cost model cannot read this model; the accuracy still counts

    def _measure(self, path: Path, runner):
        from .latency import Latency

        feed = self.evaluation_data.sample(0)
        options = {"htp_arch": self.htp_arch}
        result = runner.run(path, feed, backend="htp", provider_options=options, warmup=2, iterations=10,
                            outputs=False)
        return Latency.from_stats(result.latency) if result.latency is not None else None

    def _store_latency(self, db, plan_id: int, latency) -> None:
        db.execute("INSERT OR REPLACE INTO latency (plan_id, source, place, ms, detail, created) VALUES (?, ?, ?, ?, ?, ?)",
                   (plan_id, latency.source, latency.where, float(latency.ms), latency.detail, time.time()))

    def _evaluation(self, plan_id: int, source: str) -> Evaluation | None:
        from .latency import Latency

        with self._lock:
            row = self._db.execute(
                "SELECT p.hash, p.name, a.backend, a.source, a.metric, a.value, a.higher_is_better, a.snr_db, a.cosine,"
                " a.samples, a.seconds FROM accuracy a JOIN plans p ON p.id = a.plan_id WHERE a.plan_id = ? AND"
                " a.source = ?", (plan_id, source)).fetchone()
            if row is None:
                return None
            lats = self._db.execute("SELECT ms, source, place, detail FROM latency WHERE plan_id = ? ORDER BY source",
                                    (plan_id,)).fetchall()
        latencies = tuple(Latency(ms=ms, source=src, where=place, detail=detail) for ms, src, place, detail in lats)
        return Evaluation(plan_id, row[0], row[1], row[2], row[3], row[4], float(row[5]), bool(row[6]), row[7], row[8],
                          int(row[9]), float(row[10]), latencies, cached=True)

    def _claim_job(self, job_id: int | None = None):
        """Mark a pending job running (the oldest one, or `job_id`); its id, or None when there is none."""
        with self._lock, self._transaction() as db:
            if job_id is None:
                row = db.execute("SELECT id FROM jobs WHERE status = 'pending' ORDER BY id LIMIT 1").fetchone()
            else:
                row = db.execute("SELECT id FROM jobs WHERE id = ? AND status = 'pending'", (job_id,)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE jobs SET status = 'running', owner = ?, updated = ? WHERE id = ?",
                       (self.owner, time.time(), row[0]))
            return int(row[0])

    def _finish_job(self, job_id: int, status: str, error: str | None) -> None:
        with self._lock, self._transaction() as db:
            db.execute("UPDATE jobs SET status = ?, error = ?, owner = NULL, updated = ? WHERE id = ?",
                       (status, error, time.time(), job_id))

    def _release_orphaned_jobs(self) -> None:
        """Jobs left `running` by a process that no longer exists go back to `pending`."""
        with self._lock, self._transaction() as db:
            rows = db.execute("SELECT id, owner FROM jobs WHERE status = 'running'").fetchall()
            host = socket.gethostname()
            for job_id, owner in rows:
                owner_host, _, pid = (owner or "").rpartition(":")
                if owner_host == host and pid.isdigit() and _alive(int(pid)) and int(pid) != os.getpid():
                    continue
                db.execute("UPDATE jobs SET status = 'pending', owner = NULL, updated = ? WHERE id = ?",
                           (time.time(), job_id))
            db.execute("UPDATE searches SET status = 'interrupted' WHERE status = 'running'")

    @contextmanager
    def _transaction(self):
        try:
            with self._db:  # commits on success, rolls back on error
                yield self._db
        except sqlite3.DatabaseError as exc:
            raise MpstudioError(f"the study store {self.folder / DB_FILE} failed: {exc}") from exc


def _connect(path: Path) -> sqlite3.Connection:
    try:
        db = sqlite3.connect(path, timeout=30.0, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a commit survives a killed process
        db.execute("PRAGMA foreign_keys=ON")
        db.executescript(_SCHEMA)
        return db
    except sqlite3.DatabaseError as exc:
        raise MpstudioError(f"{path} is not a readable study store ({exc}); move it aside to start the study "
                            "afresh") from exc


def _runner_info(runner):
    agents = getattr(runner, "agents", None)
    agent = agents[0] if agents else runner
    return agent.info()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _latency_label(source, where) -> str:
    if source is None or (isinstance(source, float) and np.isnan(source)):
        return ""
    from .latency import Latency

    return Latency(ms=0.0, source=source, where=where).label


def _default_name(plan: PrecisionPlan, sixteen_bit: int) -> str:
    base = plan.base_name + ("-pc" if plan.per_channel else "")
    n16 = sixteen_bit if plan.activation_type == "uint8" else 0
    return f"{base}+{n16}x16" if n16 else (base if not plan.overrides else f"{base}+{len(plan.overrides)}ov")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


__all__ = ["Study", "Evaluation", "MetricSpec", "pareto_mask", "EVALUATION_COLUMNS", "BACKENDS", "OUTPUT_SNR"]
