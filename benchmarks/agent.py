"""The agent's overhead against a direct in-process ONNX Runtime session, on the same model (cpu backend).

Run:  python benchmarks/agent.py  [--iterations 1000] [--requests 100] [--rounds 5] [--threads 1]

Starts a real local agent (child process, loopback, token) and measures, in one run:
  1. one request that runs the model `--iterations` times, against the same loop in process
     (target: at most 2 % more wall time);
  2. `--requests` separate requests of one iteration each (outputs returned), against as many direct
     runs (target: at most 5 ms more per request).
Each figure is the best of `--rounds` alternating rounds, so a noisy neighbour hurts both sides alike.
Prints a table and exits with status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mpstudio.agent import LocalAgent
from mpstudio.runtime import create_session

LOOP_TARGET = 0.02  # relative overhead of one long request
REQUEST_TARGET_MS = 5.0  # overhead per separate request


def benchmark_model(channels: int = 32, size: int = 56, layers: int = 4) -> onnx.ModelProto:
    """A small convolutional net: a few milliseconds per run on CPU, like a light vision model."""
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for i in range(layers):
        w = numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32), f"w{i}")
        weights.append(w)
        nodes.append(helper.make_node("Conv", [current, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        current = f"r{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [current], ["y"], name="gap"))
    graph = helper.make_graph(
        nodes, "bench",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 1, 1])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads on both sides (default 1)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.onnx"
        onnx.save(benchmark_model(), str(path))
        feeds = {"x": np.random.default_rng(1).standard_normal((1, 32, 56, 56)).astype(np.float32)}
        # One intra-op thread on both sides: on a small machine ORT's pool would otherwise compete with the
        # agent's own processes and measure the contention rather than the agent.
        session = create_session(path, "cpu", intra_op_threads=args.threads)

        with LocalAgent(run_timeout=3600, extra_args=("--threads", str(args.threads))) as agent:
            client = agent.client
            client.run(path, feeds, backend="cpu", iterations=20)  # upload, session, warm caches
            for _ in range(20):
                session.run(None, feeds)

            loop_direct, loop_agent, req_direct, req_agent = [], [], [], []
            for _ in range(args.rounds):
                started = time.perf_counter()
                for _ in range(args.iterations):
                    session.run(None, feeds)
                loop_direct.append(time.perf_counter() - started)
                time.sleep(0.2)  # let ORT's spinning threads settle before the other side runs

                started = time.perf_counter()
                result = client.run(path, feeds, backend="cpu", iterations=args.iterations)
                loop_agent.append(time.perf_counter() - started)
                time.sleep(0.2)

                started = time.perf_counter()
                for _ in range(args.requests):
                    session.run(None, feeds)
                req_direct.append(time.perf_counter() - started)
                time.sleep(0.2)

                started = time.perf_counter()
                for _ in range(args.requests):
                    client.run(path, feeds, backend="cpu")
                req_agent.append(time.perf_counter() - started)
                time.sleep(0.2)

            expected = session.run(None, feeds)[0]
            assert np.array_equal(result.outputs["y"], expected), "agent outputs differ from the direct session"

    loop_d, loop_a = min(loop_direct), min(loop_agent)
    req_d, req_a = min(req_direct), min(req_agent)
    loop_overhead = loop_a / loop_d - 1.0
    request_overhead_ms = (req_a - req_d) / args.requests * 1e3
    loop_ok = loop_overhead <= LOOP_TARGET
    request_ok = request_overhead_ms <= REQUEST_TARGET_MS

    print(f"agent overhead, cpu backend, {result.latency.device}; best of {args.rounds} rounds")
    print(f"model: 4x Conv3x3 32ch 56x56, in-worker median {result.latency.median_ms:.3f} ms/run "
          f"({result.latency.label})")
    print()
    print(f"{'measurement':<38}{'direct':>12}{'agent':>12}{'overhead':>14}{'target':>12}{'':>6}")
    print(f"{f'{args.iterations} iterations in one request':<38}{loop_d * 1e3:>10.1f}ms{loop_a * 1e3:>10.1f}ms"
          f"{loop_overhead * 100:>13.2f}%{LOOP_TARGET * 100:>11.1f}%{'ok' if loop_ok else 'MISS':>6}")
    print(f"{f'{args.requests} separate requests':<38}{req_d * 1e3:>10.1f}ms{req_a * 1e3:>10.1f}ms"
          f"{request_overhead_ms:>10.2f}ms/rq{REQUEST_TARGET_MS:>9.1f}ms{'ok' if request_ok else 'MISS':>6}")
    return 0 if loop_ok and request_ok else 1


if __name__ == "__main__":
    sys.exit(main())
