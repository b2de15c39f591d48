"""The studio server refuses websocket connections that carry no Origin header.

Browsers always send Origin on a websocket handshake, so a connection without one is a script or a tool, and
Tornado lets it through (it checks an origin only when one is sent). The guard refuses it at the handshake (403)
and, for a connection whose handshake came before the guard was installed (the one whose session first ran
`app.py`), when it is attached to its session.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

_REFUSAL = "websocket connections without an Origin header are refused (only browsers may connect)"
_installed = False


def has_origin(headers) -> bool:
    """True when a handshake's headers name its origin (RFC 6455's Origin, or the older Sec-WebSocket-Origin)."""
    return bool(headers.get("Origin") or headers.get("Sec-WebSocket-Origin"))


def refuse_websockets_without_origin() -> None:
    """Install the guard into this process's Panel server (once; later calls do nothing)."""
    global _installed
    if _installed:
        return
    from bokeh.protocol.exceptions import ProtocolError
    from bokeh.server.tornado import BokehTornado
    from panel.io.server import WSHandler

    prepare, new_connection = WSHandler.prepare, BokehTornado.new_connection

    async def guarded_prepare(handler):
        if not has_origin(handler.request.headers):
            log.warning("refused a websocket from %s: no Origin header", handler.request.remote_ip)
            handler.set_status(403)
            handler.finish(_REFUSAL)
            return
        await prepare(handler)

    def guarded_new_connection(application, protocol, socket, application_context, session):
        if not has_origin(socket.request.headers):
            log.warning("closed a websocket from %s: no Origin header", socket.request.remote_ip)
            socket.close(1008, "an Origin header is required")
            raise ProtocolError(_REFUSAL)
        return new_connection(application, protocol, socket, application_context, session)

    WSHandler.prepare = guarded_prepare
    BokehTornado.new_connection = guarded_new_connection
    _installed = True
