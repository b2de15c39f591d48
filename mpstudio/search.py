"""Automatic mixed-precision search: the fewest 16-bit tensors that reach a target accuracy.

The walk, from the sensitivity ranking:
1. Evaluate the baselines (a8w8, a16w8); the target may be relative to them ("a16w8+10%").
2. Weights first: when the weight scores show that per-channel int8 weights quantize much better than
   per-tensor uint8 (free on HTP), the per-channel base is evaluated and kept if it is better.
3. Order the activation tensors by predicted gain (the noise power their isolated promotion removes from
   the base plan, in a sensitivity analysis of that plan) per unit of estimated latency cost (`latency.promotion_costs`). Plan k promotes the first k of that order.
4. Find the smallest k that reaches the target: a first guess from the isolation prediction, then
   bisection; with several agents, several k per round (multi-section). A latency budget caps k (from
   the cost model, which needs no evaluation); an evaluation budget caps the rounds.
5. Confirm on the HTP (by default, when the walk ran on the CPU reference): the recommended plan and its
   neighbours on the front of the walk's evaluations are evaluated on the HTP (the local emulator, or the
   device behind the runner), cheaper ones while the HTP still reaches the target, dearer ones until it
   does. The recommendation follows the HTP's numbers; where CPU and HTP disagree (one reaches the target
   and the other not, or they order two plans differently) the result says so.
Every evaluation lands in the study as it finishes, and a search is recorded by its spec: rerunning an
interrupted search replays it against the stored results and continues where it stopped.
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from .data import Cancelled, Progress
from .errors import MpstudioError
from .plan import PrecisionPlan
from .study import Evaluation, Study, pareto_mask

# Per-channel weights are tried first when they are this much better (median over weights, dB).
PER_CHANNEL_GAIN_DB = 6.0
# A reference name followed by a margin: "a16w8+10%", "float-1%", "a8w8+3x16 + 2 %".
_MARGIN = re.compile(r"^(?P<base>.*?\S)\s*[+-]\s*(?P<pct>\d+(?:\.\d+)?)\s*%\s*$")
# "Much better for little more" (see `better_for_little_more`): at most this much more estimated latency than
# the recommended plan (relative), for at most this fraction of its distance from the float model's value.
LITTLE_MORE = 0.10
MUCH_BETTER = 0.5
WEIGHT_MODES = ("auto", "per-tensor", "per-channel", "mixed")
CONFIRM_BACKENDS = ("htp",)
# Plans of the front confirmed at most, by default: each is a full evaluation on the HTP (minutes per plan on
# the emulator).
CONFIRM_PLANS = 3
_generate_lock = threading.Lock()  # ORT's quantizer is patched process-wide while it runs: one at a time


def named_baselines() -> dict[str, PrecisionPlan]:
    """Plans a target may name whether or not the study holds them yet (the search evaluates them)."""
    return {"a8w8": PrecisionPlan.a8w8(), "a16w8": PrecisionPlan.a16w8(),
            "a8w8-pc": PrecisionPlan(activation_type="uint8", weight_type="int8", per_channel=True, name="a8w8-pc"),
            "a16w8-pc": PrecisionPlan(activation_type="uint16", weight_type="int8", per_channel=True,
                                      name="a16w8-pc")}


@dataclass(frozen=True)
class Target:
    """What the search must reach: an absolute metric value, or a reference's value within a relative margin.

    Forms: a number (`0.14`); a reference (`a16w8`, `float`); a reference and a margin (`a16w8+10%`,
    `float-1%`). References: `float` (the float model's own value of the metric, on ONNX Runtime's CPU: see
    `Study.float_value`), the baselines `a8w8`, `a16w8`, `a8w8-pc`, `a16w8-pc` (per-channel int8 weights;
    evaluated when the study lacks them), or the name of any plan stored in the study. A margin is a
    tolerance toward worse, whatever its sign and the metric's direction: `a16w8+10%` and `a16w8-10%` both
    mean "at most 10% (of the reference's magnitude) worse than a16w8", so `float-1%` on an accuracy and
    `a16w8-pc+5%` on an error rate read naturally. A target stricter than a reference is given as a number.
    """

    text: str
    value: float | None = None
    baseline: str | None = None  # the reference's name: "float", a baseline or a stored plan
    margin: float = 0.0  # relative, 0.1 = 10%

    @classmethod
    def parse(cls, text: str | float) -> "Target":
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            return cls(str(text), _finite(float(text), text))
        raw = str(text).strip()
        if not raw:
            raise MpstudioError("the target is empty: give a number, or a reference like 'float-1%' or 'a16w8+10%'")
        try:
            number = float(raw)
        except ValueError:
            number = None
        if number is not None:
            return cls(raw, _finite(number, raw))
        match = _MARGIN.match(raw)
        if match:
            return cls(raw, None, match["base"].strip(), float(match["pct"]) / 100)
        return cls(raw, None, raw, 0.0)

    def threshold(self, references: dict, higher_is_better: bool) -> float:
        """The metric value to reach, given the references' values (Evaluations or numbers, by name)."""
        if self.value is not None:
            return self.value
        if self.baseline not in references:
            raise MpstudioError(f"target {self.text!r}: no value for {self.baseline!r}; known: "
                                f"{', '.join(sorted(references))}")
        base = references[self.baseline]
        base = float(getattr(base, "value", base))
        worse = -1.0 if higher_is_better else 1.0
        return base + worse * self.margin * abs(base)

    def check(self, study: Study) -> None:
        """Raise unless the study can resolve this target's reference (the error lists what it can)."""
        if self.baseline is None:
            return
        if self.baseline == "float":
            if study.metric_spec.kind == "output":
                raise MpstudioError(
                    f"target {self.text!r}: the study's metric is {study.metric_name} against the float model, so the "
                    "float model is the reference itself (exact, no finite value); give a number (e.g. 30 for 30 dB) "
                    "or a plan's name with a margin ('a16w8+10%'), or create the study with a task metric (--metric)")
            return
        if self.baseline in named_baselines():
            return
        names = study.plans()["name"]
        if (names == self.baseline).any():
            return
        available = ["float"] * (study.metric_spec.kind != "output") + list(named_baselines())
        stored = [n for n in dict.fromkeys(names) if n not in available]
        raise MpstudioError(
            f"target {self.text!r} names {self.baseline!r}, which is neither a number nor a known plan; give a number "
            f"or one of: {', '.join(available + stored[:30])}{' ...' if len(stored) > 30 else ''} (with a margin like "
            "'+2%' if you like)")


def _finite(value: float, text) -> float:
    if not math.isfinite(value):
        raise MpstudioError(f"target {text!r} is not a finite number")
    return value


def target_plan(study: Study, name: str) -> PrecisionPlan:
    """The plan a target's reference names: a stored plan of that name, else a named baseline."""
    plans = study.plans()
    matching = plans[plans["name"] == name]
    if len(matching) > 1:
        raise MpstudioError(f"several plans are named {name!r} (ids {', '.join(map(str, matching['plan_id']))}); "
                            "give the target as a number, or name a plan that is unique")
    if len(matching) == 1:
        return study.plan(int(matching["plan_id"].iloc[0]))
    return named_baselines()[name]


def meets(value: float, threshold: float, higher_is_better: bool) -> bool:
    return value >= threshold if higher_is_better else value <= threshold


@dataclass(frozen=True)
class SearchResult:
    """What a search found. `path` is every evaluation it used, in order (baselines first).

    When the target is missed, `recommended` is the closest plan (`closest_plan`: no evaluated plan is more
    accurate). `alternatives` are plans of the search's front that are much better for little more latency
    than the recommended one (`better_for_little_more`). `float_value` is the float model's own value of the
    metric (None for output SNR).
    """

    search_id: int
    target: str
    threshold: float
    metric: str
    higher_is_better: bool
    reached: bool
    stop_reason: str
    recommended: Evaluation
    baselines: dict
    path: tuple
    new_evaluations: int
    order: tuple = ()  # the promotion order the walk used
    promoted: int = 0  # how many tensors of the order the recommended plan promotes
    float_value: float | None = None
    alternatives: tuple = ()  # of Evaluation, by estimated latency
    confirmations: tuple = ()  # of Confirmation, in the order they ran
    confirm_note: str = ""  # why the front was not confirmed (empty when it was, or was not asked for)
    walk_pick: Evaluation | None = None  # the walk's own pick, when the confirmation changed the recommendation

    @property
    def confirmed(self) -> bool:
        return bool(self.confirmations)

    @property
    def disagreements(self) -> list[str]:
        """Where the walk's backend and the confirming one disagree, in words (see `disagreements`)."""
        return disagreements(self.confirmations, self.threshold, self.higher_is_better)

    @property
    def evaluations(self) -> int:
        return len(self.path)

    @property
    def gap(self) -> float:
        """How far the recommended plan is from the threshold (positive = better than needed)."""
        sign = 1.0 if self.higher_is_better else -1.0
        return sign * (self.recommended.value - self.threshold)

    @property
    def misses_by(self) -> float | None:
        """How much worse than the threshold the recommended plan is (None when it reaches it)."""
        return None if self.gap >= 0 else -self.gap

    def latency_ratio(self, baseline: str = "a16w8", source: str = "estimate") -> float | None:
        mine, theirs = self.recommended.latency(source), self.baselines[baseline].latency(source)
        return mine.ms / theirs.ms if mine and theirs and theirs.ms > 0 else None

    def to_json(self) -> dict:
        base_ms = _estimate_ms(self.recommended)
        return {"search_id": self.search_id, "target": self.target, "threshold": self.threshold,
                "metric": self.metric, "reached": self.reached, "stop_reason": self.stop_reason,
                "recommended_plan_id": self.recommended.plan_id, "recommended_name": self.recommended.name,
                "recommended_value": self.recommended.value, "misses_by": self.misses_by,
                "float_value": self.float_value,
                "promoted": self.promoted, "evaluations": self.evaluations, "new_evaluations": self.new_evaluations,
                "path": [e.plan_id for e in self.path],
                "alternatives": [{"plan_id": e.plan_id, "name": e.name, "value": e.value,
                                  "estimate_ms": _estimate_ms(e), "more_ms": _estimate_ms(e) - base_ms}
                                 for e in self.alternatives],
                "confirmations": [c.to_json(self.threshold, self.higher_is_better) for c in self.confirmations],
                "confirm_note": self.confirm_note, "disagreements": self.disagreements,
                "walk_pick_plan_id": self.walk_pick.plan_id if self.walk_pick is not None else None}

    def describe(self) -> str:
        r = self.recommended
        est = r.latency("estimate")
        lines = [
            f"target: {self.metric} {'>=' if self.higher_is_better else '<='} {self.threshold:.4f} ({self.target})",
            "baselines: " + "; ".join(f"{k} {v.value:.4f}" + (f" at {v.latency('estimate').ms:.3f} ms estimated"
                                                             if v.latency("estimate") else "")
                                      for k, v in self.baselines.items()),
        ]
        if self.float_value is not None:
            lines.append(f"float model (ORT CPU): {self.metric} {self.float_value:.4f}")
        where = f" on {r.accuracy_source}" if self.confirmed else ""
        lines.append(f"{'reached' if self.reached else 'NOT reached'}{where} ({self.stop_reason}) with "
                     f"{self.evaluations} evaluations ({self.new_evaluations} new)"
                     + (f" and {len(self.confirmations)} confirming ones" if self.confirmed else ""))
        if self.confirmed:
            lines += self._describe_confirmations()
        if self.confirm_note:
            lines.append(self.confirm_note)
        if self.reached:
            lines.append(f"recommended: plan {r.plan_id} {r.name}: {self.metric} {r.value:.4f} [{r.accuracy_source}] "
                         f"({'+' if self.gap >= 0 else ''}{self.gap:.4f} against the threshold)"
                         + (f", {est}" if est else ""))
        else:
            relative = f", {self.misses_by / abs(self.threshold):.1%} of it" if self.threshold else ""
            lines.append(f"recommended (the closest): plan {r.plan_id} {r.name}: {self.metric} {r.value:.4f} "
                         f"[{r.accuracy_source}], misses the threshold by {self.misses_by:.4f}{relative}"
                         + (f"; {est}" if est else ""))
        if self.walk_pick is not None:
            w = self.walk_pick
            lines.append(f"  (the walk on {w.accuracy_source} picked plan {w.plan_id} {w.name}, {self.metric} "
                         f"{w.value:.4f} there)")
        ratio = self.latency_ratio()
        if ratio is not None:
            lines.append(f"estimated latency {ratio:.2f}x of a16w8's")
        if self.alternatives:
            lines.append(f"much better for little more (at most {LITTLE_MORE:.0%} more estimated latency, "
                         + ("at least 3 dB more" if self.float_value is None else
                            f"at most {MUCH_BETTER:.0%} of the distance from the float model's value") + "):")
            base_ms = _estimate_ms(r)
            for e in self.alternatives:
                more = _estimate_ms(e) - base_ms
                lines.append(f"  plan {e.plan_id} {e.name}: {self.metric} {e.value:.4f} [{e.accuracy_source}] for "
                             f"+{more:.3f} ms (+{more / base_ms:.1%}) estimated")
        return "\n".join(lines)

    def _describe_confirmations(self) -> list[str]:
        first = self.confirmations[0]
        walk, confirmed = first.walk.accuracy_source, first.confirmed.accuracy_source
        lines = [f"confirmed on {confirmed} ({len(self.confirmations)} plan(s) of the front, every evaluation "
                 "sample):",
                 f"  {'plan':>6} {'name':<24} {walk[:26]:>26} {confirmed[:26]:>26} {'est. ms':>8}"]
        for c in sorted(self.confirmations, key=lambda c: _estimate_ms(c.walk)):
            cells = []
            for e in (c.walk, c.confirmed):
                ok = meets(e.value, self.threshold, self.higher_is_better)
                cells.append(f"{e.value:.4f} {'reaches' if ok else 'misses'}")
            lines.append(f"  {c.walk.plan_id:>6} {c.walk.name[:24]:<24} {cells[0]:>26} {cells[1]:>26} "
                         f"{_estimate_ms(c.walk):>8.3f}")
        found = self.disagreements
        lines.append("CPU and HTP disagree: " + "; ".join(found) if found else
                     "CPU and HTP agree on these plans (the same ones reach the target, in the same order)")
        return lines


@dataclass(frozen=True)
class Confirmation:
    """One plan of a search's front as the walk scored it (`walk`) and as the confirming backend did."""

    walk: Evaluation
    confirmed: Evaluation

    def to_json(self, threshold: float, higher_is_better: bool) -> dict:
        return {"plan_id": self.walk.plan_id, "name": self.walk.name, "estimate_ms": _estimate_ms(self.walk),
                **{f"{key}_{field}": value for key, e in (("walk", self.walk), ("confirmed", self.confirmed))
                   for field, value in (("source", e.accuracy_source), ("value", e.value),
                                        ("reaches", meets(e.value, threshold, higher_is_better)))}}


def disagreements(confirmations, threshold: float, higher_is_better: bool) -> list[str]:
    """Where two backends disagree over the same plans: a plan that reaches `threshold` on one and not on the
    other, and pairs of plans the two order differently (ties on either side are no disagreement)."""
    found = []
    for c in confirmations:
        walk, confirmed = (meets(e.value, threshold, higher_is_better) for e in (c.walk, c.confirmed))
        if walk != confirmed:
            found.append(f"plan {c.walk.plan_id} {c.walk.name} {'reaches' if walk else 'misses'} the target on "
                         f"{c.walk.accuracy_source} ({c.walk.value:.4f}) and {'reaches' if confirmed else 'misses'} "
                         f"it on {c.confirmed.accuracy_source} ({c.confirmed.value:.4f})")
    sign = 1.0 if higher_is_better else -1.0
    items = list(confirmations)
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            walk = sign * (a.walk.value - b.walk.value)
            confirmed = sign * (a.confirmed.value - b.confirmed.value)
            if walk * confirmed < 0:
                ahead, behind = (a, b) if walk > 0 else (b, a)
                found.append(f"{ahead.walk.accuracy_source} ranks plan {ahead.walk.plan_id} ahead of plan "
                             f"{behind.walk.plan_id}, {ahead.confirmed.accuracy_source} the reverse")
    return found


def _estimate_ms(evaluation: Evaluation) -> float:
    latency = evaluation.latency("estimate")
    return latency.ms if latency is not None else math.inf


def closest_plan(evaluations, higher_is_better: bool, sixteen_bit: dict | None = None,
                 latency_budget_ms: float | None = None) -> Evaluation:
    """The plan to recommend when none reaches the target: the most accurate of `evaluations` (of those within
    the latency budget, when any is); equal values go to fewer 16-bit activation tensors (`sixteen_bit`:
    plan_id -> count), then lower estimated latency, then the earlier evaluation. No evaluated plan is more
    accurate, so none (a baseline such as all-16-bit included) dominates it."""
    pool = list(evaluations)
    if not pool:
        raise MpstudioError("no evaluated plan to recommend")
    if latency_budget_ms is not None:
        pool = [e for e in pool if _estimate_ms(e) <= latency_budget_ms] or pool
    sign = 1.0 if higher_is_better else -1.0
    best = max(sign * e.value for e in pool)
    tied = [e for e in pool if math.isclose(sign * e.value, best, rel_tol=1e-9, abs_tol=1e-12)]
    counts = sixteen_bit or {}
    return min(tied, key=lambda e: (counts.get(e.plan_id, math.inf), _estimate_ms(e)))


def better_for_little_more(recommended: Evaluation, evaluations, higher_is_better: bool,
                           float_value: float | None, *, snr_metric: bool = False,
                           latency_budget_ms: float | None = None) -> list[Evaluation]:
    """Plans on the front of `evaluations` (metric against estimated latency) that are much better than
    `recommended` for little more: an estimated latency no lower than its and at most `LITTLE_MORE` (10 %)
    above it (and within the budget), and a metric value at most `MUCH_BETTER` (half) as far from the float
    model's value as its (a value better than float counts as no distance). For output SNR, which has no
    float value, much better is at least 3 dB more (half the noise power). By estimated latency."""
    base_ms = _estimate_ms(recommended)
    if not math.isfinite(base_ms):
        return []
    unique = list({e.plan_id: e for e in evaluations}.values())
    on_front = pareto_mask([e.value for e in unique], [_estimate_ms(e) for e in unique], higher_is_better)

    def distance(value: float) -> float:
        return max(0.0, (float_value - value) if higher_is_better else (value - float_value))

    out = []
    for e, front in zip(unique, on_front):
        ms = _estimate_ms(e)
        if not front or e.plan_id == recommended.plan_id or not base_ms <= ms <= base_ms * (1 + LITTLE_MORE):
            continue
        if latency_budget_ms is not None and ms > latency_budget_ms:
            continue
        if snr_metric:
            much = e.value - recommended.value >= 10 * math.log10(1 / MUCH_BETTER)
        elif float_value is not None:
            gap = distance(recommended.value)
            much = gap > 0 and distance(e.value) <= MUCH_BETTER * gap and e.value != recommended.value
        else:
            much = False
        if much:
            out.append(e)
    return sorted(out, key=_estimate_ms)


class LineProgress:
    """A `progress(done, total, message)` callback that writes plain lines to stderr: one when a step starts,
    then at most one every `interval` seconds while it runs. What `search()` reports when given no callback."""

    def __init__(self, stream=None, interval: float = 10.0):
        self.stream, self.interval = stream, interval
        self._message, self._last = None, 0.0

    def __call__(self, done: int, total: int, message: str) -> None:
        now = time.monotonic()
        if message == self._message and now - self._last < self.interval:
            return
        self._message, self._last = message, now
        stream = self.stream or sys.stderr
        print(f"mpstudio: {message} ({done}/{total})", file=stream, flush=True)


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
    """Search the study's plans for the cheapest one that reaches `target` (see the module docstring).

    `target`: see `Target` (a number, `float-1%`, `a16w8+10%`, `a16w8-pc+5%`, `<plan name>+2%`).
    `runner` is None (this process), an AgentClient or an AgentPool (one plan per agent per round).
    `weights` is "auto" (try per-channel int8 weights first when they help), "per-tensor", "per-channel", or
    "mixed" (each matrix weight's own precision chosen with the activations: see `_Walk.mixed_order`).
    `sensitivity_samples` calibration samples are scored per tensor and `isolation_samples` of them run per
    isolation evaluation (`Study.sensitivity`); the calibration and evaluation samples are the study's own
    (`Study.create(calibration_samples=..., evaluation_samples=...)`), as every plan of a study is scored on
    the same data. Progress goes to `progress(done, total, message)`, else to stderr as plain lines unless
    `quiet`. When the target is missed, the closest plan is recommended (`closest_plan`); plans much better
    for little more latency are listed either way (`better_for_little_more`).

    `confirm` ("htp", the default, or None): when the walk's `backend` is another one (the CPU reference),
    up to `confirm_plans` plans of its front are evaluated on that backend through `runner` (the local HTP
    emulator, or a device agent) and the recommendation follows their values (see `_Walk.confirm`); the
    result lists where the two disagree. Without an HTP backend (no QNN execution provider here and no
    runner) the search says so and keeps the walk's pick.
    """
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
    goal = Target.parse(target)
    goal.check(study)
    if progress is None and not quiet:
        progress = LineProgress()
    spec = {"target": goal.text, "latency_budget_ms": latency_budget_ms, "max_evaluations": max_evaluations,
            "backend": backend, "weights": weights, "sensitivity_samples": sensitivity_samples}
    # Keys added later only when not their default, so older records of the same search still match.
    for key, value, default in (("isolation_samples", isolation_samples, 8), ("confirm", confirm, "htp"),
                                ("confirm_plans", confirm_plans, CONFIRM_PLANS)):
        if value != default:
            spec[key] = value
    search_id = study.start_search(spec)
    walk = _Walk(study, search_id, backend, runner, max_evaluations, progress, cancel)
    walk.isolation_samples, walk.latency_budget_ms = isolation_samples, latency_budget_ms
    try:
        result = walk.run(goal, latency_budget_ms, weights, sensitivity_samples)
        if confirm is not None and confirm != backend:
            result = walk.confirm(result, confirm, int(confirm_plans))
    except Cancelled:
        study.finish_search(search_id, "cancelled", None)
        raise
    except BaseException:
        study.finish_search(search_id, "failed", None)
        raise
    study.finish_search(search_id, "done", result.to_json())
    return result


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


class _Walk:
    """One search's state: the evaluations it has used and its budget."""

    def __init__(self, study: Study, search_id: int, backend: str, runner, budget: int, progress, cancel):
        self.study, self.search_id, self.backend, self.runner = study, search_id, backend, runner
        self.budget, self.progress, self.cancel = budget, progress, cancel
        self.path: list[Evaluation] = []
        self.new = 0
        self.hib = study.higher_is_better
        # A pool evaluates one plan per healthy agent at a time; anything else is one worker.
        self.workers = (runner.healthy() or [runner]) if hasattr(runner, "healthy") else [runner]

    # ---- evaluations ----
    def left(self) -> int:
        return self.budget - len(self.path)

    def evaluate(self, plans: list[PrecisionPlan]) -> list[Evaluation]:
        """Evaluate `plans` (in parallel over the agents), counted against the budget, stored in the study."""
        self._check_cancel()
        self.study.store.heartbeat(self.search_id)
        with _generate_lock:
            for plan in plans:
                self.study.quantizer.generate(plan, None, self.cancel)
        jobs = [self.study.submit(plan, self.backend, origin=f"search {self.search_id}", search_id=self.search_id)
                for plan in plans]

        def one(args):
            job_id, worker = args
            return self.study.run_job(job_id, worker if self.runner is not None else None, cancel=self.cancel)

        pairs = [(job, self.workers[i % len(self.workers)]) for i, job in enumerate(jobs)]
        if len(pairs) > 1 and len(self.workers) > 1:
            with ThreadPoolExecutor(len(self.workers)) as pool:
                results = list(pool.map(one, pairs))
        else:
            results = [one(p) for p in pairs]
        for evaluation in results:
            self.path.append(evaluation)
            self.new += 0 if evaluation.cached else 1
            if self.progress:
                self.progress(len(self.path), self.budget, f"search: {evaluation.name} {evaluation.metric} "
                                                           f"{evaluation.value:.4f}")
        return results

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(f"search cancelled after {len(self.path)} evaluations; rerun it to continue")

    # ---- the walk ----
    def run(self, goal: Target, latency_budget_ms, weights, sensitivity_samples) -> SearchResult:
        a8, a16 = self.evaluate([PrecisionPlan.a8w8(), PrecisionPlan.a16w8()])
        self.baselines = {"a8w8": a8, "a16w8": a16}
        self.goal, self.threshold = goal, goal.threshold(self._target_references(goal), self.hib)
        base_plan, base = self._base(weights)
        # Promotions are ranked against the plan they start from (one analysis, of that plan): per-channel
        # weights remove most of a model's error, and what is left sits in other tensors than all-8-bit's worst.
        # The mixed walk starts from int4 weights and ranks on the all-8-bit analysis.
        analysed = None if weights == "mixed" or base_plan.hash == PrecisionPlan.a8w8().hash else base_plan
        report = self.study.sensitivity(samples=sensitivity_samples, isolation_samples=self.isolation_samples,
                                        progress=self.progress, cancel=self.cancel, plan=analysed)
        if self._meets(base):
            return self._result(base, 0, "the base plan already reaches the target")
        steps = None
        if weights == "mixed":
            order, predicted, steps = self.mixed_order(report, base_plan, base, sensitivity_samples)
        else:
            order, predicted = self._order(report, base_plan)
        if not order:
            return self._result(self._best_meeting() or base, 0, "no activation tensor is predicted to help")
        plans = {0: base_plan}

        def plan_k(k: int) -> PrecisionPlan:
            if k not in plans:
                name = f"{base_plan.name}+{k}"
                plans[k] = (apply_steps(base_plan, steps[:k], name) if steps is not None
                            else base_plan.promote(order[:k], name=f"{base_plan.name}+{k}x16"))
            return plans[k]

        hi = len(order)
        if latency_budget_ms is not None:
            hi = self._latency_cap(plan_k, hi, latency_budget_ms)
            if hi == 0:
                return self._result(base, 0, f"no promotion fits the latency budget of {latency_budget_ms} ms")
        known: dict[int, Evaluation] = {0: base}
        if base is a8 and hi == len(order) and set(order) >= set(self.study.graph.activations()):
            known[hi] = a16  # every activation at 16 bits is the a16w8 baseline, already evaluated
        guess = self._guess(predicted, known, self.baselines, self.threshold, hi)
        hi_k, reason = self._narrow(plan_k, known, guess, hi)
        return self._conclude(known, hi_k, reason, order, base)

    def _base(self, weights: str) -> tuple[PrecisionPlan, Evaluation]:
        """The plan promotions start from: a8w8, or per-channel int8 weights when they help (or are asked for),
        judged by the weights' own quantization scores (no sensitivity analysis needed)."""
        from .sensitivity.scores import weight_scores

        a8 = self.baselines["a8w8"]
        per_channel = PrecisionPlan(activation_type="uint8", weight_type="int8", per_channel=True, name="a8w8-pc")
        if weights == "mixed":
            plan = mixed_base(self.study.graph, self.study.htp_arch)
            (evaluation,) = self.evaluate([plan])
            return plan, evaluation
        gain_db = 0.0
        if weights == "auto":
            scores = weight_scores(self.study.quantizer.prepared.model, self.study.graph, cancel=self.cancel)
            gain_db = float(np.nanmedian(scores["per_channel_gain_8"])) if len(scores) else 0.0
        if weights == "per-channel" or (weights == "auto" and gain_db >= PER_CHANNEL_GAIN_DB):
            (pc,) = self.evaluate([per_channel])
            if weights == "per-channel" or self._better(pc.value, a8.value):
                return per_channel, pc
        return PrecisionPlan.a8w8(), a8

    def _narrow(self, plan_k, known: dict[int, Evaluation], guess: int, hi: int) -> tuple[int | None, str]:
        """Evaluate prefixes until the smallest k that reaches the target is pinned down or the budget ends:
        (that k or None, why it stopped)."""
        lo_k = 0  # largest k known to miss the target
        # The smallest k known to reach it.
        hi_k: int | None = hi if hi in known and self._meets(known[hi]) else None
        candidates = ([guess] if guess < hi else []) + [hi]
        while self.left() > 0:
            batch = sorted({k for k in candidates if k not in known and lo_k < k and (hi_k is None or k < hi_k)})
            batch = batch[:max(1, min(len(self.workers), self.left()))]
            if not batch:
                return hi_k, "target reached" if hi_k is not None else "the cheapest promotion set was narrowed down"
            for k, evaluation in zip(batch, self.evaluate([plan_k(k) for k in batch])):
                known[k] = evaluation
                if self._meets(evaluation):
                    hi_k = k if hi_k is None else min(hi_k, k)
                else:
                    lo_k = max(lo_k, k)
            if hi_k is None:
                if hi in known and not self._meets(known[hi]):
                    return None, "promoting every helpful tensor does not reach the target"
                candidates = [hi]
            elif hi_k - lo_k <= 1:
                return hi_k, "target reached"
            else:
                candidates = _sections(lo_k, hi_k, len(self.workers))
        return hi_k, "evaluation budget"

    def _conclude(self, known: dict[int, Evaluation], hi_k: int | None, reason: str, order, base) -> SearchResult:
        """The recommendation once the walk has stopped."""
        if hi_k is not None:
            if reason == "evaluation budget":
                reason = "evaluation budget (target reached, not narrowed down)"
            best = self._best_meeting()
            if best is not None and best.plan_id != known[hi_k].plan_id:
                # Converts can make a few 16-bit tensors cost more than all of them (small models): a
                # cheaper plan that also reaches the target wins.
                return self._result(best, 0 if best is base else hi_k,
                                    reason + "; a cheaper evaluated plan also reaches it", order)
            return self._result(known[hi_k], hi_k, reason, order)
        best = self._best_meeting()
        if best is not None:  # only a baseline reaches the target
            return self._result(best, len(order) if best.name == "a16w8" else 0, reason + "; a baseline reaches it",
                                order)
        best_k = max(known, key=lambda k: known[k].value if self.hib else -known[k].value)
        return self._result(known[best_k], best_k, reason, order)

    def _result(self, best: Evaluation, k: int, reason: str, order=()) -> SearchResult:
        if not self._meets(best):
            # Missed: the closest evaluated plan, never one another evaluated plan (e.g. a16w8) beats.
            closest = closest_plan(self.path, self.hib, self._sixteen_bit(), self.latency_budget_ms)
            if closest.plan_id != best.plan_id:
                best, k = closest, self._promoted(closest, order)
        float_value = self._float_value()
        alternatives = better_for_little_more(best, self.path, self.hib, float_value,
                                              snr_metric=self.study.metric_spec.kind == "output",
                                              latency_budget_ms=self.latency_budget_ms)
        return SearchResult(self.search_id, self.goal.text, self.threshold, self.study.metric_name, self.hib,
                            self._meets(best), reason, best, self.baselines, tuple(self.path), self.new,
                            tuple(order), k, float_value, tuple(alternatives))

    # ---- confirmation on the HTP ----
    def confirm(self, result: SearchResult, backend: str, max_plans: int) -> SearchResult:
        """`result` with the front around its pick evaluated on `backend` too, and recommended on its numbers.

        From the walk's pick along the front of the walk's evaluations (value against estimated latency):
        when the pick reaches the target on `backend`, the next cheaper plans while they reach it too (the
        walk's backend may have been pessimistic); when it misses, the next dearer ones until one reaches it;
        at most `max_plans` evaluations. The recommendation is then the cheapest confirmed plan that reaches
        the target on `backend` (fewer 16-bit tensors, then the better value, on a tie), else the closest.
        """
        if self.runner is None and backend == "htp":
            from .runtime import register_qnn

            try:
                register_qnn()
            except MpstudioError as exc:
                return replace(result, confirm_note=f"not confirmed on the HTP: {exc} (search with --backend htp "
                                                    "or an --agent, or pass confirm=None to skip this step)")
        unique = list({e.plan_id: e for e in self.path}.values())
        on_front = pareto_mask([e.value for e in unique], [_estimate_ms(e) for e in unique], self.hib)
        front = [e for e, keep in zip(unique, on_front) if keep]
        if all(e.plan_id != result.recommended.plan_id for e in front):
            front.append(result.recommended)
        front.sort(key=lambda e: (_estimate_ms(e), e.plan_id))
        at = next(i for i, e in enumerate(front) if e.plan_id == result.recommended.plan_id)
        done: list[Confirmation] = []

        def check(e: Evaluation) -> bool:
            self._check_cancel()
            job = self.study.submit(self.study.plan(e.plan_id), backend, origin=f"search {self.search_id} confirm",
                                    search_id=self.search_id)
            confirmed = self.study.run_job(job, self.runner, progress=self.progress, cancel=self.cancel)
            done.append(Confirmation(e, confirmed))
            if self.progress:
                self.progress(len(done), max_plans, f"search: confirmed {e.name} on {confirmed.accuracy_source}: "
                                                    f"{confirmed.metric} {confirmed.value:.4f} (walk {e.value:.4f})")
            return self._meets(confirmed)

        failure = ""
        try:
            step = -1 if check(front[at]) else 1
            i = at + step
            while 0 <= i < len(front) and len(done) < max_plans:
                if check(front[i]) != (step == -1):
                    break  # a cheaper one misses, or a dearer one reaches it: the edge is found
                i += step
        except MpstudioError as exc:  # the walk's result stands; what was confirmed before the failure counts
            failure = (f"the confirmation on the HTP stopped after {len(done)} plan(s): {exc} (rerun the search to "
                       "continue it; --no-confirm skips it)")
        if not done:
            return replace(result, confirm_note=failure)
        sixteen = self._sixteen_bit()
        sign = -1.0 if self.hib else 1.0
        reaching = [c for c in done if self._meets(c.confirmed)]
        if reaching:
            pick = min(reaching, key=lambda c: (_estimate_ms(c.walk), sixteen.get(c.walk.plan_id, math.inf),
                                                sign * c.confirmed.value)).confirmed
        else:
            pick = closest_plan([c.confirmed for c in done], self.hib, sixteen, self.latency_budget_ms)
        changed = pick.plan_id != result.recommended.plan_id
        reason = result.stop_reason + ("; the HTP confirmation moved the pick" if changed else "")
        alternatives = result.alternatives
        if changed:  # against the new pick, on the confirming backend's numbers
            alternatives = tuple(better_for_little_more(
                pick, [c.confirmed for c in done], self.hib, result.float_value,
                snr_metric=self.study.metric_spec.kind == "output", latency_budget_ms=self.latency_budget_ms))
        return replace(result, recommended=pick, reached=self._meets(pick), stop_reason=reason,
                       alternatives=alternatives, confirm_note=failure,
                       promoted=self._promoted(pick, result.order) if changed else result.promoted,
                       confirmations=tuple(done), walk_pick=result.recommended if changed else None)

    # ---- targets and recommendations (beside the walk) ----
    isolation_samples = 8
    latency_budget_ms: float | None = None
    _float = None

    def _float_value(self) -> float | None:
        if self._float is None and self.study.metric_spec.kind != "output":
            self._float = self.study.float_value(self.progress, self.cancel)
        return self._float

    def _target_references(self, goal: Target) -> dict:
        """The values a target may be relative to: the baselines, and the one the target names."""
        references = dict(self.baselines)
        name = goal.baseline
        if name is None or name in references:
            return references
        if name == "float":
            references["float"] = self._float_value()
        else:
            (references[name],) = self.evaluate([target_plan(self.study, name)])
        return references

    def _sixteen_bit(self) -> dict:
        plans = self.study.plans()
        return dict(zip(plans["plan_id"].astype(int), plans["sixteen_bit"].astype(int)))

    def _promoted(self, evaluation: Evaluation, order) -> int:
        """How many tensors of the promotion order an evaluated plan promotes."""
        plan = self.study.plan(evaluation.plan_id)
        if plan.activation_type == "uint16":
            return len(order)
        ordered = set(order)
        return sum(1 for tensor in plan.overrides if tensor in ordered)

    def _meets(self, evaluation: Evaluation) -> bool:
        return meets(evaluation.value, self.threshold, self.hib)

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.hib else a < b

    def _best_meeting(self):
        """The evaluated plan that reaches the threshold at the lowest estimated latency (then the best value)."""
        meeting = [e for e in self.path if self._meets(e)]
        sign = -1.0 if self.hib else 1.0
        return min(meeting, key=lambda e: (e.latency("estimate").ms if e.latency("estimate") else math.inf,
                                           sign * e.value), default=None)

    def _order(self, report, base_plan: PrecisionPlan) -> tuple[list[str], list[float]]:
        """Tensors by predicted gain per estimated latency cost, and the predicted output SNR of each prefix."""
        from .latency import promotion_costs

        if report.isolation is None:
            raise MpstudioError("the search needs isolation scores; analyze with isolation enabled")
        iso = report.isolation
        per = iso.per_tensor()
        if iso.metric.startswith("output SNR"):
            noise_8, noise_16 = 10 ** (-iso.all_8 / 10), 10 ** (-iso.all_16 / 10)
            # What a tensor's 8 bits cost, seen from both ends: the noise its promotion removes from the
            # all-8-bit plan, and the noise its demotion adds to the all-16-bit plan. Near a 16-bit-like
            # target the second is the telling one (isolated promotions hide behind other bottlenecks).
            removed = noise_8 - 10 ** (-per["promoted"].astype(float) / 10)
            added = 10 ** (-per["demoted"].astype(float) / 10) - noise_16
            contribution = np.maximum(removed, added)
        else:
            noise_8 = None
            contribution = np.maximum(per["promoted_gain"].astype(float), per["demoted_loss"].astype(float))
        contribution = contribution[contribution > 0]
        if contribution.empty:
            return [], []
        with _generate_lock:
            model = self.study.quantizer.generate(base_plan)
        costs = promotion_costs(model, list(contribution.index), self.study.htp_arch, graph=self.study.graph)
        costs = costs.reindex(contribution.index).fillna(costs.median() if len(costs) else 1.0)
        floor = max(float(costs[costs > 0].min()) if (costs > 0).any() else 1e-6, 1e-6)
        score = contribution / costs.clip(lower=floor)
        order = list(score.sort_values(ascending=False).index)
        predicted = []
        if noise_8 is not None:
            # Noise powers add: the all-8-bit noise less what each promoted tensor contributes.
            noise = noise_8
            for t in order:
                noise = max(noise - float(contribution[t]), noise_16)
                predicted.append(-10 * math.log10(noise))
        return order, predicted

    def mixed_order(self, report, base_plan: PrecisionPlan, base: Evaluation, samples: int):
        """Activation promotions and weight steps (int4 -> int8, int8 -> int16) in one order, by predicted noise
        removed per estimated ms; the predicted output SNR of each prefix; and each step's overrides.

        Noise powers (relative to the output's power) add: an activation's share is its isolation score (as
        in `_order`), a weight's is measured at the outputs with that weight alone quantized
        (`weight_isolation`), so both are priced in the same unit. A 16-bit weight also promotes the output of
        its op (HTP computes 16-bit weights only at 16 bits); its cost includes that promotion.
        """
        from .latency import promotion_costs, weight_costs
        from .plan import MIN_ARCH_16BIT_WEIGHTS, TensorOverride
        from .sensitivity.weight_isolation import WIDTH_TYPES

        iso = report.isolation
        if iso is None or not iso.metric.startswith("output SNR"):
            raise MpstudioError("the mixed weight search needs output-SNR isolation scores; analyze with isolation "
                                "enabled and no task metric")
        graph = self.study.graph
        per = iso.per_tensor()
        noise_8 = 10 ** (-iso.all_8 / 10)
        removed = noise_8 - 10 ** (-per["promoted"].astype(float) / 10)
        added = 10 ** (-per["demoted"].astype(float) / 10) - 10 ** (-iso.all_16 / 10)
        act_gain = np.maximum(removed, added)
        act_gain = act_gain[act_gain > 0]
        weights = self._weight_isolation(samples)
        with _generate_lock:
            model = self.study.quantizer.generate(base_plan)
        wide_ok = int(self.study.htp_arch or 75) >= MIN_ARCH_16BIT_WEIGHTS
        outputs = {w: _op_output(graph, w) for w in weights.index}
        activations = set(act_gain.index) | {t for t in outputs.values() if t}
        act_cost = promotion_costs(model, sorted(activations), self.study.htp_arch, graph=graph)
        act_cost = act_cost.fillna(act_cost.median() if act_cost.notna().any() else 0.0)
        cost_8 = weight_costs(model, {w: "int8" for w in weights.index}, self.study.htp_arch)
        cost_16 = weight_costs(model, {w: "int16" for w in weights.index}, self.study.htp_arch, "uint16")
        noise = {bits: 10 ** (-weights[f"output_snr_{bits}"].astype(float) / 10) for bits in (4, 8, 16)}
        candidates = []  # (label, gain, cost, overrides)
        for t, gain in act_gain.items():
            candidates.append((t, float(gain), float(act_cost.get(t, 0.0)), {t: TensorOverride("uint16")}))
        for w in weights.index:
            if base_plan.overrides.get(w) is None or base_plan.overrides[w].type != "int4":
                continue
            candidates.append((f"{w}:{WIDTH_TYPES[8]}", float(noise[4][w] - noise[8][w]), float(cost_8.get(w, 0.0)),
                               {w: TensorOverride("int8", per_channel=True)}))
            out = outputs[w]
            if wide_ok and out:
                step = {w: TensorOverride("int16", per_channel=True), out: TensorOverride("uint16")}
                cost = float(np.nan_to_num(cost_8.get(w, 0.0)) + np.nan_to_num(cost_16.get(w, 0.0))
                             + act_cost.get(out, 0.0))
                # Ranked as the jump from int4 (it makes the int8 step redundant); its gain after an int8
                # step is the rest, as the prediction below counts it.
                candidates.append((f"{w}:{WIDTH_TYPES[16]}", float(noise[4][w] - noise[16][w]), cost, step))
        if not candidates:
            return [], [], []
        costs = np.array([c[2] for c in candidates], dtype=float)
        costs = np.nan_to_num(costs, nan=float(np.nanmedian(costs)) if np.isfinite(costs).any() else 1.0)
        positive = costs[costs > 0]
        floor = max(float(positive.min()) if positive.size else 1e-6, 1e-6)
        pending = {c[0]: [c[1], max(float(cost), floor), c[3]] for c, cost in zip(candidates, costs)}
        order, steps, predicted = [], [], []
        level = 10 ** (-base.snr_db / 10) if base.snr_db is not None else noise_8
        # Shares measured one at a time overstate what they remove from a plan whose outputs are already
        # swamped (int4 everywhere): the prediction scales them to remove at most the base's noise.
        total = sum(max(c[1], 0.0) for c in candidates)
        shrink = min(1.0, 0.99 * level / total) if total > 0 else 1.0
        # Greedy, re-ranked as steps are taken: after a weight's int8 step its int16 step only removes the
        # rest (int8 noise less int16 noise); an int16 step taken first makes the int8 step redundant.
        while pending:
            label = max(pending, key=lambda k: (pending[k][0] / pending[k][1], -len(order)))
            gain, _, overrides = pending.pop(label)
            if gain <= 0:
                break
            tensor, _, kind = label.partition(":")
            if kind == "int8" and f"{tensor}:int16" in pending:
                pending[f"{tensor}:int16"][0] = float(noise[8][tensor] - noise[16][tensor])
            elif kind == "int16":
                pending.pop(f"{tensor}:int8", None)
            order.append(label)
            steps.append(overrides)
            level = max(level - shrink * gain, 1e-12)
            predicted.append(-10 * math.log10(level))
        return order, predicted, steps

    def _weight_isolation(self, samples: int) -> pd.DataFrame:
        """`weight_isolation` on the first calibration samples, computed once per study and sample count."""
        from .sensitivity.weight_isolation import weight_isolation

        n = max(1, min(8, samples))
        path = self.study.folder / "sensitivity" / f"weight-isolation-{n}.csv"
        if path.exists():
            return pd.read_csv(path).set_index("tensor")
        frame = weight_isolation(self.study.quantizer.float_path, self.study.graph, self.study.calibration.head(n),
                                 progress=self.progress, cancel=self.cancel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(path)
        return frame.set_index("tensor")

    def _latency_cap(self, plan_k, hi: int, budget: float) -> int:
        """The largest k whose estimated latency fits `budget` (bisection on the cost model, no evaluation)."""
        def fits(k):
            with _generate_lock:
                latency = self.study.estimate(plan_k(k))
            return latency is not None and latency.ms <= budget
        if fits(hi):
            return hi
        lo, top = 0, hi
        while top - lo > 1:
            mid = (lo + top) // 2
            if fits(mid):
                lo = mid
            else:
                top = mid
        return lo

    def _guess(self, predicted: list[float], known, baselines, threshold: float, hi: int) -> int:
        """A first k from the isolation prediction: the output SNR at which the metric crosses the threshold is
        interpolated between the base and a16w8 (both measured), then the smallest prefix predicted to get there."""
        if not predicted:
            return max(1, hi // 4)
        base, a16 = known[0], baselines["a16w8"]
        if base.snr_db is None or a16.snr_db is None or a16.snr_db <= base.snr_db or a16.value == base.value:
            needed = predicted[-1]
        else:
            frac = (threshold - base.value) / (a16.value - base.value)
            needed = base.snr_db + min(max(frac, 0.0), 1.5) * (a16.snr_db - base.snr_db)
        for k, snr in enumerate(predicted[:hi], start=1):
            if snr >= needed:
                return k
        return hi


def mixed_base(graph, htp_arch=None) -> PrecisionPlan:
    """The plan a mixed weight search starts from: 8-bit activations, int8 per-channel weights, and int4
    per-channel on every weight of a Conv, ConvTranspose, MatMul or Gemm."""
    from .plan import TensorOverride
    from .sensitivity.weight_isolation import matrix_weights

    base = PrecisionPlan(activation_type="uint8", weight_type="int8", per_channel=True)
    return base.with_overrides({w: TensorOverride("int4", per_channel=True) for w in matrix_weights(graph)},
                               name="a8w4-pc")


def apply_steps(base: PrecisionPlan, steps, name: str = "") -> PrecisionPlan:
    """`base` with the overrides of `steps` (a list of {tensor: TensorOverride}) applied in order; a tensor
    keeps the widest type any step gives it."""
    from .qdq import INTEGER_TYPES

    bits = {n: b for n, b, _ in INTEGER_TYPES.values()}
    merged: dict = {}
    for step in steps:
        for tensor, override in step.items():
            old = merged.get(tensor)
            if old is None or bits.get(override.type, 0) >= bits.get(old.type, 0):
                merged[tensor] = override
    return base.with_overrides(merged, name=name)


def _op_output(graph, weight: str) -> str | None:
    """The activation to promote with a 16-bit `weight`: its op's output, or the Relu/Clip ORT folds into it."""
    info = graph.tensors.get(weight)
    if info is None or not info.consumers:
        return None
    node = graph.nodes[info.consumers[0]]
    out = graph.tensors.get(node.outputs[0]) if node.outputs else None
    if out is None:
        return None
    if len(out.consumers) == 1 and graph.nodes[out.consumers[0]].op_type in ("Relu", "Clip"):
        after = graph.nodes[out.consumers[0]]
        if after.outputs and after.outputs[0] in graph.tensors:
            return after.outputs[0]
    return out.name if out.is_activation and out.quantizable else None


def _sections(lo: int, hi: int, parts: int) -> list[int]:
    """`parts` points splitting (lo, hi) evenly (bisection for one part)."""
    points = {lo + max(1, round((hi - lo) * (i + 1) / (parts + 1))) for i in range(parts)}
    return sorted(k for k in points if lo < k < hi) or [(lo + hi) // 2]


def path_frame(result: SearchResult) -> pd.DataFrame:
    """The search's evaluations as a table: plan_id, name, value, estimate_ms, meets."""
    rows = []
    for e in result.path:
        est = e.latency("estimate")
        rows.append({"plan_id": e.plan_id, "name": e.name, "value": e.value,
                     "estimate_ms": est.ms if est else np.nan,
                     "meets": meets(e.value, result.threshold, result.higher_is_better)})
    return pd.DataFrame(rows)


__all__ = ["search", "resume", "resume_searches", "Target", "SearchResult", "Confirmation", "disagreements", "meets", "path_frame", "closest_plan",
           "better_for_little_more", "named_baselines", "target_plan", "LineProgress", "LITTLE_MORE", "MUCH_BETTER"]
