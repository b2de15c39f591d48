"""The worker's session cache: ORT sessions kept per model and options, least recently used dropped first."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from ... import runtime
from ...errors import MpstudioError

log = logging.getLogger("mpstudio.agent")


class SessionCache:
    """Sessions by `session_key`, at most `max_sessions`, fewer while physical memory is short."""

    def __init__(self, max_sessions: int, min_free_memory: float, intra_op_threads: int):
        self.max_sessions = max_sessions
        self.min_free_memory = min_free_memory
        self.intra_op_threads = intra_op_threads
        self._sessions: OrderedDict[tuple, object] = OrderedDict()

    def open(self, key: tuple, request: dict):
        """(session, reused, create_ms): the cached session of `key`, else a new one (MpstudioError when ORT
        cannot create it)."""
        session = self._sessions.get(key)
        if session is not None:
            self._sessions.move_to_end(key)
            return session, True, 0.0
        self._make_room()
        started = time.perf_counter()
        session = runtime.create_session(
            request["model_path"], request["backend"], request["provider_options"],
            allow_cpu_fallback=bool(request.get("allow_cpu_fallback")),
            intra_op_threads=self.intra_op_threads,
        )
        self._sessions[key] = session
        return session, False, (time.perf_counter() - started) * 1e3

    def drop(self, key: tuple) -> None:
        self._sessions.pop(key, None)

    def _make_room(self) -> None:
        """Drop least recently used sessions beyond the limit or while memory is short."""
        while self._sessions and (len(self._sessions) >= self.max_sessions or memory_is_short(self.min_free_memory)):
            dropped, _ = self._sessions.popitem(last=False)
            log.info("session dropped to free memory: %s", dropped[0][:12])


def session_key(request: dict) -> tuple:
    return (
        request["model_id"],
        request["backend"],
        tuple(sorted(request["provider_options"].items())),
        bool(request.get("allow_cpu_fallback")),
    )


def check_feeds(session, feeds: dict) -> None:
    """Refuse inputs whose names or static dimensions do not match the session's model."""
    expected = {i.name: i for i in session.get_inputs()}
    missing = sorted(set(expected) - set(feeds))
    unknown = sorted(set(feeds) - set(expected))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing inputs {missing}")
        if unknown:
            parts.append(f"unknown inputs {unknown}")
        raise MpstudioError(f"the inputs do not match the model: {'; '.join(parts)} (model inputs: {sorted(expected)})")
    for name, meta in expected.items():
        shape = tuple(feeds[name].shape)
        want = meta.shape
        if len(shape) != len(want) or any(isinstance(w, int) and w != s for w, s in zip(want, shape)):
            raise MpstudioError(f"input {name!r} has shape {list(shape)}; the model expects {want}")


def is_engine_error(exc: BaseException) -> bool:
    """An HTP subsystem restart: the session must be recreated."""
    return type(exc).__name__ == "EngineError" or "ENGINE_ERROR" in str(exc)


def memory_is_short(min_free_fraction: float) -> bool:
    """True when less than `min_free_fraction` of physical memory is available (unknown: False)."""
    status = runtime.memory_status()
    return status is not None and status[0] < min_free_fraction * status[1]
