"""Evaluations on a Ray cluster: `OverRay`, a runner like `loop.runners.InProcess` whose samples run in shards on
the cluster's evaluation actors (CPU and HTP-emulator runs alike).

Each actor holds one CPU, keeps the sessions it built (by model hash) while work for them comes, and is restarted
by Ray if its process dies, its unfinished tasks retried there. A model's bytes and a sample set enter the object
store once per content (`RayCluster.put_file`, `put_feeds`); a task carries references and sample indices.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import Cancelled, DataSource, Feed, Progress
from ..errors import MpstudioError
from ..loop.runners import CPU_SOURCE
from .folders import actor_folder, release, release_all

_KEEP_SESSIONS = 2
_TASK_RETRIES = 3  # Ray's retries on the same (restarted) actor
_RESUBMITS = 5  # then ours, on another actor
# Half a CPU each: one evaluation actor and one sensitivity actor per CPU fit together (a search analyses while
# its evaluation actors stay up), and either alone runs one per core.
ACTOR_CPUS = 0.5
_START_SECONDS = 300.0


def started(ray, refs: list, what: str) -> list:
    """The answers of freshly started actors, or one MpstudioError when the cluster cannot place them."""
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get(refs, timeout=_START_SECONDS)
    except GetTimeoutError:
        raise MpstudioError(f"the Ray cluster did not start its {len(refs)} {what} actors within "
                            f"{_START_SECONDS:.0f} s: are its CPUs taken by other work? (`ray status` shows them)") \
            from None
log = logging.getLogger(__name__)


class Evaluator:
    """One evaluation actor (made remote by `EvaluatorPool`): sessions by model hash, samples run in order."""

    def __init__(self):
        # QNN writes trace files into the working directory: each actor its own.
        self.folder = actor_folder("evaluator")
        self.sessions: OrderedDict = OrderedDict()

    def release(self) -> None:
        self.sessions.clear()
        release(self.folder)

    def where(self) -> tuple[str, str, bool, int]:
        """(node id, host name, whether the HTP is the emulator, process id)."""
        import ray

        from ..runtime import htp_is_emulated

        return ray.get_runtime_context().get_node_id(), socket.gethostname(), htp_is_emulated(), os.getpid()

    def run(self, model_key: str, model_box: list, backend: str, options: dict | None, fallback: bool,
            samples: list[Feed], indices: list[int]) -> tuple[str, list[Feed]]:
        """(this node's id, the outputs of `samples[i]` for i in `indices`). `model_box` holds the reference to
        the model's bytes, fetched only when no session for `model_key` is held."""
        import ray

        from ..runtime import create_session

        key = (model_key, backend, tuple(sorted((options or {}).items())), fallback)
        session = self.sessions.pop(key, None)
        if session is None:
            model = ray.get(model_box[0])
            session = create_session(model, backend, options, allow_cpu_fallback=fallback,
                                     intra_op_threads=1 if backend == "cpu" else 0)
        self.sessions[key] = session
        while len(self.sessions) > _KEEP_SESSIONS:
            self.sessions.popitem(last=False)
        names = [o.name for o in session.get_outputs()]
        outputs = [{n: np.asarray(v) for n, v in zip(names, session.run(names, samples[i]))} for i in indices]
        return ray.get_runtime_context().get_node_id(), outputs


@dataclass(frozen=True)
class Placement:
    """Where one run's samples ran: samples per node (node id prefix @ host), with its time and task count."""

    model: str
    backend: str
    samples: dict
    tasks: int
    seconds: float

    def describe(self) -> str:
        spread = ", ".join(f"{n} samples on {node}" for node, n in sorted(self.samples.items()))
        return f"{self.model} on {self.backend}: {spread} ({self.tasks} Ray tasks, {self.seconds:.1f} s)"


class EvaluatorPool:
    """One evaluation actor per CPU of the cluster, spread over its nodes; shards go to the least loaded."""

    def __init__(self, cluster):
        ray = self.ray = cluster.ray
        count = max(1, cluster.cpus)
        actor = ray.remote(num_cpus=ACTOR_CPUS, max_restarts=-1, max_task_retries=_TASK_RETRIES)(Evaluator)
        self.actors = [actor.options(scheduling_strategy="SPREAD").remote() for _ in range(count)]
        self.where = started(ray, [a.where.remote() for a in self.actors], "evaluation")
        self.hosts = {node: host for node, host, _, _ in self.where}
        self._load = [0] * count
        self._lock = threading.Lock()

    @property
    def pids(self) -> list[int]:
        """The actors' processes as they were started (a restarted actor has another)."""
        return [pid for *_, pid in self.where]

    def emulated(self) -> bool:
        return all(emulated for _, _, emulated, _ in self.where)

    def _submit(self, args, indices, avoid: int | None = None):
        with self._lock:
            loads = [load if i != avoid or len(self._load) == 1 else float("inf") for i, load in enumerate(self._load)]
            i = loads.index(min(loads))
            self._load[i] += len(indices)
        return self.actors[i].run.remote(*args, indices), i

    def run(self, model: tuple[str, object], backend: str, options: dict | None, fallback: bool,
            samples: tuple[str, object], total: int, progress: Progress | None, cancel, label: str):
        """Every sample's outputs in order and a `Placement`."""
        started = time.perf_counter()
        chunk = max(1, min(4, total // (len(self.actors) * 4)))
        args = (model[0], [model[1]], backend, options, fallback, samples[1])
        pending = {}
        for start in range(0, total, chunk):
            indices = list(range(start, min(total, start + chunk)))
            ref, actor = self._submit(args, indices)
            pending[ref] = (indices, actor)
        results: list[Feed | None] = [None] * total
        per_node: Counter = Counter()
        failures: Counter = Counter()  # shard (first index) -> times its actor was lost
        done, tasks = 0, len(pending)
        try:
            while pending:
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"cancelled after {done} of {total} samples")
                ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    indices, actor = pending.pop(ref)
                    with self._lock:
                        self._load[actor] -= len(indices)
                    answer = self._result(ref, failures, indices[0])
                    if answer is None:  # its actor or node is gone: the shard goes to another actor
                        time.sleep(min(2.0, 0.2 * failures[indices[0]]))
                        again, actor = self._submit(args, indices, avoid=actor)
                        pending[again] = (indices, actor)
                        tasks += 1
                        continue
                    node, outputs = answer
                    for index, output in zip(indices, outputs):
                        results[index] = output
                    per_node[f"{node[:8]}@{self.hosts.get(node, '?')}"] += len(indices)
                    done += len(indices)
                    if progress:
                        progress(done, total, f"running {label} on {backend} (Ray, {len(self.actors)} actors)")
        finally:
            for ref, (indices, actor) in pending.items():
                self.ray.cancel(ref)
                with self._lock:
                    self._load[actor] -= len(indices)
        placement = Placement(label, backend, dict(per_node), tasks, time.perf_counter() - started)
        return results, placement

    def _result(self, ref, failures: Counter, shard: int):
        """The shard's (node, outputs), or None when its actor was lost (Ray's own retries on that actor spent:
        a removed node refuses them at once, before the cluster knows it is gone)."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return self.ray.get(ref)
        except RayTaskError as exc:
            cause = exc.cause if hasattr(exc, "cause") else None
            if isinstance(cause, MpstudioError):
                raise MpstudioError(str(cause.args[0] if cause.args else cause)) from None
            raise
        except RayActorError as exc:
            failures[shard] += 1
            if failures[shard] > _RESUBMITS:
                raise MpstudioError(f"the Ray actors running one shard were lost {failures[shard]} times "
                                    f"({str(exc).splitlines()[0]}); the nodes may be out of memory") from None
            log.warning("Ray: a shard's actor was lost (%s); running it on another", str(exc).splitlines()[0])
            return None

    def close(self) -> None:
        release_all(self.ray, self.actors)
        self.actors = []


class OverRay:
    """A study's runner whose CPU and HTP-emulator samples run on a Ray cluster (`distributed.connect`).

    The accuracy source is the one a local run names (the CPU numerics, or the HTP emulator on the nodes' host),
    so cluster and local results of the same numerics share a front; where each run's samples ran is kept in
    `placements` and logged."""

    agent = None
    on_device = False  # the cluster's HTP backend is this software's emulator or library, not a device's clock

    def __init__(self, cluster, lanes: int | None = None):
        self.cluster = cluster
        self.placements: list[Placement] = []
        self._lanes = lanes

    @property
    def sensitivity_workers(self):
        """What a sensitivity analysis takes as `workers` to run its chunks on this cluster."""
        return self.cluster

    def healthy(self) -> list["OverRay"]:
        """One lane per plan the cluster has room to evaluate at once (a search runs that many plans together):
        a plan per two CPUs, at most four."""
        lanes = self._lanes or max(1, min(4, self.cluster.cpus // 2))
        return [self] * lanes

    def source(self, backend: str) -> str:
        if backend == "cpu":
            return CPU_SOURCE
        pool = self.cluster.evaluators()
        hosts = sorted(set(pool.hosts.values()))
        kind = "HTP emulator" if pool.emulated() else "HTP"
        return f"{kind} on {hosts[0]}" if len(hosts) == 1 else f"{kind} on {len(hosts)} hosts ({', '.join(hosts)})"

    def outputs(self, path: Path, data: DataSource, backend: str, options: dict | None, progress: Progress | None,
                cancel, allow_cpu_fallback: bool = False) -> list[Feed]:
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled before the run started")
        feeds = list(data.feeds())
        model = self.cluster.put_file(path)
        samples = self.cluster.put_feeds(feeds)
        outputs, placement = self.cluster.evaluators().run(model, backend, options, allow_cpu_fallback, samples,
                                                           len(feeds), progress, cancel, Path(path).stem[:8])
        self.placements.append(placement)
        log.info("Ray: %s", placement.describe())
        return outputs

    def measure(self, path: Path, feed: Feed, options: dict, profile: bool = False, allow_cpu_fallback: bool = False):
        return None, None  # latency is measured on an agent's device, never from emulator tasks on a cluster


__all__ = ["OverRay", "EvaluatorPool", "Evaluator", "Placement"]
