"""Who runs a studio session's evaluations: ORT in this process, the local agent (started on first use and kept
for the session), a remote agent given by URL and token, or a Ray cluster (`distributed.OverRay`)."""

from __future__ import annotations

import threading

from ..distributed.cluster import ray_address
from ..errors import MpstudioError

RUNNERS = {"this process": "local", "local agent": "agent", "remote agent": "remote", "Ray cluster": "ray"}


class AgentClients:
    """The session's agents: `client(runner, url, token)` is the runner the core's calls take."""

    def __init__(self, lock: threading.RLock | None = None):
        self.lock = lock or threading.RLock()
        self.local = None  # LocalAgent, started on first use
        self._remote = None  # ((url, token), AgentClient)
        self._ray = None  # (address, OverRay)
        # The "Ray cluster" runner's address: a notebook's Run panel sets it; a served studio keeps its server's.
        self.ray_address = ray_address() or "auto"

    def client(self, runner: str, url: str = "", token: str = ""):
        """None (ORT in this process), the local agent's client, the remote agent's client, or the runner over
        the Ray cluster at `ray_address`."""
        if runner == "local":
            return None
        if runner == "ray":
            return self.ray(self.ray_address)
        if runner == "agent":
            from ..agent import LocalAgent

            with self.lock:
                if self.local is None:
                    self.local = LocalAgent().start()
            return self.local.client
        from ..agent import AgentClient

        url = url.strip()
        if not url.startswith(("http://", "https://")):
            raise MpstudioError("give the remote agent's URL, such as http://192.168.1.20:8765, and its token")
        key = (url, token.strip())
        if self._remote is None or self._remote[0] != key:
            if self._remote is not None:
                self._remote[1].close()
            self._remote = (key, AgentClient(url, key[1] or None))
        return self._remote[1]

    def ray(self, address: str):
        """The runner over the Ray cluster at `address` (connected once per address; docs/ray.md)."""
        from ..distributed import OverRay, connect

        address = address.strip()
        if not address:
            raise MpstudioError("give the Ray cluster's address (auto, HOST:PORT) or set MPSTUDIO_RAY_ADDRESS")
        with self.lock:
            if self._ray is None or self._ray[0] != address:
                if self._ray is not None:
                    self._ray[1].cluster.close()
                self._ray = (address, OverRay(connect(address)))
            return self._ray[1]

    def close(self) -> None:
        """Stop the local agent, close the remote agent's client and the Ray cluster's actors."""
        if self._ray is not None:
            self._ray[1].cluster.close()
            self._ray = None
        if self.local is not None:
            self.local.stop()
            self.local = None
        if self._remote is not None:
            self._remote[1].close()
            self._remote = None
