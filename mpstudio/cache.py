"""Where mpstudio keeps files it can always remake: prepared demo models, rendered data, calibration."""

from __future__ import annotations

import os
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
