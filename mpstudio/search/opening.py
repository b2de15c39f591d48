"""The base plan a study opens on, decided as the search decides its weight form (`search.weights`): per-channel
int8 weights when the stored all-8-bit measurements say they win, or, before any is stored, when the weights' own
quantization scores are decisive; and the stored bases that beat a given plan (the studio's hint)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..plan import PrecisionPlan
from .targets import named_baselines
from .weights import NO_GAIN_DB, PER_CHANNEL_GAIN_DB

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study

BASE_NAMES = ("a8w8", "a8w8-pc", "a16w8", "a16w8-pc")


@dataclass(frozen=True)
class BaseChoice:
    """The plan promotions start from and why; `measure`: whether the per-channel baselines are still to be
    measured before the choice is settled."""

    plan: PrecisionPlan
    reason: str
    measure: bool = False


def stored_bases(study: "Study", accuracy_source: str) -> dict:
    """The study's stored evaluations of the named bases on `accuracy_source`: name -> Evaluation."""
    found = {}
    for name, plan in named_baselines().items():
        plan_id = study.plan_id(plan)
        evaluation = study.store.evaluation(plan_id, accuracy_source) if plan_id is not None else None
        if evaluation is not None:
            found[name] = evaluation
    return found


def opening_base(study: "Study", accuracy_source: str, cancel: threading.Event | None = None) -> BaseChoice:
    """The best known base plan of `study`: per-channel weights when they help (measured on `accuracy_source`
    when the study holds both all-8-bit forms, by the weights' scores otherwise), else per-tensor weights."""
    from ..sensitivity.scores import weight_scores

    named, stored = named_baselines(), stored_bases(study, accuracy_source)
    sign = 1.0 if study.higher_is_better else -1.0
    if "a8w8" in stored and "a8w8-pc" in stored:
        a8, a8pc = stored["a8w8"], stored["a8w8-pc"]
        gain = (sign * (a8pc.value - a8.value),
                sign * (stored["a16w8-pc"].value - stored["a16w8"].value)
                if "a16w8" in stored and "a16w8-pc" in stored else 0.0)
        measured = f"measured: a8w8-pc {a8pc.value:.4g} against a8w8 {a8.value:.4g} ({study.metric_name})"
        if gain > (0.0, 0.0):
            return BaseChoice(named["a8w8-pc"], f"per-channel int8 weights ({measured})")
        return BaseChoice(PrecisionPlan.a8w8(), f"per-tensor uint8 weights ({measured})")
    scores = weight_scores(study.quantizer.prepared.model, study.graph, cancel=cancel)
    gain_db = float(np.nanmedian(scores["per_channel_gain_8"])) if len(scores) else 0.0
    if gain_db >= PER_CHANNEL_GAIN_DB:
        return BaseChoice(named["a8w8-pc"], f"per-channel int8 weights (their median gain {gain_db:.1f} dB is "
                                            f"decisive)", measure=True)
    if gain_db <= NO_GAIN_DB:
        return BaseChoice(PrecisionPlan.a8w8(), f"per-tensor uint8 weights (per-channel weights quantize no "
                                                f"better: median gain {gain_db:.1f} dB)")
    return BaseChoice(PrecisionPlan.a8w8(), f"per-tensor uint8 weights until per-channel weights are measured "
                                            f"(median gain {gain_db:.1f} dB, under {PER_CHANNEL_GAIN_DB:g} dB)",
                      measure=True)


def analysis_base(plan: PrecisionPlan) -> PrecisionPlan:
    """The base whose sensitivity ranks promotions of `plan`: its weight form at 8 bits (a8w8-pc for per-channel
    int8 weights, else a8w8), as the search ranks against the plan it starts from."""
    if plan.per_channel and plan.weight_type == "int8":
        return named_baselines()["a8w8-pc"]
    return PrecisionPlan.a8w8()


def beating_bases(evaluations: pd.DataFrame, plan_hash: str, higher_is_better: bool) -> pd.DataFrame:
    """The named bases in `evaluations` (one accuracy and one latency source, `loop.front`'s frame) that beat the
    plan `plan_hash`: more accurate at no more latency, or as accurate and faster; best first. Empty when the
    plan is not evaluated there."""
    if evaluations is None or evaluations.empty or "plan_hash" not in evaluations:
        return pd.DataFrame()
    current = evaluations[evaluations["plan_hash"] == plan_hash]
    if current.empty:
        return pd.DataFrame()
    value, ms = float(current["value"].iloc[0]), float(current["latency_ms"].iloc[0])
    sign = 1.0 if higher_is_better else -1.0
    bases = evaluations[evaluations["name"].isin(BASE_NAMES) & (evaluations["plan_hash"] != plan_hash)]
    better = sign * (bases["value"] - value)
    wins = bases[((better > 0) & (bases["latency_ms"] <= ms * 1.02)) | ((better >= 0) & (bases["latency_ms"] < ms))]
    return wins.assign(_order=-sign * wins["value"]).sort_values("_order").drop(columns="_order")
