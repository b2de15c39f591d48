"""The `demo` command: the built-in PP-OCRv4 recognizer, CER of float / a8w8 / a16w8."""

from __future__ import annotations

from pathlib import Path

from .arguments import add_quiet_arg
from .progress import progress_bar


def _demo(args) -> int:
    from ..cache import cache_root
    from ..demos import load_demo
    from ..loop.inprocess import evaluate
    from ..plan import PrecisionPlan
    from ..quantize import Quantizer
    from ..loop.runners import CPU_SOURCE

    # The first N evaluation lines are the same whatever N: lines are drawn in order from one seed.
    demo = load_demo(evaluation_lines=args.samples) if args.samples else load_demo()
    print(demo.model.report() if args.report else f"demo: {demo.name} ({demo.model_path})")
    evaluation = demo.evaluation
    if args.export_data:
        demo.calibration.save_npz(Path(args.export_data) / "calibration")
        evaluation.save_npz(Path(args.export_data) / "evaluation")
        print(f"calibration and evaluation samples written to {args.export_data}")
    quantizer = Quantizer(demo.model, demo.calibration, cache_root() / "demo" / "quantize")
    plans = [PrecisionPlan.a8w8(), PrecisionPlan.a16w8(),
             PrecisionPlan(weight_type="int8", per_channel=True, name="a8w8 per-channel int8")]
    options = {"htp_arch": args.htp_arch} if args.backend == "htp" else None
    rows = []
    with progress_bar(not args.quiet) as progress:
        # The float reference always runs on CPU: HTP is an integer engine, and float graphs there need
        # device-specific fp16 settings.
        rows.append(("float (cpu)", evaluate(demo.model_path, evaluation, demo.metric, "cpu", None, progress)))
        for plan in plans:
            path = quantizer.generate(plan, progress)
            rows.append((plan.name, evaluate(path, evaluation, demo.metric, args.backend, options, progress)))
    print(f"\n{demo.metric.name} on {len(evaluation)} evaluation lines, backend {args.backend}"
          + (" (HTP emulator numerics)" if args.backend == "htp" else f" ({CPU_SOURCE})"))
    for name, value in rows:
        print(f"  {name:<24} {value:.4f}")
    return 0


def add_demo_parser(sub) -> None:
    d = sub.add_parser("demo", help="the built-in demo: PP-OCRv4 recognizer, CER of float / a8w8 / a16w8")
    d.add_argument("--backend", default="cpu", choices=["cpu", "htp"], help="cpu: ORT QDQ reference; htp: QNN HTP")
    d.add_argument("--htp-arch", default="75", help="HTP architecture for the htp backend")
    d.add_argument("--samples", type=int, help="evaluate on the first N evaluation lines only")
    d.add_argument("--report", action="store_true", help="print the preparation and QNN support report")
    d.add_argument("--export-data", metavar="DIR", help="also write the demo's samples as .npz folders")
    add_quiet_arg(d)
    d.set_defaults(func=_demo)
