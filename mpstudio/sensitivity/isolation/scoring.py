"""Isolation scores: each region promoted alone from the all-8-bit plan and demoted alone from the
all-16-bit plan, scored against the float model's outputs (output SNR or a task metric)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from ...data import Cancelled, DataSource, Progress, TaskMetric
from ...loop.inprocess import run_outputs
from ...metrics import OUTPUT_SNR, ErrorAccumulator


class OutputScorer:
    """Scores a configuration's outputs over the evaluation samples: output SNR, or a task metric."""

    def __init__(self, references: Sequence[list[np.ndarray]], output_names: Sequence[str],
                 metric: TaskMetric | None = None):
        self.references, self.output_names, self.metric = list(references), list(output_names), metric

    @property
    def higher_is_better(self) -> bool:
        return self.metric.higher_is_better if self.metric else True

    @property
    def name(self) -> str:
        return self.metric.name if self.metric else OUTPUT_SNR

    def score(self, outputs: Sequence[list[np.ndarray]]) -> float:
        return self.score_terms(outputs)[0]

    def score_terms(self, outputs: Sequence[list[np.ndarray]]) -> tuple[float, np.ndarray | None]:
        """The score and, for output SNR, each sample's share of its noise power (the sample's error energy over
        the reference energy of all samples: the shares sum to the noise power of the score); a task metric
        scores the whole set and has no shares (None)."""
        if self.metric is not None:
            reference = ([dict(zip(self.output_names, r)) for r in self.references]
                         if self.metric.needs_reference else None)
            return self.metric([dict(zip(self.output_names, o)) for o in outputs], reference), None
        acc = ErrorAccumulator()
        noise = []
        for reference, values in zip(self.references, outputs):
            sample = ErrorAccumulator()  # beside the total, which keeps its own order of sums
            for r, v in zip(reference, values):
                acc.add(r, v)
                sample.add(r, v)
            noise.append(sample.noise)
        return acc.snr_db, np.asarray(noise, np.float64) / max(acc.signal, 1e-300)

    def gain(self, value: float, baseline: float) -> float:
        """How much better `value` is than `baseline`, positive when better, in the metric's units."""
        return (value - baseline) if self.higher_is_better else (baseline - value)


def float_references(float_model, data: DataSource, output_names: Sequence[str]) -> list[list[np.ndarray]]:
    """The float model's outputs for every sample (small: the model outputs only)."""
    return [[outputs[name] for name in output_names] for outputs in run_outputs(float_model, data)]


# Columns of `isolation_scores` (one row per candidate: a tensor or a region):
#   region, source (tensor/namespace/qnn/selection/...), tensors (how many activation tensors), members
#   (their names, joined by ";"), promoted (metric with only this region at 16 bits in the all-8-bit plan),
#   promoted_gain (its improvement over all-8-bit, positive = better), demoted (metric with only this region
#   at 8 bits in the all-16-bit plan), demoted_loss (its loss against all-16-bit, positive = worse).
ISOLATION_COLUMNS = ["region", "source", "tensors", "members", "promoted", "promoted_gain", "demoted", "demoted_loss"]

# `IsolationResult.terms` (output SNR only): one row per configuration of a single tensor and per baseline, each
# sample's share of that configuration's noise power (`OutputScorer.score_terms`; a row sums to the noise power
# of its SNR): columns region (the tensor; "" for a baseline), side (one of TERM_SIDES), then one per isolation
# sample, named "0", "1", ...
TERM_SIDES = ("all_8", "all_16", "promoted", "demoted")


@dataclass(frozen=True)
class Region:
    """A named group of activation tensors that is promoted or demoted together."""

    name: str
    tensors: tuple[str, ...]
    source: str = "tensor"


@dataclass(frozen=True)
class IsolationResult:
    """Isolation scores with the two baselines they are measured from."""

    scores: pd.DataFrame  # ISOLATION_COLUMNS
    metric: str
    higher_is_better: bool
    all_8: float
    all_16: float
    samples: int
    terms: pd.DataFrame | None = None  # per-sample noise terms (see TERM_SIDES); None: not kept (a task metric)

    def per_tensor(self) -> pd.DataFrame:
        """The rows of single tensors, indexed by tensor name."""
        return self.scores[self.scores["source"] == "tensor"].set_index("region")

    def side_terms(self, side: str) -> pd.DataFrame | None:
        """The per-sample noise terms of one side (TERM_SIDES), indexed by tensor ("" for a baseline), a column
        per sample; None when the analysis kept none."""
        if self.terms is None or side not in TERM_SIDES:
            return None
        rows = self.terms[self.terms["side"] == side]
        return rows.set_index("region").drop(columns=["side"]).astype(float)


def terms_frame(rows: Sequence[tuple[str, str, np.ndarray | None]], samples: int) -> pd.DataFrame | None:
    """`IsolationResult.terms` from (region, side, per-sample terms) rows; rows without terms are left out, and
    None when no row has any."""
    kept = [(region, side, np.asarray(t, np.float64)) for region, side, t in rows
            if t is not None and len(t) == samples]
    if not kept:
        return None
    frame = pd.DataFrame(np.stack([t for _, _, t in kept]), columns=[str(i) for i in range(samples)])
    frame.insert(0, "side", [side for _, side, _ in kept])
    frame.insert(0, "region", [region for region, _, _ in kept])
    return frame


def isolation_scores(
    switchable,
    data: DataSource,
    regions: Sequence[Region],
    scorer: OutputScorer,
    both_directions: bool = True,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> IsolationResult:
    """Evaluate each region promoted alone (and, if `both_directions`, demoted alone) on `data` with
    `switchable` (a SwitchableModel)."""
    samples = switchable.cached(list(data.feeds()))  # the evaluation subset is small; every configuration reuses it
    everything = frozenset(switchable.tensors)
    members = [frozenset(region.tensors) & everything for region in regions]
    configs: list[frozenset[str]] = [frozenset(), everything]
    for m in members:
        configs += [m, everything - m] if both_directions else [m]
    total = len(configs)
    done = [0]
    lock = threading.Lock()

    def evaluate(config: frozenset[str]) -> tuple[float, np.ndarray | None]:
        if cancel is not None and cancel.is_set():
            raise Cancelled("isolation scoring cancelled")
        value = scorer.score_terms(samples.outputs(switchable.setting(config)))
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], total, "isolation scores")
        return value

    with ThreadPoolExecutor(max_workers=switchable.threads) as pool:
        values = iter(list(pool.map(evaluate, configs)))
    (all_8, terms_8), (all_16, terms_16) = next(values), next(values)
    rows, terms = [], [("", "all_8", terms_8), ("", "all_16", terms_16)]
    for region, m in zip(regions, members):
        promoted, promoted_terms = next(values)
        demoted, demoted_terms = next(values) if both_directions else (np.nan, None)
        if region.source == "tensor":
            terms += [(region.name, "promoted", promoted_terms), (region.name, "demoted", demoted_terms)]
        rows.append({
            "region": region.name, "source": region.source, "tensors": len(m),
            "members": ";".join(region.tensors), "promoted": promoted,
            "promoted_gain": scorer.gain(promoted, all_8),
            "demoted": demoted, "demoted_loss": scorer.gain(all_16, demoted),
        })
    count = len(samples.samples)
    return IsolationResult(pd.DataFrame(rows, columns=ISOLATION_COLUMNS), scorer.name, scorer.higher_is_better,
                           all_8, all_16, count, terms_frame(terms, count))


def tensor_regions(tensors: Sequence[str]) -> list[Region]:
    return [Region(t, (t,), "tensor") for t in tensors]
