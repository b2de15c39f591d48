"""JobsView: a progress bar, a message and a cancel button for each of the session's latest jobs; JobBar: the jobs
that run now, across the top of the studio, with their ETA."""

from __future__ import annotations

import html

import panel as pn
import param

from .base import View
from .lanes import Job
from .state import StudioState

QUICK_KINDS = ("predict",)  # sub-second work the job bar does not show


class _JobSlots(View):
    """A fixed number of slots, each showing one job (`_jobs`; None: empty) and redrawn (`_render`) when it changes."""

    state = param.ClassSelector(class_=StudioState)

    SLOTS = 4
    WATCHED = ("title", "status", "message", "done", "total")

    def __init__(self, **params):
        super().__init__(**params)
        self._jobs: list[Job | None] = [None] * self.SLOTS
        self._watched: set[int] = set()

    def _fill(self, jobs: list) -> None:
        """Show `jobs` (at most SLOTS of them, in order) in the slots, each redrawn when it changes."""
        for job in jobs:
            if id(job) not in self._watched:
                self._watched.add(id(job))
                job.param.watch(self._on_job, list(self.WATCHED))
        self._jobs = (list(jobs[:self.SLOTS]) + [None] * self.SLOTS)[:self.SLOTS]
        for i in range(self.SLOTS):
            self._render(i)

    def _on_job(self, *events):
        changed = {id(event.obj) for event in events}
        for i, job in enumerate(self._jobs):
            if job is not None and id(job) in changed:
                self._render(i)

    def _render(self, i: int) -> None:
        raise NotImplementedError

    def _on_cancel(self, i: int) -> None:
        job = self._jobs[i]
        if job is not None:
            job.cancel()


class JobsView(_JobSlots):
    """The session's jobs, newest first; finished ones stay until newer ones push them out.

    Like the JobBar, its rows are slots made once and filled, shown and hidden, never added: a layout whose children
    change while the page is still taking the session in can lose that change (Panel drops a held change it takes
    for one the first render already carries), and the new rows' progress then reaches a page that never received
    them ("reference ... isn't known"). A slot's text or bar that misses one update shows the next.
    """

    def __init__(self, **params):
        super().__init__(**params)
        self._texts, self._cancels, self._bars, self._slots = [], [], [], []
        for i in range(self.SLOTS):
            text = pn.pane.HTML("", sizing_mode="stretch_width")
            cancel = pn.widgets.Button(name="Cancel", button_type="danger", button_style="outline", width=80,
                                       visible=False)
            cancel.on_click(lambda event, i=i: self._on_cancel(i))
            bar = pn.indicators.Progress(value=0, max=100, active=False, sizing_mode="stretch_width", height=14,
                                         bar_color="primary")
            self._texts.append(text)
            self._cancels.append(cancel)
            self._bars.append(bar)
            self._slots.append(pn.Column(pn.Row(text, cancel, sizing_mode="stretch_width"), bar, visible=False,
                                         sizing_mode="stretch_width", css_classes=["mpstudio-job"], margin=(2, 5)))
        self._empty = pn.pane.HTML("<span style='color:#666;font-size:12px'>no jobs yet</span>")
        self._column = pn.Column(self._empty, *self._slots, sizing_mode="stretch_width")
        self.state.param.watch(self._on_jobs, "jobs")
        self._on_jobs()

    def __panel__(self):
        return self._column

    def _on_jobs(self, *_):
        self._fill(self.state.jobs)
        self._empty.visible = not self.state.jobs

    def _render(self, i: int) -> None:
        job = self._jobs[i]
        if job is None:
            self._slots[i].visible = False
            return
        status, done, total = job.status, job.done, job.total
        self._texts[i].object = (
            f"<b>{html.escape(job.title)}</b> <span class='job-status'>{status}</span><br>"
            f"<span style='font-size:12px;color:#555'>{html.escape(job.message)}"
            f"{f' ({done}/{total})' if total and status == 'running' else ''}</span>")
        self._bars[i].param.update(value=job.percent, active=status == "running")
        self._cancels[i].visible = status in ("queued", "running")  # a finished job has nothing to cancel
        self._slots[i].visible = True


def eta_text(seconds) -> str:
    """'about 12 s left', '1 min 20 s left', or '' when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return ""
    seconds = int(round(seconds))
    return f"about {seconds} s left" if seconds < 60 else f"about {seconds // 60} min {seconds % 60:02d} s left"


class JobBar(_JobSlots):
    """The jobs that run or wait, across the top of the studio (quick predictions excepted): what each is, its
    progress, its ETA and a cancel button; the last finished one when none runs.

    The bar has a fixed number of slots that are filled and emptied, never added or removed, so its height never
    changes (the views below never move) and no pane is dropped while a job still updates it.
    """

    SLOTS = 3
    WATCHED = ("title", "status", "message", "done", "total", "eta")

    def __init__(self, **params):
        super().__init__(**params)
        self._texts, self._cancels, self._slots = [], [], []
        for i in range(self.SLOTS):
            text = pn.pane.HTML("", sizing_mode="stretch_width", height=46, margin=(2, 6))
            cancel = pn.widgets.Button(name="Cancel", button_type="danger", button_style="outline", width=70,
                                       height=30, margin=(8, 6), css_classes=["mpstudio-job-cancel"],
                                       description="Cancel this job")
            cancel.on_click(lambda event, i=i: self._on_cancel(i))
            self._texts.append(text)
            self._cancels.append(cancel)
            self._slots.append(pn.Row(text, cancel, sizing_mode="stretch_width", min_width=220, max_width=460,
                                      height=52, margin=(2, 6), visible=False,
                                      css_classes=["mpstudio-bar-job"],
                                      styles={"border": "1px solid #d7dde3", "border-radius": "6px",
                                              "background": "#f7fafc"}))
        self._idle = pn.pane.HTML("", sizing_mode="stretch_width", height=30, margin=(14, 10),
                                  css_classes=["mpstudio-bar-idle"])
        self._row = pn.Row(*self._slots, self._idle, sizing_mode="stretch_width", height=58, margin=0,
                           css_classes=["mpstudio-job-bar"])
        self.state.param.watch(self._on_jobs, "jobs")
        self._on_jobs()

    def __panel__(self):
        return self._row

    def _on_jobs(self, *_):
        jobs = [job for job in self.state.jobs if job.active and job.kind not in QUICK_KINDS]
        jobs.sort(key=lambda job: job.status != "running")  # running first, then queued
        self._fill(jobs)
        extra = len(jobs) - self.SLOTS
        # The last job to end is said even while others run: a cancel or a failure is seen where it was asked for.
        last = max((job for job in self.state.jobs if not job.active and job.kind not in QUICK_KINDS),
                   key=lambda job: job.ended_at, default=None)
        ended = f"last: {html.escape(last.title)} {last.status} in {last.seconds:.1f} s" if last is not None else ""
        if not jobs:
            text = "no jobs running" + (f" &middot; {ended}" if ended else "")
        else:
            text = " &middot; ".join(filter(None, [f"+{extra} more queued" if extra > 0 else "", ended]))
        self._idle.object = f"<span style='font-size:12px;color:#666'>{text}</span>"

    def _render(self, i: int) -> None:
        job = self._jobs[i]
        slot = self._slots[i]
        if job is None:
            slot.visible = False
            return
        running = job.status == "running"
        count = f" {job.done}/{job.total}" if job.total and running else ""
        left = eta_text(job.eta) if running else ""
        percent = job.percent
        bar = (f"<div style='height:6px;background:#e3e8ee;border-radius:3px;margin-top:3px'>"
               f"<div class='mpstudio-job-progress' style='height:6px;width:{max(percent, 0)}%;"
               f"background:#0b6e99;border-radius:3px'></div></div>") if percent >= 0 else (
               "<div style='height:6px;margin-top:3px;border-radius:3px;background:repeating-linear-gradient("
               "45deg,#0b6e99 0 8px,#9fd3ea 8px 16px)'></div>")
        line = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis"
        self._texts[i].object = (
            f"<div style='font-size:12px;line-height:15px'><div style='{line}'><b>{html.escape(job.title)}</b></div>"
            f"<div style='{line};color:#555'><span class='job-status'>{job.status}</span>{count}"
            f"{' &middot; <span class=job-eta>' + left + '</span>' if left else ''} &middot; "
            f"{html.escape(job.message)}</div></div>{bar}")
        self._cancels[i].visible = job.active  # a finished job has nothing to cancel: no greyed button
        slot.visible = True
