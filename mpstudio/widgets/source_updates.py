"""Bringing a Bokeh ColumnDataSource to new data with the least sent to the browser: the rows that changed are
patched and the rows added streamed; the data is replaced only when rows disappear or the columns change.

A served session's updates are held and sent as one batch (`pn.io.hold`), and a replaced `data` is serialised when
the batch is sent, after any rows streamed into it since: the browser would receive those rows twice (in the new
data, then streamed), e.g. two rings for the one current plan. So a source replaced in the batch being held is
replaced again rather than streamed into, until the batch has gone."""

from __future__ import annotations

import math
import weakref

from bokeh.models import ColumnDataSource

# Sources whose data was replaced in the batch their document holds now.
_REPLACED_IN_BATCH: weakref.WeakSet = weakref.WeakSet()


def same_value(a, b) -> bool:
    """Equal, where NaN equals NaN."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def same_values(a, b) -> bool:
    """Equal lists, where NaN equals NaN."""
    return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))


def update_source(source: ColumnDataSource, data: dict[str, list]) -> None:
    """Make `source.data` equal `data` (columns of equal length): patch, stream, or replace."""
    old = source.data
    before = len(next(iter(old.values()), []))
    after = len(next(iter(data.values()), []))
    if set(old) != set(data) or after < before or (after > before and source in _REPLACED_IN_BATCH):
        _replace(source, data)
        return
    patches = {}
    for column, values in data.items():
        current = old[column]
        changed = [(i, values[i]) for i in range(before) if not same_value(current[i], values[i])]
        if changed:
            patches[column] = changed
    if patches:
        source.patch(patches)
    if after > before:
        source.stream({column: list(values[before:]) for column, values in data.items()})


def _replace(source: ColumnDataSource, data: dict[str, list]) -> None:
    source.data = {column: list(values) for column, values in data.items()}
    doc = source.document
    if doc is not None and doc.callbacks.hold_value is not None:  # held: sent (serialised) later, as a batch
        _REPLACED_IN_BATCH.add(source)
        try:
            doc.add_next_tick_callback(lambda: _REPLACED_IN_BATCH.discard(source))  # after the batch is sent
        except Exception:  # no session runs this document's callbacks: the source stays replaced, never streamed
            pass
