"""The walk of one search: the baselines (both weight forms when per-channel weights are in play) and the
target first, the sensitivity analysis only when no all-8-bit baseline answers, then a walk over prefixes of the
promotion order that does not assume accuracy rises with k (`grid`), within the evaluation and latency budgets;
then, with the evaluations it left, a top-down walk over demotions from the all-16-bit plan (`topdown`); and the
recommendation over every plan the study holds (`choice`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
from concurrent.futures import ThreadPoolExecutor

from ..data import Cancelled
from ..errors import MpstudioError
from ..loop.build_failures import BuildFailed, BuildFailure
from ..plan import PrecisionPlan
from ..quantize import weight_form
from ..store import Evaluation
from ..value_text import value_text
from .choice import choose, pointless_because, stored_evaluations
from .evidence import REACHES, TargetEvidence
from .grid import PrefixGrid, largest
from .order import apply_steps, mixed_order, promotion_order
from .recommend import better_for_little_more
from .result import SearchResult
from .targets import Target, meets, target_plan
from .topdown import latency_points, reserve, top_down_order
from .weights import PER_CHANNEL_GAIN_DB, base_plan as weight_base

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study

__all__ = ["Walk", "PER_CHANNEL_GAIN_DB"]


class Walk:
    """One search's state: the evaluations it has used and its budget."""

    def __init__(self, study: Study, search_id: int, backend: str, runner, budget: int, progress, cancel):
        self.study, self.search_id, self.backend, self.runner = study, search_id, backend, runner
        self.budget, self.progress, self.cancel = budget, progress, cancel
        self.held = 0  # evaluations the bottom-up walk leaves for the top-down one (`topdown.reserve`)
        self._estimates: dict[str, float] = {}  # plan hash -> estimated ms (`estimate_ms`)
        self.path: list[Evaluation] = []
        self.unbuilt: list = []  # of BuildFailure: plans the walk's backend could not build
        self.new = 0
        self._stored: list[Evaluation] | None = None  # the study's evaluations of the walk's source, read once
        self.weights_note = ""
        self.blind: list[str] = []  # tensors the promotion order puts first (`blind_to_the_analysis`)
        self.order_note = ""
        self.ceiling_form: str | None = None  # the weight form whose all-16-bit baseline bounds a promotion
        self.hib = study.higher_is_better
        # A pool evaluates one plan per healthy agent at a time; anything else is one worker.
        self.workers = (runner.healthy() or [runner]) if hasattr(runner, "healthy") else [runner]

    # ---- evaluations ----
    def left(self) -> int:
        """Evaluations left, less those held for the top-down walk while the bottom-up one runs."""
        return self.budget - len(self.path) - self.held

    def evaluate(self, plans: list[PrecisionPlan], pass_over: bool = False) -> list:
        """Evaluate `plans` (in parallel over the agents), counted against the budget, stored in the study. With
        `pass_over`, a plan the walk's backend cannot build gives its `BuildFailure` in its place (kept in
        `unbuilt`, not counted); otherwise `BuildFailed` is raised."""
        self.check_cancel()
        self.study.store.heartbeat(self.search_id)
        for plan in plans:
            self.study.quantizer.generate(plan, None, self.cancel)
        jobs = [self.study.submit(plan, self.backend, origin=f"search {self.search_id}", search_id=self.search_id)
                for plan in plans]

        def one(args):
            job_id, worker = args
            try:
                return self.study.run_job(job_id, worker if self.runner is not None else None, cancel=self.cancel)
            except BuildFailed as exc:
                if not pass_over:
                    raise
                return exc.failure

        pairs = [(job, self.workers[i % len(self.workers)]) for i, job in enumerate(jobs)]
        if len(pairs) > 1 and len(self.workers) > 1:
            with ThreadPoolExecutor(len(self.workers)) as pool:
                results = list(pool.map(one, pairs))
        else:
            results = [one(p) for p in pairs]
        self._stored = None
        for evaluation in results:
            if isinstance(evaluation, BuildFailure):
                self.unbuilt.append(evaluation)
                if self.progress:
                    self.progress(len(self.path), self.budget, f"search: {evaluation.name} cannot be built on "
                                                               f"{evaluation.where}; passed over")
                continue
            self.path.append(evaluation)
            self.new += 0 if evaluation.cached else 1
            if self.progress:
                self.progress(len(self.path), self.budget, f"search: {evaluation.name} {evaluation.metric} "
                                                           f"{value_text(evaluation.value)}")
        return results

    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(f"search cancelled after {len(self.path)} evaluations; rerun it to continue")

    # ---- the walk ----
    def run(self, goal: Target, latency_budget_ms, weights, sensitivity_samples) -> SearchResult:
        try:
            a8, a16 = self.evaluate([PrecisionPlan.a8w8(), PrecisionPlan.a16w8()])
        except BuildFailed as exc:
            raise MpstudioError(f"{exc.failure.describe()}. The walk needs both baselines on its backend: walk on "
                                "the CPU (--backend cpu, the default), whose pick the HTP confirms while passing over "
                                "the plans it cannot build") from exc
        self.baselines = {"a8w8": a8, "a16w8": a16}
        self.source = a8.accuracy_source
        base_plan, base, self.weights_note = weight_base(self, weights)
        # Promotions keep the base's weights, so its all-16-bit counterpart bounds what they can give; the mixed
        # walk changes weights too, and no baseline bounds it.
        self.ceiling_form = None if weights == "mixed" else weight_form(base_plan)
        references = self._target_references(goal)
        self.goal, self.threshold = goal, goal.threshold(references, self.hib)
        self.evidence = TargetEvidence(self.study, goal, self.threshold, self.hib, references)
        # Cheap checks first: no promotion is cheaper than an all-8-bit baseline, so one that reaches the target
        # answers the search before any sensitivity analysis.
        if any(self.reaches(e) for name, e in self.baselines.items() if name.startswith("a8w8")) or \
                self.reaches(base):
            return self._result("an all-8-bit baseline already reaches the target (no sensitivity analysis needed)")
        # Promotions are ranked against the plan they start from (one analysis, of that plan): per-channel
        # weights remove most of a model's error, and what is left sits in other tensors than all-8-bit's worst.
        # The mixed walk starts from int4 weights and ranks on the all-8-bit analysis.
        analysed = None if weights == "mixed" or base_plan.hash == PrecisionPlan.a8w8().hash else base_plan
        report = self.study.sensitivity(samples=sensitivity_samples, isolation_samples=self.isolation_samples,
                                        progress=self.progress, quiet=True, cancel=self.cancel, plan=analysed,
                                        workers=getattr(self.runner, "sensitivity_workers", None))
        steps = None
        if weights == "mixed":
            order, predicted, steps = mixed_order(self.study, report, base_plan, base, sensitivity_samples,
                                                  self.progress, self.cancel)
        else:
            self.blind = self.blind_to_the_analysis(base_plan)
            order, predicted = promotion_order(self.study, report, base_plan, first=self.blind)
        if not order:
            return self._result("no activation tensor is predicted to help")
        plans = {0: base_plan}

        def plan_k(k: int) -> PrecisionPlan:
            if k not in plans:
                name = f"{base_plan.name}+{k}"
                plans[k] = (apply_steps(base_plan, steps[:k], name) if steps is not None
                            else base_plan.promote(order[:k], name=f"{base_plan.name}+{k}x16"))
            return plans[k]

        known: dict[int, Evaluation] = {0: base}
        every = set(order) >= set(self.study.graph.activations())
        top = {"a8w8": "a16w8", "a8w8-pc": "a16w8-pc"}.get(base.name if steps is None else "")
        if every and top in self.baselines:
            known[len(order)] = self.baselines[top]  # every activation at 16 bits: that baseline, evaluated
        cap = self.fitting(plan_k, len(order))
        if cap == 0:
            return self._result(f"no promotion fits the latency budget of {latency_budget_ms} ms", order)
        cap = self.worth_evaluating(plan_k, cap)
        if cap == 0:
            return self._result("every promotion costs at least as much as a stored plan that is as good, or is "
                                "priced within the cost model's resolution of one", order)
        self.grid = PrefixGrid(self, plan_k, cap, known, full=len(order))
        prior = self._guess(predicted, known, self.baselines, self.threshold, cap)
        down = top if steps is None and top in self.baselines else None
        return self._result(self._walks(prior, report, base_plan, base, down), order)

    def _walks(self, prior: int, report, base_plan: PrecisionPlan, base: Evaluation, top: str | None) -> str:
        """The bottom-up walk (`self.grid`), then the top-down one from the all-16-bit plan `top` when there is
        one, with the share of the evaluations the bottom-up walk left it. The top-down walk looks for a plan
        cheaper than any stored one that reaches the target (dearer ones are pointless), so it runs whatever
        the bottom-up walk found. Returns why they stopped."""
        self.held = reserve(self.left()) if top is not None else 0
        try:
            reason = self.grid.run(prior)
        finally:
            self.held = 0
        if top is not None and self.left() > 0:
            reason += "; top-down walk: " + self._top_down(report, base_plan, base, top)
        return reason

    def _top_down(self, report, base_plan: PrecisionPlan, base: Evaluation, top: str) -> str:
        """Walk the demotions from the all-16-bit plan `top` (`topdown`); returns why it stopped."""
        order = top_down_order(self.study, report, base_plan, kept=self.blind)
        if not set(order) >= set(self.study.graph.activations()):
            return "the demotion order does not cover every activation"
        plans = {0: base_plan}

        def plan_k(k: int) -> PrecisionPlan:
            if k not in plans:  # named by what it demotes from the all-16-bit plan
                plans[k] = base_plan.promote(order[:k], name=f"{top}-{len(order) - k}x8")
            return plans[k]

        known: dict[int, Evaluation] = {0: base, len(order): self.baselines[top]}
        cap = self.worth_evaluating(plan_k, self.fitting(plan_k, len(order)))
        if cap == 0:
            return "every demotion prefix is priced at or above a stored plan that is as good"
        low, high = self.study.estimate(base_plan), self.study.estimate(self.study.plan(self.baselines[top].plan_id))
        if low is None or high is None:
            return "no latency estimate to spread its points over"

        def estimate_ms(k: int) -> float | None:
            ms = self.estimate_ms(plan_k(k))
            return None if math.isinf(ms) else ms

        # A demotion prefix may be a plan the bottom-up walk evaluated: known, not evaluated (nor counted) again.
        counted = {e.plan_hash: e for e in self.path}
        self.down_grid = PrefixGrid(self, plan_k, cap, known, reuse=lambda plan: counted.get(plan.hash),
                                    full=len(order), demoted_from=top)
        return self.down_grid.run(points=latency_points(estimate_ms, cap, low.ms, high.ms))

    def blind_to_the_analysis(self, base_plan: PrecisionPlan) -> list[str]:
        """With a task metric, the Concats that join tensors of very different ranges at 8 bits in the base plan
        (`Quantizer.squeezed_concats`): their narrow input keeps a few steps, which the analysis' output SNR hardly
        sees (the wide inputs hold the power), so its order would leave them to the end of both walks while the
        task metric may hang on them (a detector's class scores). They are promoted first and demoted last."""
        if self.study.metric_spec.kind == "output":
            return []
        squeezed = self.study.quantizer.squeezed_concats(base_plan)
        blind = list(dict.fromkeys(s.output for s in squeezed if s.output not in base_plan.overrides))
        if blind:
            first = squeezed[0]
            self.order_note = (f"{', '.join(blind)} first: {first.output} joins {first.tensor} on a scale that "
                               f"leaves it {first.steps:.1f} steps at 8 bits, which output SNR (the analysis' "
                               "score) hardly sees")
        return blind

    def estimate_ms(self, plan: PrecisionPlan) -> float:
        """The cost model's latency of `plan` (inf without one), estimated once per plan: the walks' bisections
        over k ask for the same plans (each estimate generates the plan's QDQ model)."""
        if plan.hash not in self._estimates:
            latency = self.study.estimate(plan)
            self._estimates[plan.hash] = latency.ms if latency is not None else math.inf
        return self._estimates[plan.hash]

    def fitting(self, plan_k, n: int) -> int:
        """The largest k of [0, n] whose plan `plan_k(k)` fits the latency budget (n without one)."""
        if self.latency_budget_ms is None:
            return n
        return largest(lambda k: self.estimate_ms(plan_k(k)) <= self.latency_budget_ms, n)

    def worth_evaluating(self, plan_k, n: int) -> int:
        """The largest k of [0, n] whose plan is not pointless (`pointless`): plans dearer than a stored plan that
        reaches the target, or than the best all-16-bit plan, or priced within the cost model's resolution of one
        (a tie, which the better value wins), are."""
        return largest(lambda k: k == 0 or self.pointless(plan_k(k)) is None, n)

    def pointless(self, plan: PrecisionPlan) -> Evaluation | None:
        """The stored plan that makes evaluating `plan` pointless (`choice.pointless_because`), or None."""
        ms = self.estimate_ms(plan)
        sign = 1.0 if self.hib else -1.0
        ceiling = max((sign * e.value for name, e in self.baselines.items() if name.startswith("a16w8")
                       and weight_form(self.study.plan(e.plan_id)) == self.ceiling_form), default=None)
        return pointless_because(ms, self.stored(), self.threshold, self.hib,
                                 None if ceiling is None else sign * ceiling, self.reaches)

    def stored(self) -> list[Evaluation]:
        """Every plan of the study evaluated on the walk's accuracy source (its own evaluations included)."""
        if self._stored is None:
            self._stored = stored_evaluations(self.study, self.source, self.path)
        return self._stored

    def _result(self, reason: str, order=()) -> SearchResult:
        """The recommendation over every stored plan of the walk's accuracy source (`choice.choose`)."""
        choice = choose(self.stored(), self.threshold, self.hib, self.latency_budget_ms,
                        self.evidence.verdicts(self.stored()))
        best = choice.pick
        float_value = self._float_value()
        alternatives = better_for_little_more(best, self.stored(), self.hib, float_value,
                                              snr_metric=self.study.metric_spec.kind == "output",
                                              latency_budget_ms=self.latency_budget_ms)
        return SearchResult(self.search_id, self.goal.text, self.threshold, self.study.metric_name, self.hib,
                            self.reaches(best), reason, best, self.baselines, tuple(self.path), self.new,
                            tuple(order), self.promoted(best, order), float_value, tuple(alternatives),
                            considered=choice.considered, choice=choice.why, weights_note=self.weights_note,
                            order_note=self.order_note,
                            skipped=self._skipped(), unbuildable=tuple(self.unbuilt),
                            verdict=self.evidence.verdict(best))

    def _skipped(self) -> tuple:
        grids = [g for g in (getattr(self, "grid", None), getattr(self, "down_grid", None)) if g is not None]
        return tuple((k, e.plan_id, e.name) for g in grids for k, e in sorted(g.skipped.items()))

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
        """Whether `evaluation` clearly reaches the target (not within noise of it: `evidence`)."""
        evidence = getattr(self, "evidence", None)
        if evidence is None:
            return meets(evaluation.value, self.threshold, self.hib)
        return evidence.verdict(evaluation) == REACHES

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.hib else a < b

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

