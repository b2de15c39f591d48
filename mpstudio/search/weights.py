"""The weight form a search starts from: per-tensor uint8 or per-channel int8 weights (free on HTP latency),
decided by the weights' own quantization scores when they are decisive and by measurement otherwise; both
weight forms of the all-8-bit and all-16-bit baselines are evaluated whenever per-channel weights are in play."""

from __future__ import annotations

import numpy as np

from ..plan import PrecisionPlan
from ..store import Evaluation
from ..value_text import value_text
from .order import mixed_base
from .targets import named_baselines

# Per-channel weights are decisive when their median gain over per-tensor weights is at least this (dB); at or
# below NO_GAIN_DB per-tensor weights are; in between both forms are measured.
PER_CHANNEL_GAIN_DB = 6.0
NO_GAIN_DB = 0.0


def base_plan(walk, weights: str) -> tuple[PrecisionPlan, Evaluation, str]:
    """The plan promotions start from, its evaluation and why (in words); `walk` is the search's `walk.Walk`. Adds the per-channel baselines it
    evaluates (a8w8-pc, a16w8-pc) to `walk.baselines`."""
    from ..sensitivity.scores import weight_scores

    a8 = walk.baselines["a8w8"]
    if weights == "mixed":
        plan = mixed_base(walk.study.graph, walk.study.htp_arch)
        (evaluation,) = walk.evaluate([plan])
        return plan, evaluation, "int4 matrix weights, each promoted with the activations (--weights mixed)"
    if weights == "per-tensor":
        return PrecisionPlan.a8w8(), a8, "per-tensor uint8 weights (--weights per-tensor)"
    gain_db = None
    if weights == "auto":
        scores = weight_scores(walk.study.quantizer.prepared.model, walk.study.graph, cancel=walk.cancel)
        gain_db = float(np.nanmedian(scores["per_channel_gain_8"])) if len(scores) else 0.0
        if gain_db <= NO_GAIN_DB:
            return PrecisionPlan.a8w8(), a8, (f"per-tensor uint8 weights: per-channel int8 weights quantize no "
                                              f"better (median gain {gain_db:.1f} dB)")
    named = named_baselines()
    a8pc, a16pc = walk.evaluate([named["a8w8-pc"], named["a16w8-pc"]])
    walk.baselines.update({"a8w8-pc": a8pc, "a16w8-pc": a16pc})
    measured = (f"a8w8-pc {value_text(a8pc.value)} against a8w8 {value_text(a8.value)}, "
                f"a16w8-pc {value_text(a16pc.value)} against "
                f"a16w8 {value_text(walk.baselines['a16w8'].value)}")
    if weights == "per-channel":
        return named["a8w8-pc"], a8pc, f"per-channel int8 weights (--weights per-channel); {measured}"
    # Measured: the all-8-bit forms decide, the all-16-bit ones break a tie.
    sign = 1.0 if walk.hib else -1.0
    a16 = walk.baselines["a16w8"]
    wins = (sign * (a8pc.value - a8.value), sign * (a16pc.value - a16.value)) > (0.0, 0.0)
    decisive = gain_db >= PER_CHANNEL_GAIN_DB
    scored = f"median per-channel gain {gain_db:.1f} dB" + (" (decisive)" if decisive else
                                                            f" (under {PER_CHANNEL_GAIN_DB:g} dB: measured)")
    if wins:
        return named["a8w8-pc"], a8pc, f"per-channel int8 weights: {scored}; {measured}"
    return PrecisionPlan.a8w8(), a8, f"per-tensor uint8 weights: {scored}; {measured}"
