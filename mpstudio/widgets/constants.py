"""Writing the studio's constant parameters from any thread.

The studio's state and jobs declare their fields `constant`, so that a view or a notebook cannot write them by
mistake; the studio itself writes them inside `writable(obj)`. Param's own `edit_constant` is not safe across
threads: it clears the flag on the class's parameters, which every instance shares, and restores it on exit,
so a second thread writing inside its own block can find the flag set again by the first thread's exit
("Constant parameter ... cannot be modified"). Here a parameter's flag stays cleared while any block that cleared
it is open, and is restored when the last one closes. The lock guards only the flags, never the writes, so
watchers that a write triggers may take other locks and open blocks of their own.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import param

_lock = threading.Lock()
_held: dict[int, list] = {}  # id(parameter) -> [parameter, open blocks that hold its flag cleared]


def _constant_parameters(obj: param.Parameterized) -> list:
    """`obj`'s parameters that are constant or held clear now: the class's (shared with every instance and
    subclass) and the instance's own copies."""
    found = list(type(obj).param.objects(instance=False).items()) + list(obj._param__private.params.items())
    return [(name, p) for name, p in found if p.constant or id(p) in _held]


@contextmanager
def writable(obj: param.Parameterized) -> Iterator[None]:
    """Let this thread write `obj`'s constant parameters in the block (safe while other threads do the same)."""
    with _lock:
        held = _constant_parameters(obj)
        for _, p in held:
            entry = _held.setdefault(id(p), [p, 0])
            entry[1] += 1
            p.constant = False
    try:
        yield
    finally:
        with _lock:
            restored = set()
            for name, p in held:
                entry = _held[id(p)]
                entry[1] -= 1
                if entry[1] == 0:
                    del _held[id(p)]
                    p.constant = True
                    restored.add(name)
            # A copy the instance made of a parameter inside the block copied its cleared flag.
            for name, p in obj._param__private.params.items():
                if name in restored and id(p) not in _held:
                    p.constant = True
