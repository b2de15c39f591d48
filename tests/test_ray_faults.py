"""A node of a real Ray cluster removed mid-evaluation: its shards are retried on the nodes left, and the
evaluation's outputs are those of a local run."""

from __future__ import annotations

import threading

import numpy as np
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
