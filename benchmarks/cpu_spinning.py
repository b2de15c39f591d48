"""A plan's evaluation on the CPU with ORT's spinning intra-op threads (ORT's default) and without
(`loop.inprocess.CPU_SESSION_CONFIG`, what `run_outputs` now uses): time ratio in the same run, outputs bit for bit.

    python benchmarks/cpu_spinning.py [--lines 8] [--rounds 3] [--max-ratio 1.10]

The model is the outcome benchmark's recognizer (PP-OCRv4, shipped by rapidocr_onnxruntime) quantized to
a8w8-pc (per-channel int8 weights, the base its search walks from), calibrated on 4 lines; `--lines` lines of
its own (seed 26) are run through ORT's CPU EP with the study's CPU numerics, as `run_outputs` runs an
evaluation. The two settings alternate round by round, so both see the same load; the load average is printed.
Exits 1 when the outputs differ in any bit, or when not spinning takes more than `--max-ratio` times the
spinning threads' time (min over rounds). A ratio under 1 is the time spinning threads took from each other and
from the machine's other processes; on a quiet machine it is about 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpstudio.data import FeedList  # noqa: E402
from mpstudio.loop.inprocess import run_outputs  # noqa: E402
from mpstudio.model import prepare_model  # noqa: E402
from mpstudio.plan import PrecisionPlan  # noqa: E402
from mpstudio.quantize import Quantizer  # noqa: E402
from mpstudio.runtime import create_session  # noqa: E402

SEED = 26


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-ratio", type=float, default=1.10)
    args = parser.parse_args(argv)
    from mpstudio.demos.ocr import demo_model_file, preprocess_line, render_line, sample_lines
    from mpstudio.ctc_text import ctc_charset

    print(f"load average at the start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} ({os.cpu_count()} cores)")
    prepared = prepare_model(demo_model_file(), {"x": [1, 3, 48, 320]})
    charset = ctc_charset(prepared)
    texts = sample_lines(args.lines + 4, SEED, set(charset[1:]), min_chars=12)
    feeds = [{"x": preprocess_line(render_line(text, 1000 + SEED + i))} for i, text in enumerate(texts)]
    lines = FeedList(feeds[:args.lines], name="lines")
    times: dict[str, list[float]] = {"spinning": [], "not spinning": []}
    outputs: dict[str, list] = {"spinning": [], "not spinning": []}
    with tempfile.TemporaryDirectory(prefix="mpstudio-spinning-") as tmp:
        quantizer = Quantizer(prepared, FeedList(feeds[args.lines:]), Path(tmp))
        path = quantizer.generate(PrecisionPlan.a8w8_pc())
        for _ in range(args.rounds):
            for setting in times:
                started = time.perf_counter()
                if setting == "spinning":  # ORT's default session, as run_outputs made it before
                    session = create_session(path, "cpu")
                    names = [o.name for o in session.get_outputs()]
                    result = [dict(zip(names, session.run(names, feed))) for feed in lines.feeds()]
                else:
                    result = run_outputs(path, lines, "cpu")
                times[setting].append(time.perf_counter() - started)
                outputs[setting].append(result)
    reference = outputs["spinning"][0]
    same = all(len(r) == len(reference) and all(set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
                                                  for a, b in zip(r, reference))
               for rs in outputs.values() for r in rs)
    best = {setting: min(values) for setting, values in times.items()}
    ratio = best["not spinning"] / best["spinning"]
    print(f"recognizer a8w8-pc on the CPU EP, {args.lines} lines per round (session made and every line run)")
    for setting, values in times.items():
        print(f"  {setting:<13} " + "  ".join(f"{t:6.2f} s" for t in values) +
              f"   min {best[setting]:.2f} s ({best[setting] / args.lines:.3f} s per line)")
    print(f"  ratio not spinning/spinning (min over rounds) {ratio:.3f} (gate <= {args.max_ratio:g}); outputs "
          f"{'bit-identical' if same else 'DIFFER'}")
    print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    problems = ([] if same else ["the outputs differ"]) + \
        ([f"not spinning is slower: ratio {ratio:.3f} > {args.max_ratio:g}"] if ratio > args.max_ratio else [])
    for text in problems:
        print(f"FAILED: {text}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
