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
        if self.metric is not None:
            reference = ([dict(zip(self.output_names, r)) for r in self.references]
                         if self.metric.needs_reference else None)
            return self.metric([dict(zip(self.output_names, o)) for o in outputs], reference)
        acc = ErrorAccumulator()
        for reference, values in zip(self.references, outputs):
            for r, v in zip(reference, values):
                acc.add(r, v)
        return acc.snr_db

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

    def per_tensor(self) -> pd.DataFrame:
        """The rows of single tensors, indexed by tensor name."""
        return self.scores[self.scores["source"] == "tensor"].set_index("region")


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

    def evaluate(config: frozenset[str]) -> float:
        if cancel is not None and cancel.is_set():
            raise Cancelled("isolation scoring cancelled")
        value = scorer.score(samples.outputs(switchable.setting(config)))
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], total, "isolation scores")
        return value

    with ThreadPoolExecutor(max_workers=switchable.threads) as pool:
        values = iter(list(pool.map(evaluate, configs)))
    all_8, all_16 = next(values), next(values)
    rows = []
    for region, m in zip(regions, members):
        promoted = next(values)
        demoted = next(values) if both_directions else np.nan
        rows.append({
            "region": region.name, "source": region.source, "tensors": len(m),
            "members": ";".join(region.tensors), "promoted": promoted,
            "promoted_gain": scorer.gain(promoted, all_8),
            "demoted": demoted, "demoted_loss": scorer.gain(all_16, demoted),
        })
    return IsolationResult(pd.DataFrame(rows, columns=ISOLATION_COLUMNS), scorer.name, scorer.higher_is_better,
                           all_8, all_16, len(samples.samples))


def tensor_regions(tensors: Sequence[str]) -> list[Region]:
    return [Region(t, (t,), "tensor") for t in tensors]
