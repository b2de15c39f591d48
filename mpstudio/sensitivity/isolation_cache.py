"""The on-disk cache of isolation values: one JSON line per (configuration, samples) value, in a file named by
the models, samples and metric they were measured with, so that an interrupted or repeated analysis runs only
what is missing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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


def read_values(path: Path) -> dict:
    """The values a cache file holds: (config, samples) -> value; lines a killed process cut short are skipped."""
    values = {}
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
            config = (str(item["config"][0]), tuple(item["config"][1]))
            values[(config, int(item["samples"]))] = float(item["value"])
        except (ValueError, KeyError, IndexError, TypeError):
            continue  # a line cut short by a killed process
    return values


def append_values(path: Path, items, values) -> None:
    """Add the values of `items` ((config, samples) pairs) to the cache file."""
    lines = [json.dumps({"config": [config[0], list(config[1])], "samples": samples, "value": float(value)})
             for (config, samples), value in zip(items, values)]
    if lines:
        with open(path, "a") as handle:
            handle.write("\n".join(lines) + "\n")
