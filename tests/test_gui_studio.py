"""The studio's shared selection, errors, job independence, static save and first view, in headless Chromium."""

from __future__ import annotations

import logging

import pytest

from gui_support import (PanelServer, chromium_path, make_small_study, selected_rows, source_column,
                         table_selection, wait_for_bokeh, wait_until)

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]


class ServerLog(logging.Handler):
    """Every error the server thread logs (Bokeh, Tornado and Panel report callback failures this way)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def errors(self) -> list[str]:
        return [self.format(r) for r in self.records if r.levelno >= logging.ERROR or r.exc_info
                or "Traceback" in r.getMessage() or "pending_writes" in r.getMessage()]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60000)
    yield page
    context.close()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_small_study(tmp_path_factory.mktemp("gui-studio") / "study")


@pytest.fixture(scope="module")
def studio(study):
    from mpstudio.widgets import Studio, StudioState

    states = []

    def session():
        state = StudioState(study)
        states.append(state)
        return Studio(state).template()

    server = PanelServer(session)
    server.states = states
    yield server
    for state in states:
        state.close()
    server.stop()


@pytest.fixture
def server_log():
    handler = ServerLog()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def open_studio(page, studio):
    page.goto(studio.url)
    wait_for_bokeh(page)
    state = wait_until(lambda: studio.states[-1] if studio.states else None)
    wait_until(lambda: state.report is not None, 120, message="the sensitivity report did not load")
    wait_until(lambda: len(source_column(page, "nodes", "id") or []) == len(state.layout), 60)
    page.locator(".tabulator-row").first.wait_for(state="visible")
    return state


def graph_rows(state, tensors, ids):
    """The graph's source rows drawing `tensors`."""
    nodes = state.tensors.set_index("tensor")["node"]
    return sorted({ids.index(nodes[t] or f"input:{t}") for t in tensors})


def test_clicking_table_rows_selects_in_the_graph_without_a_server_error(page, studio, server_log):
    state = open_studio(page, studio)
    ids = source_column(page, "nodes", "id")
    rows = page.locator(".tabulator-row")
    first = rows.nth(0).locator(".tabulator-cell[tabulator-field='tensor']").text_content().strip()
    rows.nth(0).locator(".tabulator-cell[tabulator-field='tensor']").click()
    wait_until(lambda: state.selection == [first], 30, message=f"state selection {state.selection}")
    wait_until(lambda: selected_rows(page, "nodes") == graph_rows(state, [first], ids), 30,
               message="the graph did not select the clicked row's tensor")
    third = rows.nth(2).locator(".tabulator-cell[tabulator-field='tensor']").text_content().strip()
    rows.nth(2).locator(".tabulator-cell[tabulator-field='tensor']").click(modifiers=["Control"])
    wait_until(lambda: set(state.selection) == {first, third}, 30, message=f"state selection {state.selection}")
    wait_until(lambda: sorted(selected_rows(page, "nodes")) == graph_rows(state, [first, third], ids), 30,
               message="the graph did not select both rows' tensors")
    page.get_by_text("2 tensor(s) selected").first.wait_for(state="visible", timeout=30000)
    assert server_log.errors() == []
