"""The progressive sensitivity analysis: cheap per-tensor scores first, then isolation only where it can change
a decision, in worker processes; every step hands a partial SensitivityReport to `on_partial`.

1. Scores: accumulated and local error of every activation tensor (`scores.TensorScorer`), streamed over the
   samples in chunks spread over the workers, and weight scores. A partial report follows each chunk.
2. Screening: every activation tensor promoted alone on the first `screen_samples` isolation samples only
   (one by default: an eighth of isolating it, and a quarter of isolating it both ways), as an estimate:
   only its own edges at 16 bits, without resolving ORT's QNN configuration for it (which costs more than
   the run itself).
3. Isolation where it can change a decision: tensors are isolated on every isolation sample, in both
   directions, in the order of the two decisions the ranking and the search make from isolation scores:
   the promotion gain (the ranking) and what a promotion removes per estimated latency cost
   (`latency.promotion_costs`, the search's order), both by screened value, interleaved, with every fourth
   tensor drawn at random. It stops when no tensor left can enter the top `keep` of either order (a screened
   value moves on the full samples at most as far as it did for the isolated tensors screened no higher),
   or at `budget` tensors (default: 2 x `keep`); the others rank
   after the isolated ones by their screened gain. Namespace and selection regions are always isolated.

The result has the shape of `analysis.analyze`'s: its isolation table holds the isolated tensors (their
values are exactly those of an exhaustive analysis) and the regions. `exhaustive=True` isolates every
tensor (the old analysis, on the workers). Values are kept in `cache_dir`, so a cancelled, repeated or
exhaustive analysis after a progressive one runs only what is missing.
"""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from ..blas_threads import with_one_blas_thread
from ..data import Cancelled, DataSource, Progress, TaskMetric
from ..metrics import output_note
from ..noise import added_noise, removed_noise
from ..plan import PrecisionPlan
from ..quantize import Quantizer
from .. import qdq
from .analysis import SensitivityReport
from .isolation_cache import IsolationValues, cache_path
from .isolation_order import cannot_enter_top, cost_floor, interleaved_order
from .isolation import (ISOLATION_COLUMNS, IsolationResult, Region, float_references, own_params, plan_ends,
                        terms_frame)
from .ranking import namespace_regions, rank_tensors, selection_region
from .scores import ScoreSums, score_frame, weight_scores
from .workers import Config, InlineWorkers, IsolationSpec, ScoringSpec, WorkerPool, worker_count, worker_memory

ENGINE_VERSION = 4  # names the on-disk cache of isolation values; bump when the numbers (or what is kept) change
# 2: local errors read the model the ranges were calibrated on (`Quantizer.calibration_model`)
# 4: each value keeps its per-sample noise terms (`OutputScorer.score_terms`)
_ALL_8: Config = ("promote", ())
_ALL_16: Config = ("demote", ())
_WORKERS_FROM = 400  # activation tensors x isolation samples below which everything runs in this process
_SCREEN_ESTIMATE = True  # screen with ("screen", t): no QNN configuration resolved per tensor
_FIRST_CHUNK = 2  # samples in the first chunk of tensor scores


@with_one_blas_thread
def analyze_progressive(
    quantizer: Quantizer,
    data: DataSource,
    plan: PrecisionPlan | None = None,
    *,
    isolation: bool = True,
    isolation_data: DataSource | None = None,
    isolation_samples: int = 8,
    metric: TaskMetric | None = None,
    namespaces: bool = True,
    selection: Sequence[str] = (),
    keep: int = 20,
    budget: int | None = None,
    screen_samples: int = 1,
    exhaustive: bool = False,
    workers: int | None = None,
    chunk: int = 8,
    htp_arch: str | int = "75",
    cache_dir: str | Path | None = None,
    on_partial: Callable[[SensitivityReport], None] | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> SensitivityReport:
    """Score and rank every tensor of `quantizer`'s model for `plan` (default all 8 bits), progressively.

    `workers`: processes (default: one per core; 0 runs everything in this process, with the same numbers), or a
    `distributed.RayCluster` whose actors run the scoring and isolation chunks.
    `cache_dir`: where isolation values are kept, so a cancelled or repeated analysis does not redo them.
    `on_partial(report)` receives each partial report (`report.meta["partial"]` is True, and
    `report.status()` says how far it got); the final report is returned.
    Arguments otherwise as `analysis.analyze`.
    """
    return _Analysis(quantizer, data, plan or PrecisionPlan.a8w8(), isolation, isolation_data, isolation_samples,
                     metric, namespaces, selection, keep, budget, screen_samples, exhaustive, workers, chunk, htp_arch,
                     cache_dir, on_partial, progress, cancel).run()


class _Analysis:
    def __init__(self, quantizer, data, plan, isolation, isolation_data, isolation_samples, metric, namespaces,
                 selection, keep, budget, screen_samples, exhaustive, workers, chunk, htp_arch, cache_dir, on_partial,
                 progress, cancel):
        self.quantizer, self.data, self.plan = quantizer, data, plan
        self.isolation = isolation
        self.iso_data = isolation_data if isolation_data is not None else data.head(isolation_samples)
        self.metric, self.namespaces, self.selection = metric, namespaces, list(selection)
        self.keep, self.exhaustive, self.budget = max(1, keep), exhaustive, budget
        self.screen_direction = "screen" if _SCREEN_ESTIMATE else "promote"
        # A task metric scores the whole set at once: it cannot be screened on part of it.
        self.screen_samples = min(max(1, screen_samples), len(self.iso_data))
        if metric is not None:
            self.screen_samples = len(self.iso_data)
        self.workers, self.chunk, self.htp_arch = workers, max(1, chunk), htp_arch
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.on_partial, self.progress, self.cancel = on_partial, progress, cancel
        self.started = time.perf_counter()
        self.meta: dict = {}
        self.tensors_frame: pd.DataFrame | None = None
        self.weights = pd.DataFrame()
        self.store = IsolationValues()  # (config, samples) -> metric value, and its per-sample terms
        self.values: dict[tuple[Config, int], float] = self.store.values
        self.regions: list[Region] = []
        self.isolated: list[str] = []

    # ---- the steps ------------------------------------------------------------------------------------------
    def run(self) -> SensitivityReport:
        self.pool = self._pool()
        try:
            result = self._run()
        except BaseException:
            self.pool.terminate()
            raise
        self.pool.close()
        return result

    def _pool(self):
        count = self.workers
        if hasattr(count, "sensitivity_pool"):  # a distributed.RayCluster: the tasks run as its actors
            return count.sensitivity_pool(self.metric)
        if count is None:
            # Starting a worker costs a second or two: worth it from a few hundred configuration runs on.
            small = len(self.quantizer.graph.activations()) * len(self.iso_data) < _WORKERS_FROM
            memory = worker_memory(self.quantizer.prepared.model, self.quantizer.graph)
            count = 0 if small else worker_count(memory_each=memory)
        if count and self.metric is not None and not _picklable(self.metric):
            count = 0  # a metric that cannot travel to a worker is computed here
        # Workers start first: they import while this process calibrates and quantizes.
        return WorkerPool(count, self.metric) if count > 0 else InlineWorkers(self.cancel)

    def _run(self) -> SensitivityReport:
        q, graph = self.quantizer, self.quantizer.graph
        end_8, end_16 = plan_ends(self.plan)  # isolation switches between these, with the plan's weights
        self.model_8_path = q.generate(end_8, self.progress, self.cancel)
        self.model_16_path = q.generate(end_16, self.progress, self.cancel)
        plan_path = q.generate(self.plan, self.progress, self.cancel)
        model_8 = qdq.load(self.model_8_path)
        model_16 = qdq.load(self.model_16_path)
        params_8 = {t: v.encoding for t, v in qdq.read(model_8).activations().items()}
        params_16 = {t: v.encoding for t, v in qdq.read(model_16).activations().items()}
        self.tensors = list(params_8)
        self.counterparts = qdq.read(qdq.load(plan_path)).activations()
        self.meta = {"evaluated": 0, "model": q.prepared.source, "model_sha256": q.prepared.sha256, "plan": self.plan.summary(),
                     "plan_hash": self.plan.hash, "samples": len(self.data), "data": self.data.name,
                     "mode": "exhaustive" if self.exhaustive else "progressive", "tensors": len(self.tensors),
                     "workers": len(self.pool.processes), "range_note": q.range_note(self.plan),
                     "output_note": output_note(q.prepared.outputs)}
        self.pool.setup(scoring=ScoringSpec(str(q.float_path), str(plan_path), params_8, params_16,
                                            str(q.calibration_model(PrecisionPlan.a8w8()))))
        ids = self._submit_scores()
        done: dict[int, ScoreSums] = {}
        # While the workers score: the weights, and what isolation needs (scores shown as they come).
        self.weights = weight_scores(q.prepared.model, graph, cancel=self.cancel)
        self._collect_scores(graph, ids, done, wait=False)
        if self.isolation:
            output_names = [o.name for o in model_8.graph.output]
            references = float_references(q.float_path, self.iso_data, output_names)
            self.pool.setup(isolation=IsolationSpec(
                str(q.float_path), str(self.model_8_path), str(self.model_16_path), params_16, own_params(q, self.plan),
                list(self.iso_data.feeds()), references, output_names, self.metric))
            self._load_cache(model_8, model_16)
        self._collect_scores(graph, ids, done)
        result = self._isolate(graph) if self.isolation else None
        self.meta.update(partial=False, stage="done", seconds=round(time.perf_counter() - self.started, 3))
        return self._report(result, None)

    def _submit_scores(self) -> dict[int, int]:
        """Step 1: tensor scores over the samples in chunks; returns task id -> chunk index."""
        n = len(self.data)
        # A small first chunk: the first scores show within a few samples.
        starts = [0, *range(min(_FIRST_CHUNK, self.chunk), n, self.chunk)] if n else []
        self.chunks = [list(range(a, b)) for a, b in zip(starts, [*starts[1:], n]) if b > a]
        return {self.pool.submit("score", [self.data.sample(j) for j in c]): k for k, c in enumerate(self.chunks)}

    def _collect_scores(self, graph, ids: dict[int, int], done: dict[int, ScoreSums], wait: bool = True) -> None:
        """A partial report after each chunk (until all are in, or only what is there unless `wait`); the sums
        merge in sample order, whoever scored them."""
        n = len(self.data)
        while len(done) < len(self.chunks):
            self._check_cancel()
            finished = self.pool.results(0.2) if wait or isinstance(self.pool, WorkerPool) else []
            for task_id, sums in finished:
                self._check_cancel()
                done[ids[task_id]] = sums
                merged = ScoreSums.merged([done[k] for k in sorted(done)])
                self.tensors_frame = score_frame(graph, self.counterparts, merged)
                self.meta.update(stage="scores", scored_samples=merged.samples)
                self._tick(merged.samples, n, "scoring tensors")
                self._emit(None, None)
            if not wait:
                return

    def _isolate(self, graph) -> IsolationResult:
        """Steps 2 and 3: screening, then isolation of the tensors that can change a decision."""
        from ..latency import promotion_costs

        full, screen = len(self.iso_data), self.screen_samples
        regions: list[Region] = namespace_regions(graph, self.tensors) if self.namespaces else []
        if self.selection:
            regions.append(selection_region(graph, self.selection))
        self.costs = promotion_costs(self.model_8_path, self.tensors, self.htp_arch, graph=graph)
        self.regions = regions
        self.screened: dict[str, float] = {}
        self.isolated: list[str] = []
        # Baselines and regions, with the screening in the same go (every worker starts at once).
        first = [(c, full) for c in [_ALL_8, _ALL_16] + [(d, r.tensors) for r in regions
                                                          for d in ("promote", "demote")]]
        if self.exhaustive or screen >= full:
            self._evaluate(first, "isolating regions", 4)
            order = list(self.tensors)
            self.meta.update(screen_samples=full)
        else:
            screening = [(c, screen) for c in [_ALL_8] + [(self.screen_direction, (t,)) for t in self.tensors]]
            self._evaluate(first + screening, "screening tensors", 8, self._after_screening)
            self.meta.update(screen_samples=screen)
            order = self._candidates()
        self._refine(order, full, screen)
        return self._isolation_result(full)

    def _after_screening(self) -> None:
        screen = self.screen_samples
        if (_ALL_8, screen) not in self.values:
            return
        base_8 = self.values[(_ALL_8, screen)]
        for t in self.tensors:
            promoted = self.values.get(((self.screen_direction, (t,)), screen))
            if promoted is not None:
                # Screening promotes only: what the promotion removes stands for the contribution.
                self.screened[t] = _contribution(self._scorer_like(), promoted, None, base_8, None)
        self.meta.update(stage="screening", screened=len(self.screened), tensors=len(self.tensors))

    def _candidates(self) -> list[str]:
        """Every tensor in the order to isolate (`isolation_order.interleaved_order`), from the decision orders
        by screened value: the promotion gain and what a promotion removes per estimated latency cost."""
        screen = self.screen_samples
        base_8 = self.values[(_ALL_8, screen)]
        hib = self._scorer_like().higher_is_better
        gain = pd.Series({t: (1 if hib else -1) * (self.values[((self.screen_direction, (t,)), screen)] - base_8)
                          for t in self.tensors}, dtype=float)
        per_cost = pd.Series(self.screened, dtype=float).reindex(self.tensors) / self._cost_floor()
        self._screen_orders = {"gain": gain, "per_cost": per_cost}
        return interleaved_order(self.tensors, self._screen_orders)

    def _refine(self, order: list[str], full: int, screen: int) -> None:
        """Isolate tensors of `order` on all samples, in order, until none left can change a decision."""
        queue = list(order)
        inflight: dict[int, tuple[str, list[Config]]] = {}
        limit = 2 * max(1, len(self.pool.processes))
        budget = self.budget if self.budget is not None else 2 * self.keep
        # The most this will isolate: every tensor, or the budget (it may stop before, when the rest is decided).
        total = len(order) if self.exhaustive else min(len(order), budget)
        last_emit = 0.0
        stopped = False
        while queue or inflight:
            self._check_cancel()
            while queue and len(inflight) < limit and not stopped:
                if not self.exhaustive and (len(self.isolated) + len(inflight) >= budget or self._decided(queue, full)):
                    stopped = True
                    break
                t = queue.pop(0)
                configs = [("promote", (t,)), ("demote", (t,))]
                missing = [c for c in configs if (c, full) not in self.values]
                if not missing:
                    self.isolated.append(t)
                    continue
                inflight[self.pool.submit("isolate", (missing, full))] = (t, missing)
            if not inflight:
                if stopped or not queue:
                    break
                continue
            for task_id, values in self.pool.results(0.2):
                t, configs = inflight.pop(task_id)
                self._store([(c, full) for c in configs], values)
                self.isolated.append(t)
            self.meta.update(stage="isolation", isolated=len(self.isolated))
            self._tick(len(self.isolated), max(total, len(self.isolated)),
                       "isolating tensors" if self.exhaustive else f"isolating up to {total} tensors")
            now = time.perf_counter()
            if now - last_emit > 0.5 or not (queue or inflight):
                last_emit = now
                self._emit(self._isolation_result(full), self._priority())
        self.meta.update(isolated=len(self.isolated))
        if self.isolated:  # the rest is decided: the bar is full
            self._tick(len(self.isolated), len(self.isolated), "isolated tensors")
        if stopped and len(self.isolated) >= budget:
            self.meta.update(stopped=f"budget of {budget} isolated tensors reached; the other {len(queue)} are "
                                     f"ranked by their gain screened on {screen} of {full} samples")
        elif stopped:
            self.meta.update(stopped=f"the other {len(queue)} tensors cannot enter the top {self.keep} "
                                     f"(screened on {screen} of {full} samples)")

    def _decided(self, remaining: Sequence[str], full: int) -> bool:
        """Whether no tensor of `remaining` can enter the top `keep` of a decision order
        (`isolation_order.cannot_enter_top`); nothing is decided before twice `keep` tensors are isolated."""
        if len(self.isolated) < 2 * self.keep:
            return False
        return cannot_enter_top(self._screen_orders, self._full_orders(full), remaining, self.keep)

    def _full_orders(self, full: int) -> dict[str, pd.Series]:
        """The isolated tensors' values on the full samples, in the screening's terms (promotion only)."""
        base_8 = self.values[(_ALL_8, full)]
        scorer = self._scorer_like()
        sign = 1 if scorer.higher_is_better else -1
        gain, removed = {}, {}
        for t in self.isolated:
            promoted = self.values[(("promote", (t,)), full)]
            gain[t] = sign * (promoted - base_8)
            removed[t] = _contribution(scorer, promoted, None, base_8, None)
        removed = pd.Series(removed, dtype=float)
        return {"gain": pd.Series(gain, dtype=float), "per_cost": removed / self._cost_floor().reindex(removed.index)}

    def _cost_floor(self) -> pd.Series:
        return cost_floor(self.costs, self.tensors)

    # ---- running configurations ---------------------------------------------------------------------------
    def _evaluate(self, items: list[tuple[Config, int]], message: str, batch: int,
                  after: Callable[[], None] | None = None) -> None:
        """Evaluate every (config, samples) not known yet, `batch` configs a task."""
        missing = [item for item in dict.fromkeys(items) if item not in self.values]
        groups: dict[int, list[Config]] = {}
        for config, samples in missing:
            groups.setdefault(samples, []).append(config)
        ids: dict[int, tuple[list[Config], int]] = {}
        for samples, configs in groups.items():
            for i in range(0, len(configs), batch):
                part = configs[i:i + batch]
                ids[self.pool.submit("isolate", (part, samples))] = (part, samples)
        total, done, last_emit = len(missing), 0, 0.0
        while ids:
            self._check_cancel()
            for task_id, values in self.pool.results(0.2):
                configs, samples = ids.pop(task_id)
                self._store([(c, samples) for c in configs], values)
                done += len(configs)
                self._tick(done, total, message)
                now = time.perf_counter()
                if after is not None and (now - last_emit > 0.5 or not ids):
                    last_emit = now
                    after()
                    self._emit(None, self._priority())
        if after is not None and not missing:
            after()

    def _store(self, items: list[tuple[Config, int]], results: list) -> None:
        self.meta["evaluated"] = self.meta.get("evaluated", 0) + len(items)
        self.store.store(items, results)

    def _load_cache(self, model_8, model_16) -> None:
        """Isolation values of an earlier run on the same models, samples and metric."""
        if self.cache_dir is not None:
            path = cache_path(self.cache_dir, model_8, model_16, self.iso_data, self.metric, ENGINE_VERSION)
            self.meta["cached"] = self.store.open(path)

    # ---- reports --------------------------------------------------------------------------------------------
    def _isolation_result(self, full: int) -> IsolationResult | None:
        if (_ALL_8, full) not in self.values or (_ALL_16, full) not in self.values:
            return None
        scorer = self._scorer_like()
        all_8, all_16 = self.values[(_ALL_8, full)], self.values[(_ALL_16, full)]
        rows = []
        terms = [("", side, self.store.terms.get((config, full))) for side, config in (("all_8", _ALL_8),
                                                                                         ("all_16", _ALL_16))]
        for t in self.isolated:
            terms += [(t, side, self.store.terms.get(((direction, (t,)), full)))
                      for side, direction in (("promoted", "promote"), ("demoted", "demote"))]
        for name, members, source in ([(t, (t,), "tensor") for t in self.isolated]
                                      + [(r.name, r.tensors, r.source) for r in self.regions]):
            promoted = self.values.get((("promote", tuple(members)), full))
            demoted = self.values.get((("demote", tuple(members)), full))
            if promoted is None or demoted is None:
                continue
            rows.append({"region": name, "source": source, "tensors": len(set(members) & set(self.tensors)),
                         "members": ";".join(members), "promoted": promoted,
                         "promoted_gain": scorer.gain(promoted, all_8), "demoted": demoted,
                         "demoted_loss": scorer.gain(all_16, demoted)})
        return IsolationResult(pd.DataFrame(rows, columns=ISOLATION_COLUMNS), scorer.name, scorer.higher_is_better,
                               all_8, all_16, full, terms_frame(terms, full))

    def _priority(self) -> pd.Series | None:
        """The order of tensors not isolated yet: their screened promotion gain."""
        screen = self.screen_samples
        if (_ALL_8, screen) not in self.values:
            return None
        base = self.values[(_ALL_8, screen)]
        sign = 1 if self._scorer_like().higher_is_better else -1
        gains = {t: sign * (self.values[((self.screen_direction, (t,)), screen)] - base) for t in self.tensors
                 if ((self.screen_direction, (t,)), screen) in self.values}
        return pd.Series(gains, dtype=float) if gains else None

    def _report(self, isolation: IsolationResult | None, priority) -> SensitivityReport:
        if priority is None and isolation is not None:
            priority = self._priority()
        ranking = rank_tensors(self.tensors_frame, isolation, priority=priority)
        return SensitivityReport(ranking, self.tensors_frame, self.weights, isolation, dict(self.meta))

    def _emit(self, isolation, priority) -> None:
        if self.on_partial is None or self.tensors_frame is None:
            return
        self.meta.update(partial=True, seconds=round(time.perf_counter() - self.started, 3))
        self.on_partial(self._report(isolation, priority))

    def _scorer_like(self):
        from .isolation import OutputScorer

        return OutputScorer([], [], self.metric)

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("sensitivity analysis cancelled")

    def _tick(self, done: int, total: int, message: str) -> None:
        if self.progress:
            self.progress(done, total, message)


def _contribution(scorer, promoted: float, demoted: float | None, base_8: float, base_16: float | None) -> float:
    """What a tensor's 8 bits cost, seen from both ends (as the search orders tensors): for output SNR the
    noise power promoting it alone removes or demoting it alone adds, whichever is larger; for a task metric
    the larger of the two gains. Without `demoted`, what the promotion removes."""
    if scorer.metric is None:
        removed = removed_noise(base_8, promoted)
        if demoted is None:
            return removed
        return max(removed, added_noise(demoted, base_16))
    gain = scorer.gain(promoted, base_8)
    return gain if demoted is None else max(gain, scorer.gain(base_16, demoted))


def _picklable(value) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True
