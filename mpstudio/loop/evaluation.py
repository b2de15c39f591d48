"""One plan's evaluation: its QDQ model generated, run where its `Target` says (streamed in chunks when a
caller watches partial values), scored against the float model, estimated by the cost model, measured on an
agent's HTP, and recorded in the store."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Callable

from ..blas_threads import with_one_blas_thread
from ..data import DataSource, Progress, TaskMetric
from ..metric_terms import MetricTerms, metric_terms
from ..metrics import MetricSpec, output_agreement
from ..model import PreparedModel
from ..plan import PrecisionPlan
from ..quantize import Quantizer
from ..store import AccuracyRecord, Evaluation, StudyStore
from .cost_model import CostModel
from .folder import ResultCount
from .reference import FloatReference
from .runners import Target
from .streaming import FIRST_SAMPLES, PartialAccuracy, SampleTerms, sample_terms, streamed_outputs
from .uncertainty import interval, paired_difference


@dataclasses.dataclass(frozen=True)
class Scoring:
    """How a plan's outputs become its accuracy: `metric` (None: output SNR against the float model) named and
    directed by `spec`; `model` gives a CTC metric its charset for the per-sample form."""

    spec: MetricSpec
    model: PreparedModel
    metric: TaskMetric | None

    def sample_terms(self, references) -> SampleTerms | None:
        """The metric per sample, for partial values (None: a metric of the whole set only)."""
        return sample_terms(self.spec, self.model, references)

    def score(self, outputs, references) -> tuple[float, float, float]:
        """(the metric's value, output SNR, cosine) of `outputs` against the float model's `references`."""
        snr, cosine = output_agreement(references, outputs)
        value = self.metric(outputs, references) if self.metric is not None else snr
        return float(value), snr, cosine

    def terms(self, outputs, references, value: float | None = None) -> MetricTerms | None:
        """The metric's per-sample terms of `outputs` (None: a metric of the whole set only, or terms that do not
        give the metric's `value`, which are then not kept)."""
        terms = metric_terms(self.spec, self.model, outputs, references)
        if terms is None or value is None:
            return terms
        return terms if abs(terms.value() - value) <= 1e-9 * max(1.0, abs(value)) else None


@dataclasses.dataclass(frozen=True)
class PlanEvaluation:
    """Evaluates plans on `data` from explicit parts: the `quantizer` that makes a plan's QDQ model, the float
    `reference`, the `scoring`, the `cost_model` that estimates latency, the `store` results go to (and the
    `results` count beside it). `on_profile(plan_id, measured, profile)` receives a device run's per-op profile."""

    quantizer: Quantizer
    data: DataSource
    reference: FloatReference
    scoring: Scoring
    cost_model: CostModel
    store: StudyStore
    results: ResultCount
    on_profile: Callable[[int, object, object], None] | None = None

    @with_one_blas_thread
    def run(self, plan: PrecisionPlan, plan_id: int, target: Target, *, measure_latency: bool = True,
            profile: bool | None = None, progress: Progress | None = None, cancel: threading.Event | None = None,
            partial: Callable[[PartialAccuracy], None] | None = None, first_samples: int | None = None,
            versus: tuple[str, MetricTerms] | None = None) -> Evaluation:
        """Evaluate stored plan `plan_id` on `target`, record it with its per-sample metric terms and their
        interval, and return it (see `Study.evaluate`). `versus`: (name, terms) of a plan evaluated on the same
        samples, which partial values are compared with (`PartialAccuracy.paired`)."""
        started = time.perf_counter()
        path = self.quantizer.generate(plan, progress, cancel)
        if partial is not None:
            # The cost model reads the new model while the first samples run (ORT releases the GIL).
            estimating = _Background(self.cost_model.estimate, path) if measure_latency else None
            outputs = self._streamed(plan, path, target, estimating, partial, first_samples, progress, cancel,
                                     versus)
            estimate = estimating.result() if estimating is not None else None
        else:
            estimate = self.cost_model.estimate(path) if measure_latency else None
            outputs = target.outputs(path, self.data, progress, cancel)
        references = self.reference.outputs(progress, cancel)
        value, snr, cosine = self.scoring.score(outputs, references)
        terms = self.scoring.terms(outputs, references, value)
        spread = interval(terms) if terms is not None else None
        record = AccuracyRecord(target.backend, target.source, self.scoring.spec.name, value,
                                self.scoring.spec.higher_is_better, snr, cosine, len(self.data),
                                time.perf_counter() - started, spread and spread.low, spread and spread.high,
                                spread and spread.resolution)
        latencies, measured, profiled = [], None, None
        if measure_latency:
            latencies.append(estimate)
            if target.backend == "htp" and target.runner.agent is not None:
                measured, profiled = target.measure(path, self.data.sample(0), profile)
                latencies.append(measured)
        self.store.record(plan_id, record, latencies, terms)
        self.results.write()
        # A run with nodes on the CPU times more than the HTP's profile shows: no cost-model fit on it.
        if measured is not None and profiled is not None and not target.fallback and self.on_profile is not None:
            self.on_profile(plan_id, measured, profiled)
        stored = self.store.evaluation(plan_id, target.source)
        assert stored is not None
        return dataclasses.replace(stored, cached=False)

    def _streamed(self, plan: PrecisionPlan, path: Path, target: Target, estimating: "_Background | None",
                  partial: Callable[[PartialAccuracy], None], first_samples: int | None, progress, cancel,
                  versus: tuple[str, MetricTerms] | None = None) -> list:
        """The outputs in sample order, run in `streaming.stream_order` chunks, with a `PartialAccuracy` passed to
        `partial` after each chunk but the last (with its difference from `versus` on the same samples)."""
        references = self.reference.outputs(progress, cancel)
        terms = self.scoring.sample_terms(references)
        if terms is None:  # a metric of the whole set only: nothing to show before the end
            return target.outputs(path, self.data, progress, cancel)
        total = len(self.data)
        spec = self.scoring.spec
        if versus is not None and versus[1].units != total:
            versus = None  # stored on other samples: nothing to pair with

        def report(value: float, low: float, high: float, samples: int, outputs, indices) -> None:
            estimate = estimating.result() if estimating is not None else None
            paired = None
            if versus is not None:
                mine = metric_terms(spec, self.scoring.model, outputs, [references[i] for i in indices], indices)
                if mine is not None:
                    paired = paired_difference(mine, versus[1], metric=spec.name, higher_is_better=spec.higher_is_better,
                                               plan_name=plan.name or plan.summary(), versus_name=versus[0],
                                               indices=indices, total=total)
            partial(PartialAccuracy(plan.hash, spec.name, value, low, high, samples, total, target.source, estimate,
                                    paired))
        return streamed_outputs(self.data, lambda subset, step: target.outputs(path, subset, step, cancel), terms,
                                first_samples or FIRST_SAMPLES, report, progress)


class _Background:
    """`fn(*args)` run in a thread; `result()` waits for it (and raises what it raised)."""

    def __init__(self, fn, *args):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn, args):
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
