"""`AgentPool`: several agents (a device farm) used as one; runs spread over the healthy ones.

Results keep the device they ran on (`RunResult.device`, `RunResult.agent`): latencies of different
devices are never pooled.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..errors import MpstudioError
from .client import AgentClient
from .protocol import AgentError, AgentRunTimeout, RunResult

# Statuses that say the agent (not the request) is in trouble: try the job elsewhere. 507: its model
# store is full of models in use. An agent's own 504 says the run overran its --run-timeout, which is the
# run's doing: the agent (its worker replaced) stays in the pool.
_AGENT_TROUBLE = (502, 503, 504, 507)


def _run_overran(exc: AgentError) -> bool:
    return isinstance(exc, AgentRunTimeout)


class AgentPool:
    """Agents given as clients or URLs (with one `token` for all URLs).

    An agent that fails to answer is set aside for `retry_after_s` seconds, then tried again.
    """

    def __init__(self, agents: Iterable[AgentClient | str], token: str | None = None, *, retry_after_s: float = 30.0):
        self.agents: list[AgentClient] = [a if isinstance(a, AgentClient) else AgentClient(a, token) for a in agents]
        if not self.agents:
            raise MpstudioError("an agent pool needs at least one agent")
        self.retry_after_s = retry_after_s
        self._down_until: dict[str, float] = {}
        self._in_flight: dict[str, int] = {a.url: 0 for a in self.agents}
        self._lock = threading.Lock()

    def close(self) -> None:
        for agent in self.agents:
            agent.close()

    def __enter__(self) -> "AgentPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ health

    def healthy(self, check: bool = True) -> list[AgentClient]:
        """Agents not set aside; with `check`, those that also answer their health endpoint now."""
        now = time.monotonic()
        candidates = [a for a in self.agents if self._down_until.get(a.url, 0.0) <= now]
        if not check:
            return candidates
        alive = []
        for agent in candidates:
            if agent.is_healthy():
                alive.append(agent)
            else:
                self._set_aside(agent)
        return alive

    def _set_aside(self, agent: AgentClient) -> None:
        with self._lock:
            self._down_until[agent.url] = time.monotonic() + self.retry_after_s

    # ------------------------------------------------------------------ runs

    def run(self, model, inputs: Mapping[str, np.ndarray], **options) -> RunResult:
        """One run on the least busy healthy agent; on agent trouble it moves to the next one.

        A run that overruns an agent's --run-timeout is tried on the others (they may be faster, or allow
        longer) without setting that agent aside; when it overruns them all, the last timeout is raised.
        """
        tried: set[str] = set()
        overran: AgentError | None = None
        while True:
            with self._lock:
                now = time.monotonic()
                choices = [a for a in self.agents
                           if a.url not in tried and self._down_until.get(a.url, 0.0) <= now]
                if not choices:
                    if overran is not None:
                        raise overran
                    raise MpstudioError(f"no healthy agent left in the pool (tried {sorted(tried) or 'none'})")
                agent = min(choices, key=lambda a: self._in_flight[a.url])
                self._in_flight[agent.url] += 1
            tried.add(agent.url)
            try:
                return agent.run(model, inputs, **options)
            except AgentError as exc:
                if exc.status not in _AGENT_TROUBLE:
                    raise
                if _run_overran(exc):
                    overran = exc
                else:
                    self._set_aside(agent)
            finally:
                with self._lock:
                    self._in_flight[agent.url] -= 1

    def map(self, model, inputs: Sequence[Mapping[str, np.ndarray]], **options) -> list[RunResult]:
        """Run `model` on each inputs dict, spread over the healthy agents; results come back in input order.

        Each agent pulls the next job when it is free, so faster devices take more jobs. A job whose agent
        fails goes back to the queue for another agent.
        """
        agents = self.healthy()
        if not agents:
            raise MpstudioError("no healthy agent in the pool")
        jobs: queue.Queue = queue.Queue()
        for index, feed in enumerate(inputs):
            jobs.put((index, feed))
        results: list[RunResult | None] = [None] * len(inputs)
        errors: list[BaseException] = []

        def serve(agent: AgentClient):
            while not errors:
                try:
                    index, feed = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[index] = agent.run(model, feed, **options)
                except AgentError as exc:
                    if exc.status in _AGENT_TROUBLE and not _run_overran(exc):
                        jobs.put((index, feed))
                        self._set_aside(agent)
                        return
                    errors.append(exc)
                except BaseException as exc:  # noqa: BLE001 - reported to the caller below
                    errors.append(exc)

        _each_in_a_thread(serve, agents)
        if errors:
            raise errors[0]
        if any(r is None for r in results):
            missing = sum(r is None for r in results)
            raise MpstudioError(f"{missing} run(s) could not be placed: every agent in the pool failed")
        return results  # type: ignore[return-value]

    def run_everywhere(self, model, inputs: Mapping[str, np.ndarray], **options) -> dict[str, RunResult]:
        """The same run on every healthy agent, keyed by device name (a farm's per-device comparison)."""
        agents = self.healthy()
        results: dict[str, RunResult] = {}
        errors: list[BaseException] = []

        def one(agent: AgentClient):
            try:
                result = agent.run(model, inputs, **options)
                results[f"{result.device} @ {agent.url}"] = result
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        _each_in_a_thread(one, agents)
        if errors and not results:
            raise errors[0]
        return dict(sorted(results.items()))


def _each_in_a_thread(target, agents) -> None:
    """Call `target(agent)` for every agent at once, one thread each, and wait for all."""
    threads = [threading.Thread(target=target, args=(a,), daemon=True) for a in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def by_device(results: Iterable[RunResult]) -> dict[str, list[RunResult]]:
    """Group results by the device (and agent) they ran on, so per-device latencies stay apart."""
    groups: dict[str, list[RunResult]] = {}
    for result in results:
        groups.setdefault(f"{result.device} @ {result.agent}", []).append(result)
    return groups
