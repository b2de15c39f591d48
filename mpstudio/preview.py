"""What a study's plan looks like before its full evaluation, wired from the study's parts: a prediction from the
sensitivity report and the cost model (`mpstudio.loop.prediction`), and the accuracy on the first part of the
evaluation set with an interval (`mpstudio.loop.streaming`, which `Study.evaluate(partial=...)` streams).

Neither is stored: the study keeps only full evaluations as a plan's result.
"""

from __future__ import annotations

import pandas as pd

from .loop import prediction
from .loop.prediction import PlanPrediction, monotone_fit
from .loop.streaming import (BOOTSTRAP_ROUNDS, FIRST_SAMPLES, LEVEL, PartialAccuracy, SampleTerms, cer_terms,
                             sample_terms, snr_terms, stream_order)
from .sources import Latency


def promotion_basis(study):
    """(the all-8-bit plan's estimated Latency, the cost model's ms added by promoting each activation tensor
    alone), computed once per study and cost-model calibration."""
    return prediction.promotion_basis(study.cost_model, study.quantizer, study.graph)


def basis_ready(study) -> bool:
    """Whether `promotion_basis` is computed for `study` (a prediction then takes milliseconds)."""
    return prediction.basis_ready(study.cost_model)


def summed_latency(study, plan, evaluated: pd.DataFrame | None = None) -> Latency | None:
    """The cost model's latency of `plan` without making its QDQ model (`loop.prediction.summed_latency`).
    `evaluated`: the study's evaluations (`Study.evaluations` columns), when the caller has them."""
    basis = promotion_basis(study)
    if basis[0] is None:
        return None
    return prediction.summed_latency(plan, basis, study.graph, study.evaluations() if evaluated is None else evaluated)


def predict_plan(study, plan, report, accuracy_source: str | None = None, latency: Latency | None = None,
                 evaluated: pd.DataFrame | None = None) -> PlanPrediction:
    """Predict `plan`'s accuracy in `study`'s metric and its latency from the cost model, without making its
    QDQ model (`summed_latency`; `loop.prediction.predict_plan` says how). `evaluated`: the study's evaluations
    (`Study.evaluations` or `Study.front` columns), when the caller has them (it saves reading the store)."""
    evaluated = study.evaluations() if evaluated is None else evaluated
    if latency is None:
        latency = summed_latency(study, plan, evaluated)
    return prediction.predict_plan(plan, report, graph=study.graph, spec=study.metric_spec, evaluated=evaluated,
                                   latency=latency, accuracy_source=accuracy_source)


__all__ = ["PlanPrediction", "promotion_basis", "basis_ready", "summed_latency", "PartialAccuracy", "SampleTerms",
           "cer_terms", "snr_terms", "sample_terms", "stream_order", "predict_plan", "monotone_fit", "FIRST_SAMPLES",
           "LEVEL", "BOOTSTRAP_ROUNDS"]
