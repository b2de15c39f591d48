"""A study's rows of plans a backend could not build: one row per (plan, where it was built), with the error, QNN's
own words, the first failing node, the toolchain that refused it and how many times it was tried.

Rows only: what counts as a build failure, and when one is tried again, is `loop.build_failures`'s business.
"""

from __future__ import annotations

import json
import time

import pandas as pd

from .store import StudyStore

# Columns of `BuildRows.frame()`: plan_id, plan_hash, name, sixteen_bit, backend (htp), target (where it was built,
#   e.g. "HTP emulator on host"), htp_arch, error (what the build raised), qnn (QNN's words from its verbose log;
#   empty when none were read), node (the first failing node; empty when QNN names none), toolchain (dict:
#   onnxruntime, onnxruntime_qnn, htp_arch), attempts (builds tried), estimate_ms (the cost model's latency of the
#   plan; NaN without one), created, updated.
BUILD_FAILURE_COLUMNS = ["plan_id", "plan_hash", "name", "sixteen_bit", "backend", "target", "htp_arch", "error", "qnn",
                         "node", "toolchain", "attempts", "estimate_ms", "created", "updated"]


class BuildRows:
    """The build_failures table of one study's store."""

    def __init__(self, store: StudyStore):
        self.store = store

    def record(self, plan_id: int, backend: str, target: str, htp_arch: str, error: str, qnn: str, node: str,
               toolchain: dict) -> int:
        """Store one failed build of `plan_id` on `target` (replacing what an older toolchain said); returns how many
        builds of it have failed there."""
        now = time.time()
        with self.store.write() as db:
            row = db.execute("SELECT attempts FROM build_failures WHERE plan_id = ? AND target = ?",
                             (plan_id, target)).fetchone()
            attempts = (int(row[0]) if row else 0) + 1
            db.execute("INSERT INTO build_failures (plan_id, backend, target, htp_arch, error, qnn, node, toolchain,"
                       " attempts, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                       " ON CONFLICT (plan_id, target) DO UPDATE SET backend = excluded.backend,"
                       " htp_arch = excluded.htp_arch, error = excluded.error, qnn = excluded.qnn, node = excluded.node,"
                       " toolchain = excluded.toolchain, attempts = excluded.attempts, updated = excluded.updated",
                       (plan_id, backend, target, htp_arch, error, qnn, node, json.dumps(toolchain, sort_keys=True),
                        attempts, now, now))
        return attempts

    def forget(self, plan_id: int, target: str) -> None:
        """The plan built on `target` after all (a newer toolchain): its failure is history, not a result."""
        if self.store.read_only:
            return
        with self.store.write() as db:
            db.execute("DELETE FROM build_failures WHERE plan_id = ? AND target = ?", (plan_id, target))

    def frame(self) -> pd.DataFrame:
        """Every stored failure (BUILD_FAILURE_COLUMNS), oldest first. A store older than the table (opened
        read-only, so never upgraded) has none."""
        try:
            frame = self.store.read(
                """SELECT f.plan_id, p.hash AS plan_hash, p.name, p.sixteen_bit, f.backend, f.target, f.htp_arch,
                          f.error, f.qnn, f.node, f.toolchain, f.attempts, e.ms AS estimate_ms, f.created, f.updated
                   FROM build_failures f JOIN plans p ON p.id = f.plan_id
                   LEFT JOIN latency e ON e.plan_id = f.plan_id AND e.source = 'estimate'
                   ORDER BY f.created, f.plan_id""")
        except Exception as exc:  # noqa: BLE001 - only a missing table is expected; anything else is raised
            if "no such table" not in str(exc):
                raise
            return pd.DataFrame(columns=BUILD_FAILURE_COLUMNS)
        frame["toolchain"] = frame["toolchain"].map(json.loads)
        frame["estimate_ms"] = frame["estimate_ms"].astype(float)
        return frame[BUILD_FAILURE_COLUMNS]


__all__ = ["BuildRows", "BUILD_FAILURE_COLUMNS"]
