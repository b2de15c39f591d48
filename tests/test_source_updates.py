"""update_source under a held document (a served session's batch): what the browser ends up with equals the
source's data, whatever sequence of replace, patch and stream the batch holds."""

from __future__ import annotations

from bokeh.document import Document
from bokeh.document.events import ColumnDataChangedEvent, ColumnsPatchedEvent, ColumnsStreamedEvent, ModelChangedEvent
from bokeh.models import ColumnDataSource

from mpstudio.widgets.source_updates import update_source


def _browser_rows(doc: Document, source: ColumnDataSource, updates) -> list:
    """The column x as a browser applying the batch's events (serialised when the batch is sent) would hold it."""
    sent, rows = [], list(source.data["x"])  # what the browser holds before the batch
    doc.on_change(lambda event: sent.append(event))
    doc.hold("combine")
    for data in updates:
        update_source(source, data)
    doc.unhold()  # the batch goes: each event is read now, as the server serialises it
    for event in sent:
        if isinstance(event, ModelChangedEvent) and event.attr == "data":
            rows = list(event.new["x"])
        elif isinstance(event, ColumnDataChangedEvent):
            rows = list(event.model.data["x"])
        elif isinstance(event, ColumnsStreamedEvent):
            rows += list(event.data["x"])
        elif isinstance(event, ColumnsPatchedEvent):
            for i, value in event.patches.get("x", []):
                rows[i] = value
    return rows


def test_rows_streamed_after_a_replace_in_one_batch_arrive_once():
    doc = Document()
    source = ColumnDataSource({"x": [1.0, 2.0]})
    doc.add_root(source)
    # The current-plan ring: gone (an unevaluated plan), then on the plan's point, in one batch.
    rows = _browser_rows(doc, source, [{"x": []}, {"x": [3.0]}])
    assert rows == [3.0] == list(source.data["x"])


def test_a_batch_without_a_replace_still_streams_and_patches():
    doc = Document()
    source = ColumnDataSource({"x": [1.0]})
    doc.add_root(source)
    sent = []
    doc.on_change(lambda event: sent.append(type(event).__name__))
    rows = _browser_rows(doc, source, [{"x": [5.0, 6.0]}])
    assert rows == [5.0, 6.0] and "ColumnsStreamedEvent" in sent and "ColumnsPatchedEvent" in sent
