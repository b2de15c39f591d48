"""The QNN HTP remote agent: a server that runs models on a device, its worker process, and its clients.

`mpstudio agent serve` on the device; `AgentClient`, `LocalAgent` and `AgentPool` in the studio.
"""

from .client import AgentClient, LocalAgent
from .pool import AgentPool, by_device
from .protocol import (
    AgentError,
    AgentInfo,
    AgentRunTimeout,
    ContextBinary,
    LatencyStats,
    NodeFallback,
    OpCost,
    OpProfile,
    Placement,
    RunResult,
)

__all__ = [
    "AgentClient",
    "AgentError",
    "AgentInfo",
    "AgentPool",
    "AgentRunTimeout",
    "ContextBinary",
    "LatencyStats",
    "LocalAgent",
    "NodeFallback",
    "OpCost",
    "OpProfile",
    "Placement",
    "RunResult",
    "by_device",
]
