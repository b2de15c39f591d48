"""Evaluations on a real two-node Ray cluster on loopback: the same outputs as local runs value by value, the
same accuracy source, data put once per content, a killed worker retried, and a clear error for no cluster."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading

import numpy as np
import pytest

from ray_support import connected_cluster, needs_ray
from conftest import chain_feeds, make_chain_model, qnn_available
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.loop.inprocess import run_outputs
from mpstudio.loop.runners import CPU_SOURCE
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer

pytestmark = [needs_ray,
              pytest.mark.skipif(not qnn_available(), reason="onnxruntime-qnn's HTP backend is not available")]
HTP = {"htp_arch": "75"}


@pytest.fixture(scope="module")
def cluster():
    with connected_cluster(2) as connected:
        yield connected


@pytest.fixture(scope="module")
def qdq_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray-models")
    quantizer = Quantizer(prepare_model(make_chain_model(blocks=4)), FeedList(chain_feeds(4)), folder)
    return quantizer.generate(PrecisionPlan.a8w8())


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for name in x:
            np.testing.assert_array_equal(x[name], y[name])


def test_htp_and_cpu_outputs_equal_local_runs_and_spread_over_both_nodes(cluster, qdq_model):
    from mpstudio.distributed import OverRay

    assert len(cluster.nodes()) == 2
    runner = OverRay(cluster)
    data = FeedList(chain_feeds(12, seed=5))
    for backend, options in (("htp", HTP), ("cpu", None)):
        local = run_outputs(qdq_model, data, backend, options, workers=1)
        seen = []
        remote = runner.outputs(qdq_model, data, backend, options, lambda d, t, m: seen.append((d, t)), None)
        _same(local, remote)
        assert seen[-1] == (12, 12)
        placement = runner.placements[-1]
        assert sum(placement.samples.values()) == 12 and len(placement.samples) == 2, placement.describe()
    first = next(iter(local[0]))
    assert not np.array_equal(local[0][first], local[1][first])  # the order check is not vacuous


def test_a_model_and_its_samples_enter_the_object_store_once(cluster, qdq_model):
    from mpstudio.distributed import OverRay

    runner = OverRay(cluster)
    data = FeedList(chain_feeds(6, seed=9))
    runner.outputs(qdq_model, data, "htp", HTP, None, None)
    puts, moved = cluster.puts, cluster.bytes_put
    runner.outputs(qdq_model, data, "htp", HTP, None, None)
    runner.outputs(qdq_model, FeedList(chain_feeds(6, seed=9)), "cpu", None, None, None)
    assert (cluster.puts, cluster.bytes_put) == (puts, moved)
    runner.outputs(qdq_model, FeedList(chain_feeds(6, seed=10)), "cpu", None, None, None)
    assert cluster.puts == puts + 1  # new samples: one more object, the model is not put again


def test_a_worker_killed_mid_evaluation_loses_nothing(cluster, qdq_model):
    from mpstudio.distributed import OverRay

    runner = OverRay(cluster)
    pool = cluster.evaluators()
    data = FeedList(chain_feeds(40, seed=11))
    local = run_outputs(qdq_model, data, "htp", HTP, workers=1)
    victim = pool.where[1][3]
    killed = threading.Event()

    def kill_after_first_shard(done, total, message):
        if not killed.is_set():
            os.kill(victim, signal.SIGKILL)
            killed.set()

    remote = runner.outputs(qdq_model, data, "htp", HTP, kill_after_first_shard, None)
    assert killed.is_set()
    _same(local, remote)
    # Ray restarted the actor in a new process; the pool keeps working with it.
    restarted = cluster.ray.get(pool.actors[1].where.remote())
    assert restarted[3] != victim
    _same(local[:4], runner.outputs(qdq_model, FeedList(chain_feeds(40, seed=11)[:4]), "htp", HTP, None, None))


def test_the_study_gets_the_local_numbers_and_source(cluster, tmp_path):
    from mpstudio.distributed import OverRay
    from mpstudio.study import Study

    path = tmp_path / "chain.onnx"
    import onnx

    onnx.save(make_chain_model(blocks=3), path)
    results = {}
    for name, runner in (("local", None), ("ray", OverRay(cluster))):
        study = Study.create(tmp_path / name, path, FeedList(chain_feeds(6)), FeedList(chain_feeds(8, seed=7)))
        for backend in ("cpu", "htp"):
            e = study.evaluate(PrecisionPlan.a8w8(), backend, runner)
            results[name, backend] = (e.accuracy_source, e.value, e.snr_db, e.cosine, e.samples)
    for backend in ("cpu", "htp"):
        assert results["ray", backend] == results["local", backend]


def test_an_unreachable_cluster_is_one_clear_error_at_once():
    from mpstudio.distributed import connect

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MpstudioError, match="cannot be reached.*ray start --head"):
        connect(f"127.0.0.1:{port}")
    with pytest.raises(MpstudioError, match="HOST:PORT"):
        connect("not an address")


def test_a_model_the_actors_cannot_open_is_the_local_error(cluster, tmp_path):
    from mpstudio.distributed import OverRay

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(MpstudioError, match="could not create a htp session"):
        OverRay(cluster).outputs(bad, FeedList(chain_feeds(2)), "htp", HTP, None, None)


def test_the_studio_runner_connects_once_per_address(cluster):
    from mpstudio.widgets.agents import AgentClients

    clients = AgentClients()
    clients.ray_address = cluster.address  # what the Run panel's field sets
    first = clients.client("ray")
    assert clients.ray(cluster.address) is first and first.source("cpu") == CPU_SOURCE
    assert first.source("htp") == f"HTP emulator on {socket.gethostname()}"  # a local run's label on this host
    clients.close()
    with pytest.raises(MpstudioError, match="Ray cluster's address"):
        clients.ray(" ")


def test_a_search_on_the_cluster_recommends_the_local_plan_evaluating_plans_at_once(cluster, tmp_path):
    import onnx

    from mpstudio.distributed import OverRay
    from mpstudio.search import search
    from mpstudio.study import Study

    class Counted(OverRay):  # the real runner, counting the plans it runs at once
        def __init__(self, c):
            super().__init__(c, lanes=2)
            self.running, self.most, self.lock = 0, 0, threading.Lock()

        def outputs(self, *args, **kwargs):
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                return super().outputs(*args, **kwargs)
            finally:
                with self.lock:
                    self.running -= 1

    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=6, size=16), path)
    found = {}
    for name, runner in (("local", None), ("ray", Counted(cluster))):
        study = Study.create(tmp_path / name, path, FeedList(chain_feeds(8)), FeedList(chain_feeds(6, seed=5)))
        result = search(study, "a16w8+10%", max_evaluations=8, weights="per-tensor", confirm=None, quiet=True,
                        runner=runner)
        found[name] = (study.plan(result.recommended.plan_id).hash, result.recommended.value,
                       result.recommended.accuracy_source, [(e.name, e.value) for e in result.path])
        study.close()
    assert found["ray"] == found["local"]
    assert runner.most == 2  # the baselines (at least) ran together


def test_the_command_line_evaluates_on_the_cluster_and_says_where(cluster, tmp_path):
    import subprocess
    import sys

    import onnx

    from mpstudio.study import Study

    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=3), path)
    local = Study.create(tmp_path / "local", path, FeedList(chain_feeds(6)), FeedList(chain_feeds(8, seed=7)))
    expected = local.evaluate(PrecisionPlan.a8w8(), "htp")
    local.close()
    Study.create(tmp_path / "ray", path, FeedList(chain_feeds(6)), FeedList(chain_feeds(8, seed=7))).close()
    env = {**os.environ, "MPSTUDIO_RAY_ADDRESS": cluster.ray.get_runtime_context().gcs_address}
    result = subprocess.run([sys.executable, "-m", "mpstudio", "evaluate", str(tmp_path / "ray"), "--plan", "a8w8",
                             "--backend", "htp", "--quiet"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Ray cluster" in result.stdout and "2 node(s)" in result.stdout
    assert f"{expected.value:.4f}{expected.interval_text()} [{expected.accuracy_source}, 8 samples]" in result.stdout
    where = next(line for line in result.stdout.splitlines() if line.startswith("ran on Ray:"))
    # The nodes named with their share (which nodes depends on what earlier tests left on the cluster).
    assert sum(int(n) for n in re.findall(r"(\d+) samples on \w+@", where)) == 8, where
    with Study.open(tmp_path / "ray") as study:
        stored = study.evaluations().iloc[0]
        assert (stored["value"], stored["accuracy_source"]) == (expected.value, expected.accuracy_source)


def test_closed_actors_leave_no_folder_and_a_killed_ones_folder_is_swept(cluster, qdq_model):
    import tempfile
    from pathlib import Path

    from mpstudio.distributed import OverRay

    cluster.close()  # fresh actors: an earlier test's killed actor was restarted under another process id
    OverRay(cluster).outputs(qdq_model, FeedList(chain_feeds(4)), "cpu", None, None, None)
    pids = cluster.evaluators().pids
    folders = lambda: [f for pid in pids for f in Path(tempfile.gettempdir()).glob(f"mpstudio-ray-evaluator-{pid}-*")]
    assert len(folders()) == len(pids), "each actor works in a folder named by its process"
    cluster.close()
    assert folders() == []
    # A killed actor cannot clean up: the next actor started on the node removes its folder.
    OverRay(cluster).outputs(qdq_model, FeedList(chain_feeds(4)), "cpu", None, None, None)
    victim = cluster.evaluators().pids[0]
    os.kill(victim, signal.SIGKILL)
    left = list(Path(tempfile.gettempdir()).glob(f"mpstudio-ray-evaluator-{victim}-*"))
    assert left, "a killed actor's folder stays until it is swept"
    OverRay(cluster).outputs(qdq_model, FeedList(chain_feeds(4)), "cpu", None, None, None)  # restarts the actor
    assert not any(folder.exists() for folder in left)
