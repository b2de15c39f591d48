"""mpstudio's search against an AIMET-AMP-style search on the demo model, in one run.

    python benchmarks/search.py [--target a16w8+10%] [--samples 100] [--max-groups N]

Both searches evaluate plans the same way (regenerate the QDQ model from the same cached calibration, run
ORT's CPU QDQ model over the same evaluation lines, score CER) and must reach the same target. Each has its
own study folder, so neither reuses the other's evaluations.

- AMP-style (the baseline, as AIMET's automatic mixed precision does it): phase 1 evaluates every tensor
  group once: the all-16-bit plan (a16w8) with that group alone at 8 bits. Phase 2 walks greedily from
  a16w8, demoting groups cumulatively in order of their phase-1 accuracy loss (least first), evaluating
  each step, and keeps the last plan that still reaches the target. A group is one activation tensor
  (AIMET groups quantizers per op; here every op has one output).
- mpstudio: `mpstudio.search.search` (sensitivity ranking, weights first, gain per latency cost, bisection).
  Its wall time includes the sensitivity analysis.

Reported: evaluations and wall time of each, the final CER and estimated latency of each, and the ratio of
evaluations (target: mpstudio uses at most 1/5 of the baseline's).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpstudio.demos import load_demo  # noqa: E402
from mpstudio.plan import PrecisionPlan  # noqa: E402
from mpstudio.search import Target, meets, search  # noqa: E402
from mpstudio.study import MetricSpec, Study  # noqa: E402


def make_study(folder: Path, demo) -> Study:
    spec = MetricSpec("ctc_cer", demo.metric.name, demo.metric.higher_is_better, {"references": list(demo.texts)})
    return Study.create(folder, demo.model, demo.calibration, demo.evaluation, spec, name="benchmark")


def amp_style(study: Study, target: str, max_groups: int | None) -> dict:
    """Phase 1: one evaluation per group (demoted alone from a16w8); phase 2: greedy cumulative demotion."""
    started = time.perf_counter()
    evaluations = 0

    def evaluate(plan):
        nonlocal evaluations
        evaluations += 1
        return study.evaluate(plan, origin="amp")

    a8 = evaluate(PrecisionPlan.a8w8())
    a16 = evaluate(PrecisionPlan.a16w8())
    threshold = Target.parse(target).threshold({"a8w8": a8, "a16w8": a16}, study.higher_is_better)
    groups = study.graph.activations()
    if max_groups:
        groups = groups[:max_groups]
    loss = {}
    for i, tensor in enumerate(groups):
        value = evaluate(PrecisionPlan.a16w8().with_overrides({tensor: "uint8"})).value
        loss[tensor] = (value - a16.value) if not study.higher_is_better else (a16.value - value)
        if (i + 1) % 25 == 0:
            print(f"  amp phase 1: {i + 1}/{len(groups)} groups, {time.perf_counter() - started:.0f} s", flush=True)
    order = sorted(groups, key=lambda t: loss[t])
    best = a16
    demoted: list[str] = []
    for tensor in order:
        candidate = evaluate(PrecisionPlan.a16w8().with_overrides({t: "uint8" for t in demoted + [tensor]}))
        if not meets(candidate.value, threshold, study.higher_is_better):
            break
        demoted.append(tensor)
        best = candidate
    return {"evaluations": evaluations, "seconds": time.perf_counter() - started, "best": best,
            "threshold": threshold, "demoted": len(demoted), "groups": len(groups)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="a16w8+10%")
    parser.add_argument("--samples", type=int, default=100, help="evaluation lines per evaluation")
    parser.add_argument("--max-groups", type=int, help="limit phase 1 to the first N groups (quick runs)")
    parser.add_argument("--weights", default="per-tensor", choices=["per-tensor", "auto"],
                        help="mpstudio's weight handling; per-tensor (default) searches the same space as AMP")
    parser.add_argument("--keep", help="keep the study folders here")
    args = parser.parse_args()

    demo = load_demo(evaluation_lines=args.samples)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mpstudio-bench-search-"))
    shutil.rmtree(root / "mpstudio", ignore_errors=True)
    shutil.rmtree(root / "amp", ignore_errors=True)
    print(f"model: {demo.name}, {len(demo.model.model.graph.node)} nodes, "
          f"{len(demo.model.graph.activations())} activation tensors; {len(demo.evaluation)} evaluation lines; "
          f"target {args.target}")

    ours_study = make_study(root / "mpstudio", demo)
    ours_study.quantizer.calibrate()  # calibration is shared set-up, not search work, for both
    started = time.perf_counter()
    ours = search(ours_study, args.target, max_evaluations=24, weights=args.weights)
    ours_seconds = time.perf_counter() - started
    print(f"\nmpstudio search: {ours.evaluations} evaluations, {ours_seconds:.1f} s (sensitivity analysis included)")
    print("  " + ours.describe().replace("\n", "\n  "))

    amp_study = make_study(root / "amp", demo)
    amp_study.quantizer.calibrate()
    amp = amp_style(amp_study, args.target, args.max_groups)
    best = amp["best"]
    est = best.latency("estimate")
    print(f"\nAMP-style search: {amp['evaluations']} evaluations ({amp['groups']} groups in phase 1), "
          f"{amp['seconds']:.1f} s; final CER {best.value:.4f} with {amp['demoted']} groups demoted to 8 bits"
          + (f", {est.ms:.3f} ms estimated" if est else ""))

    ratio = ours.evaluations / amp["evaluations"]
    ours_est = ours.recommended.latency("estimate")
    print(f"\nthreshold {ours.threshold:.4f} ({args.target}); both reached it: "
          f"{ours.reached and meets(best.value, amp['threshold'], amp_study.higher_is_better)}")
    print(f"final CER: mpstudio {ours.recommended.value:.4f}"
          + (f" at {ours_est.ms:.3f} ms" if ours_est else "") + f"; AMP-style {best.value:.4f}"
          + (f" at {est.ms:.3f} ms" if est else "") + " (estimated latency, HTP cost model)")
    print(f"evaluations: {ours.evaluations} vs {amp['evaluations']} = {ratio:.3f}x "
          f"(target <= 0.2: {'met' if ratio <= 0.2 else 'MISSED'}); wall time {ours_seconds:.0f} s vs "
          f"{amp['seconds']:.0f} s = {ours_seconds / amp['seconds']:.3f}x")
    ours_study.close()
    amp_study.close()
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
