"""A node of a real Ray cluster removed mid-evaluation or mid-analysis: its work is sent to the nodes left, and
the outputs and reports are those of a local run."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

from ray_support import NODE, needs_ray, stop_cluster
from conftest import chain_feeds, make_chain_model, qnn_available
from mpstudio.data import FeedList
from mpstudio.loop.inprocess import run_outputs
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer

pytestmark = [needs_ray,
              pytest.mark.skipif(not qnn_available(), reason="onnxruntime-qnn's HTP backend is not available")]


def test_a_node_removed_mid_evaluation_loses_nothing(tmp_path):
    from ray.cluster_utils import Cluster

    from mpstudio.distributed import OverRay, connect

    model = Quantizer(prepare_model(make_chain_model(blocks=4)), FeedList(chain_feeds(4)), tmp_path).generate(
        PrecisionPlan.a8w8())
    data = FeedList(chain_feeds(40, seed=13))
    local = run_outputs(model, data, "htp", {"htp_arch": "75"}, workers=1)
    nodes = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    workers = [nodes.add_node(**NODE) for _ in range(2)]
    nodes.wait_for_nodes()
    try:
        cluster = connect(nodes.address)
        runner = OverRay(cluster)
        pool = cluster.evaluators()
        assert len({node for node, *_ in pool.where}) == 3
        doomed = workers[-1]
        removed = threading.Event()

        def remove_after_first_shard(done, total, message):
            if not removed.is_set():
                nodes.remove_node(doomed, allow_graceful=False)
                removed.set()

        remote = runner.outputs(model, data, "htp", {"htp_arch": "75"}, remove_after_first_shard, None)
        assert removed.is_set()
        for a, b in zip(local, remote, strict=True):
            for name in a:
                np.testing.assert_array_equal(a[name], b[name])
        placement = runner.placements[-1]
        assert sum(placement.samples.values()) == 40
        shards = -(-40 // max(1, min(4, 40 // (len(pool.actors) * 4))))  # EvaluatorPool's shard size
        assert placement.tasks > shards, placement.describe()  # the lost node's shards were sent again
        cluster.close()
    finally:
        stop_cluster(nodes)


def test_a_node_removed_mid_analysis_loses_nothing(tmp_path):
    from ray.cluster_utils import Cluster

    from gui_models import make_residual_model
    from gui_support import small_feeds
    from mpstudio.distributed import connect
    from mpstudio.sensitivity import analyze_progressive

    quantizer = Quantizer(prepare_model(make_residual_model(40, size=8)), small_feeds(8), tmp_path)
    data = small_feeds(6, seed=3)
    here = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=3)
    nodes = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    workers = [nodes.add_node(**NODE) for _ in range(2)]
    nodes.wait_for_nodes()
    removed = []

    def remove_one(report):
        if not removed:
            nodes.remove_node(workers[-1], allow_graceful=False)
            removed.append(report.meta.get("stage"))

    try:
        there = analyze_progressive(quantizer, data, isolation_samples=4, workers=connect(nodes.address), keep=3,
                                    chunk=2, on_partial=remove_one)
    finally:
        stop_cluster(nodes)
    assert removed and there.meta["workers"] == 3
    for frame in ("tensors", "weights", "ranking"):
        pd.testing.assert_frame_equal(getattr(here, frame), getattr(there, frame))
    pd.testing.assert_frame_equal(here.isolation.scores.set_index("region").sort_index(),
                                  there.isolation.scores.set_index("region").sort_index())
