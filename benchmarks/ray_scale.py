"""One HTP-emulator evaluation locally and on a local Ray cluster of N nodes: per-task overhead, bytes moved and
throughput, and from them the expected wall time of an evaluation on a cluster of M machines x C cores.

Run:  python benchmarks/ray_scale.py  [--nodes 2] [--cpus-per-node 1] [--samples 48] [--machines 8] [--cores 16]

This machine's cores are few: the cluster's nodes share them, so the benchmark measures Ray's overhead (and that
the numbers are the local ones), not a speed-up. Every figure is measured in this run; samples are seeded.
Exits 1 when the cluster's outputs differ from the local ones, or its warm throughput is under 0.8 x that of as
many local worker processes as it has actors (the same cores, measured in the same run).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every node on 127.0.0.1

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from mpstudio.data import FeedList  # noqa: E402
from mpstudio.loop.inprocess import run_outputs, shutdown_workers  # noqa: E402
from mpstudio.model import prepare_model  # noqa: E402
from mpstudio.plan import PrecisionPlan  # noqa: E402
from mpstudio.quantize import Quantizer  # noqa: E402

THROUGHPUT_TARGET = 0.8  # the warm cluster's samples/s against local worker processes as many as its actors
# The sentence encoder: 500 samples took 192-382 s per plan on 2 cores (0.77-1.53 core-s per sample).
ENCODER_SAMPLES, ENCODER_CORE_S = 500, (2 * 192 / 500, 2 * 382 / 500)


def conv_model(channels: int = 16, size: int = 32, layers: int = 4) -> onnx.ModelProto:
    """A small convolutional net: tens of milliseconds per sample on the HTP emulator."""
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((channels, channels, 3, 3)) * 0.08).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("Conv", [current, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        current = f"r{i}"
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, channels, size, size])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, channels, size, size])],
                              initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, channels: int = 16, size: int = 32, seed: int = 1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, channels, size, size)).astype(np.float32)} for _ in range(n)]


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--machines", type=int, default=8)
    parser.add_argument("--cores", type=int, default=16)
    parser.add_argument("--estimate-samples", type=int, default=5000, help="samples of the estimate's evaluation")
    args = parser.parse_args(argv)

    from ray.cluster_utils import Cluster

    from mpstudio.distributed import OverRay, connect

    folder = Path(tempfile.mkdtemp(prefix="ray-scale-"))
    quantizer = Quantizer(prepare_model(conv_model()), FeedList(feeds(4, seed=0)), folder)
    model = quantizer.generate(PrecisionPlan.a8w8())
    data = FeedList(feeds(args.samples))
    options = {"htp_arch": "75"}
    run_outputs(model, data.head(1), "htp", options, workers=1)  # warm this process's QNN libraries
    local, local_s = timed(lambda: run_outputs(model, data, "htp", options, workers=1))
    per_sample = local_s / args.samples
    pool_workers = args.nodes * args.cpus_per_node
    run_outputs(model, data.head(pool_workers), "htp", options, workers=pool_workers)  # start the process pool
    _, pool_s = timed(lambda: run_outputs(model, data, "htp", options, workers=pool_workers))
    shutdown_workers()

    node = dict(num_cpus=args.cpus_per_node, object_store_memory=100 * 1024 * 1024)
    nodes = Cluster(initialize_head=True, head_node_args=dict(node, include_dashboard=False))
    for _ in range(args.nodes - 1):
        nodes.add_node(**node)
    nodes.wait_for_nodes()
    cluster = connect(nodes.address)
    try:
        runner = OverRay(cluster)
        _, start_s = timed(cluster.evaluators)
        cold, cold_s = timed(lambda: runner.outputs(model, data, "htp", options, None, None))
        moved_cold = cluster.bytes_put
        warm, warm_s = timed(lambda: runner.outputs(model, data, "htp", options, None, None))
        moved_warm = cluster.bytes_put - moved_cold
        placement = runner.placements[-1]
        overhead = _round_trip(cluster, model, data)
    finally:
        cluster.close()
        import ray

        ray.shutdown()
        nodes.shutdown()

    same = all(np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k])
               for a, b, c in zip(local, cold, warm) for k in a)
    tasks = placement.tasks
    session_s = max(0.0, cold_s - warm_s)  # the cold run's extra: model and samples fetched, sessions built
    output_bytes = sum(v.nbytes for o in warm for v in o.values())
    print(f"model: {Path(model).stat().st_size / 1e6:.2f} MB QDQ, {args.samples} samples of "
          f"{data.sample(0)['x'].nbytes / 1e3:.0f} kB, HTP emulator (htp_arch 75)")
    print(f"{'run':<36}{'wall s':>9}{'samples/s':>11}")
    for name, seconds in (("local, this process", local_s), (f"local, {pool_workers} worker processes", pool_s),
                          (f"Ray {args.nodes} nodes, cold (first run)", cold_s),
                          (f"Ray {args.nodes} nodes, warm", warm_s)):
        print(f"{name:<36}{seconds:>9.2f}{args.samples / seconds:>11.1f}")
    print(f"actors started in {start_s:.2f} s; {tasks} tasks; {placement.describe()}")
    print(f"per-sample cost (local, one core): {per_sample * 1e3:.1f} ms")
    print(f"Ray overhead per task: {overhead * 1e3:.1f} ms (median round trip of a one-sample task to a warm actor "
          f"minus its run in this process); cold run's extra {session_s:.2f} s")
    print(f"bytes put into the object store: first run {moved_cold / 1e6:.2f} MB (model + samples, once), "
          f"second run {moved_warm / 1e6:.2f} MB; outputs returned {output_bytes / 1e6:.2f} MB per run")
    print(f"outputs identical to the local run: {same}")
    _estimate(args, per_sample, overhead, session_s, start_s)
    ratio = pool_s / warm_s
    print(f"warm cluster throughput / local worker processes: {ratio:.2f} (target >= {THROUGHPUT_TARGET})")
    failed = not same or ratio < THROUGHPUT_TARGET
    if failed:
        print(f"MISSED: identical outputs and at least {THROUGHPUT_TARGET} x the local processes' throughput")
    return 1 if failed else 0


def _round_trip(cluster, model, data, tasks: int = 30) -> float:
    """Median seconds of a one-sample task on a warm actor (its session held), less the same run in this
    process: what Ray adds per task."""
    from mpstudio.runtime import create_session

    pool = cluster.evaluators()
    model_ref = cluster.put_file(model)
    samples = cluster.put_feeds(list(data.feeds()))
    args = (model_ref[0], [model_ref[1]], "htp", {"htp_arch": "75"}, False, samples[1], [0])
    cluster.ray.get(pool.actors[0].run.remote(*args))
    remote = []
    for _ in range(tasks):
        start = time.perf_counter()
        cluster.ray.get(pool.actors[0].run.remote(*args))
        remote.append(time.perf_counter() - start)
    session = create_session(model, "htp", {"htp_arch": "75"})
    names = [o.name for o in session.get_outputs()]
    here = []
    for _ in range(tasks):
        start = time.perf_counter()
        session.run(names, data.sample(0))
        here.append(time.perf_counter() - start)
    return max(0.0, float(np.median(remote) - np.median(here)))


def _estimate(args, per_sample: float, overhead: float, session_s: float, start_s: float) -> None:
    """Expected wall time of one evaluation on machines x cores actors, from the measured costs."""
    actors = args.machines * args.cores
    print(f"\nscaling estimate, {args.machines} machines x {args.cores} cores = {actors} actors:")
    print("  T = start + build + ceil(S / P) x (c + o): S samples, P actors, c core-seconds per sample, o overhead"
          " per task (one sample per task once S < 4 P); start and build measured here (actors, first run's extra)")
    rows = [("this benchmark's conv net", args.estimate_samples, per_sample)]
    rows += [(f"the issue's sentence encoder ({label})", ENCODER_SAMPLES, cost)
             for label, cost in zip(("fast", "slow"), ENCODER_CORE_S)]
    for name, samples, cost in rows:
        one_core = samples * cost
        waves = -(-samples // actors)
        cluster_s = start_s + session_s + waves * (cost + overhead)
        print(f"  {name}: {samples} samples, {one_core:.0f} core-s -> {cluster_s:.1f} s on the cluster "
              f"({one_core / 2:.0f} s on 2 cores; x{one_core / 2 / cluster_s:.0f})")
    print("  assumptions: the emulator costs the same core-seconds per sample on every machine (one actor per "
          "core, no hyper-threads); nodes on one 10 Gb/s network, so the model and samples (put once, fetched once"
          " per node) cost under a second; one plan at a time (a search runs a plan per two CPUs at once, which "
          "fills the waves' tails); the head's own work (quantizing, scoring) is not counted.")


if __name__ == "__main__":
    sys.exit(main())
