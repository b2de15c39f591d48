"""The model commands: `prepare` (check a float model), `quantize` (write a plan's QDQ model), `analyze`
(rank tensors by quantization sensitivity)."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

from ..errors import MpstudioError
from .arguments import add_quiet_arg, add_ray_arg, add_shape_arg, open_ray, prepare_for_data
from .progress import progress_bar


def _prepare(args) -> int:
    from ..model import parse_shape_args, prepare_model

    prepared = prepare_model(args.model, parse_shape_args(args.shape), rewrite=not args.no_rewrites)
    print(prepared.report())
    if args.output:
        prepared.save(args.output)
        print(f"prepared model written to {args.output}")
    return 0 if prepared.qnn_ready or not args.strict else 3


def open_model_data_plan(args, calibration_samples: int | None = None, calibrate_on_all: bool = False,
                         method: str = "minmax"):
    """What `quantize` and `analyze` share: the prepared model, its plan, its data and a Quantizer.

    Returns `(quantizer, plan, data)`; `data` holds the first `--samples` samples when given. The quantizer
    calibrates on the first `calibration_samples` when given, else on every sample of the folder when
    `calibrate_on_all`, else on `data`.
    """
    from ..cache import cache_root
    from ..data import NpzFolder
    from ..plan import PrecisionPlan
    from ..quantize import Quantizer

    prepared = prepare_for_data(args.model, args.shape, args.data)
    plan = PrecisionPlan.load(args.plan) if args.plan else PrecisionPlan.a8w8()
    folder = NpzFolder(args.data, [spec.name for spec in prepared.inputs])
    data = folder.head(args.samples) if args.samples else folder
    if calibration_samples:
        calibration = folder.head(calibration_samples)
    else:
        calibration = folder if calibrate_on_all else data
    cache = Path(args.cache) if args.cache else cache_root() / "quantize" / prepared.sha256[:16]
    return Quantizer(prepared, calibration, cache, method=method), plan, data


def _check_output(output: str, model: str, force: bool) -> Path:
    """The output path, refused before any work when writing it would fail or destroy something."""
    out = Path(output)
    if out.is_dir():
        raise MpstudioError(f"{out} is a folder; give the path of the .onnx file to write")
    if out.exists():
        if Path(model).exists() and out.resolve() == Path(model).resolve():
            raise MpstudioError(f"{out} is the float model itself; write the QDQ model to another file")
        if not force:
            raise MpstudioError(f"{out} already exists; pass --force to overwrite it, or choose another -o")
    return out


def _quantize(args) -> int:
    out = _check_output(args.output, args.model, args.force)
    quantizer, plan, _ = open_model_data_plan(args, method=args.method)
    with progress_bar(not args.quiet) as progress:
        path = quantizer.generate(plan, progress)
    partial = out.with_name(out.name + ".partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(path.read_bytes())
        os.replace(partial, out)  # a failed write leaves any earlier file whole
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise MpstudioError(f"cannot write {out}: {exc.strerror or exc}") from None
    print(f"{plan.summary()} -> {out}")
    note = quantizer.range_note(plan)
    if note:
        print(note)
    if args.htp_arch:
        from ..latency import estimate_latency

        estimate = estimate_latency(out, args.htp_arch)
        print(f"estimated latency: {estimate.htp}\n                   {estimate.latency}")
    return 0


def _analyze(args) -> int:
    with ExitStack() as stack:  # the cluster first: one that cannot be reached fails before any work
        return _analyze_on(args, open_ray(args, stack))


def _analyze_on(args, cluster) -> int:
    from ..sensitivity import analyze, analyze_progressive

    # Calibration uses every sample unless told otherwise, whatever --samples scores.
    quantizer, plan, data = open_model_data_plan(args, args.calibration_samples, calibrate_on_all=True)
    for rewrite in quantizer.prepared.rewrites:  # what preparation changed in the graph being scored
        print(f"prepared: {rewrite.step}")
    if not quantizer.prepared.qnn_ready:
        nodes = quantizer.prepared.fallback_nodes
        print(f"note: {len(nodes)} node(s) would run on CPU on QNN HTP: {', '.join(nodes[:5])}"
              + (" ..." if len(nodes) > 5 else "") + " (mpstudio prepare MODEL says why)")
    with progress_bar(not args.quiet) as progress:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        progress.log_to(args.out)  # the report's folder keeps the native log of its runs
        if args.exhaustive:
            report = analyze(quantizer, data, plan, isolation=not args.no_isolation,
                             isolation_samples=args.isolation_samples, selection=args.select or (), progress=progress)
        else:
            report = analyze_progressive(quantizer, data, plan, isolation=not args.no_isolation,
                                         isolation_samples=args.isolation_samples, selection=args.select or (),
                                         workers=cluster if cluster is not None else args.workers,
                                         cache_dir=quantizer.cache_dir / "sensitivity", progress=progress)
    out = report.save(args.out)
    print(report.summary(args.top, notes=False))
    if report.status():
        print(report.status())
    print(f"report written to {out / 'report.html'} (tables: ranking.csv, tensors.csv, weights.csv)")
    return 0


def add_prepare_parser(sub) -> None:
    p = sub.add_parser("prepare", help="check and prepare a float model; print the QNN support report")
    p.add_argument("model", help="float ONNX model")
    add_shape_arg(p)
    p.add_argument("-o", "--output", help="write the prepared model here")
    p.add_argument("--strict", action="store_true", help="exit with status 3 when a node would fall back to CPU")
    p.add_argument("--no-rewrites", action="store_true",
                   help="leave exporter patterns as they are (no Erf-GELU to Gelu, mask clamp, Where rewrite)")
    p.set_defaults(func=_prepare)


def add_quantize_parser(sub) -> None:
    q = sub.add_parser("quantize", help="write the QDQ model of a precision plan (and print its estimated latency)")
    q.add_argument("model", help="float ONNX model")
    q.add_argument("--data", required=True, help="folder of calibration samples (.npz per sample, keys = input names)")
    q.add_argument("--plan", help="precision plan JSON (default: all 8-bit)")
    q.add_argument("-o", "--output", required=True, help="where to write the QDQ model")
    q.add_argument("--force", action="store_true", help="overwrite the output file when it exists")
    add_shape_arg(q)
    q.add_argument("--samples", type=int, help="use only the first N calibration samples")
    q.add_argument("--method", default="minmax", choices=["minmax", "entropy", "percentile"], help="calibration method")
    q.add_argument("--cache", help="cache folder for calibration ranges and generated models")
    q.add_argument("--htp-arch", default="75", help="HTP architecture of the printed latency estimate")
    add_quiet_arg(q)
    q.set_defaults(func=_quantize)


def add_analyze_parser(sub) -> None:
    a = sub.add_parser("analyze", help="rank tensors by quantization sensitivity; write CSV and HTML")
    a.add_argument("model", help="float ONNX model")
    a.add_argument("--data", required=True, help="folder of samples (.npz per sample, keys = input names)")
    a.add_argument("--plan", help="precision plan JSON whose QDQ model is scored (default: all 8-bit)")
    a.add_argument("--out", required=True, help="folder for ranking.csv, tensors.csv, weights.csv, report.html")
    add_shape_arg(a)
    a.add_argument("--samples", type=int, help="score on the first N samples only")
    a.add_argument("--calibration-samples", type=int, help="calibrate on the first N samples (default: all)")
    a.add_argument("--isolation-samples", type=int, default=8, help="samples per isolation evaluation")
    a.add_argument("--no-isolation", action="store_true", help="skip isolation scores (much faster)")
    a.add_argument("--select", action="append", metavar="TENSOR", help="add a region of these tensors")
    a.add_argument("--exhaustive", action="store_true",
                   help="isolate every tensor (default: only those that can change the top of the ranking)")
    a.add_argument("--workers", type=int, help="worker processes (default: one per core; 0: none)")
    add_ray_arg(a)
    a.add_argument("--top", type=int, default=20, help="rows of the ranking to print")
    a.add_argument("--cache", help="cache folder for calibration ranges and generated models")
    add_quiet_arg(a)
    a.set_defaults(func=_analyze)
