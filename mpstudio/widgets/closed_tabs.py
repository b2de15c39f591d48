"""A served studio's closed tabs: whether a session's tab has gone, and a quiet end for the writes it missed.

A tab closes whenever its user likes, often while a job posts progress to it. Panel's writes to its websocket then
fail with Tornado's `WebSocketClosedError` (a `StreamClosedError` underneath) in tasks nobody awaits, and asyncio
prints each as "Task exception was never retrieved" with a traceback: noise about a peer that left, never a fault
of the studio. The studio stops posting to a tab that has gone, and the server's event loop logs the writes that
were already under way at debug level instead.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

_MARK = "_mpstudio_quiet_closed_streams"


def open_connections(doc) -> int | None:
    """How many browser connections the served session of `doc` has now (None when that is not known)."""
    context = getattr(doc, "session_context", None)
    session = getattr(context, "_session", None)
    count = getattr(session, "connection_count", None)  # a property of Bokeh 3.x's ServerSession
    count = count() if callable(count) else count
    return count if isinstance(count, int) else None


def closed_stream(exc: BaseException | None) -> bool:
    """True for the errors of a write to a websocket whose peer has gone."""
    try:
        from tornado.iostream import StreamClosedError
        from tornado.websocket import WebSocketClosedError
    except ImportError:  # no Tornado, no served tabs
        return False
    return isinstance(exc, (StreamClosedError, WebSocketClosedError))


def quiet_closed_streams(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Make `loop` (the running one by default) log closed-stream task errors at debug level; every other error
    goes to the handler it had. Idempotent."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                loop = asyncio.get_event_loop_policy().get_event_loop()
            except RuntimeError:
                return
    if getattr(loop, _MARK, False):
        return
    previous = loop.get_exception_handler()

    def handler(loop, context):
        if closed_stream(context.get("exception")):
            log.debug("a write to a closed tab failed: %s", context.get("message", ""))
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    setattr(loop, _MARK, True)
