"""Work that survives a kill: queued evaluations (submitted, claimed, run, finished) and the searches that
queued them (their spec and state; `mpstudio.search` runs them). A killed process's pending jobs are run by
the next one (`mpstudio.search.resume`)."""

from __future__ import annotations

import threading
from typing import Callable

import pandas as pd

from ..data import Cancelled, Progress
from ..errors import MpstudioError
from ..plan import PrecisionPlan
from ..store import Evaluation, StudyStore


class JobQueue:
    """The jobs and searches of one study's store. `add_plan(plan, origin)` stores a plan, `plan_of(plan_id)`
    reads one back, `evaluate(plan, backend, runner, progress=, cancel=)` runs one (`Study.evaluate`)."""

    def __init__(self, store: StudyStore, add_plan: Callable[[PrecisionPlan, str], int],
                 plan_of: Callable[[int], PrecisionPlan], evaluate: Callable[..., Evaluation]):
        self.store, self.add_plan, self.plan_of, self.evaluate = store, add_plan, plan_of, evaluate

    def submit(self, plan: PrecisionPlan, backend: str = "cpu", *, origin: str = "user",
               search_id: int | None = None) -> int:
        """Queue an evaluation of `plan`; returns the job id."""
        return self.store.submit(self.add_plan(plan, origin), backend, search_id)

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
            evaluation = self.evaluate(self.plan_of(plan_id), backend, runner, progress=progress, cancel=cancel)
        except Cancelled:
            self.store.finish_job(job_id, "pending", None)
            raise
        except BaseException as exc:
            self.store.finish_job(job_id, "failed", str(exc) or type(exc).__name__)
            raise
        self.store.finish_job(job_id, "done", None)
        return evaluation

    def jobs(self) -> pd.DataFrame:
        return self.store.jobs()

    # ---- searches ----
    def start_search(self, spec: dict) -> int:
        """Record a search; an unfinished search with the same spec is continued instead of duplicated."""
        return self.store.start_search(spec)

    def finish_search(self, search_id: int, status: str, result: dict | None) -> None:
        self.store.finish_search(search_id, status, result)

    def searches(self) -> pd.DataFrame:
        return self.store.searches()
