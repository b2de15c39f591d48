"""Where mpstudio keeps files it can always remake (prepared demo models, rendered data, calibration), and the
lock that lets several processes share them."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    """`$MPSTUDIO_CACHE_DIR`, else the platform's user cache folder (`~/.cache/mpstudio` on Linux)."""
    override = os.environ.get("MPSTUDIO_CACHE_DIR")
    if override:
        root = Path(override)
    elif os.name == "nt":
        root = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "mpstudio" / "cache"
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mpstudio"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def exclusive(path: Path):
    """Hold an exclusive lock on `path` (created if needed) across processes; released if the process dies."""
    with open(path, "a+b") as handle:
        if os.name == "nt":
            import msvcrt

            handle.seek(0)
            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    continue  # LK_LOCK gives up after ten seconds: keep waiting
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
