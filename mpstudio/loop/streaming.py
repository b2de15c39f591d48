"""A plan's accuracy before its evaluation ends: the evaluation data run in chunks (a seeded first few, then
chunks doubling what has run), and after each chunk the metric on the samples so far with an interval for its
value on all of them. Partial values are never stored: a plan's result is the one on every sample."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..data import DataSource, Feed, Progress, Subset
from ..metric_terms import decomposes, metric_terms
from ..ctc_text import ctc_charset, ctc_greedy_decode, edit_distance
from ..metrics import OUTPUT_SNR, SNR_CAP_DB, ErrorAccumulator
from ..sources import Latency
from ..value_text import value_text
from . import uncertainty
from .uncertainty import small_sample_factor

LEVEL = uncertainty.LEVEL  # the intervals' coverage
BOOTSTRAP_ROUNDS = uncertainty.ROUNDS
FIRST_SAMPLES = 16  # the streamed evaluation's first value is on this many samples


@dataclass(frozen=True)
class PartialAccuracy:
    """A plan's accuracy on `samples` of the `total` evaluation samples, with a `LEVEL` interval for the value
    on all of them (bootstrap over samples, narrowed by the finite-population correction)."""

    plan_hash: str
    metric: str
    value: float
    low: float
    high: float
    samples: int
    total: int
    accuracy_source: str
    latency: Latency | None  # the cost model's estimate of the plan
    # The difference from another plan on the same samples (`uncertainty.PairedDifference`), when one was given
    # and its stored result has per-sample terms.
    paired: object | None = None

    def describe(self) -> str:
        text = (f"{self.metric} {value_text(self.value)} on {self.samples} of {self.total} samples "
                f"({100 * LEVEL:.0f} % interval {value_text(self.low)}-{value_text(self.high)}) "
                f"[{self.accuracy_source}]")
        return text + (f"; {self.paired.describe()}" if self.paired is not None else "")


class SampleTerms:
    """A metric written as `combine(sum of numerators, sum of denominators)` over samples, so any subset of
    samples gives a value, and resampling them an interval. CER: edit errors over reference characters per
    line; output SNR: signal over noise power per sample."""

    def __init__(self, name: str, terms: Callable[[Sequence[Feed], Sequence[int]], tuple[np.ndarray, np.ndarray]],
                 combine: Callable[[np.ndarray, np.ndarray], np.ndarray]):
        self.name, self.terms, self.combine = name, terms, combine

    def partial(self, outputs: Sequence[Feed], indices: Sequence[int], total: int, *, seed: int = 0
                ) -> tuple[float, float, float]:
        """(value, low, high) of the metric on the samples `indices` (whose outputs are `outputs`), the interval
        being for the value on all `total` samples."""
        num, den = self.terms(outputs, indices)
        columns = np.stack([np.asarray(num, np.float64), np.asarray(den, np.float64)], axis=1)
        return partial_interval(columns, lambda sums: self.combine(sums[..., 0], sums[..., 1]), total, seed=seed)


class MetricSampleTerms(SampleTerms):
    """A built-in metric's per-sample terms (`metric_terms`: top-1 agreement, output cosine and the rest) as
    partial values: any subset of samples gives the metric, resampling them its interval."""

    def __init__(self, spec, model, references: Sequence[Feed]):
        self.name, self.spec, self.model, self.references = spec.name, spec, model, references

    def partial(self, outputs: Sequence[Feed], indices: Sequence[int], total: int, *, seed: int = 0
                ) -> tuple[float, float, float]:
        terms = metric_terms(self.spec, self.model, outputs, [self.references[i] for i in indices], indices)
        return partial_interval(terms.columns, terms.combine, total, seed=seed)


def partial_interval(columns: np.ndarray, combine: Callable[[np.ndarray], np.ndarray], total: int, *,
                     seed: int = 0) -> tuple[float, float, float]:
    """(value, low, high) of a metric whose value is `combine(sums of the columns)` over samples (`columns`: one
    row per sample so far), the interval being for its value on all `total` samples."""
    value = float(combine(columns.sum(axis=0)))
    n = len(columns)
    if n < 2 or n >= total:
        return value, value, value
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=BOOTSTRAP_ROUNDS).astype(np.float64)
    values = np.asarray(combine(counts @ columns), np.float64)
    values = values[np.isfinite(values)]
    if not len(values):
        return value, value, value
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    # Percentile bootstrap intervals are too narrow on few samples: widen them as Student's t widens the
    # normal interval. The samples are drawn without replacement from a finite set: the interval shrinks to
    # nothing as they cover it.
    shrink = small_sample_factor(n) * math.sqrt((total - n) / (total - 1))
    return value, value - (value - float(low)) * shrink, value + (float(high) - value) * shrink


def cer_terms(references: Sequence[str], charset: list[str]) -> SampleTerms:
    """CER as per-line edit errors over per-line reference lengths (as `ctc_text.cer_metric` scores it)."""
    def terms(outputs, indices):
        errors, lengths = [], []
        for out, i in zip(outputs, indices):
            text = ctc_greedy_decode(next(iter(out.values()))[0], charset).strip()
            errors.append(edit_distance(text, references[i]))
            lengths.append(len(references[i]))
        return np.array(errors), np.array(lengths)

    def combine(errors, lengths):
        return errors / np.maximum(lengths, 1)
    return SampleTerms("CER", terms, combine)


def snr_terms(references: Sequence[Feed]) -> SampleTerms:
    """Output SNR against the float model as per-sample signal power over noise power (`output_agreement`)."""
    def terms(outputs, indices):
        signal, noise = [], []
        for out, i in zip(outputs, indices):
            acc = ErrorAccumulator(np.float64)
            for name, value in references[i].items():
                acc.add(value, out[name])
            signal.append(acc.signal)
            noise.append(acc.noise)
        return np.array(signal), np.array(noise)

    def combine(signal, noise):
        eps = float(np.finfo(np.float64).eps) ** 2
        return np.minimum(10.0 * np.log10(np.maximum(signal, eps) / np.maximum(noise, eps)), SNR_CAP_DB)
    return SampleTerms(OUTPUT_SNR, terms, combine)


def sample_terms(spec, model, references: Sequence[Feed]) -> SampleTerms | None:
    """The per-sample form of a study's metric (`metrics.MetricSpec`), or None when it has none (a metric given
    in Python is a function of the whole set)."""
    if spec.kind == "output":
        return snr_terms(references)
    if spec.kind == "ctc_cer":
        return cer_terms(tuple(spec.args["references"]), ctc_charset(model))
    if decomposes(spec) and not spec.args.get("function", "").endswith(":recall_at_k"):  # a query ranks every document
        return MetricSampleTerms(spec, model, references)
    return None


def stream_order(total: int, first: int = FIRST_SAMPLES, seed: int = 0) -> list[list[int]]:
    """Sample indices in the chunks a streamed evaluation runs them: a seeded random `first` (the same for every
    plan, so first values compare on the same samples), then chunks doubling in size over the rest."""
    order = np.random.default_rng(seed).permutation(total).tolist()
    chunks, start, size = [], 0, max(1, first)
    while start < total:
        chunks.append(sorted(order[start:start + size]))
        start += size
        size = start  # each chunk doubles what has run
    return chunks


def streamed_outputs(data: DataSource, run: Callable[[DataSource, Progress | None], list[Feed]], terms: SampleTerms,
                     first: int, on_partial: Callable[..., None],
                     progress: Progress | None = None) -> list[Feed]:
    """Every sample's outputs in sample order, `run(subset, progress)` on the `stream_order` chunks of `data`;
    after each chunk but the last, `on_partial(value, low, high, samples so far, their outputs, their indices)`."""
    total = len(data)
    outputs: dict[int, Feed] = {}
    for chunk in stream_order(total, first):
        offset = len(outputs)

        def step(done, _total, message, offset=offset):
            if progress:
                progress(offset + done, total, message)
        outputs.update(zip(chunk, run(Subset(data, chunk, f"{data.name}[stream]"), step)))
        if len(outputs) < total:
            indices = sorted(outputs)
            so_far = [outputs[i] for i in indices]
            value, low, high = terms.partial(so_far, indices, total)
            on_partial(value, low, high, len(indices), so_far, indices)
    return [outputs[i] for i in range(total)]


__all__ = ["PartialAccuracy", "SampleTerms", "MetricSampleTerms", "partial_interval", "cer_terms", "snr_terms",
           "sample_terms", "stream_order", "streamed_outputs", "FIRST_SAMPLES", "LEVEL", "BOOTSTRAP_ROUNDS"]
