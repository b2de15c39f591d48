"""Worker processes whose parent is killed (SIGKILL: no atexit, no pool shutdown) exit by themselves, and the HTP
pool's working folder goes with them: no orphan keeps running, holding memory or a device."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gui_support import wait_until

TESTS = Path(__file__).resolve().parent

PRELUDE = f"""
import os, sys, time
sys.path.insert(0, {str(TESTS)!r})
import onnx
from conftest import chain_feeds, make_chain_model
from mpstudio.data import FeedList
folder = sys.argv[1]
onnx.save(make_chain_model(blocks=2), folder + "/chain.onnx")
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start(tmp_path, body: str) -> tuple[subprocess.Popen, dict]:
    """Run a script that starts workers and prints `pids ...` (and `folder ...`), then waits to be killed."""
    script = tmp_path / "parent.py"
    script.write_text(PRELUDE + textwrap.dedent(body) + "\nprint('ready', flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=tmp_path)
    told = {}
    for line in parent.stdout:
        key, _, value = line.strip().partition(" ")
        if key == "ready":
            break
        told[key] = value
    return parent, told


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_htp_pool_workers_exit_and_tidy_when_their_parent_is_killed(tmp_path):
    parent, told = _start(tmp_path, """
        from mpstudio.loop import inprocess
        outputs = inprocess.run_outputs(folder + "/chain.onnx", FeedList(chain_feeds(8)), "cpu", workers=2)
        print("pids", " ".join(str(p) for p in inprocess._pool._processes), flush=True)
        print("folder", inprocess._pool_dirs[-1], flush=True)
    """)
    pids = [int(p) for p in told["pids"].split()]
    folder = Path(told["folder"])
    assert len(pids) == 2 and all(_alive(p) for p in pids) and folder.is_dir()
    parent.send_signal(signal.SIGKILL)
    parent.wait(30)
    wait_until(lambda: not any(_alive(p) for p in pids), 60, message="HTP pool workers outlived their parent")
    wait_until(lambda: not folder.exists(), 30, message=f"the pool's folder was left: {list(folder.rglob('*'))}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sensitivity_workers_exit_when_their_parent_is_killed(tmp_path):
    parent, told = _start(tmp_path, """
        from mpstudio.sensitivity.workers import WorkerPool
        pool = WorkerPool(2)
        print("pids", " ".join(str(p) for p in pool.pids), flush=True)
    """)
    pids = [int(p) for p in told["pids"].split()]
    assert len(pids) == 2
    wait_until(lambda: all(_alive(p) for p in pids), 30)
    time.sleep(1)  # the workers are importing and then waiting on their queues when the parent dies
    parent.send_signal(signal.SIGKILL)
    parent.wait(30)
    wait_until(lambda: not any(_alive(p) for p in pids), 60, message="sensitivity workers outlived their parent")
