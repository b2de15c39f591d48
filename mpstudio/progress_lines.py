"""Progress as plain lines on stderr: what `search()`, `Study.create` and `Study.sensitivity` print from Python
when given no callback, and what the command line prints when stderr is not a terminal."""

from __future__ import annotations

import re
import sys
import time


def phase_of(message: str) -> str:
    """The phase a progress message belongs to: its leading words, without the plan, file or figures that change
    from one step of the phase to the next ("search: a16w8 SNR 31.2" -> "search", "running g3-...onnx on htp
    (2 workers)" -> "running ... on htp")."""
    head = re.sub(r"\([^)]*\)", "", message.split(":", 1)[0])
    words = ["..." if re.search(r"[0-9./\\]", word) else word for word in head.split()]
    return re.sub(r"(\.\.\. )+", "... ", " ".join(words)).strip() or message


class LineProgress:
    """A `progress(done, total, message)` callback that writes plain lines to stderr: one when a phase starts
    (`phase_of`), then at most one every `interval` seconds while it runs. What `search()` reports when given no
    callback, and what the command line prints when stderr is not a terminal."""

    def __init__(self, stream=None, interval: float = 10.0):
        self.stream, self.interval = stream, interval
        self._phase, self._last = None, 0.0

    def __call__(self, done: int, total: int, message: str) -> None:
        now, phase = time.monotonic(), phase_of(message)
        if phase == self._phase and now - self._last < self.interval:
            return
        self._phase, self._last = phase, now
        stream = self.stream or sys.stderr
        print(f"mpstudio: {message} ({done}/{total})", file=stream, flush=True)
