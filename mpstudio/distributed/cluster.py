"""One connection to a Ray cluster: the address (`--ray`, `$MPSTUDIO_RAY_ADDRESS`), a clear error when it cannot
be reached, and the object store used by content hash so a model or a sample set crosses the network once.

Ray is imported when a cluster is connected, never at import time of this module.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np

from ..data import Feed
from ..errors import MpstudioError

RAY_ADDRESS_ENV = "MPSTUDIO_RAY_ADDRESS"
_KEEP_OBJECTS = 16  # content-hashed objects kept in the store per connection (models and sample sets)
_REACH_SECONDS = 5.0
log = logging.getLogger(__name__)


def ray_address(value: str | None = None) -> str | None:
    """The cluster a command uses: `value` (from `--ray`), else `$MPSTUDIO_RAY_ADDRESS`, else None (no Ray)."""
    text = (value if value is not None else os.environ.get(RAY_ADDRESS_ENV, "")).strip()
    return text or None


def _import_ray():
    try:
        import ray
    except ImportError:
        raise MpstudioError("Ray is not installed: pip install 'mpstudio[ray]' (or pip install 'ray[default]'), "
                            "or run without --ray / MPSTUDIO_RAY_ADDRESS") from None
    return ray


def _check_reachable(address: str) -> None:
    """A host:port (or ray://host:port) that accepts no TCP connection fails here in seconds; Ray itself waits
    minutes for a head that is not there."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise MpstudioError(f"--ray needs auto, local or HOST:PORT of a Ray head (ray://HOST:PORT for Ray "
                            f"Client), not {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=_REACH_SECONDS).close()
    except OSError as exc:
        raise MpstudioError(f"the Ray cluster at {address} cannot be reached ({exc}); start it with "
                            f"`ray start --head` on that machine, check the address, or run without --ray "
                            f"(--ray local runs Ray on this machine only)") from None


def connect(address: str) -> "RayCluster":
    """The cluster at `address`: "auto" (the one `ray start` started on this machine, or $RAY_ADDRESS),
    HOST:PORT or ray://HOST:PORT, or "local" (a Ray instance started here for this process, only when asked).
    A cluster that cannot be reached raises one MpstudioError; nothing falls back to local runs silently."""
    ray = _import_ray()
    if address not in ("auto", "local"):
        _check_reachable(address)
    if not ray.is_initialized():
        try:
            if address == "local":
                ray.init(address="local", include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            hint = ("no Ray cluster is running on this machine (start one with `ray start --head`, or pass "
                    "--ray HOST:PORT)" if address == "auto" else f"Ray could not join {address}")
            raise MpstudioError(f"{hint}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; "
                                "--ray local runs Ray on this machine only") from None
    return RayCluster(ray, address)


class RayCluster:
    """A connected cluster: its CPUs and nodes, and the object store keyed by content (`put_file`, `put_feeds`),
    so a model or a sample set is put once however many tasks read it."""

    def __init__(self, ray, address: str):
        self.ray, self.address = ray, address
        self._objects: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes_put = 0  # what this process has put into the object store
        self.puts = 0
        self._evaluators = None
        self._lock_actors = threading.Lock()

    @property
    def cpus(self) -> int:
        return int(self.ray.cluster_resources().get("CPU", 0))

    def nodes(self) -> list[dict]:
        """The alive nodes: node id, host name, address and CPUs."""
        return [{"node": n["NodeID"], "host": n["NodeManagerHostname"], "address": n["NodeManagerAddress"],
                 "cpus": int(n["Resources"].get("CPU", 0))} for n in self.ray.nodes() if n["Alive"]]

    def describe(self) -> str:
        nodes = self.nodes()
        return f"Ray cluster {self.address}: {len(nodes)} node(s), {sum(n['cpus'] for n in nodes)} CPUs"

    # ---- the object store, by content ----
    def _put(self, key: str, value, size: int):
        with self._lock:
            ref = self._objects.pop(key, None)
            if ref is None:
                ref = self.ray.put(value)
                self.bytes_put += size
                self.puts += 1
            self._objects[key] = ref
            while len(self._objects) > _KEEP_OBJECTS:
                self._objects.popitem(last=False)  # dropping the last reference frees it in the store
            return ref

    def put_file(self, path: str | Path) -> tuple[str, object]:
        """(sha256 of the file, a reference to its bytes in the object store)."""
        data = Path(path).read_bytes()
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            if key in self._objects:
                self._objects.move_to_end(key)
                return key, self._objects[key]
        return key, self._put(key, data, len(data))

    def put_feeds(self, feeds: Sequence[Feed]) -> tuple[str, object]:
        """(content hash of the samples, a reference to them in the object store)."""
        digest = hashlib.sha256()
        size = 0
        for feed in feeds:
            for name in sorted(feed):
                array = np.ascontiguousarray(feed[name])
                digest.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
                digest.update(array.data)
                size += array.nbytes
        key = "feeds-" + digest.hexdigest()
        with self._lock:
            if key in self._objects:
                self._objects.move_to_end(key)
                return key, self._objects[key]
        return key, self._put(key, [dict(f) for f in feeds], size)

    # ---- workers ----
    def evaluators(self):
        """The cluster's evaluation actors (one per CPU, started once per connection)."""
        from .evaluation import EvaluatorPool

        with self._lock_actors:
            if self._evaluators is None:
                self._evaluators = EvaluatorPool(self)
            return self._evaluators

    def sensitivity_pool(self, metric=None):
        """A sensitivity analysis' worker pool of Ray actors (the `WorkerPool` interface)."""
        from .sensitivity import RaySensitivityPool

        return RaySensitivityPool(self)

    def close(self) -> None:
        """Stop this connection's actors and leave the cluster running."""
        with self._lock_actors:
            if self._evaluators is not None:
                self._evaluators.close()
                self._evaluators = None
        self._objects.clear()

    def __enter__(self) -> "RayCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
