"""Admission to the device and to the model store: a bounded FIFO queue for runs, a cap on uploads at once."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from ..protocol import AgentError


class DeviceQueue:
    """One request on the device at a time; at most `max_waiting` others wait (FIFO), the rest get 503."""

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        self.waiting = 0
        self.busy = False
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def slot(self):
        if self.waiting >= self.max_waiting:
            raise AgentError(f"the agent is busy ({self.waiting} requests waiting); retry later", 503)
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
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
