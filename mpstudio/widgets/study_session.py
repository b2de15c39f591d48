"""What a served studio keeps per study, not per tab: the current plan, the search target, the selection, the last
search's answer and the jobs that run on the study, shared by every session of one server process that has that
study open.

A reload, or a second tab on the same study, shows the same plan, target, selection and jobs; a job another tab
started is visible (and cancellable) in each tab, and a tab cannot start a second search or analysis on a study
that already runs one: it is shown the running one. Closing every tab leaves the study's jobs running; a tab that
comes back opens on the plan the study's tabs left, and shows its jobs, with their progress, and their results (the
analysis it was shown, rather than one started afresh; README, "Sessions belong to the study"). The plan, target
and selection are kept in the study folder too, so a server started again on the study opens on them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path


from ..errors import MpstudioError
from ..plan import PrecisionPlan
from ..search.opening import analysis_base
from .lanes import Job, session_document
from .constants import writable

# Kinds of which one job at a time may run on one study, whatever its title: a second would repeat or fight it.
EXCLUSIVE_KINDS = ("search", "analyze")
# Kinds whose jobs are the tab's own view of the study (its opening, its predicted points).
PRIVATE_KINDS = ("open", "predict")
KEPT_JOBS = 8
# In the study folder: the plan, target and selection its tabs left, for the server started again on the study.
LEFT_FILE = "studio-session.json"
log = logging.getLogger(__name__)


@dataclass
class StudySession:
    """The server's view of one study: what its tabs share."""

    folder: Path
    plan: PrecisionPlan | None = None
    selection: list = field(default_factory=list)
    target: str | None = None
    search_result: object = None
    report: object = None  # the last finished analysis's SensitivityReport, for the tabs to come
    jobs: list = field(default_factory=list)
    members: list = field(default_factory=list)  # the StudioStates of the open tabs
    lock: threading.RLock = field(default_factory=threading.RLock)

    def running(self, kind: str, title: str) -> Job | None:
        """The active job a new job of `kind` and `title` would repeat or conflict with."""
        with self.lock:
            for job in self.jobs:
                if job.active and job.kind == kind and (kind in EXCLUSIVE_KINDS or job.title == title):
                    return job
        return None

    def add(self, job: Job) -> list:
        """Record `job`: the study's jobs are the active ones, the failed ones and the last search and analysis
        (their outcomes are what a tab that comes back wants to see), newest first."""
        with self.lock:
            last = [next((j for j in self.jobs if j.kind == kind), None) for kind in EXCLUSIVE_KINDS]
            kept = [j for j in self.jobs if j.active or j.status == "failed" or any(j is k for k in last)]
            self.jobs = [job, *kept[:KEPT_JOBS - 1]]
            return list(self.jobs)


_SESSIONS: dict[Path, StudySession] = {}
_SESSIONS_LOCK = threading.Lock()


def study_session(folder: str | Path) -> StudySession:
    """The server's session of the study in `folder` (made on first use; kept while the server runs)."""
    key = Path(folder).resolve()
    with _SESSIONS_LOCK:
        if not _SESSIONS:
            _cancel_at_shutdown()
        session = _SESSIONS.get(key)
        if session is None:
            session = _SESSIONS[key] = StudySession(key, **_left_on(key))
        return session


def _left_on(folder: Path) -> dict:
    """The plan, target and selection the study's tabs left when its last server stopped (none when unreadable)."""
    try:
        data = json.loads((folder / LEFT_FILE).read_text())
        return {"plan": PrecisionPlan.from_json(data["plan"]), "target": data.get("target"),
                "selection": [str(t) for t in data.get("selection", [])]}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, MpstudioError) as exc:
        log.warning("ignored %s: %s", folder / LEFT_FILE, exc)
        return {}


def _leave_on_disk(session: StudySession) -> None:
    """Write what `session` holds to its study folder (replaced whole, so a stop mid-write leaves the last one)."""
    path = session.folder / LEFT_FILE
    with session.lock:
        data = {"plan": session.plan.to_json(), "target": session.target, "selection": list(session.selection)}
    try:
        scratch = path.with_name(f".{LEFT_FILE}.{os.getpid()}.{threading.get_ident()}")
        scratch.write_text(json.dumps(data, indent=1))
        os.replace(scratch, path)
    except OSError as exc:  # a read-only study still works, without the record
        log.warning("could not keep the tabs' plan in %s: %s", path, exc)


def study_key(folder: str | Path) -> str:
    """What a tab's address says of the study it shows: a digest of its folder, never the path."""
    return hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]


def open_study_folder(key: str) -> Path | None:
    """The folder of the study this server has open under `key` (a reloaded tab's address), else None: an address
    reopens only what a tab of this server opened, never a folder it names."""
    with _SESSIONS_LOCK:
        return next((folder for folder in _SESSIONS if study_key(folder) == key), None)


def forget(folder: str | Path) -> None:
    """Drop the server's record of the study in `folder` (and what its tabs left there), cancelling its jobs: the
    next tab opens it afresh, as a first visitor (a server handing a study to a new user, and tests that each start
    from a fresh studio)."""
    with _SESSIONS_LOCK:
        session = _SESSIONS.pop(Path(folder).resolve(), None)
    (Path(folder) / LEFT_FILE).unlink(missing_ok=True)
    if session is not None:
        with session.lock:
            for job in session.jobs:
                if job.active:
                    job.cancel()


def cancel_all() -> None:
    """Cancel every study's active jobs (the server stops)."""
    with _SESSIONS_LOCK:
        sessions = list(_SESSIONS.values())
    for session in sessions:
        with session.lock:
            for job in session.jobs:
                if job.active:
                    job.cancel()


def _cancel_at_shutdown() -> None:
    """Stopping the server ends the jobs no tab owns any more. At interpreter exit, the worker pools of a running
    analysis are joined by callbacks `threading` runs, latest registered first, before `atexit`'s: the jobs must be
    cancelled in one of those, or the server would wait for them to finish."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(cancel_all)
            return
    except RuntimeError:  # already shutting down
        return
    import atexit

    atexit.register(cancel_all)


class StudyMembership:
    """One StudioState's link to the StudySession of its open study. Served sessions share; a notebook's or a
    script's state (no session document) keeps everything to itself, as before."""

    def __init__(self, state, shared: bool | None = None):
        self.state = state
        self.shared = session_document() is not None if shared is None else shared
        self.session: StudySession | None = None  # kept after the tab leaves: its jobs' results still count
        self.closed = False  # the tab has gone: the state joins no study any more
        self._adopting = False
        # Another tab's jobs are shown through mirrors updated through this tab's own posting, which stops once the
        # tab has gone: the views of a closed tab are never updated from another tab's thread.
        self._mirrors: dict[int, Job] = {}
        self._watchers: list = []
        state.param.watch(self._on_change, ["plan", "selection", "target"])

    # ---- joining and leaving ---------------------------------------------------------------------------------
    def join(self, study) -> StudySession | None:
        """Leave the previous study's session and join `study`'s; None when this state does not share."""
        self.leave()
        self.session = None
        if not self.shared or self.closed:
            return None
        session = study_session(study.folder)
        with session.lock:
            session.members.append(self.state)
        self.session = session
        return session

    def adopt(self) -> bool:
        """Show what the session holds (plan, selection, target, jobs, search answer, the analysis of the plan's
        base); False when it holds no plan yet: this is the study's first tab, whose opening plan the session keeps
        from now on (a tab that comes back after every tab has closed opens on it, not on a base chosen afresh)."""
        session, state = self.session, self.state
        if session is None:
            return False
        with session.lock:
            plan, selection, target = session.plan, list(session.selection), session.target
            jobs, answer, report = list(session.jobs), session.search_result, session.report
            if plan is None:
                session.plan = state.plan
        self._adopting = True
        try:
            with writable(state):
                state.param.update(jobs=self._shown(jobs), search_result=answer)
            if target is not None and target != state.target:
                state.target = target
            if plan is None:
                return False
            if plan.hash != state.plan.hash:
                state.set_plan(plan)
            if wants_report(state) and report is not None and report.meta.get("plan_hash") == analysis_base(
                    state.plan).hash:
                state.show_report(report)
            state.select(selection)
        finally:
            self._adopting = False
        return True

    def move_on(self) -> None:
        """The tab opens another study: its own work on this one has nothing left to show and is cancelled (other
        tabs' jobs run on), and it leaves, so the plan and selection it then resets are not the study's tabs'."""
        for job in self.state.jobs:
            if job.active and job.kind != "open" and getattr(job, "owner", self.state) is self.state:
                job.cancel()
        self.leave()

    def close(self) -> list[Job]:
        """The tab has gone: leave for good; the active jobs it started (they run on for the tabs to come)."""
        self.closed = True
        return self.leave()

    def leave(self) -> list[Job]:
        """Leave the session; the active jobs this state started (they keep running for the tabs to come)."""
        session = self.session
        if session is None:
            return []
        for job, watcher in self._watchers:
            job.param.unwatch(watcher)
        self._watchers, self._mirrors = [], {}
        with session.lock:
            if self.state in session.members:
                session.members.remove(self.state)
            return [job for job in session.jobs if job.active and getattr(job, "owner", None) is self.state]

    # ---- jobs ---------------------------------------------------------------------------------------------------
    def running(self, kind: str, title: str) -> Job | None:
        """The job of another (or this) tab that a new one would conflict with, told to the user; None if none."""
        session = self.session
        if session is None or kind in PRIVATE_KINDS:
            return None
        job = session.running(kind, title)
        if job is not None:
            told = (f"already running on this study: {job.title} (its progress is in the job bar of every tab on "
                    f"the study)")
            with writable(self.state):
                self.state.message = told
            after_jobs([job], lambda: self.state.post(lambda: self._ended(job, told)))
        return job

    def _ended(self, job: Job, told: str) -> None:
        """The job this tab was `told` runs has ended: the message line says so, unless it says something newer."""
        if self.state.message == told:
            with writable(self.state):
                self.state.message = f"{job.title}: {job.status} (it ran for the study's tabs)"

    def add(self, job: Job) -> bool:
        """Record `job` in the session and show it in every tab; False when this state does not share."""
        session = self.session
        job.owner = self.state
        if session is None or job.kind in PRIVATE_KINDS:
            return False
        jobs = session.add(job)
        self._each_other(lambda member: member._membership._show_jobs(jobs))
        with writable(self.state):
            self.state.jobs = self._shown(jobs)
        return True

    def finished(self, job: Job) -> None:
        """`job` (started in this tab) has ended: the other tabs show its outcome."""
        session = self.session
        if session is None or job.kind in PRIVATE_KINDS:
            return
        with session.lock:
            if job.kind == "search" and job.status == "done":
                session.search_result = job.result
            if job.kind == "analyze" and job.status == "done":
                session.report = job.result
            members = [m for m in session.members if m is not self.state]
        for member in members:
            member.post(lambda member=member: member._membership._shared_finished(job))

    def _shared_finished(self, job: Job) -> None:
        state, session = self.state, self.session
        if session is None:
            return
        with writable(state):
            state.jobs = self._shown(list(session.jobs))
        if job.status != "done":
            return
        state.refresh_evaluations()
        if job.kind == "analyze" and wants_report(state):
            state.show_report(job.result)
        elif job.kind == "search":
            with writable(state):
                state.search_result = job.result

    def share_partial(self, report) -> None:
        """A partial ranking of this tab's analysis: shown in the other tabs that have no full one."""
        self._each_other(lambda member: member.post(
            lambda: member.show_report(report) if wants_report(member) else None))

    def _show_jobs(self, jobs: list) -> None:
        def show():
            with writable(self.state):
                self.state.jobs = self._shown(jobs)
        self.state.post(show)

    def _shown(self, jobs: list) -> list:
        """`jobs` as this tab shows them: its own, and mirrors of the other tabs'."""
        return [job if getattr(job, "owner", None) is self.state else self._mirror(job) for job in jobs]

    def _mirror(self, job: Job) -> Job:
        mirror = self._mirrors.get(id(job))
        if mirror is not None:
            return mirror
        mirror = Job(kind=job.kind, title=job.title)
        mirror.cancel_event, mirror.finished, mirror.edit = job.cancel_event, job.finished, job.edit
        mirror._started = job._started  # it ended when its job ended (the job bar names the last job to end)
        mirror.owner, mirror.source = job.owner if hasattr(job, "owner") else None, job
        names = ["status", "done", "total", "message", "error", "seconds", "eta"]

        def copy(*_):
            values = {name: getattr(job, name) for name in names}

            def apply():
                mirror.result = job.result
                mirror._set(**values)
            self.state.post(apply)
        copy()
        self._watchers.append((job, job.param.watch(copy, names)))
        self._mirrors[id(job)] = mirror
        return mirror

    # ---- what the tabs share -----------------------------------------------------------------------------------
    def _on_change(self, *events) -> None:
        session = self.session
        if session is None or self._adopting:
            return
        changed = False
        with session.lock:
            if self.state not in session.members:  # a tab that has left (for another study) changes its own
                return
            for event in events:
                if event.name == "plan" and (session.plan is None or session.plan.hash != event.new.hash):
                    session.plan, changed = event.new, True
                elif event.name == "selection" and session.selection != list(event.new):
                    session.selection, changed = list(event.new), True
                elif event.name == "target" and session.target != event.new:
                    session.target, changed = event.new, True
        if changed:
            if session.plan is not None:
                _leave_on_disk(session)
            self._each_other(lambda member: member.post(lambda: member._membership.adopt()))

    def _each_other(self, fn) -> None:
        session = self.session
        if session is None:
            return
        with session.lock:
            members = [m for m in session.members if m is not self.state]
        for member in members:
            fn(member)


def wants_report(state) -> bool:
    """Whether `state` shows no ranking yet, or a partial one (an analysis's final report replaces it)."""
    return state.report is None or bool(state.report.meta.get("partial"))


def after_jobs(jobs: list[Job], fn) -> None:
    """Call `fn()` once every job of `jobs` has finished (at once when there is none)."""
    if not jobs:
        fn()
        return

    def wait():
        for job in jobs:
            job.finished.wait()
        fn()
    threading.Thread(target=wait, name="mpstudio-after-jobs", daemon=True).start()
