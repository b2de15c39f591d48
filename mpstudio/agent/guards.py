"""What the agent refuses before a request reaches a route: slow or oversized requests and idle sockets
(at the connection, whichever HTTP parser uvicorn uses), missing tokens and oversized bodies (in ASGI),
and tokens in URLs (which would land in the access log).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl

BODY_METHODS = ("POST", "PUT", "PATCH")


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many sockets it may hold open."""

    header_timeout_s: float = 10.0  # request line and headers, from the first byte (or the connection)
    body_timeout_s: float = 30.0  # longest silence in the middle of a body
    request_timeout_s: float = 600.0  # the whole request, headers and body
    max_header_bytes: int = 64 * 1024
    max_connections: int = 128
    max_unauthenticated_per_client: int = 16  # connections from one address that have not shown the token


class ClientConnections:
    """Which open connections have not yet shown the token, by client address.

    Such a connection is cheap to open and proves nothing, so one address may hold only a few, and when
    the agent is at its connection cap the oldest of them is closed to make room (a client that has shown
    the token is never closed for another). `RequestGuard` marks a connection once a request on it passes.
    """

    def __init__(self):
        self._pending: dict[tuple, object] = {}  # client (host, port) -> protocol, oldest first

    def opened(self, protocol) -> None:
        if protocol.client is not None:
            self._pending[protocol.client] = protocol

    def closed(self, protocol) -> None:
        if protocol.client is not None and self._pending.get(protocol.client) is protocol:
            del self._pending[protocol.client]

    def authenticated(self, client) -> None:
        if client is not None:
            self._pending.pop(tuple(client), None)

    def pending_from(self, host: str) -> int:
        return sum(1 for client in self._pending if client[0] == host)

    def oldest_pending(self, besides):
        return next((protocol for protocol in self._pending.values() if protocol is not besides), None)


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"detail": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n")
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


class _Deadlines:
    """Mixin for uvicorn's HTTP protocol classes (h11 or httptools): read deadlines, a header size limit and
    a cap on open connections, none of which uvicorn has (its keep-alive timer only runs between requests,
    so a client that never finishes its headers or body would hold a socket forever)."""

    limits: ConnectionLimits  # set by guarded_protocol()
    registry: ClientConnections  # set by guarded_protocol()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._timer = None
        self._phase = None  # "headers" while reading a request's head, "body" while reading its body
        self._started = self._last_data = time.monotonic()
        self._header_bytes = 0
        self._head_tail = b""
        limits, registry = self.limits, self.registry
        host = self.client[0] if self.client else None
        if host is not None and registry.pending_from(host) >= limits.max_unauthenticated_per_client:
            self._refuse(503, "Service Unavailable",
                         f"this address already has {limits.max_unauthenticated_per_client} open connections that "
                         "have not sent the token; retry later")
            return
        registry.opened(self)
        if len(self.connections) > limits.max_connections:
            oldest = registry.oldest_pending(besides=self)
            if oldest is None:
                self._refuse(503, "Service Unavailable",
                             f"the agent already has {limits.max_connections} open connections; retry later")
                return
            # Room for this one at the cost of a connection that has shown nothing yet.
            oldest._refuse(503, "Service Unavailable",
                           f"closed to make room: the agent has {limits.max_connections} open connections, and this "
                           "one had not sent the token")
        self._begin("headers")

    def connection_lost(self, exc) -> None:
        self._cancel()
        self._stop_write_timer()
        self.registry.closed(self)
        super().connection_lost(exc)

    # A client that stops reading its answer would keep the whole answer (a run's outputs, say) in the
    # transport's buffer forever: past the body timeout without draining, the connection is dropped.
    def pause_writing(self) -> None:
        super().pause_writing()
        self._stop_write_timer()
        self._write_timer = asyncio.get_running_loop().call_later(self.limits.body_timeout_s, self._write_stalled)

    def resume_writing(self) -> None:
        self._stop_write_timer()
        super().resume_writing()

    def _stop_write_timer(self) -> None:
        if getattr(self, "_write_timer", None) is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_stalled(self) -> None:
        self._write_timer = None
        logging.getLogger("mpstudio.agent").warning(
            "dropped a connection whose client read nothing of its answer for %g s", self.limits.body_timeout_s)
        self.transport.abort()  # frees what is buffered; close() would wait for the client to read it

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if self._phase is None and (cycle is None or cycle.response_complete):
            self._begin("headers")  # the first bytes of the next request on a kept-alive connection
        self._last_data = time.monotonic()
        if self._phase == "headers":
            # Count only up to the head's end (a body may follow in the same read), and refuse before the
            # parser sees a head that arrived whole in one read and would pass unchecked.
            seen = self._head_tail + data
            end = seen.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else end + 4 - len(self._head_tail)
            self._head_tail = seen[-3:]
            if self._header_bytes > self.limits.max_header_bytes:
                return self._refuse(431, "Request Header Fields Too Large",
                                    f"request headers larger than {self.limits.max_header_bytes // 1024} KB")
        super().data_received(data)
        if self.transport.is_closing():
            self._cancel()
            return
        if self.cycle is not cycle:  # the parser finished a request head
            self._phase = "body" if self.cycle.more_body else None
            if self._phase is None:
                self._cancel()
        elif self._phase == "body" and not self.cycle.more_body:
            self._phase = None
            self._cancel()

    # ------------------------------------------------------------------ timers

    def _begin(self, phase: str) -> None:
        self._phase = phase
        self._started = self._last_data = time.monotonic()
        self._header_bytes = 0
        self._head_tail = b""
        self._arm(self.limits.header_timeout_s)

    def _arm(self, delay: float) -> None:
        self._cancel()
        self._timer = asyncio.get_running_loop().call_later(max(delay, 0.05), self._check_deadline)

    def _cancel(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None

    def _check_deadline(self) -> None:
        self._timer = None
        if self._phase is None or self.transport.is_closing():
            return
        now = time.monotonic()
        limits = self.limits
        if self.flow.read_paused:  # the app is behind, not the client: give the client its time back
            self._last_data = now
        if self._phase == "headers":
            left = self._started + limits.header_timeout_s - now
            if left <= 0:
                return self._refuse(408, "Request Timeout",
                                    f"the request headers did not arrive within {limits.header_timeout_s:g} s")
            return self._arm(left)
        left = min(self._last_data + limits.body_timeout_s, self._started + limits.request_timeout_s) - now
        if left <= 0:
            # The app is reading this body: closing the socket ends its read with a disconnect.
            logging.getLogger("mpstudio.agent").warning("closed a connection whose request body stalled")
            self._phase = None
            self.transport.close()
            return
        self._arm(left)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._phase = None
        self._cancel()
        if not self.transport.is_closing():
            self.transport.write(_raw_response(status, reason, message))
            self.transport.close()


def guarded_protocol(http: str, limits: ConnectionLimits, registry: ClientConnections | None = None) -> type:
    """uvicorn's protocol class for `http` ("auto", "h11" or "httptools") with the agent's limits added;
    `registry` (shared with the app's `RequestGuard`) learns which connections have shown the token."""
    if http == "auto":
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
    elif http == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    elif http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        raise ValueError(f"unknown HTTP implementation {http!r}")
    return type(f"Guarded{base.__name__}", (_Deadlines, base),
                {"limits": limits, "registry": registry or ClientConnections()})


# ============================================================================================ ASGI

class _BodyTooLarge(Exception):
    pass


class RequestGuard:
    """ASGI middleware: bearer token (constant-time compare), no credentials in URLs, and a body limit that
    counts the bytes really received, so it holds for chunked bodies and whatever parser is installed."""

    OPEN_PATHS = ("/openapi.json",)

    def __init__(self, app, token: str | None, max_bytes: int):
        self.app = app
        self.token = token.encode() if token else None
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal is not None:
            status, message, headers = refusal
            # Closing the connection spares reading a body that was refused on its head.
            return await send_error(send, status, message, [*headers, (b"connection", b"close")])
        registry = getattr(getattr(scope.get("app"), "state", None), "connections", None)
        if registry is not None:
            registry.authenticated(scope.get("client"))
        if scope["method"] not in BODY_METHODS:
            return await self.app(scope, receive, send)
        await self._limited(scope, receive, send)

    def _refusal(self, scope) -> tuple | None:
        """(status, message, extra headers) when the request is refused on its head alone."""
        if _has_credential_in_query(scope.get("query_string", b"")):
            return 400, ("credentials in the URL are refused (URLs are logged): send the token in an "
                         "'Authorization: Bearer <token>' header"), ()
        headers = dict(scope["headers"])
        if self.token is not None and scope["path"] not in self.OPEN_PATHS:
            scheme, _, credential = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credential.strip(), self.token):
                return 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")]
        if scope["method"] not in BODY_METHODS:
            return None
        if b"transfer-encoding" in headers:
            return 411, "send a Content-Length; chunked bodies are not accepted", ()
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return 413, self._too_large(), ()
        return None

    def _too_large(self) -> str:
        return (f"request body larger than the agent's limit of {self.max_bytes / 2**20:g} MB "
                "(start the agent with a larger --max-upload-mb)")

    async def _limited(self, scope, receive, send):
        """Run the app with a receive that stops it past the limit, and answer 413 in its place."""
        received = 0
        exceeded = False
        started = False

        async def counting_receive():
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise _BodyTooLarge()
            return message

        async def guarded_send(message):
            nonlocal started
            if exceeded:
                return  # the app's answer to a body it could not finish reading
            started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await send_error(send, 413, self._too_large(), [(b"connection", b"close")])


_CREDENTIAL_NAMES = re.compile(r"token|auth|key|secret|password|bearer", re.IGNORECASE)


def _has_credential_in_query(query: bytes) -> bool:
    if not query:
        return False
    return any(_CREDENTIAL_NAMES.search(name) for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True))


async def send_error(send, status: int, message: str, extra_headers=()):
    body = json.dumps({"detail": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra_headers]
    if status == 503:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RedactQuery(logging.Filter):
    """Drops query strings from uvicorn's access lines: a client may put a secret there by mistake."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?<redacted>", *args[3:])
        return True
