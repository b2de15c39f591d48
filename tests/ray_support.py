"""A real Ray cluster of two nodes on loopback for the tests of `mpstudio.distributed` (Ray's own cluster
utilities; one CPU and a small object store per node, no dashboard)."""

from __future__ import annotations

import os
from contextlib import contextmanager

# Ray reads this when imported: keep every node, and the address a driver joins, on 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest  # noqa: E402

try:
    import ray  # noqa: E402
    from ray.cluster_utils import Cluster  # noqa: E402
except ImportError:  # the optional extra is not installed
    ray = None

NODE = dict(num_cpus=1, object_store_memory=100 * 1024 * 1024)
needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install 'mpstudio[ray]')")


def start_cluster(nodes: int = 2):
    """A cluster of `nodes` nodes with this process connected to it."""
    cluster = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    for _ in range(nodes - 1):
        cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    return cluster


def stop_cluster(cluster) -> None:
    ray.shutdown()
    cluster.shutdown()


@contextmanager
def connected_cluster(nodes: int = 2):
    """A cluster of `nodes` nodes started here and mpstudio connected to it (`distributed.RayCluster`)."""
    from mpstudio.distributed import connect

    cluster = start_cluster(nodes)
    connected = connect(cluster.address)
    try:
        yield connected
    finally:
        connected.close()
        stop_cluster(cluster)
