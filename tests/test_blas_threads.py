"""One BLAS thread around the analysis, the evaluations and the search (mpstudio.blas_threads), with real numpy
BLAS; CPU evaluations without ORT's spinning threads (loop.inprocess), with real sessions."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mpstudio.blas_threads import blas_threads, one_blas_thread

@pytest.fixture
def two_blas_threads():
    """BLAS at two threads for the test (the machine may have set one), restored after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    limiter = threadpoolctl.threadpool_limits(limits=2, user_api="blas")
    if blas_threads() != 2:
        limiter.restore_original_limits()
        pytest.skip("this numpy's BLAS cannot run two threads")
    yield
    limiter.restore_original_limits()


def test_one_thread_inside_and_the_default_restored_after(two_blas_threads):
    with one_blas_thread():
        assert blas_threads() == 1
        with one_blas_thread():  # reentrant: the inner exit keeps the outer's limit
            pass
        assert blas_threads() == 1
    assert blas_threads() == 2


HOLDS = """
import threading
import numpy  # its BLAS loaded, for threadpoolctl to find
import threadpoolctl
from mpstudio.blas_threads import blas_threads, one_blas_thread

def run(fn):
    thread = threading.Thread(target=fn)
    thread.start()
    return thread

# Two threads at once, as the studio's lanes run (OpenBLAS ignores a thread's setting once the main thread has
# set one, so the threads here, like the lanes, are not the main thread).
run(lambda: threadpoolctl.threadpool_limits(limits=2, user_api="blas")).join()
if blas_threads() != 2:
    print("skip")
    raise SystemExit(0)
entered, leave = threading.Event(), threading.Event()
seen = []

def other():
    with one_blas_thread():
        entered.set()
        leave.wait(10)

def second():
    entered.wait(10)
    with one_blas_thread():
        seen.append(blas_threads())
    seen.append(blas_threads())  # this thread left; the other is still inside

holder = run(other)
run(second).join()
leave.set()
holder.join()
seen.append(blas_threads())  # both left: the default again
print(seen)
"""


def test_the_limit_holds_while_any_thread_is_inside():
    pytest.importorskip("threadpoolctl")
    out = subprocess.run([sys.executable, "-c", HOLDS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.strip() == "skip":
        pytest.skip("this numpy's BLAS cannot run two threads")
    assert out.stdout.strip() == "[1, 1, 2]"


def test_the_same_numbers_with_one_thread():
    x = np.random.default_rng(0).standard_normal(24576).astype(np.float32)
    y = np.random.default_rng(1).standard_normal(24576).astype(np.float32)
    threaded = float(np.dot(x, y))
    with one_blas_thread():
        assert float(np.dot(x, y)) == threaded


def test_the_analysis_workers_run_their_tasks_with_one_thread(two_blas_threads):
    from mpstudio.sensitivity.workers import SensitivityWorker

    worker = SensitivityWorker()
    worker.score = lambda payload, cancel=None: blas_threads()  # what the task sees of BLAS
    assert worker.run("score", []) == 1
    assert blas_threads() == 2


def test_a_plan_evaluation_scores_with_one_thread(two_blas_threads, tmp_path):
    from conftest import chain_feeds, make_chain_model
    from mpstudio.data import FeedList, TaskMetric
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study

    seen = []

    def mean_abs(outputs):  # a task metric that also notes what BLAS runs with while it is scored
        seen.append(blas_threads())
        return float(np.mean([np.abs(o["y"]).mean() for o in outputs]))

    metric = TaskMetric("mean |y|", mean_abs, True)
    with Study.create(tmp_path / "s", make_chain_model(blocks=2), FeedList(chain_feeds(2)), metric=metric) as study:
        study.evaluate(PrecisionPlan.a8w8(), measure_latency=False)
    assert seen and set(seen) == {1}
    assert blas_threads() == 2


def test_without_threadpoolctl_nothing_changes(monkeypatch):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails as if it were not installed
    with one_blas_thread():
        assert blas_threads() is None
    assert float(np.dot(np.ones(3), np.ones(3))) == 3.0


def test_cpu_evaluations_without_spinning_give_the_same_outputs(tmp_path):
    """`run_outputs` makes its CPU sessions with ORT's threads not spinning: the same threads, the same numbers."""
    import onnx

    from conftest import chain_feeds, make_chain_model
    from mpstudio.data import FeedList
    from mpstudio.loop.inprocess import CPU_SESSION_CONFIG, run_outputs
    from mpstudio.runtime import create_session

    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=3), path)
    feeds = chain_feeds(3)
    session = create_session(path, "cpu", session_config=CPU_SESSION_CONFIG)
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spinning = create_session(path, "cpu")
    names = [o.name for o in spinning.get_outputs()]
    for ours, feed in zip(run_outputs(path, FeedList(feeds), "cpu"), feeds):
        for name, value in zip(names, spinning.run(names, feed)):
            assert np.array_equal(ours[name], value)
