"""The walk of one search: the baselines, the base plan, then the smallest prefix of the promotion order that
reaches the target (a first guess from the isolation prediction, then bisection or multi-section over the
agents), within the evaluation and latency budgets; and the recommendation once it stops."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..data import Cancelled
from ..plan import PrecisionPlan
from ..store import Evaluation
from .order import apply_steps, mixed_base, mixed_order, promotion_order
from .recommend import better_for_little_more, closest_plan
from .result import SearchResult
from .targets import Target, meets, target_plan

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study

# Per-channel weights are tried first when they are this much better (median over weights, dB).
PER_CHANNEL_GAIN_DB = 6.0


class Walk:
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
        self.check_cancel()
        self.study.store.heartbeat(self.search_id)
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

    def check_cancel(self) -> None:
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
        if self.reaches(base):
            return self._result(base, 0, "the base plan already reaches the target")
        steps = None
        if weights == "mixed":
            order, predicted, steps = mixed_order(self.study, report, base_plan, base, sensitivity_samples,
                                                  self.progress, self.cancel)
        else:
            order, predicted = promotion_order(self.study, report, base_plan)
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
        from ..sensitivity.scores import weight_scores

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
        hi_k: int | None = hi if hi in known and self.reaches(known[hi]) else None
        candidates = ([guess] if guess < hi else []) + [hi]
        while self.left() > 0:
            batch = sorted({k for k in candidates if k not in known and lo_k < k and (hi_k is None or k < hi_k)})
            batch = batch[:max(1, min(len(self.workers), self.left()))]
            if not batch:
                return hi_k, "target reached" if hi_k is not None else "the cheapest promotion set was narrowed down"
            for k, evaluation in zip(batch, self.evaluate([plan_k(k) for k in batch])):
                known[k] = evaluation
                if self.reaches(evaluation):
                    hi_k = k if hi_k is None else min(hi_k, k)
                else:
                    lo_k = max(lo_k, k)
            if hi_k is None:
                if hi in known and not self.reaches(known[hi]):
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
        if not self.reaches(best):
            # Missed: the closest evaluated plan, never one another evaluated plan (e.g. a16w8) beats.
            closest = closest_plan(self.path, self.hib, self.sixteen_bit(), self.latency_budget_ms)
            if closest.plan_id != best.plan_id:
                best, k = closest, self.promoted(closest, order)
        float_value = self._float_value()
        alternatives = better_for_little_more(best, self.path, self.hib, float_value,
                                              snr_metric=self.study.metric_spec.kind == "output",
                                              latency_budget_ms=self.latency_budget_ms)
        return SearchResult(self.search_id, self.goal.text, self.threshold, self.study.metric_name, self.hib,
                            self.reaches(best), reason, best, self.baselines, tuple(self.path), self.new,
                            tuple(order), k, float_value, tuple(alternatives))

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

    def sixteen_bit(self) -> dict:
        plans = self.study.plans()
        return dict(zip(plans["plan_id"].astype(int), plans["sixteen_bit"].astype(int)))

    def promoted(self, evaluation: Evaluation, order) -> int:
        """How many tensors of the promotion order an evaluated plan promotes."""
        plan = self.study.plan(evaluation.plan_id)
        if plan.activation_type == "uint16":
            return len(order)
        ordered = set(order)
        return sum(1 for tensor in plan.overrides if tensor in ordered)

    def reaches(self, evaluation: Evaluation) -> bool:
        return meets(evaluation.value, self.threshold, self.hib)

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.hib else a < b

    def _best_meeting(self):
        """The evaluated plan that reaches the threshold at the lowest estimated latency (then the best value)."""
        meeting = [e for e in self.path if self.reaches(e)]
        sign = -1.0 if self.hib else 1.0
        return min(meeting, key=lambda e: (e.latency("estimate").ms if e.latency("estimate") else math.inf,
                                           sign * e.value), default=None)

    def _latency_cap(self, plan_k, hi: int, budget: float) -> int:
        """The largest k whose estimated latency fits `budget` (bisection on the cost model, no evaluation)."""
        def fits(k):
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



def _sections(lo: int, hi: int, parts: int) -> list[int]:
    """`parts` points splitting (lo, hi) evenly (bisection for one part)."""
    points = {lo + max(1, round((hi - lo) * (i + 1) / (parts + 1))) for i in range(parts)}
    return sorted(k for k in points if lo < k < hi) or [(lo + hi) // 2]

