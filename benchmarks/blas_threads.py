"""The analysis's per-tensor scoring and a plan's scoring with BLAS's default threads and with one
(`mpstudio.blas_threads.one_blas_thread`, what the sensitivity analysis and every evaluation now run inside):
time ratio measured in the same run, and the sums compared bit for bit.

    python benchmarks/blas_threads.py [--layers 2] [--samples 8] [--rounds 5] [--max-ratio 1.10]

The model is the outcome benchmark's encoder at MiniLM width (hidden 384, 12 heads, 64 tokens: every activation
holds 24,576 values, a size BLAS splits over its threads), with `--layers` layers, random weights (seed 0), random
token sequences (seed 26). The two settings alternate round by round, so both see the same load. What is timed:
`TensorScorer.score` over `--samples` sequences (float, QDQ and calibration-model sessions per sample, then one
`np.dot` per tensor and sample for its accumulated and local error: the sensitivity analysis's scoring step), and
the output agreement of the QDQ model's outputs (the metrics a plan's evaluation computes).

Exits 1 when the analysis's sums differ between the settings (any bit), when the output agreement differs by more
than 1e-12 (relative) or from round to round with one thread, or when one thread takes more than `--max-ratio`
times the default's time (min over rounds). The sums are float32 dots, which OpenBLAS sums in the same order on
one thread or several; the output agreement sums float64 dots, whose threaded sum splits the vector per thread:
its last digit depended on the machine's core count, and with one thread it no longer does. A ratio under 1 is the time the default threads lose waiting for each
other; it grows with the load: the load average is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpstudio import qdq  # noqa: E402
from mpstudio.blas_threads import blas_threads, one_blas_thread  # noqa: E402
from mpstudio.data import FeedList  # noqa: E402
from mpstudio.metrics import ErrorAccumulator, output_agreement  # noqa: E402
from mpstudio.model import prepare_model  # noqa: E402
from mpstudio.plan import PrecisionPlan  # noqa: E402
from mpstudio.quantize import Quantizer  # noqa: E402
from mpstudio.runtime import create_session  # noqa: E402
from mpstudio.sensitivity.scores import TensorScorer  # noqa: E402

SEED = 26


def sentences(count: int, seed: int = SEED) -> list[dict]:
    """Token sequences of 16-64 tokens, padded to 64 and masked (as benchmarks/outcome.py's encoder case)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        length = int(rng.integers(16, 65))
        ids = np.zeros((1, 64), np.int64)
        ids[0, :length] = rng.integers(1000, 30000, length)
        feeds.append({"input_ids": ids, "attention_mask": (np.arange(64) < length)[None].astype(np.int64)})
    return feeds


def fingerprint(sums) -> list[tuple]:
    """Every running sum of a `ScoreSums`, exactly."""
    rows = [(t, a.signal, a.test, a.noise, a.dot, a.max_abs, a.count) for t, a in sorted(sums.accumulated.items())]
    rows += [(t, bits, a.signal, a.noise, a.count) for t, widths in sorted(sums.local.items())
             for bits, a in sorted(widths.items())]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-ratio", type=float, default=1.10)
    args = parser.parse_args(argv)
    import latency_models

    print(f"load average at the start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} ({os.cpu_count()} cores); "
          f"BLAS threads by default: {blas_threads()}")
    model = latency_models._bert("minilm", 0, 64, args.layers, width=384, heads=12)
    types = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
    feeds = [{name: value.astype(types[name]) for name, value in feed.items()} for feed in sentences(args.samples + 4)]
    with tempfile.TemporaryDirectory(prefix="mpstudio-blas-") as tmp:
        quantizer = Quantizer(prepare_model(model), FeedList(feeds[args.samples:]), Path(tmp))
        model_8 = quantizer.generate(PrecisionPlan.a8w8())
        params_8 = {t: q.encoding for t, q in qdq.read(model_8).activations().items()}
        params_16 = {t: q.encoding for t, q in qdq.read(quantizer.generate(PrecisionPlan.a16w8())).activations().items()}
        scorer = TensorScorer(quantizer.float_path, model_8, quantizer.graph, params_8, params_16, threads=1,
                              local_model=quantizer.calibration_model(PrecisionPlan.a8w8()))
        evaluation = feeds[:args.samples]
        float_outputs = _outputs(quantizer.float_path, evaluation)
        qdq_outputs = _outputs(model_8, evaluation)

        def work():
            sums = scorer.score(evaluation, len(evaluation))
            return fingerprint(sums), output_agreement(float_outputs, qdq_outputs)

        # The reductions alone: the scorer's per-tensor accumulation over values kept from one pass.
        values = [(_values(scorer.float_session, scorer.float_names, feed),
                   _values(scorer.qdq_session, scorer.qdq_names, feed)) for feed in evaluation]

        def reductions():
            for float_values, qdq_values in values:
                for t in scorer.matched:
                    ErrorAccumulator().add(float_values[t], qdq_values[scorer.counterparts[t].post])

        times: dict[str, list[float]] = {"default": [], "one": []}
        reduction_times: dict[str, list[float]] = {"default": [], "one": []}
        results: dict[str, list] = {"default": [], "one": []}
        with one_blas_thread():
            inside = blas_threads()
        for _ in range(args.rounds):
            for setting in ("default", "one"):
                with one_blas_thread() if setting == "one" else contextlib.nullcontext():
                    started = time.perf_counter()
                    results[setting].append(work())
                    times[setting].append(time.perf_counter() - started)
                    started = time.perf_counter()
                    reductions()
                    reduction_times[setting].append(time.perf_counter() - started)
    problems = []
    sums = {setting: [r[0] for r in rs] for setting, rs in results.items()}
    agreement = {setting: [r[1] for r in rs] for setting, rs in results.items()}
    reference = sums["default"][0]
    if any(r != reference for rs in sums.values() for r in rs):
        problems.append("the analysis's sums differ between the settings or rounds")
    if any(a != agreement["one"][0] for a in agreement["one"]):
        problems.append("the output agreement with one BLAS thread differs between rounds")
    drift = max(abs(a - b) / max(abs(b), 1e-300) for a, b in zip(agreement["default"][0], agreement["one"][0]))
    if drift > 1e-12:
        problems.append(f"the output agreement differs by {drift:.1e} (relative) between the settings")
    best = {setting: min(values) for setting, values in times.items()}
    ratio = best["one"] / best["default"]
    print(f"encoder {args.layers}x384, 64 tokens; {args.samples} samples scored per round, {len(reference)} "
          f"running sums; BLAS threads inside one_blas_thread: {inside}")
    print("  scoring step (sessions and reductions):")
    for setting, label in (("default", "default BLAS threads"), ("one", "one BLAS thread")):
        print(f"    {label:<21} " + "  ".join(f"{t:6.2f} s" for t in times[setting]) + f"   min {best[setting]:.2f} s")
    print(f"    ratio one/default (min over rounds) {ratio:.3f} (gate <= {args.max_ratio:g})")
    print(f"  the reductions alone ({len(scorer.matched)} tensors x {args.samples} samples, ErrorAccumulator.add):")
    for setting, label in (("default", "default BLAS threads"), ("one", "one BLAS thread")):
        print(f"    {label:<21} " + "  ".join(f"{t:6.3f} s" for t in reduction_times[setting]) +
              f"   min {min(reduction_times[setting]):.3f} s")
    print(f"    ratio one/default (min over rounds) "
          f"{min(reduction_times['one']) / min(reduction_times['default']):.3f}")
    same = all(r == reference for rs in sums.values() for r in rs)
    print(f"  the analysis's sums (float32 dots): {'bit-identical' if same else 'DIFFER'} in every round of both")
    default, one = agreement["default"][0], agreement["one"][0]
    print(f"  output agreement (float64 dots): default SNR {default[0]!r} dB, cosine {default[1]!r}; one thread "
          f"{one[0]!r} dB, {one[1]!r} ({'identical' if default == one else f'relative difference {drift:.1e}'})")
    print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if ratio > args.max_ratio:
        problems.append(f"one BLAS thread is slower: ratio {ratio:.3f} > {args.max_ratio:g}")
    for text in problems:
        print(f"FAILED: {text}")
    return 1 if problems else 0


def _values(session, names: list[str], feed: dict) -> dict:
    return dict(zip(names, session.run(names, feed)))


def _outputs(model, feeds: list[dict]) -> list[dict]:
    session = create_session(model, intra_op_threads=1)
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]


if __name__ == "__main__":
    sys.exit(main())
