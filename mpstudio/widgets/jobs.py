"""JobsView: a progress bar, a message and a cancel button for every long job of the session; JobBar: the jobs
that run now, across the top of the studio, with their ETA."""

from __future__ import annotations

import html

import panel as pn
import param

from .base import View
from .state import Job, StudioState

QUICK_KINDS = ("predict",)  # sub-second work the job bar does not show


class JobRow(View):
    """One job: its title, progress bar, message and cancel button."""

    job = param.ClassSelector(class_=Job)

    def __init__(self, **params):
        super().__init__(**params)
        job = self.job
        self._cancel = pn.widgets.Button(name="Cancel", button_type="danger", button_style="outline", width=80,
                                         disabled=pn.bind(lambda status: status not in ("queued", "running"),
                                                          job.param.status))
        self._cancel.on_click(self._on_cancel)
        self._view = None

    def __panel__(self):
        if self._view is None:
            job = self.job
            progress = pn.indicators.Progress(
                value=pn.bind(lambda done, total, status: job.percent, job.param.done, job.param.total,
                              job.param.status),
                max=100, active=pn.bind(lambda status: status == "running", job.param.status),
                sizing_mode="stretch_width", height=14, bar_color="primary")
            text = pn.bind(lambda title, status, message, done, total: (
                f"<b>{title}</b> <span class='job-status'>{status}</span><br>"
                f"<span style='font-size:12px;color:#555'>{message}"
                f"{f' ({done}/{total})' if total and status == 'running' else ''}</span>"),
                job.param.title, job.param.status, job.param.message, job.param.done, job.param.total)
            self._view = pn.Column(pn.Row(pn.pane.HTML(text, sizing_mode="stretch_width"), self._cancel), progress,
                                   sizing_mode="stretch_width", css_classes=["mpstudio-job"], margin=(2, 5))
        return self._view

    def _on_cancel(self, event):
        self.job.cancel()


class JobsView(View):
    """The session's jobs, newest first; finished ones stay until newer ones push them out."""

    state = param.ClassSelector(class_=StudioState)

    def __init__(self, **params):
        super().__init__(**params)
        self._rows: dict[int, JobRow] = {}
        self._empty = pn.pane.HTML("<span style='color:#666;font-size:12px'>no jobs yet</span>")
        self._column = pn.Column(self._empty, sizing_mode="stretch_width")
        self.state.param.watch(self._on_jobs, "jobs")
        self._on_jobs()

    def __panel__(self):
        return self._column

    def _on_jobs(self, *_):
        jobs = self.state.jobs[:4]
        # Rows are made once per job and kept, so a job's bar keeps updating in place.
        self._rows = {id(job): self._rows.get(id(job)) or JobRow(job=job) for job in jobs}
        objects = [self._rows[id(job)].__panel__() for job in jobs] or [self._empty]
        if objects != list(self._column.objects):
            self._column.objects = objects


def eta_text(seconds) -> str:
    """'about 12 s left', '1 min 20 s left', or '' when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return ""
    seconds = int(round(seconds))
    return f"about {seconds} s left" if seconds < 60 else f"about {seconds // 60} min {seconds % 60:02d} s left"


class JobChip(View):
    """One running or queued job in the job bar: what it is, its progress, its ETA and a cancel button."""

    job = param.ClassSelector(class_=Job)

    def __init__(self, **params):
        super().__init__(**params)
        job = self.job
        self._cancel = pn.widgets.Button(name="Cancel", button_type="danger", button_style="outline", width=70,
                                         height=30, margin=(2, 4), css_classes=["mpstudio-job-cancel"],
                                         disabled=pn.bind(lambda status: status not in ("queued", "running"),
                                                          job.param.status))
        self._cancel.on_click(self._on_cancel)
        self._view = None

    def __panel__(self):
        if self._view is None:
            job = self.job
            progress = pn.indicators.Progress(
                value=pn.bind(lambda done, total, status: job.percent, job.param.done, job.param.total,
                              job.param.status),
                max=100, active=pn.bind(lambda status: status == "running", job.param.status),
                sizing_mode="stretch_width", height=10, margin=(0, 6), bar_color="primary")

            def text(title, status, message, done, total, eta):
                count = f" {done}/{total}" if total and status == "running" else ""
                left = eta_text(eta) if status == "running" else ""
                return (f"<div style='font-size:12px;line-height:15px;white-space:nowrap;overflow:hidden;"
                        f"text-overflow:ellipsis'><b>{html.escape(title)}</b> "
                        f"<span class='job-status'>{status}</span>{count}"
                        f"{' &middot; <span class=job-eta>' + left + '</span>' if left else ''}<br>"
                        f"<span style='color:#555'>{html.escape(message)}</span></div>")
            info = pn.pane.HTML(pn.bind(text, job.param.title, job.param.status, job.param.message, job.param.done,
                                        job.param.total, job.param.eta), sizing_mode="stretch_width", height=34,
                                margin=(2, 6))
            self._view = pn.Column(pn.Row(info, self._cancel, sizing_mode="stretch_width", height=36, margin=0),
                                   progress, width=420, height=52, margin=(2, 6),
                                   css_classes=["mpstudio-bar-job"],
                                   styles={"border": "1px solid #d7dde3", "border-radius": "6px",
                                           "background": "#f7fafc"})
        return self._view

    def _on_cancel(self, event):
        self.job.cancel()


class JobBar(View):
    """The jobs that run or wait, across the top of the studio (quick predictions excepted); the last finished
    one when none runs. Its height never changes, so the views below it never move."""

    state = param.ClassSelector(class_=StudioState)
    shown = param.Integer(3, doc="How many jobs the bar shows side by side")

    def __init__(self, **params):
        super().__init__(**params)
        self._chips: dict[int, JobChip] = {}
        self._idle = pn.pane.HTML("", sizing_mode="stretch_width", height=30, margin=(14, 10),
                                  css_classes=["mpstudio-bar-idle"])
        self._more = pn.pane.HTML("", width=90, height=30, margin=(14, 4))
        self._row = pn.Row(self._idle, sizing_mode="stretch_width", height=58, margin=0,
                           css_classes=["mpstudio-job-bar"])
        self.state.param.watch(self._on_jobs, "jobs")
        self._on_jobs()

    def __panel__(self):
        return self._row

    def _on_jobs(self, *_):
        jobs = [job for job in self.state.jobs if job.active and job.kind not in QUICK_KINDS]
        jobs.sort(key=lambda job: job.status != "running")  # running first, then queued
        shown = jobs[:self.shown]
        self._chips = {id(job): self._chips.get(id(job)) or JobChip(job=job) for job in shown}
        if shown:
            objects = [self._chips[id(job)].__panel__() for job in shown]
            if len(jobs) > len(shown):
                self._more.object = f"<span style='font-size:12px;color:#555'>+{len(jobs) - len(shown)} queued</span>"
                objects.append(self._more)
        else:
            last = next((job for job in self.state.jobs if not job.active and job.kind not in QUICK_KINDS), None)
            text = "no jobs running"
            if last is not None:
                text += f" &middot; last: {html.escape(last.title)} {last.status} in {last.seconds:.1f} s"
            self._idle.object = f"<span style='font-size:12px;color:#666'>{text}</span>"
            objects = [self._idle]
        if objects != list(self._row.objects):
            self._row.objects = objects
