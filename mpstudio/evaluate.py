"""Run a model over a data source in this process and score it: the quick path for scripts and the CLI.

Studies evaluate through an agent; this module is what the agent's worker and the command line share.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .data import Cancelled, DataSource, Feed, Progress, TaskMetric
from .runtime import create_session


def run_outputs(
    model: str | Path,
    source: DataSource,
    backend: str = "cpu",
    provider_options: dict | None = None,
    progress: Progress | None = None,
    cancel=None,
    *,
    allow_cpu_fallback: bool = False,
) -> list[Feed]:
    """Every sample's outputs (name -> array), in sample order (on htp, nodes QNN lacks run on ORT's CPU EP only
    with `allow_cpu_fallback`)."""
    session = create_session(model, backend, provider_options, allow_cpu_fallback=allow_cpu_fallback)
    names = [o.name for o in session.get_outputs()]
    outputs: list[Feed] = []
    total = len(source)
    for i, feed in enumerate(source.feeds()):
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"cancelled after {i} of {total} samples")
        values = session.run(names, feed)
        outputs.append({n: np.asarray(v) for n, v in zip(names, values)})
        if progress:
            progress(i + 1, total, f"running {Path(model).name} on {backend}")
    return outputs


def evaluate(model: str | Path, source: DataSource, metric: TaskMetric, backend: str = "cpu",
             provider_options: dict | None = None, progress: Progress | None = None, cancel=None) -> float:
    """The task metric of `model` on `source`."""
    return metric(run_outputs(model, source, backend, provider_options, progress, cancel))
