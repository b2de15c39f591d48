"""The sensitivity analysis' worker pool on a Ray cluster: the `sensitivity.workers.WorkerPool` interface over
Ray actors that each hold a `SensitivityWorker` (its sessions) for the life of one analysis.

Model files travel through the object store by content hash and are written once per actor's node-local folder;
a task carries its specs as references, so an actor Ray restarts after a crash sets itself up again and the task
is retried there.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from ..errors import MpstudioError
from .evaluation import ACTOR_CPUS, started
from .folders import actor_folder, release, release_all
from ..sensitivity.workers import IsolationSpec, ScoringSpec, SensitivityWorker

_PATHS = {ScoringSpec: ("float_model", "qdq_model", "local_model"),
          IsolationSpec: ("float_model", "model_8", "model_16")}
_TASK_RETRIES = 3  # Ray's retries on the same (restarted) actor
_RESUBMITS = 5  # then ours, on another actor


class SensitivityActor:
    """One Ray actor running sensitivity tasks; sets itself up from the specs a task names."""

    def __init__(self):
        self.folder = actor_folder("sensitivity")
        self.worker = SensitivityWorker()
        self.version = -1

    def release(self) -> None:
        release(self.folder)

    def pid(self) -> int:
        return os.getpid()

    def _local(self, spec):
        import ray

        changes = {}
        for field in _PATHS[type(spec)]:
            shipped = getattr(spec, field)
            if isinstance(shipped, tuple):  # ("ray-file", sha256, [ref]) -> a file in this actor's folder
                path = self.folder / f"{shipped[1]}.onnx"
                if not path.exists():
                    path.write_bytes(ray.get(shipped[2][0]))
                changes[field] = str(path)
        return dataclasses.replace(spec, **changes)

    def run(self, kind: str, payload: Any, version: int, specs: list):
        import ray

        if version != self.version:
            scoring, isolation = (ray.get(ref) if ref is not None else None for ref in specs)
            self.worker.run("setup", (self._local(scoring) if scoring is not None else None,
                                      self._local(isolation) if isolation is not None else None))
            self.version = version
        return self.worker.run(kind, payload)


class RaySensitivityPool:
    """`WorkerPool` on a cluster: one actor per CPU; `setup` ships the specs (files by content) once."""

    def __init__(self, cluster):
        self.cluster, self.ray = cluster, cluster.ray
        actor = self.ray.remote(num_cpus=ACTOR_CPUS, max_restarts=-1, max_task_retries=_TASK_RETRIES)(SensitivityActor)
        self.processes = [actor.options(scheduling_strategy="SPREAD").remote() for _ in range(max(1, cluster.cpus))]
        started(self.ray, [a.pid.remote() for a in self.processes], "sensitivity")
        self._specs: list = [None, None]
        self._version = 0
        self._next = 0
        self._owner: dict[int, tuple] = {}  # task id -> (ref, actor index, kind, payload, times its actor was lost)
        self._lock = threading.Lock()

    @property
    def pids(self) -> list[int]:
        return self.ray.get([a.pid.remote() for a in self.processes])

    @property
    def pending(self) -> int:
        return len(self._owner)

    def _ship(self, spec):
        changes = {}
        for field in _PATHS[type(spec)]:
            path = getattr(spec, field)
            if path is not None:
                sha, ref = self.cluster.put_file(path)
                changes[field] = ("ray-file", sha, [ref])
        return self.ray.put(dataclasses.replace(spec, **changes))

    def setup(self, scoring: ScoringSpec | None = None, isolation: IsolationSpec | None = None) -> None:
        if scoring is not None:
            self._specs[0] = self._ship(scoring)
        if isolation is not None:
            self._specs[1] = self._ship(isolation)
        self._version += 1

    def submit(self, kind: str, payload, task_id: int | None = None, avoid: int | None = None) -> int:
        with self._lock:
            if task_id is None:
                task_id = self._next
                self._next += 1
            loads = [0] * len(self.processes)
            for _, index, *_ in self._owner.values():
                loads[index] += 1
            if avoid is not None and len(loads) > 1:
                loads[avoid] = len(self._owner) + 1
            index = loads.index(min(loads))
            ref = self.processes[index].run.remote(kind, payload, self._version, list(self._specs))
            lost = self._owner.get(task_id, (None, None, None, None, 0))[4]
            self._owner[task_id] = (ref, index, kind, payload, lost)
        return task_id

    def results(self, timeout: float) -> list[tuple[int, Any]]:
        """The tasks finished within `timeout` s, as (id, value); a failed task raises here."""
        from ray.exceptions import RayActorError, RayTaskError

        if not self._owner:
            return []
        by_ref = {entry[0]: task_id for task_id, entry in self._owner.items()}
        ready, _ = self.ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        out = []
        for ref in ready:
            task_id = by_ref[ref]
            _, index, kind, payload, lost = self._owner.pop(task_id)
            try:
                out.append((task_id, self.ray.get(ref)))
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, MpstudioError):
                    raise MpstudioError(str(cause.args[0] if cause.args else cause)) from None
                raise RuntimeError(f"a sensitivity task failed on the Ray cluster: {exc}") from None
            except RayActorError as exc:  # Ray's retries on that actor spent (a removed node): another actor
                if lost >= _RESUBMITS:
                    raise MpstudioError(f"the Ray actors running one sensitivity task were lost {lost + 1} times "
                                        f"({str(exc).splitlines()[0]}); the nodes may be out of memory") from None
                self._owner[task_id] = (None, index, kind, payload, lost + 1)
                self.submit(kind, payload, task_id=task_id, avoid=index)
        return out

    def close(self) -> None:
        release_all(self.ray, self.processes)
        self._owner.clear()

    terminate = close
