"""The study commands: `search`, `study show|resume|calibrate`, `export`, `import` and `diverge`, and how
they open a study (an existing folder, a new one from MODEL and --data, or the demo)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import MpstudioError
from .arguments import add_quiet_arg, add_runner_args, add_shape_arg, open_runner, prepare_for_data
from .progress import progress_bar


# The options with which `search` creates a study; commands without them (import, diverge) create one with
# these defaults.
_STUDY_OPTIONS = ("metric", "metric_args", "metric_direction", "charset", "labels", "calibration_samples",
                  "eval_samples")


def _open_study(args, progress):
    """The study of `--study` (reopened when it exists), else a new one from MODEL and --data, or the demo."""
    for option in _STUDY_OPTIONS:
        if not hasattr(args, option):
            setattr(args, option, None)
    from ..study import STUDY_FILE, Study

    spec = _metric_arg(args)
    if args.demo:
        if spec is not None:
            raise MpstudioError("the demo is scored by its CER; --metric is for a study of your own model")
        return Study.demo(args.study, progress=progress)
    folder = Path(args.study) if args.study else None
    if folder is not None and (folder / STUDY_FILE).exists():
        study = Study.open(folder)
        if spec is not None and spec.to_json() != study.metric_spec.to_json():
            study.close()
            raise MpstudioError(f"{folder} is a study scored by {study.metric_spec.describe()}; a study keeps one "
                                "metric: drop --metric to continue it, or give a new --study folder")
        for option, what, count, source in (
                ("--calibration-samples", "calibration", args.calibration_samples, study.calibration),
                ("--eval-samples", "evaluation", args.eval_samples, study.evaluation_data)):
            if count is not None and count != len(source):
                study.close()
                raise MpstudioError(f"{folder} was created with {len(source)} {what} samples; {option} applies when "
                                    "a study is created: drop it, or give a new --study folder")
        return study
    if not args.model or not args.data:
        raise MpstudioError("give MODEL and --data to start a study (or --study DIR of an existing one, or --demo)")
    from ..data import NpzFolder

    prepared = prepare_for_data(args.model, args.shape, args.data)
    names = [spec.name for spec in prepared.inputs]
    calibration = NpzFolder(args.data, names)
    evaluation = NpzFolder(args.eval_data, names) if args.eval_data else calibration
    folder = folder or Path(f"{Path(args.model).stem}.study")
    if (folder / STUDY_FILE).exists():
        return Study.open(folder)
    before = set(folder.iterdir()) if folder.is_dir() else None
    study = Study.create(folder, prepared, calibration, evaluation, spec, htp_arch=args.htp_arch,
                         calibration_samples=args.calibration_samples, evaluation_samples=args.eval_samples,
                         progress=progress, allow_fallback=getattr(args, "allow_fallback", False))
    if spec is not None:
        try:  # the float model's own value: "float" targets are relative to it, and a broken metric fails now
            study.float_value(progress)
        except MpstudioError as exc:
            study.close()
            # A study keeps one metric: left in place, it would refuse the command with the metric fixed.
            _undo_creation(folder, before)
            raise MpstudioError(f"{exc}; {folder} was not created: fix the metric and run the command again") from exc
        except BaseException:
            study.close()
            raise
    return study


def _undo_creation(folder: Path, before: set | None) -> None:
    """Remove what creating a study added to `folder` (the folder too when `before` is None: it was not there)."""
    import shutil

    for item in [] if before is None else set(folder.iterdir()) - before:
        shutil.rmtree(item, ignore_errors=True) if item.is_dir() else item.unlink(missing_ok=True)
    if before is None:
        shutil.rmtree(folder, ignore_errors=True)


def _metric_arg(args):
    """The MetricSpec of `--metric` and its options (None without --metric)."""
    from ..metrics import metric_spec

    if not args.metric:
        for option, value in (("--metric-args", args.metric_args), ("--metric-direction", args.metric_direction),
                              ("--charset", args.charset), ("--labels", args.labels)):
            if value is not None:
                raise MpstudioError(f"{option} goes with --metric")
        return None
    return metric_spec(args.metric, args=args.metric_args, direction=args.metric_direction, charset=args.charset,
                       labels=args.labels)


def _search(args) -> int:
    from contextlib import ExitStack

    from ..search import path_frame, search

    with ExitStack() as stack, progress_bar(not args.quiet) as progress:
        runner = open_runner(args, stack)  # first: a cluster that cannot be reached fails before any work
        study = stack.enter_context(_open_study(args, progress))
        progress.log_to(study.folder)
        print(f"study: {study.folder}")
        result = search(study, args.target, latency_budget_ms=args.latency_budget,
                        max_evaluations=args.max_evaluations, backend=args.backend, runner=runner,
                        weights=args.weights, sensitivity_samples=args.sensitivity_samples,
                        isolation_samples=args.isolation_samples, confirm=None if args.no_confirm else "htp",
                        confirm_plans=args.confirm_plans, progress=progress, quiet=args.quiet)
        print(result.describe())
        note = study.quantizer.range_note(study.plan(result.recommended.plan_id))  # the pick's own precisions
        if note:
            print(note)
        for baseline in result.baselines.values():  # a baseline far off for a clipped bias says why
            if baseline.plan_id != result.recommended.plan_id:
                clipped = study.quantizer.bias_note(study.plan(baseline.plan_id))
                if clipped:
                    print(clipped)
        print("\nevaluations along the way:")
        print(path_frame(result).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print()
        print(study.summary())
        print(f"\nexport it: mpstudio export {study.folder} --plan {result.recommended.plan_id} --format all")
    return 0 if result.reached else 1


def _study_show(args) -> int:
    from ..study import Study

    with Study.open(args.folder) as study:
        if args.json:
            import json

            frame = study.front(args.latency_source)
            print(json.dumps(json.loads(frame.to_json(orient="records")), indent=2))
            return 0
        print(study.summary(args.latency_source))
        jobs = study.jobs()
        pending = int((jobs["status"] == "pending").sum()) if len(jobs) else 0
        searches = study.searches()
        status = searches["status"]
        running = int((status == "running").sum())
        unfinished = int(status.isin(["interrupted", "cancelled", "failed"]).sum())
        if running:
            print(f"{running} search(es) running now in another process")
        if pending or unfinished:
            print(f"{pending} pending evaluation(s), {unfinished} unfinished search(es): "
                  f"mpstudio study resume {args.folder}")
    return 0


def _study_calibrate(args) -> int:
    from ..study import Study

    with Study.open(args.folder) as study:
        calibration = study.recalibrate(args.device, allow_emulator=args.allow_emulator)
        print(calibration.describe())
        print(study.summary())
    return 0


def _study_resume(args) -> int:
    from contextlib import ExitStack

    from ..search import resume
    from ..study import Study

    with ExitStack() as stack, progress_bar(not args.quiet) as progress:
        study = stack.enter_context(Study.open(args.folder))
        progress.log_to(study.folder)
        done, searches = resume(study, open_runner(args, stack), progress=progress)
        print(f"{len(done)} pending evaluation(s) run, {len(searches)} search(es) continued")
        for result in searches:
            print(result.describe())
        print(study.summary())
    return 0


def _diverge(args) -> int:
    from contextlib import ExitStack

    from ..diverge import diverge
    from ..study import STUDY_FILE

    target = Path(args.target) if args.target else None
    if target is not None and target.is_dir():
        if not (target / STUDY_FILE).exists():
            raise MpstudioError(f"{target} is not a study folder (no {STUDY_FILE}); give a study folder or a model "
                                "file")
        args.study, args.model = str(target), None
    else:
        args.model = args.target
    with ExitStack() as stack, progress_bar(not args.quiet) as progress:
        study = stack.enter_context(_open_study(args, progress))
        progress.log_to(study.folder)
        report = diverge(study, args.plan, samples=args.samples, chunk_size=args.chunk, threshold_steps=args.threshold,
                         runner=open_runner(args, stack), progress=progress)
    print(report.describe(args.top))
    print(f"full table: {report.csv_path}")
    return 0


def _export(args) -> int:
    from contextlib import ExitStack

    from ..diverge import resolve_plan
    from ..export import export_plan
    from ..study import Study

    formats = {"ort": ("ort",), "qnn": ("qnn",), "model": ("model",), "context": ("context",),
               "float": ("float",), "all": ("ort", "qnn", "model", "float")}[args.format]
    with ExitStack() as stack:
        study = stack.enter_context(Study.open(args.folder))
        plan = resolve_plan(study, args.plan)  # as `evaluate --plan` reads it: an id, a name, a baseline, a file
        agent = None
        if args.format == "context" or args.agent or args.local_agent:
            runner = open_runner(args, stack)
            if runner is None:
                raise MpstudioError("a context binary is built on the device: give --agent URL or --local-agent")
            agent = runner.healthy()[0] if hasattr(runner, "healthy") else runner
            if args.format == "all":
                formats = formats + ("context",)
        plan_id = study.plan_id(plan)
        out = Path(args.output) if args.output else study.folder / "exports" / (
            f"plan-{plan_id}" if plan_id is not None else f"plan-{plan.hash}")
        result = export_plan(study.quantizer, plan, out, formats, agent=agent,
                             provider_options={"htp_arch": study.htp_arch}, with_parameters=args.pin_parameters,
                             encodings_version=args.encodings_version)
    print(f"plan {args.plan} ({plan.summary()}) exported:")
    for path in result.paths():
        print(f"  {path}")
    for note in () if args.quiet else result.notes:
        print(f"\n{note}")
    return 0


def _import(args) -> int:
    from contextlib import ExitStack

    with ExitStack() as stack, progress_bar(not args.quiet) as progress:
        study = stack.enter_context(_open_study(args, progress))
        progress.log_to(study.folder)
        imported = study.import_plan(args.source, name=args.name)
        print(f"study: {study.folder}")
        print(imported.describe())
        if args.evaluate:
            done = study.evaluate(imported.plan, args.backend, open_runner(args, stack), origin="import", progress=progress)
            print(done.describe())
    print(f"\nexport it: mpstudio export {study.folder} --plan {imported.plan_id}")
    return 0


def add_search_parser(sub) -> None:
    s = sub.add_parser("search", help="find the cheapest mixed-precision plan that reaches a target accuracy")
    s.add_argument("model", nargs="?", help="float ONNX model (not needed to continue an existing --study)")
    s.add_argument("--data", help="calibration samples (.npz per sample, keys = input names)")
    s.add_argument("--eval-data", help="evaluation samples (default: the calibration samples)")
    s.add_argument("--study", help="study folder (created when new, continued when it exists; default MODEL.study)")
    s.add_argument("--demo", action="store_true", help="search the built-in demo (PP-OCRv4 recognizer, CER)")
    s.add_argument("--target", default="a16w8+10%",
                   help="what to reach: a metric value (0.14); 'float' (the float model's value; needs --metric); a "
                        "baseline (a8w8, a16w8, a8w8-pc, a16w8-pc: per-channel int8 weights) or any stored plan's "
                        "name; each with a margin toward worse, whichever the sign: 'float-1%%', 'a16w8-pc+5%%', "
                        "'PLAN+2%%' (default a16w8+10%%)")
    s.add_argument("--metric", metavar="NAME|MODULE:FUNCTION",
                   help="the study's task metric (when the study is created): a built-in (top1: top-1 agreement "
                        "with the float model, over the last axis; a 4-D output names its class axis: "
                        "--metric-args '{\"axis\": 1}' for N, C, H, W; cosine or snr of the outputs; cer with --charset [--labels]; "
                        "recall@K over paired samples) or module:function, a function fn(outputs, reference, "
                        "**args) -> float importable from PYTHONPATH (see mpstudio.metrics). Stored by reference: "
                        "later commands evaluate it again (default: output SNR against the float model)")
    s.add_argument("--metric-args", metavar="JSON", help="keyword arguments of the metric function, a JSON object")
    s.add_argument("--metric-direction", choices=["higher", "lower"],
                   help="whether a higher value of a module:function metric is better (when the function has no "
                        "higher_is_better attribute)")
    s.add_argument("--charset", metavar="FILE", help="for --metric cer: the CTC character list, one per line")
    s.add_argument("--labels", metavar="FILE",
                   help="for --metric cer: one reference text per evaluation sample (default: the float model's text)")
    s.add_argument("--calibration-samples", type=int, metavar="N",
                   help="when creating the study: calibrate on the first N samples of --data")
    s.add_argument("--eval-samples", type=int, metavar="N",
                   help="when creating the study: evaluate on the first N evaluation samples")
    s.add_argument("--sensitivity-samples", type=int, default=32, metavar="N",
                   help="calibration samples of the sensitivity analysis (default 32)")
    s.add_argument("--isolation-samples", type=int, default=8, metavar="N",
                   help="samples per isolation evaluation of the sensitivity analysis (default 8)")
    s.add_argument("--max-evaluations", type=int, default=24, help="evaluation budget, baselines included")
    s.add_argument("--latency-budget", type=float, metavar="MS", help="largest estimated latency allowed (ms)")
    s.add_argument("--backend", default="cpu", choices=["cpu", "htp"], help="where accuracy is measured")
    s.add_argument("--no-confirm", action="store_true",
                   help="skip the confirmation on the HTP (by default, a search on the CPU evaluates its pick and its "
                        "neighbours on the front on the HTP, the local emulator or --agent's device, recommends on "
                        "the HTP's numbers and says where CPU and HTP disagree)")
    s.add_argument("--confirm-plans", type=int, default=3, metavar="N",
                   help="plans of the front confirmed on the HTP at most (default 3; each is a full evaluation)")
    s.add_argument("--confirm", action="store_true", help=argparse.SUPPRESS)  # the default since it was added
    s.add_argument("--weights", default="auto", choices=["auto", "per-tensor", "per-channel", "mixed"],
                   help="weight quantization of the base plan (auto: per-channel int8 when it clearly helps; "
                        "mixed: int4 matrix weights, each promoted to int8/int16 with the activations)")
    add_shape_arg(s)
    s.add_argument("--allow-fallback", action="store_true",
                   help="accept a model with nodes QNN HTP cannot run: HTP evaluations run them on ORT's CPU EP and "
                        "every HTP number says \"HTP + N nodes on CPU\"")
    s.add_argument("--htp-arch", default="75", help="target HTP architecture (cost model and HTP runs)")
    add_runner_args(s)
    add_quiet_arg(s)
    s.set_defaults(func=_search)


def add_study_parser(sub) -> None:
    from ..sources import LATENCY_SOURCES

    st = sub.add_parser("study", help="show or resume a study")
    st_sub = st.add_subparsers(dest="study_command", metavar="COMMAND")
    st_sub.required = True
    show = st_sub.add_parser("show", help="every evaluated plan and the accuracy/latency front")
    show.add_argument("folder", help="study folder")
    show.add_argument("--latency-source", default="estimate", choices=list(LATENCY_SOURCES))
    show.add_argument("--json", action="store_true", help="print the table as JSON")
    show.set_defaults(func=_study_show)
    resume = st_sub.add_parser("resume", help="run pending evaluations and continue unfinished searches")
    resume.add_argument("folder", help="study folder")
    add_runner_args(resume)
    add_quiet_arg(resume)
    resume.set_defaults(func=_study_resume)
    calibrate = st_sub.add_parser("calibrate", help="refit the HTP cost model on the per-op profiles of a device's "
                                                    "runs and re-estimate every plan")
    calibrate.add_argument("folder", help="study folder")
    calibrate.add_argument("--device", help="the device whose profiles to use (default: the one with the most)")
    calibrate.add_argument("--allow-emulator", action="store_true",
                           help="accept HTP emulator profiles (host time: the label says so)")
    calibrate.set_defaults(func=_study_calibrate)


def add_export_parser(sub) -> None:
    e = sub.add_parser("export", help="write a plan's ORT overrides, QNN encodings, QDQ model (and context binary)")
    e.add_argument("folder", help="study folder")
    e.add_argument("--plan", required=True, help="a stored plan's id, name or hash (see mpstudio study show), a "
                                                 "baseline (a8w8, a16w8, a8w8-pc, a16w8-pc) or a plan JSON file")
    e.add_argument("--format", default="all", choices=["ort", "qnn", "model", "float", "context", "all"],
                   help="ort: TensorQuantOverrides JSON; qnn: QNN/AIMET encodings JSON; model: the QDQ model; "
                        "float: the prepared float model the encodings name; context: the QNN context binary "
                        "(needs an agent); all: ort, qnn, model and float (and context with an agent)")
    e.add_argument("--pin-parameters", action=argparse.BooleanOptionalAction, default=True,
                   help="pin each activation's scale and zero point in the ORT overrides (the default: ORT's "
                        "quantizer then reproduces the model on any calibration data; without, it calibrates "
                        "on its own and the model differs)")
    e.add_argument("--encodings-version", default="1.0.0", choices=["1.0.0", "0.6.1"],
                   help="AIMET encodings format of the qnn file: 1.0.0 (default; what aimet-onnx 2.x writes and "
                        "reads) or 0.6.1 (the older dict form, for tools that predate 1.0.0)")
    e.add_argument("-o", "--output", help="output folder (default STUDY/exports/plan-ID)")
    add_runner_args(e, ray=False)  # a context binary is built by a device's agent
    add_quiet_arg(e, "print only the files written, not the notes on what each format carries")
    e.set_defaults(func=_export)


def add_import_parser(sub) -> None:
    i = sub.add_parser("import", help="import a QDQ model (AIMET's or any) or an AIMET/QNN encodings file as a plan "
                                      "of a study, keeping its scales and zero points")
    i.add_argument("source", help="a QDQ model (.onnx) or an encodings file (AIMET 1.0.0 or the older dict form) of "
                                  "the study's float model")
    i.add_argument("--study", required=True, help="study folder (created from --model and --data when new)")
    i.add_argument("--model", help="the float ONNX model, to create the study")
    i.add_argument("--data", help="calibration samples (.npz per sample), to create the study")
    i.add_argument("--eval-data", help="evaluation samples (default: the calibration samples)")
    i.add_argument("--name", help="the plan's name (default: 'imported <file name>')")
    i.add_argument("--evaluate", action="store_true", help="evaluate the imported plan at once")
    i.add_argument("--backend", default="cpu", choices=["cpu", "htp"], help="where --evaluate measures accuracy")
    add_shape_arg(i)
    i.add_argument("--htp-arch", default="75", help="target HTP architecture of a new study")
    add_runner_args(i)
    add_quiet_arg(i)
    i.set_defaults(func=_import, demo=False)


def add_diverge_parser(sub) -> None:
    d = sub.add_parser("diverge", help="find the first tensors where the HTP and ORT's CPU disagree beyond "
                                       "quantization noise, for one plan")
    d.add_argument("target", nargs="?", metavar="MODEL_OR_STUDY",
                   help="a study folder, or a float ONNX model (with --data; its study is MODEL.study or --study)")
    d.add_argument("--plan", help="plan id, name or hash of the study, a8w8 / a16w8 / a8w8-pc / a16w8-pc, or a plan "
                                  "JSON file (default a8w8)")
    d.add_argument("--data", help="samples of a bare model (.npz per sample, keys = input names)")
    d.add_argument("--eval-data", help="evaluation samples of a bare model (default: --data); diverge runs on these")
    d.add_argument("--study", help="study folder of a bare model (default MODEL.study)")
    d.add_argument("--demo", action="store_true", help="the built-in demo (PP-OCRv4 recognizer)")
    d.add_argument("--samples", type=int, default=2, help="evaluation samples compared (HTP runs are slow; default 2)")
    d.add_argument("--chunk", type=int, default=64,
                   help="tensors exposed per HTP session (default 64; fewer outputs per session keep its graph "
                        "closer to the unmodified model's)")
    d.add_argument("--threshold", type=float, default=1.0,
                   help="a tensor diverges when HTP and CPU differ by more than this many quantization steps RMS")
    d.add_argument("--top", type=int, default=15, help="first diverging tensors to print")
    add_shape_arg(d)
    d.add_argument("--htp-arch", default="75", help="HTP architecture of a new study")
    add_runner_args(d)
    add_quiet_arg(d)
    d.set_defaults(func=_diverge)
