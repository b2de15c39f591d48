"""What a study holds beyond single values: the per-sample terms of its results and paired comparisons between
plans (`loop.comparison`), and the plans a backend could not build (`loop.build_failures`). A part of `Study`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import MpstudioError
from .loop import comparison
from .loop.build_failures import BuildFailure, BuildFailures
from .plan import PrecisionPlan
from .store_builds import BuildRows


class StudyRecords:
    """Mixed into `Study`, whose store, quantizer and cost model it reads."""

    def _id(self, plan: PrecisionPlan | int | str | None) -> int | None:
        if plan is None or isinstance(plan, (int, np.integer)):
            return plan
        found = self.plan_id(self.resolve_plan(plan))
        if found is None and isinstance(plan, str):
            raise MpstudioError(f"plan {plan!r} has no result in this study yet; evaluate it first "
                                f"(study.evaluate({plan!r}))")
        return found

    def terms(self, plan: PrecisionPlan | int, accuracy_source: str):
        """The per-sample metric terms (`metric_terms.MetricTerms`) of a plan's stored result from `accuracy_source`;
        None when it has none (a metric of the whole set, a result stored before terms were kept, no result)."""
        return comparison.stored_terms(self.store, self._id(plan), accuracy_source)

    def compare(self, plan: PrecisionPlan | int | str, versus: PrecisionPlan | int | str,
                accuracy_source: str | None = None):
        """`plan` minus `versus` on the same evaluation samples, with a paired bootstrap's 95 % interval
        (`loop.uncertainty.PairedDifference`), from their stored results of `accuracy_source` (default: the first
        source both have terms from). Each plan is a PrecisionPlan, a stored plan's id or its name."""
        return comparison.compare_stored(self.store, self._id(plan), self._id(versus), self.metric_name,
                                         self.higher_is_better, accuracy_source)

    def build_failures(self) -> list[BuildFailure]:
        """The plans a backend could not build, with where and why (`loop.build_failures`), oldest first."""
        return BuildFailures(BuildRows(self.store)).all()

    def _failed_build(self, plan: PrecisionPlan) -> Path:
        """The QDQ model of a plan that did not build, with its estimate stored (the plot places it by it)."""
        path = self.quantizer.generate(plan)
        latency = self.cost_model.estimate(path)
        plan_id = self.plan_id(plan)
        if latency is not None and plan_id is not None:
            self.store.record_latency(plan_id, latency)
        return path
