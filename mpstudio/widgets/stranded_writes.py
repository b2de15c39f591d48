"""A served studio's changes that Panel queued for the page and no task is left to send.

When Panel cannot write a change to the page at once (a write to its websocket is still under way), it serializes
the change into a queue of messages for the document and starts a task that sends them
(`panel.io.document.schedule_write_events`). The task sending an earlier queue clears the document's write block only
after its own awaits; a queue filled during those awaits is then left behind, because its task saw the block already
cleared and returned. Those messages go out only with the next change of that document, so the last change of a
burst (a plan's label after its evaluation, a job's final line) could stay off the page for good while the server
held it. On Panel 1.9, a session that opens a study and promotes a tensor left three to seven queues behind
in its first minute.

The studio looks at each served document a few times a second and sends a queue that nothing is sending. A Panel
without these queues makes this a no-op.
"""

from __future__ import annotations

import functools
import logging
from weakref import WeakSet

log = logging.getLogger(__name__)

CHECK_MS = 250  # how often a served document's queue is looked at

_watched: WeakSet = WeakSet()


@functools.cache
def _panel_queues():
    """Panel's per-document write queue, write block, and its task starter and sender (None when this Panel keeps
    none). Module-level objects Panel changes in place, looked up once: the check runs four times a second."""
    from panel.io import document

    parts = tuple(getattr(document, name, None) for name in ("_WRITE_MSGS", "_WRITE_BLOCK", "_dispatch_write_task",
                                                             "_dispatch_msgs"))
    return None if any(part is None for part in parts) else parts


def send_stranded_writes(doc) -> bool:
    """Start sending `doc`'s queued messages when no task is sending them; whether it did. Run on the document's
    event loop (a periodic callback of the session)."""
    parts = _panel_queues()
    if parts is None:
        return False
    queued, blocked, start, send = parts
    if not queued.get(doc) or doc in blocked:
        return False
    log.debug("sending %d change message(s) Panel left queued for the page",
              sum(len(messages) for messages in queued[doc].values()))
    blocked[doc] = True  # as Panel marks a queue being sent, so that later changes join it
    start(doc, send, doc)
    return True


def watch_stranded_writes(doc) -> None:
    """Check the served document `doc` every CHECK_MS for queued changes nobody sends (once per document; the
    check ends with the session). Call it from the session's own thread."""
    if doc is None or doc.session_context is None or doc in _watched or _panel_queues() is None:
        return
    _watched.add(doc)
    try:
        doc.add_periodic_callback(functools.partial(send_stranded_writes, doc), CHECK_MS)
    except Exception:  # the session has ended: nothing left to send
        log.debug("could not watch a session's queued changes", exc_info=True)
