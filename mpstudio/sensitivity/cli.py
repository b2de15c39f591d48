"""`mpstudio analyze`: score every tensor of a model, print the top of the ranking, write CSV + HTML."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    a = subparsers.add_parser("analyze", help="rank tensors by quantization sensitivity; write CSV and HTML")
    a.add_argument("model", help="float ONNX model")
    a.add_argument("--data", required=True, help="folder of samples (.npz per sample, keys = input names)")
    a.add_argument("--plan", help="precision plan JSON whose QDQ model is scored (default: all 8-bit)")
    a.add_argument("--out", required=True, help="folder for ranking.csv, tensors.csv, weights.csv, report.html")
    a.add_argument("--shape", action="append", metavar="NAME=D1,D2,...", help="fix a dynamic input's shape")
    a.add_argument("--samples", type=int, help="score on the first N samples only")
    a.add_argument("--calibration-samples", type=int, help="calibrate on the first N samples (default: all)")
    a.add_argument("--isolation-samples", type=int, default=8, help="samples per isolation evaluation")
    a.add_argument("--no-isolation", action="store_true", help="skip isolation scores (much faster)")
    a.add_argument("--select", action="append", metavar="TENSOR", help="add a region of these tensors")
    a.add_argument("--top", type=int, default=20, help="rows of the ranking to print")
    a.add_argument("--cache", help="cache folder for calibration ranges and generated models")
    a.add_argument("--quiet", action="store_true", help="no progress bars")
    a.set_defaults(func=run_analyze)


def run_analyze(args) -> int:
    from ..cli import open_model_data_plan, progress_bar
    from .analysis import analyze

    # Calibration uses every sample unless told otherwise, whatever --samples scores.
    quantizer, plan, data = open_model_data_plan(args, args.calibration_samples, calibrate_on_all=True)
    with progress_bar(not args.quiet) as progress:
        report = analyze(quantizer, data, plan, isolation=not args.no_isolation,
                         isolation_samples=args.isolation_samples, selection=args.select or (), progress=progress)
    out = report.save(args.out)
    print(report.summary(args.top))
    print(f"report written to {out / 'report.html'} (tables: ranking.csv, tensors.csv, weights.csv)")
    return 0
