"""Run a model over a data source in this process (and score it): what a study's in-process runs, the
sensitivity engine and the command line share.

On the HTP backend the samples are spread over worker processes (`htp_workers()`; one inference on the x86_64
emulator takes 0.3-5 s of one core, so a 100-sample evaluation is minutes per plan). Workers are spawned,
never forked (a QNN session used after a fork hangs), live for the whole process and keep the last sessions
they opened, so a second evaluation of the same model does not pay session creation again.
"""

from __future__ import annotations

import atexit
import contextlib
import concurrent.futures as futures
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..data import Cancelled, DataSource, Feed, Progress, TaskMetric
from ..errors import MpstudioError
from ..runtime import available_cores, create_session, exit_with_parent, spawn_context

WORKERS_ENV = "MPSTUDIO_HTP_WORKERS"
# An evaluation on the CPU runs ORT's kernels on every core with threads that, between kernels, spin rather than
# sleep: on a machine with more runnable threads than cores they spin through the time slices the others need
# (a recognizer's line took 0.25 s with spinning and 0.18 s without at a load average of 27 on two cores;
# benchmarks/cpu_spinning.py). Without spinning the threads and the numbers are the same.
CPU_SESSION_CONFIG = {"session.intra_op.allow_spinning": "0"}


def htp_workers() -> int:
    """How many processes run HTP samples in parallel: `$MPSTUDIO_HTP_WORKERS`, else one per core."""
    text = os.environ.get(WORKERS_ENV, "").strip()
    if not text:
        return available_cores()
    try:
        value = int(text)
    except ValueError:
        raise MpstudioError(f"{WORKERS_ENV} must be a whole number of worker processes, not {text!r}") from None
    if value < 1:
        raise MpstudioError(f"{WORKERS_ENV} must be at least 1, not {value}")
    return value


def run_outputs(
    model: str | Path,
    source: DataSource,
    backend: str = "cpu",
    provider_options: dict | None = None,
    progress: Progress | None = None,
    cancel=None,
    *,
    workers: int | None = None,
    allow_cpu_fallback: bool = False,
) -> list[Feed]:
    """Every sample's outputs (name -> array), in sample order.

    `workers`: processes for the samples (default: `htp_workers()` on htp, this process on cpu, whose
    kernels already use every core). `allow_cpu_fallback`: on htp, nodes QNN lacks run on ORT's CPU EP
    (otherwise they are an error).
    """
    total = len(source)
    workers = (htp_workers() if backend == "htp" else 1) if workers is None else workers
    workers = min(workers, total)
    if workers > 1:
        return _run_parallel(model, source, backend, provider_options, progress, cancel, workers,
                             allow_cpu_fallback)
    session = create_session(model, backend, provider_options, allow_cpu_fallback=allow_cpu_fallback,
                             session_config=CPU_SESSION_CONFIG if backend == "cpu" else None)
    names = [o.name for o in session.get_outputs()]
    outputs: list[Feed] = []
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


# ---- worker processes ------------------------------------------------------------------------------------------
_pool: futures.ProcessPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()
# The folders the workers work in, one per pool, made and removed by this process: a worker killed or ended
# without its own clean-up leaves nothing behind once the pool is shut down.
_pool_dirs: list[str] = []


def _executor(workers: int) -> futures.ProcessPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != workers:
            if _pool is not None:
                _pool.shutdown(wait=False, cancel_futures=True)  # its folder goes at shutdown_workers
            _pool_dirs.append(tempfile.mkdtemp(prefix="mpstudio-htp-workers-"))
            _pool = futures.ProcessPoolExecutor(workers, mp_context=spawn_context(),
                                                initializer=_worker_start, initargs=(_pool_dirs[-1],))
            _pool_size = workers
        return _pool


def shutdown_workers() -> None:
    """Stop the worker processes (they are started again when needed) and remove the folders they worked in."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)
            _pool = None
        while _pool_dirs:
            shutil.rmtree(_pool_dirs.pop(), ignore_errors=True)


atexit.register(shutdown_workers)


def _run_parallel(model, source: DataSource, backend: str, options, progress, cancel, workers: int,
                  allow_cpu_fallback: bool = False) -> list[Feed]:
    total = len(source)
    model_arg = bytes(model) if isinstance(model, (bytes, bytearray, memoryview)) else str(Path(model).resolve())
    # Small chunks keep every worker busy to the end and progress fine-grained; one sample per chunk costs a
    # pickle of its inputs and outputs, nothing next to an emulated inference.
    chunk = max(1, min(4, total // (workers * 4)))
    pool = _executor(workers)
    pending = {}
    for start in range(0, total, chunk):
        indices = list(range(start, min(total, start + chunk)))
        feeds = [source.sample(i) for i in indices]
        pending[pool.submit(_run_chunk, model_arg, backend, options, feeds, allow_cpu_fallback)] = indices
    results: list[Feed | None] = [None] * total
    done = 0
    try:
        for finished in futures.as_completed(pending):
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"cancelled after {done} of {total} samples")
            for index, outputs in zip(pending[finished], finished.result()):
                results[index] = outputs
            done += len(pending[finished])
            if progress:
                progress(done, total, f"running {Path(model_arg).name if isinstance(model_arg, str) else 'model'} "
                                      f"on {backend} ({workers} workers)")
    except futures.process.BrokenProcessPool as exc:
        shutdown_workers()
        raise MpstudioError(f"an {backend} worker process died while running the model ({exc}); "
                            f"set {WORKERS_ENV}=1 to run in this process and see its error") from None
    finally:
        for future in pending:
            future.cancel()
    return results  # type: ignore[return-value]


_sessions: OrderedDict = OrderedDict()
_KEEP_SESSIONS = 2


def _worker_start(pool_dir: str) -> None:
    # QNN writes trace files into the working directory: give each worker its own, inside its pool's.
    folder = tempfile.mkdtemp(prefix="worker-", dir=pool_dir)
    os.chdir(folder)

    def tidy():  # the parent that would remove the pool's folder has died: the last worker out removes it
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(pool_dir)
    exit_with_parent(tidy)


def _run_chunk(model, backend: str, options, feeds: list[Feed], allow_cpu_fallback: bool = False) -> list[Feed]:
    # A path with its size and time: a file rewritten in place is a new model.
    what = (model, os.stat(model).st_mtime_ns, os.stat(model).st_size) if isinstance(model, str) else hash(model)
    key = (what, backend, tuple(sorted((options or {}).items())), allow_cpu_fallback)
    session = _sessions.pop(key, None)
    if session is None:
        session = create_session(model, backend, options, allow_cpu_fallback=allow_cpu_fallback)
    _sessions[key] = session
    while len(_sessions) > _KEEP_SESSIONS:
        _sessions.popitem(last=False)
    names = [o.name for o in session.get_outputs()]
    return [{n: np.asarray(v) for n, v in zip(names, session.run(names, feed))} for feed in feeds]
