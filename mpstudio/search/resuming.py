"""Resume of killed searches: a killed or cancelled process's pending evaluations run, and its unfinished
searches rerun from their recorded spec (each replays against the stored results and continues)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import threading

from ..data import Progress
from ..store import Evaluation
from .result import SearchResult
from .run import search

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study


def resume_searches(study: Study, runner=None, *, progress: Progress | None = None,
                    cancel: threading.Event | None = None) -> list[SearchResult]:
    """Continue every search a killed or cancelled process left unfinished (not those another process runs)."""
    frame = study.searches()
    results = []
    for spec in frame[frame["status"].isin(["interrupted", "cancelled"])]["spec"]:
        spec = dict(spec)
        results.append(search(study, spec.pop("target"), runner=runner, progress=progress, cancel=cancel, **spec))
    return results


def resume(study: Study, runner=None, *, progress: Progress | None = None,
           cancel: threading.Event | None = None) -> tuple[list[Evaluation], list[SearchResult]]:
    """Finish what a killed process left in `study`: its pending evaluations, then its unfinished searches."""
    done = study.run_pending(runner, progress=progress, cancel=cancel)
    return done, resume_searches(study, runner, progress=progress, cancel=cancel)
