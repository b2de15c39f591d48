"""StudioState: the one state object of a studio session (study, plan, selection, jobs, results), shared by
every view. Views render it and call its actions; the actions run their work as jobs (mpstudio.widgets.lanes)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd
import panel as pn
import param

from ..errors import MpstudioError
from ..layout import GraphLayout, collapsible_namespaces, layout_graph
from ..plan import PrecisionPlan
from ..preview import FIRST_SAMPLES, promotion_basis
from ..search.run import WEIGHT_MODES
from ..sensitivity import SensitivityReport
from ..sources import LATENCY_SOURCES
from ..study import Study
from . import analyses
from .agents import RUNNERS, AgentClients
from .editing import edit_plan, export_current, find_tensors
from .lanes import Job, Lanes, on_session_loop, session_document
from .opening import demo_study, model_study, open_arguments
from .plan_evaluation import PlanEvaluations, evaluated_id
from .provisional import PROVISIONAL_COLUMNS
from .policy import ServerPolicy
from .opening_base import BaseOpening
from .study_session import StudyMembership, after_jobs
from .tensor_frame import SCORE_ATTENTION, SCORES, TENSOR_COLUMNS, tensor_frame
from .constants import writable

__all__ = ["Job", "PROVISIONAL_COLUMNS", "RUNNERS", "SCORES", "SCORE_ATTENTION", "StudioState", "TENSOR_COLUMNS",
           "session_document"]

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
    search_weights = param.Selector(objects=list(WEIGHT_MODES), default="auto", doc="The search's weights: auto "
                                    "(per-channel int8 when they help), per-tensor, per-channel, or mixed (int4 too)")
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
    search_result = param.Parameter(None, constant=True, doc="The last search's SearchResult (the search card)")
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
                 auto_analyze: bool = True, policy: ServerPolicy | None = None, **params):
        super().__init__(**params)
        self.study_folder = Path(study_folder) if study_folder else None
        # What a visitor may open and where it may send work: a served studio's roots and agents (any path and
        # agent in a notebook, whose user owns the process).
        self.policy = policy or ServerPolicy()
        if self.policy.agents and self.agent_url not in self.policy.agents:
            self.agent_url = self.policy.agents[0]
        self.auto_analyze = auto_analyze
        self._lanes = Lanes(self._on_job_finished)
        self.agents = AgentClients(self._lanes.lock)
        self._evaluations = PlanEvaluations(self)
        self._membership = StudyMembership(self)  # what the server's tabs on the same study share
        self.opening = BaseOpening(self)  # the best known base plan, chosen when a study opens
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
        if session_document() is not None:  # once the page is up: its progress bar then shows the opening
            pn.state.onload(lambda: open_arguments(state, study, model, data, shapes))
        else:
            open_arguments(state, study, model, data, shapes)
        return state

    def set_study(self, study: Study) -> None:
        """Show `study`: its graph, results, the plan its other tabs show or its best base; then that base's analysis."""
        if self.study is not None and study is not self.study:
            self._membership.move_on()  # before the reset below, which is this tab's alone
        graph = study.graph
        layout = layout_graph(graph, [], model_sha256=study.prepared.sha256)
        self.param.collapsed.objects = collapsible_namespaces(graph)
        with writable(self):
            self.param.update(study=study, layout=layout, plan=PrecisionPlan.a8w8(), plan_id=study.plan_id(
                PrecisionPlan.a8w8()), report=None, latency_ops=None, focus="", error="",
                message=f"opened {study.name}")
            self.param.update(selection=[], collapsed=[], query="", provisional=self.param.provisional.default)
        self.refresh_tensors()
        self.refresh_evaluations()
        # Another tab's (or a reloaded tab's) plan, target, selection and jobs, when it has the study open.
        adopted = self._membership.join(study) is not None and self._membership.adopt()
        if self.auto_analyze:
            self.evaluate_baselines()  # in the background lane, while the analysis runs in its own
            self.submit("predict", "preparing predictions", lambda progress, cancel: promotion_basis(study))
            self.opening.start(adopted)  # the best known base, then the analysis that ranks promotions from it

    def open_study(self, folder: str | Path | None = None) -> Job:
        """Open a study folder: `folder` (the caller's own), else the study_path a visitor typed (confined to
        the server's roots)."""
        folder = Path(str(folder or self.policy.confine(self.study_path, "study folder")).strip()).expanduser()
        return self.submit("open", f"opening the study {folder.name}", lambda progress, cancel: Study.open(folder),
                           self.set_study)

    def open_demo(self) -> Job:
        return self.submit("open", "opening the demo (PP-OCRv4 text-line recognizer)",
                           lambda progress, cancel: demo_study(None, progress), self.set_study)

    def open_model(self, model: str | Path | None = None, data: str | Path | None = None,
                   shapes: str | None = None, allow_fallback: bool | None = None) -> Job:
        """A new study of `model` on the `.npz` samples in `data` (or the one made from the same files). Arguments
        default to the fields a visitor types, which must lie, with what they link to, under the server's roots.
        `study_folder` holds the caller's own files' study only (the demo and a typed model have their own)."""
        confine = self.policy.confine if model is None or data is None else None
        folder = self.study_folder if confine is None else None
        model = model or self.policy.confine(self.model_path, "model file (.onnx)")
        data = data or self.policy.confine(self.data_path, "data folder")
        shapes, fallback = (self.input_shapes if shapes is None else shapes,
                            self.allow_fallback if allow_fallback is None else allow_fallback)
        return self.submit("open", f"opening {Path(str(model)).name}", lambda progress, cancel: model_study(
            model, data, shapes, fallback, folder, progress, confine), self.set_study)

    # ---- selection and plan ---------------------------------------------------------------------------
    def select(self, tensors) -> None:
        """Select activation tensors (unknown or non-activation names are ignored)."""
        known = self._activation_set()
        chosen = [t for t in dict.fromkeys(tensors) if t in known]
        if chosen != self.selection:
            self.selection = chosen

    def find(self, text: str) -> list[str]:
        """Select the tensors whose name, or whose producer's name, is `text` (case-insensitive), or matches it
        when it is a pattern (*, ?, [...])."""
        return find_tensors(self, text)

    def promote_selected(self) -> PrecisionPlan:
        """The current plan with the selected activation tensors at 16 bits."""
        return edit_plan(self, self.selection, "uint16")

    def demote_selected(self) -> PrecisionPlan:
        """The current plan with the selected activation tensors back at the plan's default (or 8 bits)."""
        return edit_plan(self, self.selection, "uint8")

    def set_plan(self, plan: PrecisionPlan) -> None:
        if self.study is not None:
            plan.validate(self.study.graph, self.study.htp_arch)
        plan_id = self.study.plan_id(plan) if self.study is not None else None
        with writable(self):
            self.param.update(plan=plan, plan_id=plan_id, latency_ops=None, divergence=None)  # the old plan's
        self.refresh_tensors()
        if self.color_by == "latency_share" and self.study is not None:
            self.estimate_latency()
        if self.color_by == "divergence" and self.study is not None:
            self.find_divergence()

    def load_plan(self, plan_id: int) -> PrecisionPlan:
        """Make a stored plan the current one (a click on the Pareto plot)."""
        plan = self.require_study().plan(int(plan_id))
        self.set_plan(plan)
        with writable(self):
            self.param.update(message=f"loaded plan {plan_id}: {plan.summary()}", error="")
        return plan

    def sixteen_bit(self) -> list[str]:
        """Activation tensors at 16 bits in the current plan."""
        return self.tensors.loc[self.tensors["bits"] == 16, "tensor"].tolist() if len(self.tensors) else []

    def collapse(self, namespace: str) -> None:
        if namespace not in self.collapsed:
            self.collapsed = [*self.collapsed, namespace]

    def expand(self, namespace: str | None = None) -> None:
        """Expand one namespace, or all of them."""
        self.collapsed = [] if namespace is None else [n for n in self.collapsed if n != namespace]

    # ---- long work --------------------------------------------------------------------------------------
    def analyze(self) -> Job:
        """The sensitivity analysis of the current plan's base (read back from the study when it was done before)."""
        return analyses.analyze(self)

    def evaluate_plan(self, plan: PrecisionPlan | None = None, *, streamed: bool = True, edit: bool = False,
                      after: Job | None = None, versus: PrecisionPlan | None = None) -> Job:
        """Evaluate the current plan (accuracy and latency) on the chosen backend and runner.

        Streamed: a first value on a few samples, with its interval, reaches the Pareto plot within seconds,
        then values on more samples, until the full result is stored. `edit` marks an evaluation started by a
        promote or demote: the next edit cancels it when it has not finished. The baselines of the backend are
        queued in the background when the study lacks them (they never run before this evaluation). `after`: a
        job whose result shows first (the prediction); `versus`: a plan to show the paired difference from.
        """
        return self._evaluations.evaluate(plan, streamed, edit, after, versus)

    def preview_plan(self, plan: PrecisionPlan | None = None) -> tuple[Job | None, Job | None]:
        """Draw `plan` (default the current one) on the Pareto plot at once, as predicted by the sensitivity
        report and the cost model, and start its streamed evaluation, which replaces the prediction with
        measured values. Returns (the prediction's job, None when it was made at once; the evaluation's job,
        None in a served session, where it is submitted in the next update)."""
        return self._evaluations.preview(plan)

    def evaluate_baselines(self, backend: str | None = None) -> Job:
        """The all-8-bit and all-16-bit-activation plans, evaluated in the background (once per study and
        backend; a job of the user's evaluation lane always goes first)."""
        return self._evaluations.baselines(backend)

    def estimate_latency(self) -> Job:
        """The HTP cost model's per-op latency of the current plan (for colouring by latency share)."""
        return analyses.estimate_latency(self)

    def find_divergence(self, samples: int = 1) -> Job:
        """Where the current plan's HTP run first departs from ORT's CPU (mpstudio.diverge), for colouring by
        divergence: the study's saved table of this plan when there is one, else a run on the HTP backend."""
        return analyses.find_divergence(self, samples)

    def start_search(self, target: str | None = None, max_evaluations: int = 16) -> Job:
        """Search for the cheapest plan that reaches `target`; its recommendation becomes the current plan."""
        return analyses.start_search(self, target, max_evaluations)

    def cancel_jobs(self) -> None:
        for job in self.jobs:
            if job.active:
                job.cancel()

    def refresh_evaluations(self) -> None:
        """The study's evaluations for the plot, and the current plan's id once one is the plan's (see evaluated_id)."""
        study = self.study
        frame = study.front(self.latency_source) if study is not None else pd.DataFrame()
        checks = study.cross_checks(self.latency_source, frame) if study is not None else pd.DataFrame()
        plan_id = self.plan_id if self.plan_id is not None else evaluated_id(frame, self.plan)
        with writable(self):
            self.param.update(cross_checks=checks, evaluations=frame, plan_id=plan_id)  # the plot redraws on these

    def export(self, formats: tuple[str, ...], out_dir: str | Path | None = None):
        """Write the current plan in `formats` (see mpstudio.export.FORMATS) -> mpstudio.export.ExportResult."""
        return export_current(self, formats, out_dir)

    def close(self) -> None:
        """The session ended: a served tab's study jobs run on for the tabs to come (then the local agent stops);
        elsewhere the jobs are cancelled and the local agent stopped."""
        running = self._membership.close()
        if not self._membership.shared:  # a shared tab's jobs, and the mirrors of other tabs', run on
            self.cancel_jobs()
        self._lanes.close()
        after_jobs(running, self.agents.close)

    def show_error(self, message: str) -> None:
        """Show a readable error message (and no traceback)."""
        with writable(self):
            self.param.update(error=message, message="")

    def dismiss_error(self) -> None:
        with writable(self):
            self.error = ""

    # ---- for the verbs' helpers (analyses, plan_evaluation) ---------------------------------------------
    def require_study(self) -> Study:
        """The open study; without one, an error message and MpstudioError."""
        if self.study is None:
            message = "no study is open yet; open a model and data folder, a study, or the demo"
            self.show_error(message)
            raise MpstudioError(message)
        return self.study

    def submit(self, kind: str, title: str, work: Callable, on_done: Callable | None = None) -> Job:
        """Run `work(progress, cancel_event)` as a job in the lane of `kind`; `on_done(result)` is applied where
        Bokeh models may be touched, unless another study was opened meanwhile."""
        running = self._membership.running(kind, title)
        if running is not None:  # another tab (or this one) runs it on this study: shown, not repeated
            return running
        job = Job(kind=kind, title=title)
        study = self.study
        if on_done is not None and kind != "open":
            # A result for a study that is no longer open must not reach the views.
            def on_done(result, apply=on_done):
                if self.study is study:
                    apply(result)
        if not self._membership.add(job):
            with writable(self):
                self.jobs = [job, *[j for j in self.jobs if j.active or j.status == "failed"][:7]]
        self._lanes.submit(job, work, on_done)
        return job

    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn` where Bokeh models may be touched: the session's event loop when served, else here."""
        self._lanes.post(fn)

    def runner_client(self):
        """None (ORT in this process), the local agent (started on first use) or the remote agent."""
        if self.runner != "remote" or self.policy.agents is None:
            return self.agents.client(self.runner, self.agent_url, self.agent_token)
        # A served studio's agents are the server's: a visitor picks one of them, never a URL of its own.
        return self.agents.client(self.runner, self.policy.agent(self.agent_url), self.policy.agent_token)

    def refresh_tensors(self) -> None:
        """Rebuild `tensors` for the current plan, report, latency estimate and divergence."""
        if self.study is not None:
            with writable(self):
                self.tensors = tensor_frame(self.study.graph, self.plan, self.report, self.latency_ops,
                                            self.divergence)

    def show_report(self, report: SensitivityReport) -> None:
        with writable(self):
            self.report = report
        self.refresh_tensors()

    # ---- internals --------------------------------------------------------------------------------------
    def _activation_set(self) -> set[str]:
        return set(self.tensors["tensor"]) if len(self.tensors) else set()

    def _on_collapsed(self, event) -> None:
        if self.study is None:
            return
        try:
            layout = layout_graph(self.study.graph, event.new, model_sha256=self.study.prepared.sha256)
        except MpstudioError as exc:
            self.show_error(str(exc))
            return
        with writable(self):
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

    def _on_job_finished(self, job: Job) -> None:
        self._membership.finished(job)
        with writable(self):
            if job.status == "failed":
                self.param.update(error=job.error, jobs=list(self.jobs))
            else:
                self.jobs = list(self.jobs)


def _configure(self, **values) -> None:
    """Set the state's parameters (`target`, `backend`, `search_weights`, `color_by`, ...) as the views' widgets do."""
    self.param.update(**values)


StudioState.configure = _configure


# A script or a notebook may call these from a thread of its own on a served studio: each runs on the session's
# event loop and returns its result there (a change made in another thread races the page's own updates).
for _name in ("set_study", "open_study", "open_demo", "open_model", "select", "find", "promote_selected",
              "demote_selected", "set_plan", "load_plan", "collapse", "expand", "analyze", "evaluate_plan",
              "preview_plan", "evaluate_baselines", "estimate_latency", "find_divergence", "start_search",
              "cancel_jobs", "refresh_evaluations", "export", "show_error", "dismiss_error", "submit",
              "configure"):
    setattr(StudioState, _name, on_session_loop(getattr(StudioState, _name)))
del _name
