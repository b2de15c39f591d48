"""The working folder of one Ray actor on its node: named by the actor's process id, removed when the actor is
released, and, since a killed or lost actor cannot clean up, removed by the next actor started on that node once
the process that owned it is gone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "mpstudio-ray-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep(root: Path | None = None) -> int:
    """Remove the actor folders under `root` (the temporary folder) whose process has ended; how many."""
    removed = 0
    for folder in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*-*-*"):
        pid = folder.name[len(PREFIX):].split("-")[1]
        if folder.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def actor_folder(kind: str) -> Path:
    """A new folder for this process's actor of `kind` ("evaluator", "sensitivity"), after sweeping the folders
    of ended actors; the process works in it (QNN writes trace files into the working directory)."""
    sweep()
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-"))
    os.chdir(folder)
    return folder


def release(folder: Path) -> None:
    """Leave and remove an actor's folder (before the actor is killed)."""
    os.chdir(tempfile.gettempdir())
    shutil.rmtree(folder, ignore_errors=True)


def release_all(ray, actors, timeout: float = 10.0) -> None:
    """Ask every live actor to remove its folder, then kill them; an actor that does not answer in time is
    killed anyway (the next actor on its node sweeps its folder)."""
    try:
        ray.get([actor.release.remote() for actor in actors], timeout=timeout)
    except Exception:  # lost or busy actors: killed below, swept later
        pass
    for actor in actors:
        ray.kill(actor)
