"""Who owns a study's work in progress, and whether that owner still runs: an owner is host:pid:start, checked
directly on its own host (its pid and start time, so a later process given the same pid does not keep the work)
and by the age of its heartbeat elsewhere, dated on the clock of the file system holding the study so hosts whose
clocks disagree still agree on a heartbeat's age."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pandas as pd

# A heartbeat older than this means its owner is gone (owners on another host are judged by it alone);
# one dated further than this into the future is not believed either.
STALE_AFTER_S = 120.0


def this_process() -> str:
    """The owner name of work this process runs: host:pid, and :start (the process's start time) where it can
    be read, which tells the owner from a later process that was given the same pid."""
    start = _process_start(os.getpid())
    return f"{socket.gethostname()}:{os.getpid()}" + (f":{start}" if start else "")


def owner_alive(owner: str | None, updated: float, now: float | None = None) -> bool:
    """Whether the process named `owner` still runs: checked directly on this host (its pid, and its start
    time when recorded), by the age of its heartbeat (`updated`) elsewhere. `updated` and `now` are on the
    study's clock (`StudyStore.clock`), so hosts whose clocks disagree still agree on a heartbeat's age."""
    parts = (owner or "").split(":")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
        return False
    host, pid, start = parts[0], int(parts[1]), parts[2] if len(parts) == 3 else None
    if host == socket.gethostname():
        return _pid_alive(pid) and (start is None or _process_start(pid) in (None, start))
    age = (now if now is not None else time.time()) - updated
    return -STALE_AFTER_S < age < STALE_AFTER_S


def study_clock_offset(path: Path) -> float:
    """Seconds to add to this host's clock to read the clock of the file system holding `path`: every host
    writing a study dates its heartbeats on that one clock. 0 where the file cannot be touched."""
    try:
        before = time.time()
        os.utime(path, None)  # None: the file system's own time (a network file system's server time)
        after = time.time()
        return os.stat(path).st_mtime - (before + after) / 2
    except OSError:
        return 0.0


def settle(frame: pd.DataFrame, running_gone: str = "pending", now: float | None = None) -> pd.DataFrame:
    """Rows marked running whose owner process is gone read as `running_gone` (`now` on the study's clock)."""
    if len(frame):
        now = time.time() if now is None else now
        gone = [status == "running" and not owner_alive(owner, updated, now)
                for status, owner, updated in zip(frame["status"], frame["owner"], frame["updated"])]
        frame.loc[gone, "status"] = running_gone
    return frame


def _process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), or None where that is unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()  # the 22nd field of the whole line: starttime
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
