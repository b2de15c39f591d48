"""Evaluations and sensitivity analyses on a Ray cluster (the optional `mpstudio[ray]` extra).

`connect("auto" | ADDRESS | "local")` gives a `RayCluster`; `OverRay(cluster)` is a runner like the in-process one
(pass it wherever a study takes a runner), and the cluster itself is the `workers` of a sensitivity analysis.
Ray is imported only here, and only when a cluster is asked for.
"""

from .cluster import RAY_ADDRESS_ENV, RayCluster, connect, ray_address
from .evaluation import OverRay

__all__ = ["RAY_ADDRESS_ENV", "RayCluster", "connect", "ray_address", "OverRay"]
