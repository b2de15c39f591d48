"""Bringing a Bokeh ColumnDataSource to new data with the least sent to the browser: the rows that changed are
patched and the rows added streamed; the data is replaced only when rows disappear or the columns change."""

from __future__ import annotations

import math

from bokeh.models import ColumnDataSource


def same_value(a, b) -> bool:
    """Equal, where NaN equals NaN."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def same_values(a, b) -> bool:
    """Equal lists, where NaN equals NaN."""
    return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))


def update_source(source: ColumnDataSource, data: dict[str, list]) -> None:
    """Make `source.data` equal `data` (columns of equal length): patch, stream, or replace."""
    old = source.data
    if set(old) != set(data):
        source.data = data
        return
    before = len(next(iter(old.values()), []))
    after = len(next(iter(data.values()), []))
    if after < before:
        source.data = data
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
