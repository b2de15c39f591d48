"""mpstudio's search against an AIMET-AMP-style search on the demo model, in one run.

    python benchmarks/search.py [--target a16w8+10%] [--samples 100] [--amp-groups 24 | --full]

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

The AMP-style search needs one evaluation per group before its walk can start: 405 on the demo, about
15-20 s each on a 2-core machine, so the full run takes hours. By default phase 1 runs on the first
`--amp-groups` groups and is extrapolated: its evaluation count is exact by definition (one per group, plus
the two baselines, plus at least one phase-2 step, so the count is a lower bound), its time is the measured
mean per evaluation times that count (also a lower bound). `--full` runs both phases to the end and reports
AMP's final plan.
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
    all_groups = study.graph.activations()
    groups = all_groups[:max_groups] if max_groups else all_groups
    loss = {}
    phase_1 = time.perf_counter()
    for i, tensor in enumerate(groups):
        value = evaluate(PrecisionPlan.a16w8().with_overrides({tensor: "uint8"})).value
        loss[tensor] = (value - a16.value) if not study.higher_is_better else (a16.value - value)
        if (i + 1) % 10 == 0:
            print(f"  amp phase 1: {i + 1}/{len(groups)} groups, {time.perf_counter() - started:.0f} s", flush=True)
    per_evaluation = (time.perf_counter() - phase_1) / len(groups)
    best, demoted = a16, []
    if len(groups) == len(all_groups):
        for tensor in sorted(groups, key=lambda t: loss[t]):
            candidate = evaluate(PrecisionPlan.a16w8().with_overrides({t: "uint8" for t in demoted + [tensor]}))
            if not meets(candidate.value, threshold, study.higher_is_better):
                break
            demoted.append(tensor)
            best = candidate
        return {"evaluations": evaluations, "seconds": time.perf_counter() - started, "best": best,
                "threshold": threshold, "demoted": len(demoted), "groups": len(all_groups), "complete": True}
    # Extrapolated: every group once, the baselines, and at least one step of the walk.
    count = len(all_groups) + 3
    return {"evaluations": count, "seconds": per_evaluation * count, "best": None, "threshold": threshold,
            "demoted": None, "groups": len(all_groups), "complete": False, "measured_groups": len(groups),
            "per_evaluation": per_evaluation}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="a16w8+10%")
    parser.add_argument("--samples", type=int, default=100, help="evaluation lines per evaluation")
    parser.add_argument("--amp-groups", type=int, default=24,
                        help="time AMP's phase 1 on the first N groups and extrapolate (default 24)")
    parser.add_argument("--full", action="store_true", help="run AMP's both phases to the end (hours)")
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
    amp = amp_style(amp_study, args.target, None if args.full else args.amp_groups)
    ours_est = ours.recommended.latency("estimate")
    if amp["complete"]:
        best = amp["best"]
        est = best.latency("estimate")
        print(f"\nAMP-style search: {amp['evaluations']} evaluations ({amp['groups']} groups in phase 1), "
              f"{amp['seconds']:.1f} s; final CER {best.value:.4f} with {amp['demoted']} groups demoted to 8 bits"
              + (f", {est.ms:.3f} ms estimated" if est else ""))
        print(f"final CER: mpstudio {ours.recommended.value:.4f}" + (f" at {ours_est.ms:.3f} ms" if ours_est else "")
              + f"; AMP-style {best.value:.4f}" + (f" at {est.ms:.3f} ms" if est else "")
              + " (estimated latency, HTP cost model)")
        bound = ""
    else:
        print(f"\nAMP-style search: phase 1 timed on {amp['measured_groups']} of {amp['groups']} groups: "
              f"{amp['per_evaluation']:.1f} s per evaluation; the whole search needs at least {amp['evaluations']} "
              f"evaluations ({amp['groups']} groups + 2 baselines + 1 walk step), at least "
              f"{amp['seconds']:.0f} s. Its walk keeps the last plan that reaches the target, so it ends at the "
              "target too (a16w8 at worst).")
        print(f"final CER: mpstudio {ours.recommended.value:.4f}" + (f" at {ours_est.ms:.3f} ms" if ours_est else "")
              + f" (threshold {ours.threshold:.4f})")
        bound = "at least "
    ratio = ours.evaluations / amp["evaluations"]
    print(f"evaluations: {ours.evaluations} vs {bound}{amp['evaluations']} = {'at most ' if bound else ''}{ratio:.3f}x "
          f"(target <= 0.2: {'met' if ratio <= 0.2 else 'MISSED'}); wall time {ours_seconds:.0f} s vs {bound}"
          f"{amp['seconds']:.0f} s = {'at most ' if bound else ''}{ours_seconds / amp['seconds']:.3f}x")
    ours_study.close()
    amp_study.close()
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
