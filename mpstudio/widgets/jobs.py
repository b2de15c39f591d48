"""JobsView: a progress bar, a message and a cancel button for every long job of the session."""

from __future__ import annotations

import panel as pn
import param

from .base import View
from .state import Job, StudioState


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
