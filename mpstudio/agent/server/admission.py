"""Admission to the device and to the model store: a bounded FIFO queue for runs, a cap on uploads at once."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from ..protocol import AgentError


class DeviceQueue:
    """One request on the device at a time; at most `max_waiting` others wait (FIFO), holding at most
    `max_waiting_bytes` of encoded inputs between them (their arrays are decoded only when their turn
    comes); the rest get 503."""

    def __init__(self, max_waiting: int, max_waiting_bytes: int | None = None):
        self.max_waiting = max_waiting
        self.max_waiting_bytes = max_waiting_bytes
        self.waiting = 0
        self.waiting_bytes = 0
        self.busy = False
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def slot(self, held_bytes: int = 0):
        """Wait for the device, holding `held_bytes` (a request's encoded inputs) while waiting."""
        if self.waiting >= self.max_waiting:
            raise AgentError(f"the agent is busy ({self.waiting} requests waiting); retry later", 503)
        must_wait = self.busy or self.waiting > 0
        if must_wait and self.max_waiting_bytes is not None and \
                self.waiting_bytes + held_bytes > self.max_waiting_bytes:
            raise AgentError(
                f"the agent is busy: the runs waiting for the device already hold {self.waiting_bytes / 2**20:.1f} MB "
                f"of inputs, and this one's {held_bytes / 2**20:.1f} MB would pass its limit of "
                f"{self.max_waiting_bytes / 2**20:g} MB (--max-queued-mb); retry later", 503)
        self.waiting += 1
        self.waiting_bytes += held_bytes
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
            self.waiting_bytes -= held_bytes
        self.busy = True
        try:
            yield
        finally:
            self.busy = False
            self._lock.release()


class UploadSlots:
    """At most `limit` uploads in progress at once; the rest get 503."""

    def __init__(self, limit: int):
        self.limit = limit
        self.active = 0

    @asynccontextmanager
    async def slot(self):
        if self.active >= self.limit:
            raise AgentError(f"{self.active} uploads are in progress, the agent's limit (--max-uploads); "
                             "retry later", 503)
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
