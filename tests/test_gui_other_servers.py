"""A studio served beside other Bokeh servers in one process (threads: a notebook serving a studio, the benchmarks,
the tests): Bokeh keeps one current document for the whole process, and another server that applies a browser's
message during this studio's callback changes it. Panel picks a document's cached stylesheets by the current
document, so a pane updated then took another document's stylesheet: the server failed the page's message ("Models
must be owned by only a single document") and the page lost the update. The studio's Bokeh callbacks now run with
their own document as Panel's current one. A real Panel server, a second real one, a real small study and real
headless Chromium."""

from __future__ import annotations

import logging
import threading

import pytest

from gui_support import (PanelServer, chromium_path, drag_box, make_small_study, open_studio, screen_points,
                         source_column, studio_server, visible_rows, wait_until)

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage() + (f" {record.exc_info[1]!r}" if record.exc_info else ""))


def test_a_selection_made_while_another_server_applies_a_message_reaches_the_page(browser, tmp_path):
    import panel as pn
    from bokeh.io.doc import patch_curdoc

    study = make_small_study(tmp_path / "study")
    documents = []

    def other_session():
        documents.append(pn.state.curdoc)
        return pn.Column(pn.pane.HTML("another server's page"), pn.pane.Markdown("with *its* stylesheets"))

    records = Records()
    logging.getLogger().addHandler(records)
    other = PanelServer(other_session, path="other")
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    other_context = browser.new_context()
    try:
        with studio_server(study) as studio:
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            elsewhere = other_context.new_page()
            elsewhere.goto(other.url)
            wait_until(lambda: documents, 30, message="the other server opened no session")
            state = open_studio(page, studio)

            # While the studio handles the page's selection, the other server's thread takes Bokeh's current
            # document (as its own message handling does) until the selection has reached every view.
            taken, handled = threading.Event(), threading.Event()

            def other_server_busy():
                with patch_curdoc(documents[0]):
                    taken.set()
                    handled.wait(30)
            busy = threading.Thread(target=other_server_busy, daemon=True)

            seen = []

            def during_selection(event):
                if not busy.is_alive() and not handled.is_set():
                    busy.start()
                    taken.wait(30)
                    seen.append(pn.state.curdoc)  # the document Panel updates panes and picks stylesheets for
            # Before the views' own watchers (param keeps negative precedences to its internal `_watch`).
            state.param._watch(during_selection, ["selection"], precedence=-1)

            xs, ys = source_column(page, "nodes", "x"), source_column(page, "nodes", "y")
            points = screen_points(page, "graph", xs, ys)
            inside = drag_box(page, points, visible_rows(page, "graph", points, 3))
            wait_until(lambda: state.selection, 30, message="the selection did not reach the state")
            count = len(state.selection)
            summary = page.get_by_text(f"{count} tensor(s) selected")
            try:
                summary.wait_for(state="visible", timeout=20000)
            finally:
                handled.set()
                busy.join(10)
            assert inside and count >= 1
            assert seen and seen[0] is state._lanes._doc, "the studio's callback ran in another document"
            assert not [m for m in records.messages if "single document" in m or "error handling" in m.lower()], \
                records.messages[:3]
            assert errors == [], errors[:3]
    finally:
        handled_set = locals().get("handled")
        if handled_set is not None:
            handled_set.set()
        logging.getLogger().removeHandler(records)
        context.close()
        other_context.close()
        other.stop()
