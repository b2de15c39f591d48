"""A change Panel queued for the page while an earlier write was under way, whose sending task then found the write
block already cleared by the earlier task and returned: the queue stays behind until the document's next change, so
the last change of a burst (a tab's plan label after its evaluation) never reached an idle page. The interleaving of
the two tasks cannot be forced from outside, so the test leaves a real change in the state it ends in (serialized
into Panel's queue for the page's connection, no task sending it) and checks that the studio sends it. A real Panel
server, a real small study, real headless Chromium."""

from __future__ import annotations

import pytest

from gui_support import chromium_path, make_small_study, open_studio, studio_server, wait_until

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

TEXT = "a change left in the queue reached the page"


def leave_in_queue(state) -> int:
    """Make a visible change on the session's loop and leave it as the race leaves it: in Panel's write queue of the
    document, with no task sending it. How many messages were left."""
    import panel as pn
    from panel.io import document as panel_document

    from mpstudio.widgets.constants import writable

    doc = pn.state.curdoc
    assert doc.callbacks.hold_value, "a posted update runs under the batch's hold"
    with writable(state):
        state.message = TEXT
    held = doc.callbacks._held_events
    ours = [event for event in held if TEXT in str(getattr(event, "new", ""))]
    assert ours, "the message line's change was not collected by the batch's hold"
    doc.callbacks._held_events = [event for event in held if event not in ours]
    queue = panel_document._WRITE_MSGS.setdefault(doc, {})
    connections = list(doc.session_context._session._subscribed_connections)
    for connection in connections:
        queue.setdefault(connection, []).append(connection.protocol.create("PATCH-DOC", ours))
    return len(connections)


def test_a_change_left_in_panels_queue_reaches_the_page(browser, tmp_path):
    study = make_small_study(tmp_path / "study")
    with studio_server(study) as studio:
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page = context.new_page()
        try:
            state = open_studio(page, studio)
            wait_until(lambda: all(job.status not in ("queued", "running") for job in state.jobs), 120,
                       message="the opening jobs did not end")
            page.wait_for_timeout(1000)  # the page idle: no later change would carry the queue along
            assert state._lanes.call(lambda: leave_in_queue(state)) == 1
            message = page.locator(".mpstudio-message").first
            wait_until(lambda: TEXT in message.inner_text(), 10,
                       message=f"the queued change never reached the page: {message.inner_text()!r}")
        finally:
            context.close()
