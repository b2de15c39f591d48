"""Worker processes for the sensitivity engine: each holds its own sessions for the life of one analysis and
runs the tasks it is sent (score some samples, isolate some configurations); cancel stops them at once.

Workers are spawned, never forked: an ONNX Runtime session used after a fork hangs. They receive file paths
and small tables once, at start, and build their sessions themselves, so no session or model is pickled;
a task carries only sample feeds or tensor names, a result only sums or scores.
"""

from __future__ import annotations

import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..blas_threads import one_blas_thread, with_one_blas_thread
from ..data import Cancelled, Feed, TaskMetric
from ..errors import MpstudioError
from ..runtime import available_cores, exit_with_parent, memory_status, spawn_context
from ..qdq import Encoding
from ..quantize import TensorParams

# A configuration to isolate: ("promote", members) puts only `members` at 16 bits in the all-8-bit plan,
# ("demote", members) leaves only them at 8 bits in the all-16-bit plan. ("promote", ()) is the all-8-bit
# plan and ("demote", ()) the all-16-bit one. ("screen", members) estimates ("promote", members) more cheaply:
# only the members' own edges at 16 bits, without resolving what ORT's QNN configuration converts with them.
Config = tuple[str, tuple[str, ...]]


@dataclass(frozen=True)
class ScoringSpec:
    """What a worker needs to score samples (`scores.TensorScorer`): model files and calibrated parameters."""

    float_model: str
    qdq_model: str
    params_8: Mapping[str, Encoding]
    params_16: Mapping[str, Encoding]
    local_model: str | None = None  # the model the parameters were calibrated on (`TensorScorer`'s local_model)


@dataclass(frozen=True)
class IsolationSpec:
    """What a worker needs to isolate configurations (`isolation.SwitchableModel`): model files, ORT's own
    parameters, the isolation samples with the float model's outputs for them, and the metric."""

    float_model: str
    model_8: str
    model_16: str
    params_16: Mapping[str, Encoding]
    own: TensorParams
    samples: Sequence[Feed]
    references: Sequence[list[np.ndarray]]
    output_names: Sequence[str]
    metric: TaskMetric | None = None


class SensitivityWorker:
    """The sessions of one worker, built on first use; the same object runs tasks in this process when the
    analysis runs without worker processes, so both give the same numbers."""

    def __init__(self, scoring: ScoringSpec | None = None, isolation: IsolationSpec | None = None):
        self.scoring_spec, self.isolation_spec = scoring, isolation
        self._scorer = None
        self._isolation = None

    @with_one_blas_thread
    def run(self, kind: str, payload: Any, cancel: threading.Event | None = None):
        if kind == "score":
            return self.score(payload, cancel)
        if kind == "isolate":
            return self.isolate(payload, cancel)
        if kind == "setup":
            scoring, isolation = payload
            if scoring is not None:
                self.scoring_spec, self._scorer = scoring, None
            if isolation is not None:
                self.isolation_spec, self._isolation = isolation, None
            return None
        raise ValueError(f"unknown task {kind!r}")

    def score(self, feeds: Sequence[Feed], cancel: threading.Event | None = None):
        """`scores.ScoreSums` over `feeds`."""
        if self._scorer is None:
            import onnx

            from ..graph import ModelGraph
            from .scores import TensorScorer

            spec = self.scoring_spec
            graph = ModelGraph(onnx.load(spec.float_model))
            self._scorer = TensorScorer(spec.float_model, spec.qdq_model, graph, spec.params_8, spec.params_16,
                                        threads=1, local_model=spec.local_model)
        return self._scorer.score(feeds, len(feeds), cancel=cancel)

    def isolate(self, payload: tuple[Sequence[Config], int],
                cancel: threading.Event | None = None) -> list[tuple[float, np.ndarray | None]]:
        """The metric of each configuration over the first `samples` isolation samples, with its per-sample noise
        terms (`OutputScorer.score_terms`; None for a task metric)."""
        from .isolation import Setting

        configs, samples = payload
        switchable, cached, scorers = self._isolation_parts()
        subset = cached.head(samples)
        scorer = scorers.setdefault(samples, _scorer_for(self.isolation_spec, samples))
        everything = frozenset(switchable.tensors)
        values = []
        for direction, members in configs:
            if cancel is not None and cancel.is_set():
                raise Cancelled("isolation cancelled")
            chosen = frozenset(members) & everything
            if direction == "screen":
                setting = Setting(frozenset((t, r) for t in chosen for r in switchable.receivers[t]))
            else:
                setting = switchable.setting(chosen if direction == "promote" else everything - chosen)
            values.append(scorer.score_terms(subset.outputs(setting)))
        return values

    def _isolation_parts(self):
        if self._isolation is None:
            import gc

            import onnx

            # Scoring is over by now (a later scoring task builds its sessions again): its three sessions, every
            # intermediate tensor exposed, would otherwise stay beside the isolation's (gigabytes on an encoder).
            self._scorer = None
            gc.collect()

            from .. import qdq
            from ..graph import ModelGraph
            from .isolation import SwitchableModel

            spec = self.isolation_spec
            float_model = onnx.load(spec.float_model)
            switchable = SwitchableModel(qdq.load(spec.model_8), spec.params_16, threads=1, float_model=float_model,
                                         graph=ModelGraph(float_model), own_params=spec.own,
                                         qdq_model_16=spec.model_16)
            self._isolation = (switchable, switchable.cached(list(spec.samples)), {})
        return self._isolation


def _scorer_for(spec: IsolationSpec, samples: int):
    from .isolation import OutputScorer

    if spec.metric is not None and samples != len(spec.samples):
        raise MpstudioError("a task metric scores the whole isolation set; it cannot be screened on a subset")
    return OutputScorer(list(spec.references)[:samples], spec.output_names, spec.metric)


def worker_count(tasks: int | None = None, memory_each: int | None = None) -> int:
    """The cores this process may use (at most `tasks`), and no more workers than the available memory holds at
    `memory_each` bytes a worker (`worker_memory`); at least one."""
    cores = available_cores()
    count = min(cores, tasks) if tasks else cores
    status = memory_status() if memory_each else None
    if status is not None:
        count = min(count, int(MEMORY_SHARE * status[0] // memory_each))
    return max(1, count)


# A worker's peak, measured on a BERT-base encoder (440 MB of float32 weights, 128 tokens: 6.3-6.5 GB a worker):
# its isolation holds about thirteen times the float weights (the switchable model and the cut suffixes, and the
# all-8-bit model and frontier probe while they run, each an ONNX Runtime session with its weights, and their
# protos), a few copies of one sample's activations, and the interpreter with ONNX Runtime.
_WEIGHT_COPIES, _ACTIVATION_COPIES, _BASE_BYTES = 13, 3, 256 << 20
MEMORY_SHARE = 0.8  # of the available memory, the share the workers may take


def worker_memory(model, graph) -> int:
    """Bytes one worker is expected to need for `model` (the prepared float ModelProto) and its `graph`."""
    import numpy as np

    from .isolation.cuts import weight_bytes

    weights = weight_bytes(model)
    activations = sum(4 * int(np.prod(info.shape)) for info in graph.tensors.values()
                      if info.is_activation and info.shape and all(isinstance(d, int) and d > 0 for d in info.shape))
    return _WEIGHT_COPIES * weights + _ACTIVATION_COPIES * activations + _BASE_BYTES


def _serve(tasks, results) -> None:
    """A worker process: run the tasks of its queue until the None sentinel."""
    exit_with_parent()
    with one_blas_thread():  # for the process's life: a task then only counts itself in (setting it costs ms)
        _serve_tasks(tasks, results)


def _serve_tasks(tasks, results) -> None:
    worker = SensitivityWorker()
    while True:
        item = tasks.get()
        if item is None:
            return
        task_id, kind, payload = item
        try:
            value = worker.run(kind, payload)
            if task_id is not None:
                results.put((task_id, True, value))
        except BaseException as exc:  # reported to the parent, which decides
            message = exc.args[0] if isinstance(exc, MpstudioError) and exc.args else \
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
            results.put((task_id, False, (isinstance(exc, MpstudioError), message)))


class WorkerPool:
    """`workers` spawned processes, each with its own task queue. `setup` sends every worker what it needs
    (each builds its sessions from it); `submit` gives a task to the least busy worker; `results` returns
    what has finished. `terminate` kills the workers where they are (cancel); `close` lets them exit."""

    def __init__(self, workers: int, payload=None):
        context = spawn_context(payload)  # `payload`: what setup will send (a metric from the user's script?)
        self._results = context.Queue()
        self._queues = [context.Queue() for _ in range(workers)]
        self.processes = [context.Process(target=_serve, args=(tasks, self._results),
                                          name=f"mpstudio-sensitivity-{i}", daemon=True)
                          for i, tasks in enumerate(self._queues)]
        for process in self.processes:
            process.start()
        self._next = 0
        self._owner: dict[int, int] = {}  # pending task -> worker index

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    @property
    def pending(self) -> int:
        return len(self._owner)

    def setup(self, scoring: ScoringSpec | None = None, isolation: IsolationSpec | None = None) -> None:
        for tasks in self._queues:
            tasks.put((None, "setup", (scoring, isolation)))

    def submit(self, kind: str, payload) -> int:
        task_id = self._next
        self._next += 1
        loads = [0] * len(self._queues)
        for worker in self._owner.values():
            loads[worker] += 1
        worker = loads.index(min(loads))
        self._owner[task_id] = worker
        self._queues[worker].put((task_id, kind, payload))
        return task_id

    def results(self, timeout: float) -> list[tuple[int, Any]]:
        """The tasks finished within `timeout` s (at least one unless the time runs out), as (id, value).
        A task that failed raises here; a worker that died raises MpstudioError."""
        done = []
        try:
            item = self._results.get(timeout=timeout)
            while True:
                done.append(item)
                item = self._results.get_nowait()
        except queue.Empty:
            pass
        if not done:
            busy = set(self._owner.values())
            dead = [p for i, p in enumerate(self.processes) if i in busy and not p.is_alive()]
            if dead:
                raise MpstudioError(f"a sensitivity worker process stopped (exit code {dead[0].exitcode}); "
                                    "the machine may be out of memory: retry with fewer workers")
        out = []
        for task_id, ok, value in done:
            self._owner.pop(task_id, None)
            if not ok:
                is_user_error, message = value
                if is_user_error:
                    raise MpstudioError(message)
                raise RuntimeError(f"a sensitivity worker failed: {message}")
            out.append((task_id, value))
        return out

    def close(self) -> None:
        for tasks in self._queues:
            tasks.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
        self._release()

    def terminate(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        self._release()

    def _release(self) -> None:
        for q in (self._results, *self._queues):
            q.cancel_join_thread()
            q.close()


class InlineWorkers:
    """The WorkerPool interface run in this process, one task at a time, for `workers=0`."""

    def __init__(self, cancel: threading.Event | None = None):
        self.worker = SensitivityWorker()
        self.cancel = cancel
        self._queue: list[tuple[int, str, Any]] = []
        self._next = 0
        self.processes: list = []
        self.pids: list[int] = []

    @property
    def pending(self) -> int:
        return len(self._queue)

    def setup(self, scoring: ScoringSpec | None = None, isolation: IsolationSpec | None = None) -> None:
        self.worker.run("setup", (scoring, isolation))

    def submit(self, kind: str, payload) -> int:
        task_id = self._next
        self._next += 1
        self._queue.append((task_id, kind, payload))
        return task_id

    def results(self, timeout: float) -> list[tuple[int, Any]]:
        if not self._queue:
            return []
        task_id, kind, payload = self._queue.pop(0)
        return [(task_id, self.worker.run(kind, payload, self.cancel))]

    def close(self) -> None:
        self._queue.clear()

    terminate = close
