"""The agent's HTTP service: its ASGI app (FastAPI) and the loop that serves it.

One worker process runs everything on the device, one request at a time; other requests wait in a
bounded queue. Every endpoint but the OpenAPI schema needs the bearer token when one is set.
"""

from __future__ import annotations

import errno
import logging
import sys
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool

from ... import __version__
from ...errors import MpstudioError
from ...runtime import htp_is_emulated
from ..guards import ClientConnections, RedactQuery, RequestGuard, guarded_protocol
from ..protocol import AgentError
from .config import AgentConfig
from .routes import router
from .state import AgentState

log = logging.getLogger("mpstudio.agent")

KEEP_ALIVE_S = 30
# Write errors that mean there is no room: a full disk, a full quota, a file-size limit.
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _error_response(status: int, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


async def _agent_error(request: Request, exc: AgentError):
    return _error_response(exc.status, str(exc))


async def _user_error(request: Request, exc: MpstudioError):
    return _error_response(422, str(exc))


async def _file_error(request: Request, exc: OSError):
    """A file the agent itself writes or reads failed: a full disk is 507 and says so, anything else a 500 that
    names the error instead of an unhandled traceback."""
    if exc.errno in _NO_ROOM:
        log.error("no room to write under the agent's work directory: %s", exc)
        return _error_response(507, f"the agent's disk has no room left ({exc.strerror}); free space under its "
                                    "--workdir or lower --max-store-mb, then retry")
    log.exception("file error")
    return _error_response(500, f"the agent could not read or write its files: {exc.strerror or exc}")


async def _validation_error(request: Request, exc: RequestValidationError):
    # Say which field is wrong without echoing the (possibly huge) input back.
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
    return _error_response(422, f"invalid request: {problems}")


def create_app(config: AgentConfig) -> FastAPI:
    """The agent's ASGI app; its worker starts with the app's lifespan and stops with it."""
    config.check()
    state = AgentState(config)

    @asynccontextmanager
    async def lifespan(app):
        state.worker.start()
        yield
        await run_in_threadpool(state.close)

    bearer = HTTPBearer(auto_error=False, description="the agent token (MPSTUDIO_AGENT_TOKEN)")
    app = FastAPI(
        title="mpstudio agent",
        version=__version__,
        description="Runs ONNX models on a Qualcomm HTP (or its x86_64 emulator) through ONNX Runtime's QNN EP.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # Declares the bearer scheme in the OpenAPI schema; the check itself is in RequestGuard.
        dependencies=[Security(bearer)],
    )
    app.state.agent = state
    app.add_middleware(RequestGuard, token=config.token, max_bytes=config.upload_bytes)
    app.add_exception_handler(AgentError, _agent_error)
    app.add_exception_handler(MpstudioError, _user_error)
    app.add_exception_handler(OSError, _file_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.include_router(router)
    return app


def serve(config: AgentConfig, *, log_level: str = "info", announce=sys.stdout) -> None:
    """Serve until interrupted. Prints one line with the URL once listening (the port may be chosen by the OS)."""
    import socket

    import uvicorn

    app = create_app(config)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on such sockets, and without it every response
    # waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    # log_config=None: uvicorn's records (access lines too) go through the agent's logging, to stderr,
    # keeping stdout for the one "listening on" line a parent process reads.
    app.state.connections = ClientConnections()  # shared by the protocol and RequestGuard
    try:
        protocol = guarded_protocol(config.http, config.connection_limits(), app.state.connections)
    except ImportError as exc:
        raise MpstudioError(f"HTTP implementation {config.http!r} is not installed ({exc}); use --http auto") from None
    logging.getLogger("uvicorn.access").addFilter(RedactQuery())
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, log_config=None, http=protocol, ws="none",
                                           timeout_keep_alive=KEEP_ALIVE_S))
    log.info("HTP is %s; %s; HTTP parser %s", "the x86_64 emulator (timings are host time)" if htp_is_emulated()
             else "the device NPU", "bearer token required" if config.token else "no token (loopback only)",
             protocol.__mro__[2].__name__)
    print(f"mpstudio agent listening on http://{host}:{port}", file=announce, flush=True)
    server.run(sockets=[sock])
