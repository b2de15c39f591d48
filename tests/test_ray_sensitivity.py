"""The sensitivity analysis' chunks on a real two-node Ray cluster on loopback: the numbers of this process,
a worker killed mid-analysis retried, and the command line's clear error for a cluster it cannot reach."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from ray_support import connected_cluster, needs_ray
from gui_models import make_residual_model
from gui_support import small_feeds
from mpstudio.model import prepare_model
from mpstudio.quantize import Quantizer
from mpstudio.sensitivity import analyze_progressive

pytestmark = needs_ray


@pytest.fixture(scope="module")
def cluster():
    with connected_cluster(2) as connected:
        yield connected


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    prepared = prepare_model(make_residual_model(40, size=8))
    quantizer = Quantizer(prepared, small_feeds(8), tmp_path_factory.mktemp("ray-residual"))
    data = small_feeds(6, seed=3)
    return quantizer, data, analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=3)


def _same(here, there):
    pd.testing.assert_frame_equal(here.tensors, there.tensors)
    pd.testing.assert_frame_equal(here.weights, there.weights)
    pd.testing.assert_frame_equal(here.isolation.scores.set_index("region").sort_index(),
                                  there.isolation.scores.set_index("region").sort_index())
    pd.testing.assert_frame_equal(here.ranking, there.ranking)


def test_the_cluster_gives_the_numbers_of_this_process(cluster, residual):
    quantizer, data, here = residual
    there = analyze_progressive(quantizer, data, isolation_samples=4, workers=cluster, keep=3)
    assert there.meta["workers"] == 2
    _same(here, there)


def test_a_worker_killed_mid_analysis_is_retried(cluster, residual):
    quantizer, data, here = residual
    killed = []

    def kill_one(report):
        if not killed:
            pool = kill_one.pool
            victim = pool.pids[0]
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    from mpstudio.distributed.sensitivity import RaySensitivityPool

    class Watched(RaySensitivityPool):  # the real pool; the test only keeps a handle to kill one of its actors
        def __init__(self, c):
            super().__init__(c)
            kill_one.pool = self

    original = type(cluster).sensitivity_pool
    type(cluster).sensitivity_pool = lambda self, metric=None: Watched(self)
    try:
        there = analyze_progressive(quantizer, data, isolation_samples=4, workers=cluster, keep=3, chunk=2,
                                    on_partial=kill_one)
    finally:
        type(cluster).sensitivity_pool = original
    assert killed
    _same(here, there)


def test_the_command_line_refuses_a_cluster_it_cannot_reach(tmp_path):
    import onnx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = tmp_path / "m.onnx"
    onnx.save(make_residual_model(10, size=8), model)
    (tmp_path / "data").mkdir()
    for i, feed in enumerate(small_feeds(2).feeds()):
        np.savez(tmp_path / "data" / f"{i}.npz", **feed)
    env = {**os.environ, "MPSTUDIO_RAY_ADDRESS": f"127.0.0.1:{port}"}
    result = subprocess.run([sys.executable, "-m", "mpstudio", "analyze", str(model), "--data", str(tmp_path / "data"),
                             "--out", str(tmp_path / "r")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert f"the Ray cluster at 127.0.0.1:{port} cannot be reached" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()  # refused before any work
