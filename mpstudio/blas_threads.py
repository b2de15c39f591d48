"""One BLAS thread around numpy's small reductions: the sensitivity analysis (and its worker processes), every
plan's evaluation and the search (the per-tensor scores, the metrics, their intervals and paired comparisons).

Those reduce arrays of some ten thousand values with `np.dot` (and bootstrap counts with a matrix-vector
product), once per tensor and sample: BLAS hands each call to its worker threads, which on a machine with more
runnable threads than cores wait for each other on every call (a 24,576-value dot took 16.8 ms with the default
threads at a load average of 25 on two cores, 0.02 ms with one). Nothing mpstudio does is parallel in BLAS.
The per-tensor scores (float32 dots) come out bit for bit the same; a float64 dot's last digit, which with
threads depended on how many cores split it, now depends on nothing (benchmarks/blas_threads.py). The limit
uses threadpoolctl, set when the first thread enters and restored when the last leaves (BLAS's thread count is
per process); without threadpoolctl nothing changes. (OpenBLAS 0.3.31 ignores a setting made from another
thread once the main thread has made one: the studio's jobs run in threads of their own and the command line in
the main thread, so each sees its own setting take effect.)
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Iterator, TypeVar

_lock = threading.Lock()
_depth = 0  # threads inside `one_blas_thread` now: the limit is set by the first, restored by the last
_limiter = None

F = TypeVar("F", bound=Callable)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with BLAS limited to one thread (nothing changes without threadpoolctl). Reentrant and
    shared between threads: BLAS's thread count is per process, so the limit holds while any thread is inside."""
    global _depth, _limiter
    with _lock:
        _depth += 1
        if _depth == 1:
            _limiter = _limit()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None


def with_one_blas_thread(fn: F) -> F:
    """`fn` run inside `one_blas_thread`."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with one_blas_thread():
            return fn(*args, **kwargs)
    return wrapped  # type: ignore[return-value]


def blas_threads() -> int | None:
    """The threads numpy's BLAS uses now (None without threadpoolctl, or when it finds no BLAS)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    counts = [info["num_threads"] for info in threadpool_info() if info.get("user_api") == "blas"]
    return max(counts) if counts else None


def _limit():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an optional speed-up: without it BLAS keeps its default threads
        return None
    import numpy  # noqa: F401  (its BLAS must be loaded for threadpoolctl to find it)

    return threadpool_limits(limits=1, user_api="blas")
