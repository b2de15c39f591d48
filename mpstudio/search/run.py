"""The search's entry point: its arguments checked, its spec recorded in the study (so that a rerun replays
it), the walk and the HTP confirmation run, and progress reported as plain lines when nobody listens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import threading

from ..blas_threads import with_one_blas_thread
from ..data import Cancelled, Progress
from ..errors import MpstudioError
from ..progress_lines import LineProgress
from .confirmation import confirm as confirm_front
from .result import SearchResult
from .rewalk import go_on
from .targets import Target
from .walk import Walk

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study

WEIGHT_MODES = ("auto", "per-tensor", "per-channel", "mixed")
CONFIRM_BACKENDS = ("htp",)
# Plans of the front confirmed at most, by default: each is a full evaluation on the HTP (minutes per plan on
# the emulator).
CONFIRM_PLANS = 3


@with_one_blas_thread  # its evidence bootstraps the metric's terms: small products, many of them
def search(
    study: Study,
    target: str | float = "a16w8+10%",
    *,
    latency_budget_ms: float | None = None,
    max_evaluations: int = 24,
    backend: str = "cpu",
    runner=None,
    weights: str = "auto",
    sensitivity_samples: int = 32,
    isolation_samples: int = 8,
    confirm: str | None = "htp",
    confirm_plans: int = CONFIRM_PLANS,
    progress: Progress | None = None,
    quiet: bool = False,
    cancel: threading.Event | None = None,
) -> SearchResult:
    """Search the study's plans for the cheapest one that reaches `target` (see `mpstudio.search`'s docstring).

    `target`: see `Target` (a number, `float-1%`, `a16w8+10%`, `a16w8-pc+5%`, `<plan name>+2%`).
    `runner` is None (this process), an AgentClient or an AgentPool (one plan per agent per round).
    `weights` is "auto" (try per-channel int8 weights first when they help), "per-tensor", "per-channel", or
    "mixed" (each matrix weight's own precision chosen with the activations: see `order.mixed_order`).
    `sensitivity_samples` calibration samples are scored per tensor and `isolation_samples` of them run per
    isolation evaluation (`Study.sensitivity`); the calibration and evaluation samples are the study's own
    (`Study.create(calibration_samples=..., evaluation_samples=...)`), as every plan of a study is scored on
    the same data. Progress goes to `progress(done, total, message)`, else to stderr as plain lines unless
    `quiet`. The recommendation is chosen over every stored plan (`choice.choose`; estimated latencies within
    the cost model's resolution are a tie, which goes to the better value); plans much better for little more
    latency are listed either way (`better_for_little_more`).

    `confirm` ("htp", the default, or None): when the walk's `backend` is another one (the CPU reference),
    up to `confirm_plans` plans of its front are evaluated on that backend through `runner` (the local HTP
    emulator, or a device agent) and the recommendation follows their values (see `confirmation.confirm`); the
    result lists where the two disagree. Without an HTP backend (no QNN execution provider here and no
    runner) the search says so and keeps the walk's pick.
    """
    confirm = _checked_arguments(weights, confirm, confirm_plans, max_evaluations, sensitivity_samples,
                                 isolation_samples)
    goal = Target.parse(target)
    goal.check(study)
    if progress is None and not quiet:
        progress = LineProgress()
    spec = _spec(goal, latency_budget_ms, max_evaluations, backend, weights, sensitivity_samples, isolation_samples,
                 confirm, confirm_plans)
    search_id = study.start_search(spec)
    walk = Walk(study, search_id, backend, runner, max_evaluations, progress, cancel)
    walk.isolation_samples, walk.latency_budget_ms = isolation_samples, latency_budget_ms
    try:
        result = walk.run(goal, latency_budget_ms, weights, sensitivity_samples)
        if confirm is not None and confirm != backend:
            result = confirm_front(walk, result, confirm, int(confirm_plans))
            result = go_on(walk, result, confirm_front, confirm, int(confirm_plans))
    except Cancelled:
        study.finish_search(search_id, "cancelled", None)
        raise
    except BaseException:
        study.finish_search(search_id, "failed", None)
        raise
    study.finish_search(search_id, "done", result.to_json())
    return result


def _checked_arguments(weights: str, confirm: str | None, confirm_plans: int, max_evaluations: int,
                       sensitivity_samples: int, isolation_samples: int) -> str | None:
    """Raise on an argument `search` cannot run with; returns `confirm` ("none" and "" read as None)."""
    if weights not in WEIGHT_MODES:
        raise MpstudioError(f"weights must be one of {', '.join(WEIGHT_MODES)}, not {weights!r}")
    if confirm in ("none", ""):
        confirm = None
    if confirm is not None and confirm not in CONFIRM_BACKENDS:
        raise MpstudioError(f"confirm must be one of {', '.join(CONFIRM_BACKENDS)} or None, not {confirm!r}")
    if int(confirm_plans) < 1:
        raise MpstudioError(f"confirm_plans must be at least 1, not {confirm_plans}")
    if max_evaluations < 3:
        raise MpstudioError("max_evaluations must be at least 3 (two baselines and one candidate)")
    for what, count in (("sensitivity_samples", sensitivity_samples), ("isolation_samples", isolation_samples)):
        if int(count) < 1:
            raise MpstudioError(f"{what} must be at least 1, not {count}")
    return confirm


def _spec(goal: Target, latency_budget_ms, max_evaluations, backend, weights, sensitivity_samples, isolation_samples,
          confirm, confirm_plans) -> dict:
    """The search's record in the study: a rerun with the same spec replays it against the stored results."""
    spec = {"target": goal.text, "latency_budget_ms": latency_budget_ms, "max_evaluations": max_evaluations,
            "backend": backend, "weights": weights, "sensitivity_samples": sensitivity_samples}
    # Keys added later only when not their default, so older records of the same search still match.
    for key, value, default in (("isolation_samples", isolation_samples, 8), ("confirm", confirm, "htp"),
                                ("confirm_plans", confirm_plans, CONFIRM_PLANS)):
        if value != default:
            spec[key] = value
    return spec
