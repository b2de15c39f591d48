"""A script driving a served studio from a thread of its own (as the README allows): each of the state's verbs
runs on the session's event loop, so the page never meets an update racing the session's own (BokehJS would drop
updates naming models it was never sent: "reference ... isn't known"); and a tab that closes is known to have gone.
A real Panel server, a real small study and real headless Chromium."""

from __future__ import annotations

import threading

import pytest

from gui_support import chromium_path, make_small_study, open_studio, selected_rows, studio_server, wait_until
from mpstudio.errors import MpstudioError
from mpstudio.widgets.closed_tabs import open_connections

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

ROUNDS = 12


def test_verbs_called_from_another_thread_run_on_the_session_loop(browser, tmp_path):
    study = make_small_study(tmp_path / "study")
    with studio_server(study) as studio:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "net::ERR_" not in m.text
                else None)
        try:
            state = open_studio(page, studio)
            doc = state._lanes._doc
            loop_thread = state._lanes.call(threading.get_ident)
            assert loop_thread != threading.get_ident()  # the premise: this test runs in a thread of its own
            setting = []
            state.param.watch(lambda event: setting.append(threading.get_ident()), "selection")
            tensors = state.tensors["tensor"].tolist()
            base = state.plan
            for i in range(ROUNDS):
                chosen = tensors[i % len(tensors):][:3]
                state.select(chosen)  # from this thread: the verb runs on the loop, and has run on return
                assert state.selection == chosen
                state.set_plan(base.promote(chosen, name=f"round {i}") if i % 2 else base)
            assert setting and set(setting) == {loop_thread}
            colouring = []
            state.param.watch(lambda event: colouring.append(threading.get_ident()), "color_by")
            state.configure(color_by="cosine")  # a parameter, set as the page's widget would
            assert state.color_by == "cosine" and colouring == [loop_thread]
            wait_until(lambda: len(selected_rows(page, "nodes") or []) == len(chosen), 30,
                       message="the page did not show the last selection")
            with pytest.raises(MpstudioError, match="unknown tensor"):
                state.set_plan(base.promote(["no such tensor"]))  # an error inside comes back to this thread
            page.wait_for_timeout(500)
            assert errors == [], errors[:5]
            assert open_connections(doc) == 1 and not state._lanes.gone
            context.close()
            wait_until(lambda: state._lanes.gone, 30, message="the closed tab was not noticed")
            assert open_connections(doc) == 0
            assert state._lanes.call(threading.get_ident) == threading.get_ident()  # a gone tab: run here
        finally:
            if not page.is_closed():
                context.close()
