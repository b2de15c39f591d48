"""The isolation values of an analysis and their on-disk cache: one JSON line per (configuration, samples) value
with its per-sample noise terms, in a file named by the models, samples and metric they were measured with, so
that an interrupted or repeated analysis runs only what is missing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..data import DataSource, TaskMetric

# The output SNR's name in the cache's key: older than `metrics.OUTPUT_SNR` and kept byte for byte, so that
# caches written before stay valid.
CACHE_KEY_OUTPUT_SNR = "output SNR"


def cache_path(cache_dir: Path, model_8, model_16, data: DataSource, metric: TaskMetric | None,
               engine_version: int) -> Path:
    """The cache file of isolation values between `model_8` and `model_16` on `data` with `metric` (None: output
    SNR), created folder included."""
    digest = hashlib.sha256()
    for part in (model_8.SerializeToString(), model_16.SerializeToString(), data.fingerprint().encode(),
                 (metric.name if metric else CACHE_KEY_OUTPUT_SNR).encode(), f"v{engine_version}".encode()):
        digest.update(hashlib.sha256(part).digest())
    cache_dir.mkdir(parents=True, exist_ok=True)
    return cache_dir / f"isolation-{digest.hexdigest()[:16]}.jsonl"


class IsolationValues:
    """(config, samples) -> metric value, and -> its per-sample noise terms where the metric has them
    (`OutputScorer.score_terms`); mirrored in a cache file once `open` names one."""

    def __init__(self):
        self.values: dict = {}
        self.terms: dict = {}
        self.path: Path | None = None

    def open(self, path: Path) -> int:
        """Read what the cache file at `path` holds (lines a killed process cut short are skipped) and append to it
        from now on; returns how many values it held."""
        self.path = path
        if not path.exists():
            return 0
        for line in path.read_text().splitlines():
            try:
                item = json.loads(line)
                key = ((str(item["config"][0]), tuple(item["config"][1])), int(item["samples"]))
                value = float(item["value"])
                terms = item.get("terms")
                terms = None if terms is None else np.asarray(terms, np.float64)
            except (ValueError, KeyError, IndexError, TypeError):
                continue  # a line cut short by a killed process
            self.values[key] = value
            if terms is not None:
                self.terms[key] = terms
        return len(self.values)

    def store(self, items, results) -> None:
        """Keep the results ((value, terms or None) pairs) of `items` ((config, samples) pairs), in the file too."""
        lines = []
        for (config, samples), (value, terms) in zip(items, results):
            self.values[(config, samples)] = float(value)
            line = {"config": [config[0], list(config[1])], "samples": samples, "value": float(value)}
            if terms is not None:
                self.terms[(config, samples)] = np.asarray(terms, np.float64)
                line["terms"] = [float(t) for t in terms]
            lines.append(json.dumps(line))
        if lines and self.path is not None:
            with open(self.path, "a") as handle:
                handle.write("\n".join(lines) + "\n")
