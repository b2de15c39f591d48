"""Progress bars of the command line: tqdm on stderr, one bar per message."""

from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def progress_bar(enabled: bool = True):
    """A `progress(done, total, message)` callback drawn with tqdm on stderr (one bar per message)."""
    from tqdm import tqdm

    state: dict = {"bar": None, "message": None}

    def progress(done: int, total: int, message: str) -> None:
        if not enabled:
            return
        if state["message"] != message or state["bar"] is None:
            if state["bar"] is not None:
                state["bar"].close()
            state["bar"] = tqdm(total=total, desc=message, file=sys.stderr, leave=False, dynamic_ncols=True)
            state["message"] = message
        bar = state["bar"]
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        yield progress
    finally:
        if state["bar"] is not None:
            state["bar"].close()
