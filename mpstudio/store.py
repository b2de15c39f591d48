"""A study's results on disk: plans, accuracy and latency results, queued evaluations and searches (and the rows
`store_builds` keeps of plans a backend could not build), in SQLite.

WAL mode, each result committed in one transaction when it is measured, so a study killed at any moment
reopens with every finished evaluation. Work in progress (a running job, a running search) belongs to an
owner process that keeps a heartbeat; work whose owner is gone is free again, and nothing is marked
abandoned just because another process opened the study. Heartbeats are dated on the clock of the file
system holding the study, so hosts whose clocks disagree agree on their age; an owner on this host is
checked by its pid and start time, so a later process given the same pid does not keep its work.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import MpstudioError
from .sources import Latency
from .store_owners import STALE_AFTER_S, owner_alive, settle, study_clock_offset, this_process
from .value_text import step_text, value_text

DB_FILE = "study.sqlite"
# How often a process refreshes the heartbeats of the work it owns, while it owns any.
PULSE_EVERY_S = STALE_AFTER_S / 4
# The WAL is folded into the database file at least this often while results are written.
CHECKPOINT_EVERY_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id INTEGER PRIMARY KEY, hash TEXT UNIQUE NOT NULL, name TEXT NOT NULL, origin TEXT NOT NULL,
    plan_json TEXT NOT NULL, sixteen_bit INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS accuracy (
    id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL REFERENCES plans(id), backend TEXT NOT NULL,
    source TEXT NOT NULL, metric TEXT NOT NULL, value REAL NOT NULL, higher_is_better INTEGER NOT NULL,
    snr_db REAL, cosine REAL, samples INTEGER NOT NULL, seconds REAL NOT NULL, created REAL NOT NULL,
    UNIQUE (plan_id, source));
CREATE TABLE IF NOT EXISTS latency (
    id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL REFERENCES plans(id), source TEXT NOT NULL,
    place TEXT NOT NULL, ms REAL NOT NULL, detail TEXT NOT NULL, created REAL NOT NULL,
    UNIQUE (plan_id, source, place));
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL REFERENCES plans(id), backend TEXT NOT NULL,
    status TEXT NOT NULL, search_id INTEGER, owner TEXT, error TEXT, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS searches (
    id INTEGER PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL, result TEXT, created REAL NOT NULL,
    updated REAL NOT NULL, owner TEXT);
CREATE TABLE IF NOT EXISTS build_failures (
    id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL REFERENCES plans(id), backend TEXT NOT NULL, target TEXT NOT NULL,
    htp_arch TEXT NOT NULL, error TEXT NOT NULL, qnn TEXT NOT NULL, node TEXT NOT NULL, toolchain TEXT NOT NULL,
    attempts INTEGER NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, UNIQUE (plan_id, target));
CREATE TABLE IF NOT EXISTS sample_terms (
    plan_id INTEGER NOT NULL REFERENCES plans(id), source TEXT NOT NULL, header TEXT NOT NULL, terms BLOB NOT NULL,
    PRIMARY KEY (plan_id, source));
"""
# Columns added after the first format; added to older stores when they are opened.
# Latency scope and interval: empty in rows stored before them (Latency fills the scope in, no interval).
_ADDED_COLUMNS = {"searches": {"owner": "TEXT"},
                  "latency": {"includes": "TEXT", "low_ms": "REAL", "high_ms": "REAL"},
                  "accuracy": {"low": "REAL", "high": "REAL", "resolution": "REAL"}}

# Columns of `StudyStore.evaluations()`: one row per (plan, accuracy source), with the plan's latencies.
#   plan_id, plan_hash, name, origin, sixteen_bit (activation tensors at 16 bits), backend (cpu/htp),
#   accuracy_source (e.g. "ORT CPU QDQ", "HTP emulator on <host>", "HTP on <device>"), metric, value,
#   higher_is_better, snr_db, cosine (outputs against the float model), samples, seconds,
#   latency_ms, latency_source (estimate/measured/emulator), latency_where, latency_label (what the figure is
#   and includes), latency_low_ms / latency_high_ms (the estimate's interval; NaN without one),
#   plus `estimate_ms` (the cost model, always present when latency.py could read the model); value_low/high
#   (95 % bootstrap interval) and resolution (one count's weight): NaN when unknown (older results).
EVALUATION_COLUMNS = [
    "plan_id", "plan_hash", "name", "origin", "sixteen_bit", "backend", "accuracy_source", "metric", "value",
    "higher_is_better", "snr_db", "cosine", "samples", "seconds", "latency_ms", "latency_source",
    "latency_where", "latency_label", "latency_low_ms", "latency_high_ms", "estimate_ms", "created",
    "value_low", "value_high", "resolution",
]


@dataclass(frozen=True)
class Evaluation:
    """One plan's accuracy from one source, with the latencies known for that plan."""

    plan_id: int
    plan_hash: str
    name: str
    backend: str
    accuracy_source: str
    metric: str
    value: float
    higher_is_better: bool
    snr_db: float | None
    cosine: float | None
    samples: int
    seconds: float
    latencies: tuple = ()  # of latency.Latency
    cached: bool = False  # True when the study already had this result
    low: float | None = None  # the value's 95 % interval over the samples (None: not known)
    high: float | None = None
    resolution: float | None = None  # one count's weight in a counted metric

    def latency(self, source: str = "estimate"):
        return next((lat for lat in self.latencies if lat.source == source), None)

    def interval_text(self) -> str:
        """The value's interval and resolution in words ("" when not known)."""
        step = f", resolution {step_text(self.resolution)}" if self.resolution else ""
        return "" if self.low is None or self.high is None else \
            f" (95 % interval {value_text(self.low)}-{value_text(self.high)} over {self.samples} samples{step})"

    def describe(self) -> str:
        lat = ", ".join(str(lat) for lat in self.latencies) or "no latency"
        return (f"{self.name}: {self.metric} {value_text(self.value)}{self.interval_text()} [{self.accuracy_source}]; "
                f"{lat}")


@dataclass(frozen=True)
class AccuracyRecord:
    """What one evaluation measured, as the store keeps it."""

    backend: str
    source: str
    metric: str
    value: float
    higher_is_better: bool
    snr_db: float | None
    cosine: float | None
    samples: int
    seconds: float
    low: float | None = None
    high: float | None = None
    resolution: float | None = None


class StudyStore:
    """The SQLite file of one study (see the module docstring). Thread-safe within a process."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.owner = this_process()
        self._lock = threading.RLock()
        self._db, self.read_only = _connect(self.path)
        self._last_checkpoint = time.monotonic()
        self._clock_offset = study_clock_offset(self.path)
        self._pulse: threading.Thread | None = None
        self._closing = threading.Event()
        self._checkpoint_timer: threading.Timer | None = None
        self.checkpoint()  # a killed writer's results, still in the log alone, go into the file now

    def clock(self) -> float:
        """Now, on the clock of the file system that holds the study (see `study_clock_offset`)."""
        return time.time() + self._clock_offset

    def _keep_pulse(self) -> None:
        """Refresh the heartbeats of the work this process owns every PULSE_EVERY_S, from a thread, while
        it owns any: a long evaluation between two search steps must not read as abandoned."""
        with self._lock:
            if self._pulse is not None and self._pulse.is_alive():
                return
            self._pulse = threading.Thread(target=self._beat, daemon=True, name="study-heartbeat")
            self._pulse.start()

    def _beat(self) -> None:
        while not self._closing.wait(PULSE_EVERY_S):
            try:
                self._clock_offset = study_clock_offset(self.path)
                with self._transaction() as db:
                    now, owned = self.clock(), 0
                    for table in ("jobs", "searches"):
                        owned += db.execute(f"UPDATE {table} SET updated = ? WHERE owner = ? AND status = 'running'",
                                            (now, self.owner)).rowcount
            except MpstudioError:
                continue  # busy or briefly unreadable: the next beat tries again
            if not owned:
                return

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            if self._checkpoint_timer is not None:
                self._checkpoint_timer.cancel()
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.DatabaseError:
                pass  # another process holds the database: its own close checkpoints
            self._db.close()

    # ---- plans ----
    def add_plan(self, plan_hash: str, name: str, origin: str, plan_json: dict, sixteen_bit: int) -> int:
        """The id of the plan with `plan_hash`, stored now if it is new."""
        with self._transaction() as db:
            row = db.execute("SELECT id FROM plans WHERE hash = ?", (plan_hash,)).fetchone()
            if row:
                return int(row[0])
            return int(db.execute(
                "INSERT INTO plans (hash, name, origin, plan_json, sixteen_bit, created) VALUES (?, ?, ?, ?, ?, ?)",
                (plan_hash, name, origin, json.dumps(plan_json), sixteen_bit, time.time())).lastrowid)

    def plan_row(self, plan_id: int | str) -> tuple[dict, str] | None:
        """(plan JSON, name) of a plan by id, hash or unique hash prefix; None when there is none."""
        with self._lock:
            if isinstance(plan_id, (int, np.integer)) or str(plan_id).isdigit():
                row = self._db.execute("SELECT plan_json, name, id FROM plans WHERE id = ?",
                                       (int(plan_id),)).fetchone()
            else:
                rows = self._db.execute("SELECT plan_json, name, id FROM plans WHERE hash LIKE ?",
                                        (f"{plan_id}%",)).fetchall()
                if len(rows) > 1:
                    raise MpstudioError(f"plan hash prefix {plan_id!r} is ambiguous ({len(rows)} plans); give more of it")
                row = rows[0] if rows else None
        return (self._stored_json(row[0], "plans", "plan_json", row[2]), row[1]) if row else None

    def _stored_json(self, text, table: str, column: str, row_id, *, optional: bool = False) -> dict | None:
        """A JSON object the store keeps as text, checked: a damaged one is an MpstudioError naming its row."""
        if optional and not isinstance(text, str):
            return None  # an empty column reads back as NaN or None
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            value = None
        if not isinstance(value, dict):
            raise MpstudioError(f"row {row_id} of {table} in the study store {self.path} is damaged ({column} is not "
                                f"a JSON object); the rest of the study is intact: restore the file from a copy, or "
                                f"delete that row (sqlite3 {self.path.name} \"DELETE FROM {table} WHERE id = "
                                f"{row_id}\")")
        return value

    def plan_id(self, plan_hash: str) -> int | None:
        with self._lock:
            row = self._db.execute("SELECT id FROM plans WHERE hash = ?", (plan_hash,)).fetchone()
        return int(row[0]) if row else None

    def plans(self) -> pd.DataFrame:
        """Columns: plan_id, plan_hash, name, origin, sixteen_bit, created."""
        return self._query("SELECT id AS plan_id, hash AS plan_hash, name, origin, sixteen_bit, created FROM plans "
                           "ORDER BY id")

    # ---- results ----
    def record(self, plan_id: int, accuracy: AccuracyRecord, latencies=(), terms=None) -> None:
        """Store one evaluation's accuracy, latencies and per-sample metric terms (an object with `header()` and
        `blob()`, e.g. `metric_terms.MetricTerms`) in one transaction."""
        a = accuracy
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO accuracy (plan_id, backend, source, metric, value, higher_is_better, snr_db,"
                " cosine, samples, seconds, created, low, high, resolution) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?)", (plan_id, a.backend, a.source, a.metric, float(a.value), int(a.higher_is_better),
                              a.snr_db, a.cosine, a.samples, a.seconds, time.time(), a.low, a.high, a.resolution))
            if terms is not None:
                db.execute("INSERT OR REPLACE INTO sample_terms (plan_id, source, header, terms) VALUES (?, ?, ?, ?)",
                           (plan_id, a.source, terms.header(), sqlite3.Binary(terms.blob())))
            for latency in latencies:
                if latency is not None:
                    self._insert_latency(db, plan_id, latency)
        self._maybe_checkpoint()

    def result_count(self) -> int:
        """How many accuracy results the store holds."""
        with self._lock:
            try:
                return int(self._db.execute("SELECT COUNT(*) FROM accuracy").fetchone()[0])
            except sqlite3.DatabaseError as exc:
                raise MpstudioError(f"the study store {self.path} could not be read: {exc}") from exc

    def sample_terms(self, plan_id: int, source: str) -> tuple[str, bytes] | None:
        """(header, blob) of a result's per-sample metric terms; None when it has none (stored before them)."""
        with self._lock:
            row = self._db.execute("SELECT header, terms FROM sample_terms WHERE plan_id = ? AND source = ?",
                                   (int(plan_id), source)).fetchone()
        return (row[0], bytes(row[1])) if row else None

    def record_latency(self, plan_id: int, latency) -> None:
        with self._transaction() as db:
            self._insert_latency(db, plan_id, latency)

    def evaluation(self, plan_id: int, source: str) -> Evaluation | None:
        """The stored evaluation of a plan from one accuracy source, with every latency of the plan."""
        with self._lock:
            row = self._db.execute(
                "SELECT p.hash, p.name, a.backend, a.source, a.metric, a.value, a.higher_is_better, a.snr_db, a.cosine,"
                " a.samples, a.seconds, a.low, a.high, a.resolution FROM accuracy a JOIN plans p ON p.id = a.plan_id WHERE a.plan_id = ? AND"
                " a.source = ?", (plan_id, source)).fetchone()
            if row is None:
                return None
            lats = self._db.execute("SELECT ms, source, place, detail, includes, low_ms, high_ms FROM latency"
                                    " WHERE plan_id = ? ORDER BY source",
                                    (plan_id,)).fetchall()
        latencies = tuple(Latency(ms=ms, source=src, where=place, detail=detail, includes=includes or "", low_ms=low,
                                  high_ms=high) for ms, src, place, detail, includes, low, high in lats)
        return Evaluation(plan_id, row[0], row[1], row[2], row[3], row[4], float(row[5]), bool(row[6]), row[7], row[8],
                          int(row[9]), float(row[10]), latencies, cached=True, low=row[11], high=row[12],
                          resolution=row[13])

    def evaluations(self) -> pd.DataFrame:
        """Every evaluated plan with its accuracy and latency (EVALUATION_COLUMNS; one row per accuracy source
        and latency source, so a plan measured on a device appears once with its estimate, once measured)."""
        frame = self._query(
            """SELECT p.id AS plan_id, p.hash AS plan_hash, p.name, p.origin, p.sixteen_bit, a.backend,
                      a.source AS accuracy_source, a.metric, a.value, a.higher_is_better, a.snr_db, a.cosine,
                      a.samples, a.seconds, l.ms AS latency_ms, l.source AS latency_source,
                      l.place AS latency_where, l.includes AS latency_includes, l.low_ms AS latency_low_ms,
                      l.high_ms AS latency_high_ms, e.ms AS estimate_ms, a.created, a.low AS value_low,
                      a.high AS value_high, a.resolution
               FROM accuracy a JOIN plans p ON p.id = a.plan_id
               LEFT JOIN latency l ON l.plan_id = a.plan_id
               LEFT JOIN latency e ON e.plan_id = a.plan_id AND e.source = 'estimate'
               ORDER BY a.created, l.source""")
        frame["higher_is_better"] = frame["higher_is_better"].astype(bool)
        frame["latency_label"] = [_latency_label(s, w, i) for s, w, i in
                                  zip(frame["latency_source"], frame["latency_where"], frame["latency_includes"])]
        for column in ("value", "snr_db", "cosine", "seconds", "latency_ms", "latency_low_ms",
                       "latency_high_ms", "estimate_ms", "value_low", "value_high", "resolution"):
            numbers = pd.to_numeric(frame[column], errors="coerce").astype(float)
            damaged = frame[column].notna() & numbers.isna()  # text where SQLite's loose typing let it in
            if damaged.any():
                raise MpstudioError(f"the study store {self.path} is damaged: the {column} of plan "
                                    f"{frame['plan_id'][damaged].iloc[0]} is not a number; restore the file from a copy")
            frame[column] = numbers
        return frame[EVALUATION_COLUMNS]

    # ---- jobs: queued evaluations that survive a kill ----
    def submit(self, plan_id: int, backend: str, search_id: int | None) -> int:
        """A pending job for (plan, backend), or the one already pending or running."""
        now = time.time()
        with self._transaction() as db:
            row = db.execute("SELECT id FROM jobs WHERE plan_id = ? AND backend = ? AND status IN ('pending', 'running')",
                             (plan_id, backend)).fetchone()
            if row:
                return int(row[0])
            return int(db.execute(
                "INSERT INTO jobs (plan_id, backend, status, search_id, created, updated) VALUES (?, ?, 'pending', ?, ?, ?)",
                (plan_id, backend, search_id, now, now)).lastrowid)

    def jobs(self) -> pd.DataFrame:
        """Columns: job_id, plan_id, backend, status (pending/running/done/failed), search_id, error, owner."""
        frame = self._query("SELECT id AS job_id, plan_id, backend, status, search_id, error, owner, created, updated"
                            " FROM jobs ORDER BY id")
        return settle(frame, now=self.clock())

    def job(self, job_id: int) -> tuple[int, str]:
        with self._lock:
            row = self._db.execute("SELECT plan_id, backend FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise MpstudioError(f"this study has no job {job_id}")
        return int(row[0]), str(row[1])

    def claim_job(self, job_id: int | None = None) -> int | None:
        """Mark a job running for this process: the oldest pending one (or one a dead process left running), or
        `job_id`; its id, or None when there is none to take."""
        now = self.clock()
        with self._transaction() as db:
            where = "" if job_id is None else " AND id = ?"
            args = () if job_id is None else (job_id,)
            rows = db.execute(f"SELECT id, status, owner, updated FROM jobs WHERE status IN ('pending', 'running')"
                              f"{where} ORDER BY id", args).fetchall()
            free = next((r[0] for r in rows if r[1] == "pending" or not owner_alive(r[2], r[3], now)), None)
            if free is None:
                return None
            db.execute("UPDATE jobs SET status = 'running', owner = ?, updated = ? WHERE id = ?",
                       (self.owner, now, free))
        self._keep_pulse()
        return int(free)

    def finish_job(self, job_id: int, status: str, error: str | None) -> None:
        with self._transaction() as db:
            db.execute("UPDATE jobs SET status = ?, error = ?, owner = NULL, updated = ? WHERE id = ?",
                       (status, error, self.clock(), job_id))

    # ---- searches (their spec and state; mpstudio.search runs them) ----
    def start_search(self, spec: dict) -> int:
        """Record a search run by this process; an unfinished search with the same spec is continued instead of
        duplicated. A search another live process runs is not taken over."""
        text = json.dumps(spec, sort_keys=True)
        now = self.clock()
        with self._transaction() as db:
            row = db.execute("SELECT id, status, owner, updated FROM searches WHERE spec = ? AND status != 'done' "
                             "ORDER BY id DESC LIMIT 1", (text,)).fetchone()
            if row and row[1] == "running" and row[2] != self.owner and owner_alive(row[2], row[3], now):
                raise MpstudioError(f"search {row[0]} with the same settings is running in another process "
                                    f"({row[2]}); wait for it or stop it first")
            if row:
                db.execute("UPDATE searches SET status = 'running', owner = ?, updated = ? WHERE id = ?",
                           (self.owner, now, row[0]))
                search_id = int(row[0])
            else:
                search_id = int(db.execute("INSERT INTO searches (spec, status, owner, created, updated) "
                                           "VALUES (?, 'running', ?, ?, ?)", (text, self.owner, now, now)).lastrowid)
        self._keep_pulse()
        return search_id

    def heartbeat(self, search_id: int) -> None:
        """Say that this process still runs the search (a search calls it as it evaluates)."""
        with self._transaction() as db:
            db.execute("UPDATE searches SET updated = ? WHERE id = ? AND owner = ?", (self.clock(), search_id, self.owner))
        self._maybe_checkpoint()

    def finish_search(self, search_id: int, status: str, result: dict | None) -> None:
        with self._transaction() as db:
            db.execute("UPDATE searches SET status = ?, result = ?, owner = NULL, updated = ? WHERE id = ?",
                       (status, json.dumps(_jsonable(result)) if result is not None else None, self.clock(), search_id))
        self.checkpoint()

    def searches(self) -> pd.DataFrame:
        """Columns: search_id, spec (dict), status (running/done/cancelled/failed/interrupted), result (dict or
        None), owner. A search whose owner process is gone reads as interrupted."""
        frame = self._query("SELECT id AS search_id, spec, status, result, owner, created, updated FROM searches"
                            " ORDER BY id")
        frame["spec"] = [self._stored_json(spec, "searches", "spec", i)
                         for i, spec in zip(frame["search_id"], frame["spec"])]
        frame["result"] = [self._stored_json(result, "searches", "result", i, optional=True)
                           for i, result in zip(frame["search_id"], frame["result"])]
        return settle(frame, running_gone="interrupted", now=self.clock())

    # ---- rows other rooms keep (`store_builds`) ----
    def write(self):
        """A write transaction (a context manager yielding the connection), for rooms that keep rows of their own."""
        return self._transaction()

    def read(self, sql: str) -> pd.DataFrame:
        """The rows of one query, read under the store's lock (a store's own error on failure)."""
        return self._query(sql)

    # ---- housekeeping ----
    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file, so the file alone holds every result."""
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.DatabaseError:
                pass  # busy: the next checkpoint folds it
            self._last_checkpoint = time.monotonic()

    def _maybe_checkpoint(self) -> None:
        """Checkpoint when one is due; otherwise make sure one follows when it is, even if nothing more is
        written (the last results of a burst must not sit in the log alone)."""
        wait = self._last_checkpoint + CHECKPOINT_EVERY_S - time.monotonic()
        if wait <= 0:
            self.checkpoint()
            return
        with self._lock:
            if self._closing.is_set() or (self._checkpoint_timer is not None and self._checkpoint_timer.is_alive()):
                return
            self._checkpoint_timer = threading.Timer(wait, self._deferred_checkpoint)
            self._checkpoint_timer.daemon = True
            self._checkpoint_timer.start()

    def _deferred_checkpoint(self) -> None:
        with self._lock:
            if not self._closing.is_set():
                self.checkpoint()

    def _insert_latency(self, db, plan_id: int, latency) -> None:
        if latency.source == "estimate":  # one estimate per plan: the cost model as it is now (maybe recalibrated)
            db.execute("DELETE FROM latency WHERE plan_id = ? AND source = 'estimate'", (plan_id,))
        db.execute("INSERT OR REPLACE INTO latency (plan_id, source, place, ms, detail, created, includes, low_ms,"
                   " high_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (plan_id, latency.source, latency.where, float(latency.ms), latency.detail, time.time(),
                    latency.includes, latency.low_ms, latency.high_ms))

    def _query(self, sql: str) -> pd.DataFrame:
        with self._lock:
            try:
                return pd.read_sql_query(sql, self._db)
            except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
                raise MpstudioError(f"the study store {self.path} could not be read: {exc}") from exc

    @contextmanager
    def _transaction(self):
        if self.read_only:
            raise MpstudioError(f"the study at {self.path.parent} is read-only here (its folder or files cannot be "
                                "written): it can be shown but not changed; copy the folder somewhere writable to "
                                "continue it")
        with self._lock:
            try:
                with self._db:  # commits on success, rolls back on error
                    # Take the write lock at once: a read-then-write (is this plan stored? is a job pending?)
                    # is then atomic across processes, not only across this process's threads.
                    self._db.execute("BEGIN IMMEDIATE")
                    yield self._db
            except sqlite3.DatabaseError as exc:
                raise MpstudioError(f"the study store {self.path} failed: {exc}") from exc


def _connect(path: Path) -> tuple[sqlite3.Connection, bool]:
    """The store's connection, and whether it is read-only (a study on read-only media or folder)."""
    # Switching to WAL and setting up the schema need the database to themselves for a moment; another
    # process opening the same new study gets "locked" at once rather than waiting, so wait here.
    deadline = time.monotonic() + 30.0
    while True:
        try:
            return _connect_once(path)
        except MpstudioError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _connect_once(path: Path) -> tuple[sqlite3.Connection, bool]:
    db = None
    try:
        db = sqlite3.connect(path, timeout=30.0, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a commit survives a killed process
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("BEGIN IMMEDIATE")  # one process at a time sets up or upgrades the schema
        for statement in filter(str.strip, _SCHEMA.split(";")):
            db.execute(statement)
        for table, columns in _ADDED_COLUMNS.items():
            have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            for column, kind in columns.items():
                if column not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        db.commit()
    except sqlite3.DatabaseError as exc:
        if db is not None:
            db.close()
        text = str(exc).lower()
        if any(sign in text for sign in ("not a database", "malformed", "disk image")):
            raise MpstudioError(f"{path} is not a readable study store ({exc}); move it aside to start the study "
                                "afresh") from exc
        if path.exists() and ("readonly" in text or "read-only" in text or "unable to open" in text):
            return _connect_read_only(path, exc), True
        # Not damage: the store is intact, so nothing may advise moving it aside.
        if "locked" in text:
            raise MpstudioError(f"{path} is locked by another process (one writing to the study, or a program that "
                                "holds it open) and stayed locked for 30 s; let that finish or stop it, then retry") \
                from exc
        raise MpstudioError(f"{path} could not be opened ({exc}); check that this user can read and write "
                            f"{path.parent} and its files") from exc
    return db, False


def _connect_read_only(path: Path, cause: Exception) -> sqlite3.Connection:
    """A read-only connection to a store whose folder or file cannot be written. Without a write-ahead log
    holding results the file alone is complete and is opened as immutable (no -shm file is needed)."""
    from urllib.parse import quote

    wal = path.with_name(path.name + "-wal")
    pending = wal.exists() and wal.stat().st_size > 0
    uri = f"file:{quote(str(path))}?mode=ro" + ("" if pending else "&immutable=1")
    try:
        db = sqlite3.connect(uri, uri=True, timeout=30.0, check_same_thread=False)
        db.execute("SELECT COUNT(*) FROM plans").fetchone()
        return db
    except sqlite3.DatabaseError as exc:
        where = (f"its newest results are in {wal.name}, which cannot be read without writing beside it"
                 if pending else f"{exc}")
        raise MpstudioError(f"the study store {path} cannot be written here ({cause}) nor read as it is ({where}); "
                            "copy the study folder somewhere writable and open the copy") from exc


def _jsonable(value):
    """`value` with non-finite floats as None: JSON has no NaN, and other readers reject it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _latency_label(source, where, includes=None) -> str:
    if source is None or (isinstance(source, float) and np.isnan(source)):
        return ""
    return Latency(ms=0.0, source=source, where=where, includes=includes if isinstance(includes, str) else "").label


__all__ = ["StudyStore", "Evaluation", "AccuracyRecord", "EVALUATION_COLUMNS", "DB_FILE", "this_process",
           "owner_alive"]
