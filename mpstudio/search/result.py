"""What a search found (`SearchResult`), the plans it confirmed on a second backend (`Confirmation`) and where
the two backends disagree, in words and as a table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..store import Evaluation
from ..value_text import step_text, value_text
from .recommend import LITTLE_MORE, MUCH_BETTER, estimate_ms
from .targets import meets


@dataclass(frozen=True)
class SearchResult:
    """What a search found. `path` is every evaluation it used, in order (baselines first).

    `recommended` is chosen over every plan the study holds (`choice.choose`): the cheapest that reaches the
    target, else the most accurate within the budget, never a dominated plan. `alternatives` are plans of the search's front that are much better for little more latency
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
    # Why the front was not confirmed, or what the confirmation's budget left out (empty when nothing is to be said)
    confirm_note: str = ""
    walk_pick: Evaluation | None = None  # the walk's own pick, when the confirmation changed the recommendation
    considered: tuple = ()  # of choice.Considered: every stored plan the recommendation chose among
    choice: str = ""  # why the recommended plan, in words
    weights_note: str = ""  # which weight form the walk started from, and why
    order_note: str = ""  # which tensors the promotion order puts first whatever the analysis says, and why
    skipped: tuple = ()  # of (k, plan_id, name): prefixes not evaluated, and the stored plan that made each pointless
    unbuildable: tuple = ()  # of loop.build_failures.BuildFailure: plans the confirming backend could not build
    # What the recommended plan's value says of the target: "reaches", "misses" or "within noise" (it meets or
    # misses the threshold by less than the metric's resolution or its interval: `evidence.TargetEvidence`).
    verdict: str = ""

    @property
    def within_noise(self) -> bool:
        return self.verdict == "within noise"

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
        base_ms = estimate_ms(self.recommended)
        return {"search_id": self.search_id, "target": self.target, "threshold": self.threshold,
                "metric": self.metric, "reached": self.reached, "stop_reason": self.stop_reason,
                "recommended_plan_id": self.recommended.plan_id, "recommended_name": self.recommended.name,
                "recommended_value": self.recommended.value, "misses_by": self.misses_by,
                "verdict": self.verdict or ("reaches" if self.reached else "misses"),
                "recommended_interval": ([self.recommended.low, self.recommended.high]
                                         if self.recommended.low is not None else None),
                "resolution": self.recommended.resolution,
                "float_value": self.float_value,
                "promoted": self.promoted, "evaluations": self.evaluations, "new_evaluations": self.new_evaluations,
                "path": [e.plan_id for e in self.path],
                "alternatives": [{"plan_id": e.plan_id, "name": e.name, "value": e.value,
                                  "estimate_ms": estimate_ms(e), "more_ms": estimate_ms(e) - base_ms}
                                 for e in self.alternatives],
                "confirmations": [c.to_json(self.threshold, self.higher_is_better) for c in self.confirmations],
                "confirm_note": self.confirm_note, "disagreements": self.disagreements,
                "walk_pick_plan_id": self.walk_pick.plan_id if self.walk_pick is not None else None,
                "choice": self.choice, "considered": [c.to_json() for c in self.considered],
                "weights": self.weights_note, "order_note": self.order_note,
                "skipped": [{"promoted": k, "because_plan_id": plan_id, "because_name": name}
                            for k, plan_id, name in self.skipped],
                "unbuildable": [f.to_json() for f in self.unbuildable]}

    def describe(self) -> str:
        r = self.recommended
        est = r.latency("estimate")
        lines = [
            f"target: {self.metric} {'>=' if self.higher_is_better else '<='} {value_text(self.threshold)} "
            f"({self.target})",
            "baselines: " + "; ".join(f"{k} {value_text(v.value)}" + (f" at {v.latency('estimate').ms:.3f} ms estimated"
                                                             if v.latency("estimate") else "")
                                      for k, v in self.baselines.items()),
        ]
        if self.float_value is not None:
            lines.append(f"float model (ORT CPU): {self.metric} {value_text(self.float_value)}")
        if self.weights_note:
            lines.append(f"weights: {self.weights_note}")
        if self.order_note:
            lines.append(f"order: {self.order_note}")
        where = f" on {r.accuracy_source}" if self.confirmed else ""
        status = ("within noise of the target" if self.within_noise else
                  "reached" if self.reached else "NOT reached")
        lines.append(f"{status}{where} ({self.stop_reason}) with "
                     f"{self.evaluations} evaluations ({self.new_evaluations} new)"
                     + (f" and {len(self.confirmations)} confirming ones" if self.confirmed else ""))
        if self.confirmed:
            lines += self._describe_confirmations()
        lines += [f"cannot build on {f.where}: plan {f.plan_id} {f.name}: {f.reason}" for f in self.unbuildable]
        if self.confirm_note:
            lines.append(self.confirm_note)
        if self.reached or self.misses_by is None:  # reaches, or meets it within noise
            lines.append(f"recommended: plan {r.plan_id} {r.name}: {self.metric} {value_text(r.value)}"
                         f"{r.interval_text()} [{r.accuracy_source}] ({value_text(self.gap, sign=True)} against the "
                         "threshold"
                         f"{self._noise_note()})" + (f", {est}" if est else ""))
        else:
            relative = f", {self.misses_by / abs(self.threshold):.1%} of it" if self.threshold else ""
            label = "within noise of the target" if self.within_noise else "the closest"
            lines.append(f"recommended ({label}): plan {r.plan_id} {r.name}: {self.metric} {value_text(r.value)}"
                         f"{r.interval_text()} [{r.accuracy_source}], misses the threshold by "
                         f"{value_text(self.misses_by)}"
                         f"{relative}{self._noise_note()}" + (f"; {est}" if est else ""))
        if self.walk_pick is not None:
            w = self.walk_pick
            lines.append(f"  (the walk on {w.accuracy_source} picked plan {w.plan_id} {w.name}, {self.metric} "
                         f"{value_text(w.value)} there)")
        lines += self._describe_choice()
        ratio = self.latency_ratio()
        if ratio is not None:
            lines.append(f"estimated latency {ratio:.2f}x of a16w8's")
        if self.alternatives:
            lines.append(f"much better for little more (at most {LITTLE_MORE:.0%} more estimated latency, "
                         + ("at least 3 dB more" if self.float_value is None else
                            f"at most {MUCH_BETTER:.0%} of the distance from the float model's value") + "):")
            base_ms = estimate_ms(r)
            for e in self.alternatives:
                more = estimate_ms(e) - base_ms
                lines.append(f"  plan {e.plan_id} {e.name}: {self.metric} {value_text(e.value)} "
                             f"[{e.accuracy_source}] for "
                             f"+{more:.3f} ms (+{more / base_ms:.1%}) estimated")
        return "\n".join(lines)

    def _noise_note(self) -> str:
        if not self.within_noise:
            return ""
        step = self.recommended.resolution
        return ("; within noise: " + (f"less than one step of the metric ({step_text(step)}) or " if step else "")
                + "inside the interval, so neither clearly reached nor clearly missed")

    def _describe_choice(self) -> list[str]:
        if not self.considered:
            return []
        lines = [f"why: {self.choice}"]
        for c in self.considered:
            ms = f"{c.estimate_ms:.3f} ms" if np.isfinite(c.estimate_ms) else "no estimate"
            spread = f"[{value_text(c.low)}, {value_text(c.high)}]" if c.low is not None and c.high is not None else ""
            lines.append(f"  plan {c.plan_id:>4} {c.name[:28]:<28} {self.metric} {value_text(c.value)} {spread:>18} "
                         f"{ms:>10}  {c.verdict}")
        if self.skipped:
            lines.append("not evaluated (a stored plan as good for no more estimated latency, as far as the cost model "
                         "resolves): "
                         + ", ".join(f"{k} promoted (plan {plan_id} {name})" for k, plan_id, name in self.skipped))
        return lines

    def _describe_confirmations(self) -> list[str]:
        first = self.confirmations[0]
        walk, confirmed = first.walk.accuracy_source, first.confirmed.accuracy_source
        lines = [f"confirmed on {confirmed} ({len(self.confirmations)} plan(s) of the front, every evaluation "
                 "sample):",
                 f"  {'plan':>6} {'name':<24} {walk[:26]:>26} {confirmed[:26]:>26} {'est. ms':>8}"]
        for c in sorted(self.confirmations, key=lambda c: estimate_ms(c.walk)):
            cells = [f"{value_text(e.value)} {verdict}" for e, verdict in
                     zip((c.walk, c.confirmed), c.verdicts(self.threshold, self.higher_is_better))]
            lines.append(f"  {c.walk.plan_id:>6} {c.walk.name[:24]:<24} {cells[0]:>26} {cells[1]:>26} "
                         f"{estimate_ms(c.walk):>8.3f}")
        found = self.disagreements
        lines.append("CPU and HTP disagree: " + "; ".join(found) if found else
                     "CPU and HTP agree on these plans (the same ones reach the target, in the same order)")
        return lines


@dataclass(frozen=True)
class Confirmation:
    """One plan as the walk scored it (`walk`) and as the confirming backend did, with what each value says of the
    target (`walk_verdict`, `verdict`: "reaches", "misses" or "within noise", `evidence.TargetEvidence`; empty
    when not judged, and the value is then read against the threshold alone)."""

    walk: Evaluation
    confirmed: Evaluation
    walk_verdict: str = ""
    verdict: str = ""

    def verdicts(self, threshold: float, higher_is_better: bool) -> tuple[str, str]:
        """(on the walk's backend, on the confirming one)."""
        return tuple(v or ("reaches" if meets(e.value, threshold, higher_is_better) else "misses")
                     for v, e in ((self.walk_verdict, self.walk), (self.verdict, self.confirmed)))

    def to_json(self, threshold: float, higher_is_better: bool) -> dict:
        verdicts = dict(zip(("walk", "confirmed"), self.verdicts(threshold, higher_is_better)))
        return {"plan_id": self.walk.plan_id, "name": self.walk.name, "estimate_ms": estimate_ms(self.walk),
                **{f"{key}_{field}": value for key, e in (("walk", self.walk), ("confirmed", self.confirmed))
                   for field, value in (("source", e.accuracy_source), ("value", e.value),
                                        ("reaches", verdicts[key] == "reaches"), ("verdict", verdicts[key]))}}


_SAYS = {"reaches": "reaches the target", "misses": "misses the target", "within noise": "is within noise of the target"}


def disagreements(confirmations, threshold: float, higher_is_better: bool) -> list[str]:
    """Where two backends disagree over the same plans: a plan that reaches `threshold` on one and not on the
    other (or is within noise of it on one only), and pairs of plans the two order differently (ties on either
    side are no disagreement)."""
    found = []
    for c in confirmations:
        walk, confirmed = c.verdicts(threshold, higher_is_better)
        if walk != confirmed:
            found.append(f"plan {c.walk.plan_id} {c.walk.name} {_SAYS[walk]} on {c.walk.accuracy_source} "
                         f"({value_text(c.walk.value)}) and {_SAYS[confirmed].replace(' the target', ' it')} on "
                         f"{c.confirmed.accuracy_source} ({value_text(c.confirmed.value)})")
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


def path_frame(result: SearchResult) -> pd.DataFrame:
    """The search's evaluations as a table: plan_id, name, value, estimate_ms, meets."""
    rows = []
    for e in result.path:
        est = e.latency("estimate")
        rows.append({"plan_id": e.plan_id, "name": e.name, "value": e.value,
                     "estimate_ms": est.ms if est else np.nan,
                     "meets": meets(e.value, result.threshold, result.higher_is_better)})
    return pd.DataFrame(rows)

