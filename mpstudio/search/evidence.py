"""Whether a stored plan clearly reaches a search's target, clearly misses it, or is within noise: it meets or
misses the threshold by less than the metric's resolution (one count: a query of recall@k, a character of CER,
an image of top-1), or the threshold lies inside the plan's 95 % interval. A target relative to a plan or the
float model is judged on the same samples (a paired bootstrap of the plan against its reference), an absolute
one on the plan's own interval. Results without per-sample terms are judged on their value alone.

The search treats a plan within noise as neither reaching nor missing: the walk keeps looking for a plan that
clearly reaches, and the recommendation prefers one (`choice.choose`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..loop.uncertainty import against_reference, target_verdict
from ..store import Evaluation
from .targets import Target

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study

REACHES, MISSES, WITHIN_NOISE = "reaches", "misses", "within noise"


class TargetEvidence:
    """The verdicts of one search's target, `threshold` from `goal` and its `references` (Evaluations or the
    float model's value, by name), computed once per plan and accuracy source."""

    def __init__(self, study: Study, goal: Target, threshold: float, higher_is_better: bool, references: dict):
        self.study, self.goal, self.threshold, self.hib = study, goal, threshold, higher_is_better
        self.references = references
        self._verdicts: dict[tuple[int, str], str] = {}
        self._float_terms = None

    def verdict(self, e: Evaluation) -> str:
        """REACHES, MISSES or WITHIN_NOISE for evaluation `e`."""
        key = (e.plan_id, e.accuracy_source)
        if key not in self._verdicts:
            self._verdicts[key] = self._judge(e)
        return self._verdicts[key]

    def verdicts(self, evaluations) -> dict[int, str]:
        return {e.plan_id: self.verdict(e) for e in evaluations}

    def _judge(self, e: Evaluation) -> str:
        low, high = e.low, e.high
        terms = self.study.terms(e.plan_id, e.accuracy_source)
        reference = self._reference_terms(e.accuracy_source)
        if terms is not None and reference is not None and reference.units == terms.units:
            # The target moves with its reference on the same samples: judge the plan against it sample by sample.
            margin_low, margin_high = against_reference(terms, reference, self.goal.margin, self.hib)
            low, high = self.threshold + margin_low, self.threshold + margin_high
        return target_verdict(e.value, self.threshold, self.hib, low, high, e.resolution)

    def _reference_terms(self, source: str):
        name = self.goal.baseline
        if name is None:
            return None
        if name == "float":
            if self._float_terms is None:
                from ..metric_terms import metric_terms

                outputs = self.study.float_outputs()
                self._float_terms = metric_terms(self.study.metric_spec, self.study.prepared, outputs, outputs) or False
            return self._float_terms or None
        reference = self.references.get(name)
        plan_id = getattr(reference, "plan_id", None)
        return self.study.terms(plan_id, source) if plan_id is not None else None


__all__ = ["TargetEvidence", "REACHES", "MISSES", "WITHIN_NOISE"]
