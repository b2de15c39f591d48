"""Regenerating a mixed-precision QDQ model from cached calibration vs ORT's plain path, in one run.

    python benchmarks/regenerate.py [--plans 5] [--plain-runs 2]

Plain path: `get_qnn_qdq_config` + `quantize` of the same plan, which recalibrates over the calibration set.
mpstudio's path: `Quantizer.generate` reading the calibration cache (computed once, not counted).
Targets: regenerate <= 0.2x the plain path, and under 1 s. Exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mpstudio.demos import load_demo
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer, quantize_plain


def mixed_plans(graph, count):
    acts = graph.activations()
    step = max(1, len(acts) // (count + 1))
    # Each plan promotes a different block of 20 activations to 16 bits, so no plan comes from the model cache.
    return [PrecisionPlan.a8w8().promote(acts[i * step:i * step + 20], name=f"mixed-{i}") for i in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=5)
    parser.add_argument("--plain-runs", type=int, default=2)
    args = parser.parse_args()

    demo = load_demo()
    with tempfile.TemporaryDirectory(prefix="mpstudio-bench-") as tmp:
        quantizer = Quantizer(demo.model, demo.calibration, Path(tmp) / "cache")
        cache = quantizer.calibrate()
        print(f"model: {demo.name}, {len(demo.model.graph.nodes)} nodes; calibration: {cache.samples} samples "
              f"(computed once in {cache.seconds:.2f} s, not counted)")
        plans = mixed_plans(demo.model.graph, args.plans)

        fast = []
        for plan in plans:
            started = time.perf_counter()
            quantizer.generate(plan)
            fast.append(time.perf_counter() - started)
        plain = []
        for i in range(args.plain_runs):
            started = time.perf_counter()
            quantize_plain(quantizer.float_path, demo.calibration, plans[i % len(plans)], demo.model.graph,
                           Path(tmp) / f"plain-{i}.onnx")
            plain.append(time.perf_counter() - started)

    fast_s, plain_s = statistics.median(fast), statistics.median(plain)
    ratio = fast_s / plain_s
    print(f"regenerate from cache : median {fast_s:.3f} s over {len(fast)} plans  {[round(t, 3) for t in fast]}")
    print(f"plain ORT (recalibrate): median {plain_s:.3f} s over {len(plain)} runs   {[round(t, 3) for t in plain]}")
    ok_ratio, ok_abs = ratio <= 0.2, fast_s < 1.0
    print(f"ratio {ratio:.3f}  (target <= 0.2: {'met' if ok_ratio else 'MISSED'}); "
          f"absolute {fast_s:.3f} s (target < 1 s: {'met' if ok_abs else 'MISSED'})")
    return 0 if ok_ratio and ok_abs else 1


if __name__ == "__main__":
    sys.exit(main())
