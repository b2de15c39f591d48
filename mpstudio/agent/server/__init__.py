"""The agent's HTTP service (FastAPI): models by sha256, runs, context binaries, info and health.

`config` holds how an agent serves and its limits; `admission` the queue to the device and the upload cap;
`state` what an agent holds; `wire` the request and response bodies; `routes` the endpoints; `app` the
ASGI app and the server loop.
"""

from .admission import DeviceQueue, UploadSlots
from .app import KEEP_ALIVE_S, create_app, serve
from .codec import INLINE_BYTES
from .config import HTTP_IMPLEMENTATIONS, AgentConfig, default_device_name, is_loopback
from .routes import router
from .state import AgentState
from .wire import MAX_ITERATIONS, MAX_WARMUP, ContextRequest, RunRequest, RunSpec

__all__ = [
    "HTTP_IMPLEMENTATIONS",
    "INLINE_BYTES",
    "KEEP_ALIVE_S",
    "MAX_ITERATIONS",
    "MAX_WARMUP",
    "AgentConfig",
    "AgentState",
    "ContextRequest",
    "DeviceQueue",
    "RunRequest",
    "RunSpec",
    "UploadSlots",
    "create_app",
    "default_device_name",
    "is_loopback",
    "router",
    "serve",
]
