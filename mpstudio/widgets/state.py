"""StudioState: the one state object of a studio session (study, plan, selection, jobs, results), shared by
every view. Views render it and call its actions. Work runs in worker threads, one lane each: opening a model or
study never waits behind a long analysis, search or evaluation."""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import panel as pn
import param

from ..cache import cache_root
from ..data import Cancelled, NpzFolder
from ..errors import MpstudioError, brief
from ..graph import ModelGraph
from ..layout import GraphLayout, collapsible_namespaces, layout_graph
from ..model import parse_shape_args
from ..plan import PrecisionPlan
from ..preview import FIRST_SAMPLES, basis_ready, promotion_basis
from ..sensitivity import SensitivityReport
from ..sources import LATENCY_SOURCES
from ..study import Study

log = logging.getLogger(__name__)
_CREATING = threading.Lock()  # studies are created one at a time in this process

# What the graph can be coloured by: label -> column of StudioState.tensors. Each has a direction: for
# "low" scores low values need attention (drawn red), for "high" scores high values do.
SCORES = {"SNR (dB)": "snr_db", "cosine": "cosine", "isolation gain": "isolation_gain",
          "latency share": "latency_share", "rank": "rank", "HTP vs CPU (steps)": "divergence"}
SCORE_ATTENTION = {"snr_db": "low", "cosine": "low", "isolation_gain": "high", "latency_share": "high", "rank": "low",
                   "divergence": "high"}
RUNNERS = {"this process": "local", "local agent": "agent", "remote agent": "remote"}
# Lanes of work, one worker thread each: opening studies; long work on the open study (analysis, search); the
# user's evaluations; quick work (predictions, latency estimates); and background work (the baselines), which
# starts only while no evaluation of the user's runs.
_LANES = ("open", "long", "evaluate", "quick", "background")
_LANE_OF = {"open": "open", "evaluate": "evaluate", "predict": "quick", "latency": "quick", "baselines": "background"}

# Columns of StudioState.provisional (points drawn before a plan's full evaluation is stored):
#   plan_hash, name, kind ("predicted": isolation scores and the cost model; "partial": measured on some of the
#   evaluation samples), value, low, high (the interval of a partial value; NaN for a prediction), latency_ms
#   (the cost model's estimate), samples, total, accuracy_source, detail (what the point is, for the hover).
PROVISIONAL_COLUMNS = ["plan_hash", "name", "kind", "value", "low", "high", "latency_ms", "samples", "total",
                       "accuracy_source", "detail"]

# Columns of StudioState.tensors (one row per activation tensor, in topological order):
#   tensor, node (its producer; "" for a graph input), op, namespace, kind, bits (8 or 16 in the current plan),
#   rank, snr_db, cosine, local_snr_8, local_snr_16, isolation_gain (NaN until the sensitivity analysis ran),
#   latency_share (share of the estimated latency of the current plan spent in its producer; NaN if unknown),
#   divergence (RMS of HTP - CPU in quantization steps for the current plan, from mpstudio.diverge; NaN if unknown).
TENSOR_COLUMNS = ["tensor", "node", "op", "namespace", "kind", "bits", "rank", "snr_db", "cosine", "local_snr_8",
                  "local_snr_16", "isolation_gain", "latency_share", "divergence"]
_SCORE_COLUMNS = ["rank", "snr_db", "cosine", "local_snr_8", "local_snr_16", "isolation_gain"]


def session_document():
    """The document of the `panel serve` session running this code, or None (notebook, script, tests).

    Only the document Panel sets for the running session counts: `pn.state.curdoc` falls back to Bokeh's
    process-wide current document, which a server run in a thread of the same process leaves behind.
    """
    from panel.io.state import state

    current = getattr(state, "_curdoc", None)
    doc = current.get() if current is not None else pn.state.curdoc
    return doc if doc is not None and doc.session_context is not None else None


class Job(param.Parameterized):
    """One piece of long work: its progress, its outcome, and a cancel event the core checks."""

    kind = param.String(constant=True)
    title = param.String(constant=True)
    status = param.Selector(objects=["queued", "running", "done", "failed", "cancelled"], default="queued",
                            constant=True)
    done = param.Integer(0, constant=True)
    total = param.Integer(0, constant=True, doc="0 while the amount of work is unknown")
    message = param.String("", constant=True)
    error = param.String("", constant=True)
    seconds = param.Number(0.0, constant=True)
    eta = param.Number(None, allow_None=True, constant=True, doc="Seconds left in the current step, if known")

    def __init__(self, **params):
        super().__init__(**params)
        self.cancel_event = threading.Event()
        self.finished = threading.Event()
        self.result = None
        self.edit = ""  # the plan hash of an evaluation a promote/demote started (the next edit supersedes it)
        self._started = time.perf_counter()

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")

    @property
    def percent(self) -> int:
        """0-100, or -1 (indeterminate) while the total is unknown."""
        return int(100 * self.done / self.total) if self.total else (-1 if self.status == "running" else 0)

    def cancel(self) -> None:
        self.cancel_event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has finished and its result is applied to the state (tests, scripts)."""
        return self.finished.wait(timeout)

    def _set(self, **values) -> None:
        with param.edit_constant(self):
            self.param.update(**values)


class StudioState(param.Parameterized):
    """The study and what the user is doing with it: the current plan, the selection, jobs and results."""

    # ---- what the user chooses ----
    selection = param.List(default=[], item_type=str, doc="Selected activation tensors (graph and table)")
    color_by = param.Selector(objects=SCORES, default="snr_db", doc="Score the graph is coloured by")
    collapsed = param.ListSelector(default=[], objects=[], doc="Namespaces drawn as one node")
    query = param.String("", doc="Find tensors and nodes by name")
    backend = param.Selector(objects=["cpu", "htp"], default="cpu", doc="Where plans are evaluated")
    runner = param.Selector(objects=RUNNERS, default="local", doc="Who runs the evaluations")
    agent_url = param.String("", doc="URL of a remote agent (mpstudio agent serve)")
    agent_token = param.String("", doc="Token of the remote agent")
    target = param.String("a16w8+10%", doc="Search target: a metric value, or a baseline with a margin")
    latency_source = param.Selector(objects=list(LATENCY_SOURCES), default="estimate",
                                    doc="Which latency the Pareto plot uses")
    model_path = param.String("", doc="An ONNX model file to open")
    data_path = param.String("", doc="A folder of .npz samples (keys: the model's input names)")
    input_shapes = param.String("", doc="Static shapes for dynamic inputs, such as x=1,3,224,224")
    allow_fallback = param.Boolean(False, doc="Open a model whose nodes QNN HTP lacks anyway: HTP evaluations run "
                                              "those nodes on ORT's CPU EP and every number says so")
    study_path = param.String("", doc="A study folder to open")

    # ---- what the studio shows (read-only; set by actions) ----
    study = param.ClassSelector(class_=Study, allow_None=True, constant=True)
    plan = param.ClassSelector(class_=PrecisionPlan, default=PrecisionPlan.a8w8(), constant=True, instantiate=False)
    plan_id = param.Integer(None, allow_None=True, constant=True, doc="The current plan's id in the study, if stored")
    report = param.ClassSelector(class_=SensitivityReport, allow_None=True, constant=True)
    layout = param.ClassSelector(class_=GraphLayout, allow_None=True, constant=True)
    tensors = param.DataFrame(default=pd.DataFrame(columns=TENSOR_COLUMNS), constant=True)
    evaluations = param.DataFrame(default=pd.DataFrame(), constant=True,
                                  doc="study.front(latency_source): every evaluation with a `pareto` column")
    cross_checks = param.DataFrame(default=pd.DataFrame(), constant=True,
                                   doc="study.cross_checks(latency_source): plans of that front another accuracy "
                                       "source scored too (a search's HTP confirmation)")
    focus = param.String("", constant=True, doc="A tensor the graph should scroll to")
    divergence = param.DataFrame(default=None, allow_None=True, constant=True, precedence=-1,
                                 doc="The current plan's divergence table (mpstudio.diverge.COLUMNS)")
    jobs = param.List(default=[], item_type=Job, constant=True)
    message = param.String("", constant=True)
    error = param.String("", constant=True)
    latency_ops = param.DataFrame(default=None, allow_None=True, constant=True, precedence=-1)
    evaluate_on_edit = param.Boolean(True, doc="Evaluate each plan promote or demote makes, showing its predicted "
                                               "point at once and its measured point as the evaluation streams")
    confirm_search = param.Boolean(True, doc="A search on the CPU confirms its front on the HTP (the emulator or the "
                                             "agent's device) and recommends on the HTP's numbers")
    first_samples = param.Integer(FIRST_SAMPLES, bounds=(1, None), precedence=-1,
                                  doc="Samples of a streamed evaluation's first value")
    provisional = param.DataFrame(default=pd.DataFrame(columns=PROVISIONAL_COLUMNS), constant=True,
                                  doc="Predicted and partially measured points (PROVISIONAL_COLUMNS)")

    def __init__(self, study: Study | None = None, *, study_folder: str | Path | None = None,
                 auto_analyze: bool = True, **params):
        super().__init__(**params)
        self.study_folder = Path(study_folder) if study_folder else None
        self.auto_analyze = auto_analyze
        self._doc = session_document()
        # One queue and worker thread per lane, so opening a model (and its errors) never waits behind an
        # analysis or a search: "open" for opening studies, "long" for work on the open study.
        self._queues: dict[str, queue.Queue] = {lane: queue.Queue() for lane in _LANES}
        self._idle = {lane: threading.Event() for lane in _LANES}  # set while the lane's worker waits for work
        for event in self._idle.values():
            event.set()
        self._workers: dict[str, threading.Thread] = {}
        self._agent = None  # LocalAgent, started on first use
        self._remote = None
        self._lock = threading.RLock()
        self._posted: list[Callable[[], None]] = []  # updates waiting for the session's event loop, in order
        self._provisional_plans: set[str] = set()  # plans whose provisional points may still be drawn
        self._draining = False
        self.param.watch(self._on_collapsed, "collapsed")
        self.param.watch(self._on_latency_source, "latency_source")
        self.param.watch(self._on_query, "query")
        self.param.watch(self._on_color_by, "color_by")
        if study is not None:
            self.set_study(study)

    # ---- opening ----------------------------------------------------------------------------------------
    @classmethod
    def from_arguments(cls, study: str | None = None, model: str | None = None, data: str | None = None,
                       shapes: str = "", **params) -> "StudioState":
        """The state of `panel serve app.py --args ...`: a study folder, a model + data, or the demo."""
        state = cls(study_folder=study if (study and model) else None, **params)

        def start():
            if model or data:
                if not (model and data):
                    state.show_error("give both --model and --data (a folder of .npz samples), or --study, or "
                                     "nothing for the demo")
                else:
                    state.open_model(model, data, shapes)
            elif study:
                state.open_study(study)
            else:
                state.open_demo()

        if session_document() is not None:
            pn.state.onload(start)  # once the page is up: its progress bar then shows the opening
        else:
            start()
        return state

    def set_study(self, study: Study) -> None:
        """Show `study`: its graph, its stored results, the all-8-bit plan; then its sensitivity (a job)."""
        if self.study is not None and study is not self.study:
            for job in self.jobs:  # work on the previous study has nothing left to show
                if job.active and job.kind != "open":
                    job.cancel()
        graph = study.graph
        layout = self._layout(graph, [], study.prepared.sha256)
        self.param.collapsed.objects = collapsible_namespaces(graph)
        with param.edit_constant(self):
            self.param.update(study=study, layout=layout, plan=PrecisionPlan.a8w8(), plan_id=study.plan_id(
                PrecisionPlan.a8w8()), report=None, latency_ops=None, focus="", error="",
                message=f"opened {study.name}")
            self.param.update(selection=[], collapsed=[], query="", provisional=self.param.provisional.default)
        self._refresh_tensors()
        self.refresh_evaluations()
        if self.auto_analyze:
            self.evaluate_baselines()  # in the background lane, while the analysis runs in its own
            self._submit("predict", "preparing predictions", lambda progress, cancel: promotion_basis(study))
            self.analyze()

    def open_study(self, folder: str | Path | None = None) -> Job:
        folder = Path(str(folder or self.study_path).strip()).expanduser()
        return self._submit("open", f"opening the study in {folder}", lambda progress, cancel: Study.open(folder),
                            self.set_study)

    def open_demo(self) -> Job:
        def work(progress, cancel):
            with _CREATING:  # two sessions opening the demo at once must not both create it
                return Study.demo(self.study_folder, progress=progress)
        return self._submit("open", "opening the demo (PP-OCRv4 text-line recognizer)", work, self.set_study)

    def open_model(self, model: str | Path | None = None, data: str | Path | None = None,
                   shapes: str | None = None, allow_fallback: bool | None = None) -> Job:
        """A new study of `model` calibrated and evaluated on the `.npz` samples in `data` (or the study
        already made from the same files). Arguments default to the model_path, data_path, input_shapes and
        allow_fallback parameters."""
        model = model or self.model_path
        data = data or self.data_path
        shapes = self.input_shapes if shapes is None else shapes
        fallback = self.allow_fallback if allow_fallback is None else allow_fallback

        def work(progress, cancel):
            if not str(model).strip() or not str(data).strip():
                raise MpstudioError("give a model file (.onnx) and a data folder of .npz samples")
            model_path, data_path = Path(str(model).strip()).expanduser(), Path(str(data).strip()).expanduser()
            if not model_path.is_file():
                raise MpstudioError(f"model file not found: {model_path}")
            input_shapes = parse_shape_args(shapes.split()) if shapes.strip() else None
            digest = hashlib.sha256(model_path.read_bytes())
            digest.update(str(data_path.resolve()).encode())
            suffix = "-fallback" if fallback else ""  # a study with CPU fallback is another study
            folder = self.study_folder or cache_root() / "studies" / f"{model_path.stem}-{digest.hexdigest()[:12]}{suffix}"
            with _CREATING:
                if (folder / "study.json").exists():
                    return Study.open(folder)
                from ..model import prepare_model

                prepared = prepare_model(model_path, input_shapes)
                if not prepared.qnn_ready and not fallback:
                    raise MpstudioError(prepared.fallback_refusal() + " In the studio: tick \"Allow CPU fallback\" "
                                        "and open the model again.")
                calibration = NpzFolder(data_path, [spec.name for spec in prepared.inputs])
                return Study.create(folder, prepared, calibration, progress=progress, allow_fallback=fallback)
        return self._submit("open", f"opening {Path(str(model)).name}", work, self.set_study)

    # ---- selection and plan ---------------------------------------------------------------------------
    def select(self, tensors) -> None:
        """Select activation tensors (unknown or non-activation names are ignored)."""
        known = self._activation_set()
        chosen = [t for t in dict.fromkeys(tensors) if t in known]
        if chosen != self.selection:
            self.selection = chosen

    def find(self, text: str) -> list[str]:
        """Select the tensors whose name, or whose producer's name, contains `text` (case-insensitive)."""
        text = text.strip().lower()
        frame = self.tensors
        if not text or frame.empty:
            return []
        hits = frame[frame["tensor"].str.lower().str.contains(text, regex=False)
                     | frame["node"].str.lower().str.contains(text, regex=False)]["tensor"].tolist()
        self.select(hits)
        with param.edit_constant(self):
            self.param.update(focus=hits[0] if hits else "",
                              message=f"{len(hits)} tensor(s) match {text!r}" if hits else f"nothing matches {text!r}")
        return hits

    def promote_selected(self) -> PrecisionPlan:
        """The current plan with the selected activation tensors at 16 bits."""
        return self._edit_plan(self.selection, "uint16")

    def demote_selected(self) -> PrecisionPlan:
        """The current plan with the selected activation tensors back at the plan's default (or 8 bits)."""
        return self._edit_plan(self.selection, "uint8")

    def set_plan(self, plan: PrecisionPlan) -> None:
        if self.study is not None:
            plan.validate(self.study.graph, self.study.htp_arch)
        plan_id = self.study.plan_id(plan) if self.study is not None else None
        with param.edit_constant(self):
            self.param.update(plan=plan, plan_id=plan_id, latency_ops=None, divergence=None)  # the old plan's
        self._refresh_tensors()
        if self.color_by == "latency_share" and self.study is not None:
            self.estimate_latency()
        if self.color_by == "divergence" and self.study is not None:
            self.find_divergence()

    def load_plan(self, plan_id: int) -> PrecisionPlan:
        """Make a stored plan the current one (a click on the Pareto plot)."""
        plan = self._require_study().plan(int(plan_id))
        self.set_plan(plan)
        with param.edit_constant(self):
            self.param.update(message=f"loaded plan {plan_id}: {plan.summary()}", error="")
        return plan

    def sixteen_bit(self) -> list[str]:
        """Activation tensors at 16 bits in the current plan."""
        frame = self.tensors
        return frame.loc[frame["bits"] == 16, "tensor"].tolist() if len(frame) else []

    def collapse(self, namespace: str) -> None:
        if namespace not in self.collapsed:
            self.collapsed = [*self.collapsed, namespace]

    def expand(self, namespace: str | None = None) -> None:
        """Expand one namespace, or all of them."""
        self.collapsed = [] if namespace is None else [n for n in self.collapsed if n != namespace]

    # ---- long work --------------------------------------------------------------------------------------
    def analyze(self) -> Job:
        """The sensitivity analysis of the all-8-bit plan (read back from the study when it was done before)."""
        study = self._require_study()
        shown = [0.0, ""]

        def partial(report: SensitivityReport) -> None:
            # Partial rankings reach the table as they come (at most one a second, and each new stage).
            now, stage = time.perf_counter(), report.meta.get("stage", "")
            if now - shown[0] >= 1.0 or stage != shown[1]:
                shown[:] = [now, stage]
                self._post(lambda: self._on_report(report) if self.study is study else None)

        return self._submit("analyze", "sensitivity analysis",
                            lambda progress, cancel: study.sensitivity(progress=progress, cancel=cancel,
                                                                       on_partial=partial),
                            self._on_report)

    def evaluate_plan(self, plan: PrecisionPlan | None = None, *, streamed: bool = True, edit: bool = False,
                      after: Job | None = None) -> Job:
        """Evaluate the current plan (accuracy and latency) on the chosen backend and runner.

        Streamed: a first value on a few samples, with its interval, reaches the Pareto plot within seconds,
        then values on more samples, until the full result is stored. `edit` marks an evaluation started by a
        promote or demote: the next edit cancels it when it has not finished. The baselines of the backend are
        queued in the background when the study lacks them (they never run before this evaluation). `after`:
        a job (the plan's prediction) whose result is shown before any measured value.
        """
        study = self._require_study()
        plan = plan or self.plan
        backend = self.backend
        if edit:
            for job in self.jobs:  # the plan it evaluates is no longer the one being edited
                if job.active and job.edit:
                    job.cancel()
                    if job.edit != plan.hash:
                        self._drop_provisional(job.edit)  # it may never start, and never clear its point

        def shown(point):
            def apply():
                if self.study is study and self._tracked(plan.hash):
                    self._set_provisional(plan.hash, plan_name, "partial", point.value, point.low, point.high,
                                          point.latency.ms if point.latency is not None else np.nan, point.samples,
                                          point.total, point.accuracy_source,
                                          f"measured on {point.samples} of {point.total} samples; interval "
                                          f"{point.low:.4f}-{point.high:.4f}")
            self._post(apply)

        def work(progress, cancel):
            if after is not None:
                after.wait(5.0)  # quick: its predicted point shows before any measured one
            runner = self._runner()
            try:
                evaluation = study.evaluate(plan, backend, runner, progress=progress, cancel=cancel,
                                            partial=shown if streamed else None, first_samples=self.first_samples)
            except BaseException:
                def drop():  # unless a newer evaluation of the same plan draws it now
                    if not any(other.active and other.edit == plan.hash and other is not job for other in self.jobs):
                        self._drop_provisional(plan.hash)
                self._post(drop)
                raise
            if not self._has_baselines(study, backend, runner):
                self._post(lambda: self.evaluate_baselines(backend))
            return evaluation

        def done(evaluation):
            self._drop_provisional(plan.hash)
            if evaluation.plan_hash == self.plan.hash:
                with param.edit_constant(self):
                    self.plan_id = evaluation.plan_id
            self.refresh_evaluations()
            with param.edit_constant(self):
                self.message = evaluation.describe()
        plan_name = plan.name or plan.summary()
        self._track(plan.hash)
        job = self._submit("evaluate", f"evaluating {plan_name} on {backend}", work, done)
        job.edit = plan.hash if edit else ""
        return job

    def preview_plan(self, plan: PrecisionPlan | None = None) -> tuple[Job | None, Job | None]:
        """Draw `plan` (default the current one) on the Pareto plot at once, as predicted by the sensitivity
        report and the cost model, and start its streamed evaluation, which replaces the prediction with
        measured values. Returns (the prediction's job, None when it was made at once; the evaluation's job,
        None in a served session, where it is submitted in the next update)."""
        study = self._require_study()
        plan = plan or self.plan
        report = self.report
        frame = self.evaluations
        accuracy_source = frame["accuracy_source"].iloc[0] if len(frame) else None
        plan_name = plan.name or plan.summary()

        # The plotted estimate-axis front has every column a prediction reads: no need to read the store.
        evaluated = frame if self.latency_source == "estimate" and len(frame) else None

        def work(progress, cancel):
            return study.predict(plan, report, accuracy_source, evaluated)

        def done(prediction):
            if not prediction.placed:
                with param.edit_constant(self):
                    self.message = prediction.describe()
                return
            known = self.provisional
            if not self._tracked(plan.hash) or (known["plan_hash"] == plan.hash).any():
                return  # measured already (or its evaluation ended): a prediction has nothing to add
            self._set_provisional(plan.hash, plan_name, "predicted", prediction.value, np.nan, np.nan,
                                  prediction.latency.ms, 0, len(study.evaluation_data), "prediction",
                                  prediction.basis)
        self._track(plan.hash)
        if basis_ready(study):  # milliseconds: drawn in this very update
            done(work(None, None))
            predicting = None
        else:
            predicting = self._submit("predict", f"predicting {plan_name}", work, done)
        # Served, the evaluation (and its job's rows) start in the next update, so that this one, with the
        # predicted point, reaches the browser first.
        evaluating: list[Job] = []
        self._post(lambda: evaluating.append(self.evaluate_plan(plan, edit=True, after=predicting)))
        return predicting, (evaluating[0] if evaluating else None)

    def evaluate_baselines(self, backend: str | None = None) -> Job:
        """The all-8-bit and all-16-bit-activation plans, evaluated in the background (once per study and
        backend; a job of the user's evaluation lane always goes first)."""
        study = self._require_study()
        backend = backend or self.backend

        def work(progress, cancel):
            runner = self._runner()
            return study.baselines(backend, runner, progress=progress, cancel=cancel)

        def done(result):
            self.refresh_evaluations()
        return self._submit("baselines", f"evaluating the baselines (a8w8, a16w8) on {backend}", work, done)

    def estimate_latency(self) -> Job:
        """The HTP cost model's per-op latency of the current plan (for colouring by latency share)."""
        from ..latency import estimate_latency

        study = self._require_study()
        plan = self.plan

        def work(progress, cancel):
            return estimate_latency(study.quantizer.generate(plan, progress, cancel), study.htp_arch)

        def done(estimate):
            if plan.hash != self.plan.hash:
                return  # the plan changed meanwhile; its own estimate is on its way
            with param.edit_constant(self):
                self.param.update(latency_ops=estimate.ops,
                                  message=f"estimated latency {estimate.ms:.3f} ms ({estimate.latency.label})")
            self._refresh_tensors()
        return self._submit("latency", f"estimating the latency of {plan.name or plan.summary()}", work, done)

    def find_divergence(self, samples: int = 1) -> Job:
        """Where the current plan's HTP run first departs from ORT's CPU (mpstudio.diverge), for colouring by
        divergence: the study's saved table of this plan when there is one, else a run on the HTP backend."""
        from ..diverge import diverge, load_report

        study = self._require_study()
        plan = self.plan

        def work(progress, cancel):
            plan_id = study.plan_id(plan)
            saved = load_report(study, plan_id) if plan_id is not None else None
            if saved is not None:
                return saved
            return diverge(study, plan, samples=samples, runner=self._runner(), progress=progress,
                           cancel=cancel).frame

        def done(frame):
            if plan.hash != self.plan.hash:
                return
            first = frame.loc[frame["first"].astype(bool), "tensor"].tolist()
            with param.edit_constant(self):
                self.param.update(divergence=frame, plan_id=study.plan_id(plan),
                                  message=f"first HTP/CPU divergence: {', '.join(first[:5])}" if first else
                                  "HTP and CPU agree within quantization noise on every tensor")
            self._refresh_tensors()
            if first:
                with param.edit_constant(self):
                    self.focus = first[0]
        return self._submit("diverge", f"comparing {plan.name or plan.summary()} on HTP and CPU", work, done)

    def start_search(self, target: str | None = None, max_evaluations: int = 16) -> Job:
        """Search for the cheapest plan that reaches `target`; its recommendation becomes the current plan."""
        from ..search import search

        study = self._require_study()
        target = target or self.target
        backend, confirm = self.backend, self.confirm_search

        def refresh():
            if self.study is study:
                self.refresh_evaluations()

        def work(progress, cancel):
            def step(done, total, message):
                progress(done, total, message)
                if message.startswith("search: "):  # an evaluation has landed in the study: plot it now
                    self._post(refresh)
            try:
                return search(study, target, backend=backend, runner=self._runner(), max_evaluations=max_evaluations,
                              confirm="htp" if confirm else None, progress=step, cancel=cancel)
            finally:  # cancelled or failed too: what was evaluated stays on the plot
                self._post(refresh)

        def done(result):
            self.refresh_evaluations()
            self.set_plan(study.plan(result.recommended.plan_id))
            with param.edit_constant(self):
                self.message = result.describe()
        return self._submit("search", f"searching for {target} on {backend}", work, done)

    def cancel_jobs(self) -> None:
        for job in self.jobs:
            if job.active:
                job.cancel()

    @property
    def active_job(self) -> Job | None:
        return next((job for job in self.jobs if job.status == "running"), None)

    def refresh_evaluations(self) -> None:
        study = self.study
        frame = study.front(self.latency_source) if study is not None else pd.DataFrame()
        checks = study.cross_checks(self.latency_source, frame) if study is not None else pd.DataFrame()
        with param.edit_constant(self):
            self.param.update(cross_checks=checks, evaluations=frame)  # the plot redraws on evaluations

    def export(self, formats: tuple[str, ...], out_dir: str | Path | None = None):
        """Write the current plan in `formats` (see mpstudio.export.FORMATS) -> mpstudio.export.ExportResult."""
        from ..export import export_plan

        study = self._require_study()
        out_dir = Path(out_dir) if out_dir else study.folder / "exports"
        return export_plan(study.quantizer, self.plan, out_dir, formats)

    def close(self) -> None:
        """Cancel the jobs and stop the local agent (the session ended)."""
        self.cancel_jobs()
        for lane in self._queues.values():
            lane.put(None)
        if self._agent is not None:
            self._agent.stop()
            self._agent = None
        if self._remote is not None:
            self._remote[1].close()
            self._remote = None

    # ---- internals --------------------------------------------------------------------------------------
    def _require_study(self) -> Study:
        if self.study is None:
            message = "no study is open yet; open a model and data folder, a study, or the demo"
            self.show_error(message)
            raise MpstudioError(message)
        return self.study

    def show_error(self, message: str) -> None:
        """Show a readable error message (and no traceback)."""
        with param.edit_constant(self):
            self.param.update(error=message, message="")

    def dismiss_error(self) -> None:
        with param.edit_constant(self):
            self.error = ""

    # ---- provisional points: predicted, then partially measured, until the full result is stored ----
    def _track(self, plan_hash: str) -> None:
        self._provisional_plans.add(plan_hash)

    def _tracked(self, plan_hash: str) -> bool:
        return plan_hash in self._provisional_plans

    def _set_provisional(self, plan_hash: str, name: str, kind: str, value: float, low: float, high: float,
                         latency_ms: float, samples: int, total: int, accuracy_source: str, detail: str) -> None:
        frame = self.provisional
        row = pd.DataFrame([[plan_hash, name, kind, float(value), float(low), float(high), float(latency_ms),
                             int(samples), int(total), accuracy_source, detail]], columns=PROVISIONAL_COLUMNS)
        kept = frame[frame["plan_hash"] != plan_hash]
        with param.edit_constant(self):
            self.provisional = pd.concat([kept, row], ignore_index=True) if len(kept) else row

    def _drop_provisional(self, plan_hash: str) -> None:
        self._provisional_plans.discard(plan_hash)
        frame = self.provisional
        if (frame["plan_hash"] == plan_hash).any():
            with param.edit_constant(self):
                self.provisional = frame[frame["plan_hash"] != plan_hash].reset_index(drop=True)

    @staticmethod
    def _has_baselines(study: Study, backend: str, runner) -> bool:
        source = study.accuracy_source(backend, runner)
        ids = [study.plan_id(PrecisionPlan.a8w8()), study.plan_id(PrecisionPlan.a16w8())]
        return all(pid is not None and study.store.evaluation(pid, source) is not None for pid in ids)

    def _activation_set(self) -> set[str]:
        return set(self.tensors["tensor"]) if len(self.tensors) else set()

    def _edit_plan(self, tensors, to: str) -> PrecisionPlan:
        study = self._require_study()
        if not tensors:
            self.show_error("select tensors first (box-select in the graph, or rows in the table)")
            return self.plan
        graph = study.graph
        chosen = [t for t in tensors if graph.tensors[t].quantizable]
        base = self.plan
        default = base.activation_type
        if to == default:
            plan = base.without(chosen)
        else:
            plan = base.with_overrides({t: to for t in chosen}, name="")
        plan.validate(graph, study.htp_arch)
        if self.evaluate_on_edit and plan.hash != base.hash:
            self.preview_plan(plan)
        verb = "promoted" if to == "uint16" else "demoted"

        def show():
            self.set_plan(plan)
            with param.edit_constant(self):
                self.param.update(message=f"{verb} {len(chosen)} tensor(s); plan {plan.summary()}", error="")
        # Served, the predicted point goes to the browser with this event's reply, and the graph's and table's
        # larger update in the next one (at once here otherwise).
        self._post(show)
        return plan

    def _layout(self, graph: ModelGraph, collapsed, sha256: str | None) -> GraphLayout:
        return layout_graph(graph, collapsed, model_sha256=sha256)

    def _refresh_tensors(self) -> None:
        study = self.study
        if study is None:
            return
        graph = study.graph
        rows = []
        for name in graph.activations():
            info = graph.tensors[name]
            node = graph.nodes[info.producer] if info.producer else None
            rows.append((name, info.producer or "", node.op_type if node else "Input", node.namespace if node else "",
                         info.kind))
        frame = pd.DataFrame(rows, columns=["tensor", "node", "op", "namespace", "kind"])
        sixteen = set(self.plan.sixteen_bit_activations(graph))
        frame["bits"] = np.where(frame["tensor"].isin(sixteen), 16, 8)
        if self.report is not None:
            scores = self.report.ranking.set_index("tensor")
            for column in _SCORE_COLUMNS:
                frame[column] = frame["tensor"].map(scores[column]) if column in scores else np.nan
        else:
            for column in _SCORE_COLUMNS:
                frame[column] = np.nan
        frame["latency_share"] = np.nan
        if self.latency_ops is not None and "share" in self.latency_ops:
            share = self.latency_ops.groupby("node")["share"].sum()
            frame["latency_share"] = frame["node"].map(share)
        frame["divergence"] = np.nan
        if self.divergence is not None:
            frame["divergence"] = frame["tensor"].map(self.divergence.set_index("tensor")["rms_steps"])
        frame = frame[TENSOR_COLUMNS]
        with param.edit_constant(self):
            self.tensors = frame

    def _on_report(self, report: SensitivityReport) -> None:
        with param.edit_constant(self):
            self.report = report
        self._refresh_tensors()

    def _on_collapsed(self, event) -> None:
        if self.study is None:
            return
        try:
            layout = self._layout(self.study.graph, event.new, self.study.prepared.sha256)
        except MpstudioError as exc:
            self.show_error(str(exc))
            return
        with param.edit_constant(self):
            self.layout = layout

    def _on_color_by(self, event) -> None:
        if event.new == "latency_share" and self.latency_ops is None and self.study is not None:
            self.estimate_latency()
        if event.new == "divergence" and self.divergence is None and self.study is not None:
            self.find_divergence()

    def _on_latency_source(self, event) -> None:
        self.refresh_evaluations()

    def _on_query(self, event) -> None:
        if event.new.strip():
            self.find(event.new)

    # ---- the job queue ----
    def _submit(self, kind: str, title: str, work: Callable, on_done: Callable | None = None) -> Job:
        job = Job(kind=kind, title=title)
        lane = _LANE_OF.get(kind, "long")
        study = self.study
        if on_done is not None and kind != "open":
            # A result for a study that is no longer open must not reach the views.
            def on_done(result, apply=on_done):
                if self.study is study:
                    apply(result)
        with param.edit_constant(self):
            self.jobs = [job, *[j for j in self.jobs if j.active or j.status == "failed"][:7]]
        with self._lock:
            worker = self._workers.get(lane)
            if worker is None or not worker.is_alive():
                self._doc = session_document() or self._doc
                worker = threading.Thread(target=self._work, args=(self._queues[lane],),
                                          name=f"mpstudio-studio-{lane}", daemon=True)
                self._workers[lane] = worker
                worker.start()
        self._queues[lane].put((job, work, on_done))
        return job

    def _work(self, jobs: queue.Queue) -> None:
        lane = next(name for name, q in self._queues.items() if q is jobs)
        while True:
            self._idle[lane].set()
            item = jobs.get()
            self._idle[lane].clear()
            if item is None:
                return
            job, work, on_done = item
            if lane == "background":  # the user's evaluations go first
                while not (self._idle["evaluate"].is_set() and self._queues["evaluate"].empty()):
                    if job.cancel_event.wait(0.2):
                        break
            if job.cancel_event.is_set():
                self._post(lambda job=job: self._finish(job, "cancelled", "cancelled before it started"))
                continue
            self._post(lambda job=job: job._set(status="running", message="starting"))
            last = [0.0]
            step = {"total": None, "start": time.perf_counter(), "done": 0}  # the step the ETA is for

            def progress(done, total, message, job=job):
                now = time.perf_counter()
                if total != step["total"] or done < step["done"]:
                    step.update(total=total, start=now, done=done)
                    step["first"] = done
                step["done"] = done
                if now - last[0] < 0.1 and done < total:
                    return  # at most ten updates a second reach the browser
                last[0] = now
                ran = done - step.get("first", 0)
                eta = (now - step["start"]) / ran * (total - done) if ran > 0 and total else None
                self._post(lambda: job._set(done=int(done), total=int(total), message=str(message), eta=eta))

            try:
                result = work(progress, job.cancel_event)
            except Cancelled:
                self._post(lambda job=job: self._finish(job, "cancelled", "cancelled"))
            except MpstudioError as exc:
                self._post(lambda job=job, text=str(exc): self._finish(job, "failed", text))
            except Exception as exc:  # a bug or an ORT failure: a readable line here, the traceback in the log
                log.exception("%s failed", job.title)
                text = f"{job.title} failed: {type(exc).__name__}: {brief(exc)}"
                self._post(lambda job=job, text=text: self._finish(job, "failed", text))
            else:
                def apply(job=job, result=result, on_done=on_done):  # bound now: the loop moves on
                    job.result = result
                    try:
                        if on_done is not None:
                            on_done(result)
                    except MpstudioError as exc:
                        self._finish(job, "failed", str(exc))
                        return
                    self._finish(job, "done", "done")
                self._post(apply)

    def _finish(self, job: Job, status: str, message: str) -> None:
        job._set(status=status, message=message if status != "failed" else "failed",
                 error=message if status == "failed" else "", seconds=time.perf_counter() - job._started,
                 done=job.total if status == "done" else job.done)
        with param.edit_constant(self):
            if status == "failed":
                self.param.update(error=message, jobs=list(self.jobs))
            else:
                self.jobs = list(self.jobs)
        job.finished.set()

    def _post(self, fn: Callable[[], None]) -> None:
        """Run `fn` where Bokeh models may be touched: the session's event loop when served, else here."""
        doc = self._doc
        if doc is not None and doc.session_context is not None:
            from panel.io.state import set_curdoc

            # Next-tick callbacks each wait for the document's lock and may run out of order; one drain at a time
            # runs the posted functions in the order they were posted (a job's "running" never lands after its
            # "done", a partial value never after the full result).
            with self._lock:
                self._posted.append(fn)
                if self._draining:
                    return
                self._draining = True

            def drain():
                with self._lock:  # what was posted until now goes to the browser as one batch; later posts next
                    batch, self._posted = self._posted, []
                try:
                    with set_curdoc(doc), pn.io.hold(doc):
                        for next_fn in batch:
                            try:
                                next_fn()
                            except Exception:  # one failing update must not stop the ones after it
                                log.exception("a studio update failed")
                finally:
                    with self._lock:
                        if self._posted:
                            doc.add_next_tick_callback(drain)
                        else:
                            self._draining = False
            doc.add_next_tick_callback(drain)
        else:
            with self._lock:
                fn()

    def _runner(self):
        """None (ORT in this process), the local agent (started on first use) or the remote agent."""
        if self.runner == "local":
            return None
        if self.runner == "agent":
            from ..agent import LocalAgent

            with self._lock:
                if self._agent is None:
                    self._agent = LocalAgent().start()
            return self._agent.client
        from ..agent import AgentClient

        url = self.agent_url.strip()
        if not url.startswith(("http://", "https://")):
            raise MpstudioError("give the remote agent's URL, such as http://192.168.1.20:8765, and its token")
        key = (url, self.agent_token.strip())
        if self._remote is None or self._remote[0] != key:
            if self._remote is not None:
                self._remote[1].close()
            self._remote = (key, AgentClient(url, key[1] or None))
        return self._remote[1]
