"""The studio's job runner: a Job per piece of long work, run in worker threads, one lane each, with its progress
and outcome posted, in order, to the session's event loop (where Bokeh models may be touched)."""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from typing import Callable

import panel as pn
import param

from ..data import Cancelled
from ..errors import MpstudioError, brief
from .base import READY_POLL_MS, page_not_ready
from .closed_tabs import open_connections, quiet_closed_streams
from .stranded_writes import watch_stranded_writes
from .constants import writable

log = logging.getLogger(__name__)

# Lanes of work, one worker thread each: opening studies; long work on the open study (analysis, search); the
# user's evaluations; quick work (predictions, latency estimates); and background work (the baselines), which
# starts only while no evaluation of the user's runs.
LANES = ("open", "long", "evaluate", "quick", "background")
# How long a call from another thread waits for the session's event loop to run it.
CALL_TIMEOUT = 300.0
LANE_OF = {"open": "open", "evaluate": "evaluate", "predict": "quick", "latency": "quick", "baselines": "background"}


def session_document():
    """The document of the `panel serve` session running this code, or None (notebook, script, tests).

    Only the document Panel sets for the running session counts: `pn.state.curdoc` falls back to Bokeh's
    process-wide current document, which a server run in a thread of the same process leaves behind.
    """
    from panel.io.state import state

    current = getattr(state, "_curdoc", None)
    doc = current.get() if current is not None else pn.state.curdoc
    return doc if doc is not None and doc.session_context is not None else None


def _session_loop(doc):
    """The event loop serving `doc` when this is its thread (where a served session's state is made), else None."""
    if doc is None:
        return None
    from tornado.ioloop import IOLoop

    return IOLoop.current(instance=False)


def on_session_thread(doc) -> bool:
    """Whether this thread is the one serving `doc` (its event loop), or that is not known (then it is taken as
    this one: the behaviour of an unserved document)."""
    from panel.io.state import state

    owner = getattr(state, "_thread_id_", {}).get(doc)
    return owner is None or owner == threading.get_ident()


def on_session_loop(method: Callable) -> Callable:
    """`method` of an object with `_lanes` (a Lanes), run on the session's event loop when called from another
    thread (`Lanes.call`)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return self._lanes.call(lambda: method(self, *args, **kwargs))
    return call


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

    @property
    def ended_at(self) -> float:
        """When the job ended (on the `time.perf_counter` clock); meaningful once it is no longer active."""
        return self._started + self.seconds

    def cancel(self) -> None:
        self.cancel_event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has finished and its result is applied to the state (tests, scripts)."""
        return self.finished.wait(timeout)

    def _set(self, **values) -> None:
        with writable(self):
            self.param.update(**values)


class _Progress:
    """A job's `progress(done, total, message)` callback: at most ten updates a second, with the ETA of the
    current step (a new total, or a count going back, starts a new step)."""

    def __init__(self, job: Job, post: Callable[[Callable[[], None]], None]):
        self.job, self.post = job, post
        self.last = 0.0
        self.total, self.start, self.done, self.first = None, time.perf_counter(), 0, 0

    def __call__(self, done, total, message) -> None:
        now = time.perf_counter()
        if total != self.total or done < self.done:
            self.total, self.start, self.done, self.first = total, now, done, done
        self.done = done
        if now - self.last < 0.1 and done < total:
            return  # at most ten updates a second reach the browser
        self.last = now
        ran = done - self.first
        eta = (now - self.start) / ran * (total - done) if ran > 0 and total else None
        job = self.job
        self.post(lambda: job._set(done=int(done), total=int(total), message=str(message), eta=eta))


class Lanes:
    """Worker threads, one per lane, started on first use, and the ordered posting of what they report.

    `on_finished(job)` runs (where Bokeh models may be touched) after a job's status is final and before its
    `finished` event is set, so that a caller waiting on the job sees the state it left.
    """

    def __init__(self, on_finished: Callable[[Job], None]):
        self.on_finished = on_finished
        self.lock = threading.RLock()
        self._doc = session_document()
        self._loop = _session_loop(self._doc)
        self._connected = False  # whether the session's tab has connected yet (a tab that left never returns)
        if self._doc is not None:
            quiet_closed_streams()
            watch_stranded_writes(self._doc)
        # One queue and worker thread per lane, so opening a model (and its errors) never waits behind an
        # analysis or a search: "open" for opening studies, "long" for work on the open study.
        self._queues: dict[str, queue.Queue] = {lane: queue.Queue() for lane in LANES}
        self._idle = {lane: threading.Event() for lane in LANES}  # set while the lane's worker waits for work
        for event in self._idle.values():
            event.set()
        self._workers: dict[str, threading.Thread] = {}
        self._posted: list[Callable[[], None]] = []  # updates waiting for the session's event loop, in order
        self._draining = False
        self._late: list[Callable[[], None]] = []  # updates posted after the tab has gone, run in the posting thread
        self._late_running = False
        self._closed = False

    def submit(self, job: Job, work: Callable, on_done: Callable | None = None) -> None:
        """Queue `work(progress, cancel_event)` in the lane of `job.kind`; `on_done(result)` is posted."""
        lane = LANE_OF.get(job.kind, "long")
        if self._closed:  # work a closed session's late callbacks ask for (an opening that ended after its tab)
            self.post(lambda: self._finish(job, "cancelled", "cancelled: its tab has gone"))
            return
        with self.lock:
            worker = self._workers.get(lane)
            if worker is None or not worker.is_alive():
                current = session_document()
                if current is not None:
                    self._doc, self._loop = current, _session_loop(current)
                    watch_stranded_writes(current)
                worker = threading.Thread(target=self._work, args=(lane,), name=f"mpstudio-studio-{lane}",
                                          daemon=True)
                self._workers[lane] = worker
                worker.start()
        self._queues[lane].put((job, work, on_done))

    def close(self) -> None:
        """Stop every lane's worker once its current job ends; later jobs are cancelled. Updates still waiting for
        a page that never got ready run here (their jobs end, and a waiter wakes)."""
        self._closed = True
        for lane in self._queues.values():
            lane.put(None)
        if page_not_ready(self._doc, bounded=False):
            with self.lock:
                stranded, self._posted, self._draining = self._posted, [], False
            for fn in stranded:
                self._after_session(fn)

    def _work(self, lane: str) -> None:
        jobs = self._queues[lane]
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
                self.post(lambda job=job: self._finish(job, "cancelled", "cancelled before it started"))
                continue
            self.post(lambda job=job: job._set(status="running", message="starting"))
            self._run(job, work, on_done)

    def _run(self, job: Job, work: Callable, on_done: Callable | None) -> None:
        try:
            result = work(_Progress(job, self.post), job.cancel_event)
        except Cancelled:
            self.post(lambda: self._finish(job, "cancelled", "cancelled"))
        except MpstudioError as exc:
            self.post(lambda text=str(exc): self._finish(job, "failed", text))
        except Exception as exc:  # a bug or an ORT failure: a readable line here, the traceback in the log
            log.exception("%s failed", job.title)
            text = f"{job.title} failed: {type(exc).__name__}: {brief(exc)}"
            self.post(lambda: self._finish(job, "failed", text))
        else:
            def apply():
                job.result = result
                status, text = "done", "done"
                try:
                    if on_done is not None:
                        on_done(result)
                except MpstudioError as exc:
                    status, text = "failed", str(exc)
                except Exception as exc:  # a live view's bug: said on the job and logged; the lane runs on
                    doc = self._doc
                    if doc is not None and (doc.session_context is None or self._tab_gone(doc)):
                        raise  # views of a tab that has gone: the job is done, nobody reads them
                    log.exception("showing the result of %s failed", job.title)
                    status, text = "failed", f"showing {job.title} failed: {type(exc).__name__}: {brief(exc)}"
                finally:  # a view failing to show the result (a bug, a closed tab) still ends the job
                    self._finish(job, status, text)
            self.post(apply)

    def _finish(self, job: Job, status: str, message: str) -> None:
        try:
            job._set(status=status, message=message if status != "failed" else "failed",
                     error=message if status == "failed" else "", seconds=time.perf_counter() - job._started,
                     done=job.total if status == "done" else job.done)
            self.on_finished(job)
        finally:  # a waiter wakes even when a view failed to show the outcome
            job.finished.set()

    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn` where Bokeh models may be touched: the session's event loop when served, else here."""
        doc = self._doc
        if doc is None:
            with self.lock:
                fn()
            return
        if doc.session_context is None or self._tab_gone(doc):  # its views are gone, and so is any reader of them
            self._after_session(fn)
            return
        # Next-tick callbacks each wait for the document's lock and may run out of order; one drain at a time
        # runs the posted functions in the order they were posted (a job's "running" never lands after its
        # "done", a partial value never after the full result).
        with self.lock:
            self._posted.append(fn)
            if self._draining:
                return
            self._draining = True
        self._schedule_drain(doc)

    def _schedule_drain(self, doc) -> None:
        """The next drain, on the session's next tick, asked for from the session's own thread. Asked from a worker
        thread, the document's "callback added" event could land in a hold the session thread was releasing at that
        moment (Bokeh copies the held events, then empties the list) and be lost: no drain would ever run again,
        and the tab would show nothing more (an evaluation stored, its job shown running for good)."""
        loop = self._loop
        if loop is None or on_session_thread(doc):
            doc.add_next_tick_callback(lambda: self._drain(doc))
        else:
            loop.add_callback(lambda: doc.add_next_tick_callback(lambda: self._drain(doc)))

    def call(self, fn: Callable[[], object], timeout: float = CALL_TIMEOUT):
        """`fn()` run on the session's event loop, after what was posted before it; its result (or its exception,
        raised here). Now, in this thread, when this is that loop, or the session is not served or has gone.

        For a script or a notebook driving a served studio from a thread of its own: a change made there would
        reach the page racing the session's own updates (BokehJS then drops those naming models it was never
        sent: "reference ... isn't known")."""
        doc = self._doc
        if doc is None or on_session_thread(doc) or self.gone:
            return fn()
        done, outcome = threading.Event(), {}

        def run():
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # raised again in the caller's thread
                outcome["error"] = exc
            finally:
                done.set()
        self.post(run)
        if not done.wait(timeout):
            raise MpstudioError(f"the studio's session did not run the call within {timeout:.0f} s: its event loop "
                                "is busy or its tab has closed; try again, or reload the page")
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    @property
    def gone(self) -> bool:
        """The session has closed, or its tab has gone: nobody reads its views any more."""
        doc = self._doc
        return self._closed or (doc is not None and (doc.session_context is None or self._tab_gone(doc)))

    def _tab_gone(self, doc) -> bool:
        """True once the session's tab has connected and every connection has closed: Panel would write the
        update to a closed websocket. (Before its first connection a new tab's updates are kept for it.)"""
        count = open_connections(doc)
        if count:
            self._connected = True
        return self._connected and count == 0

    def _after_session(self, fn: Callable[[], None]) -> None:
        """An update posted after the session ended: jobs still finish (a waiter wakes), but a view's update of
        a destroyed document fails harmlessly, and is no traceback and no failure of the job that posted it.

        Run in order, one caller at a time, but without holding the lock: an update may post to another tab of
        the study, whose own late updates may post back here (two tabs' locks taken in turn would deadlock)."""
        with self.lock:
            self._late.append(fn)
            if self._late_running:
                return  # the caller running the late updates runs this one after those before it
            self._late_running = True
        while True:
            with self.lock:
                if not self._late:
                    self._late_running = False
                    return
                batch, self._late = self._late, []
            for late_fn in batch:
                try:
                    late_fn()
                except Exception:
                    log.debug("an update after the session ended failed", exc_info=True)

    def _drain(self, doc) -> None:
        from panel.io.state import set_curdoc

        if doc.session_context is None or self._tab_gone(doc):
            # The tab went between the posting and this tick: Panel would schedule the views' updates for a session
            # about to be destroyed, and fail on its removed models a tick later.
            with self.lock:
                self._draining = False
                batch, self._posted = self._posted, []
            for next_fn in batch:
                self._after_session(next_fn)
            return
        if page_not_ready(doc):  # Panel would drop the batch's changes: wait for the page
            doc.add_timeout_callback(lambda: self._drain(doc), READY_POLL_MS)
            return
        with self.lock:  # what was posted until now goes to the browser as one batch; later posts next
            batch, self._posted = self._posted, []
        try:
            with set_curdoc(doc), pn.io.hold(doc):
                for next_fn in batch:
                    try:
                        next_fn()
                    except Exception:  # one failing update must not stop the ones after it
                        log.exception("a studio update failed")
        finally:
            with self.lock:
                if self._posted:
                    doc.add_next_tick_callback(lambda: self._drain(doc))
                else:
                    self._draining = False
