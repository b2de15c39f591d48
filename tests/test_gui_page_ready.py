"""An update the studio makes after the page has pulled its session but before the page says it has rendered it
(Bokeh's document_ready): Panel drops the changes a hold collects until then, taking them for changes the document
the page pulled already carries. A job's result, or a selection, that landed in that second was lost for good (the
graph opened grey, without labels; a new job row's progress named models the page never got: "reference ... isn't
known"). The studio's batched updates now wait for the page. A real Panel server, a real small study, real headless
Chromium; the page's document_ready is held back (Playwright's websocket routing) while the update is made."""

from __future__ import annotations

import re

import pytest

from gui_support import chromium_path, make_small_study, selected_rows, studio_server, wait_for_bokeh, wait_until

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]


def test_an_update_made_before_the_page_is_ready_reaches_it(browser, tmp_path):
    from mpstudio.widgets.study_session import forget

    study = make_small_study(tmp_path / "study")
    with studio_server(study) as studio:
        forget(studio.folder)
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        held, link = [], {}

        def route(ws):
            link["server"] = ws.connect_to_server()

            def from_page(message):
                # From the page's "I have rendered it" on, its messages wait (in order) until released.
                if "released" not in link and (held or "document_ready" in str(message)):
                    held.append(message)
                    return
                link["server"].send(message)
            ws.on_message(from_page)
        page.route_web_socket(re.compile(r".*/ws(\?.*)?$"), route)
        try:
            page.goto(studio.url)
            wait_until(lambda: held or page.wait_for_timeout(100), 120,
                       message="the page never said it had rendered the session")
            state = wait_until(lambda: studio.states[-1] if studio.states else None)
            tensors = sorted(state._activation_set())[:3]
            # As a job's result is shown: posted to the session, whose event loop runs it while the page is not
            # yet known to be ready.
            state._lanes.post(lambda: state.select(tensors))
            # Held for seconds: a page on a loaded machine takes that long to render once connected, and the update
            # must still wait for it.
            page.wait_for_timeout(8000)
            link["released"] = True
            for message in held:
                link["server"].send(message)
            wait_for_bokeh(page)
            wait_until(lambda: state.selection == tensors, 30, message="the posted selection never ran")
            page.get_by_text(f"{len(tensors)} tensor(s) selected").wait_for(state="visible", timeout=30000)
            wait_until(lambda: len(selected_rows(page, "nodes") or []) >= 1, 30,
                       message="the graph never showed the selection made before the page was ready")
            page.wait_for_timeout(500)
            assert errors == [], errors[:3]
        finally:
            context.close()
