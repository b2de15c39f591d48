"""What a search must reach: targets (a number, or a reference plan within a margin), the baselines a target
may name, and whether a value meets a threshold."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
import re
from dataclasses import dataclass

from ..errors import MpstudioError
from ..metrics import metric_range
from ..plan import BASELINES, PrecisionPlan

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study

# A reference name followed by a margin: "a16w8+10%", "float-1%", "a8w8+3x16 + 2 %". Without its % sign
# ("a16w8+10") it is no margin: `Target.check` refuses it naming the form meant.
_MARGIN = re.compile(r"^\s*(?P<base>.*?\S)\s*(?P<sign>[+-])\s*(?P<pct>\d+(?:\.\d+)?)\s*(?P<percent>%)?\s*$")


def named_baselines() -> dict[str, PrecisionPlan]:
    """Plans a target may name whether or not the study holds them yet (the search evaluates them)."""
    return {name: make() for name, make in BASELINES.items()}


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
        if match and match["percent"]:
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
        """Raise unless the study can resolve this target's reference (the error lists what it can), or when a
        number is outside what the study's metric can take."""
        if self.baseline is None:
            _within_range(self.value, study.metric_name)
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
        bare = _MARGIN.match(self.text)  # a margin without its % sign (one with it is parsed as a margin)
        if bare and (bare["base"] in available or (names == bare["base"]).any()):
            meant = f"{bare['base']}{bare['sign']}{bare['pct']}%"
            raise MpstudioError(f"target {self.text!r}: a margin is a percentage of the reference, such as {meant!r}; "
                                "a target stricter than a reference is given as a number")
        stored = [n for n in dict.fromkeys(names) if n not in available]
        raise MpstudioError(
            f"target {self.text!r} names {self.baseline!r}, which is neither a number nor a known plan; give a number "
            f"or one of: {', '.join(available + stored[:30])}{' ...' if len(stored) > 30 else ''} (with a margin like "
            "'+2%' if you like)")


def _within_range(value: float, metric: str) -> None:
    bounds = metric_range(metric)
    if bounds is None:
        return
    low, high = bounds
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"[{low:g}, {high:g}]" if high is not None else f"at least {low:g}"
        raise MpstudioError(f"target {value:g} is outside what {metric} can take ({span}): no plan can reach it; give a "
                            f"value in that range, or a reference with a margin such as 'a16w8-pc-1%'")


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

