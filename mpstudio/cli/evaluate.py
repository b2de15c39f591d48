"""`mpstudio evaluate STUDY`: one plan of a study evaluated on a chosen backend (a plan JSON file, a baseline
such as a16w8-pc, or a stored plan's id or name), its value, latency and where each comes from printed."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MpstudioError
from ..value_text import value_text
from .arguments import add_quiet_arg, add_runner_args, open_runner
from .progress import progress_bar


def resolve(study, text: str):
    """The plan `text` names: a baseline (a8w8, a16w8, a8w8-pc, a16w8-pc), a plan JSON file, or a stored plan's
    id, name or hash prefix."""
    from ..diverge import resolve_plan
    from ..search import named_baselines

    stored = study.plans()
    if text in named_baselines() and not (stored["name"] == text).any():
        return named_baselines()[text]
    if text.endswith(".json") and Path(text).is_file():
        from ..plan import PrecisionPlan

        try:
            return PrecisionPlan.load(text)
        except (ValueError, KeyError, TypeError) as exc:  # a file that is not a plan
            raise MpstudioError(f"{text} is not a plan JSON file ({exc}); write one with PrecisionPlan.save or "
                                "take one from mpstudio export --format ort") from exc
    return resolve_plan(study, text)


def _evaluate(args) -> int:
    from contextlib import ExitStack

    from ..study import STUDY_FILE, Study

    if not (Path(args.folder) / STUDY_FILE).exists():
        raise MpstudioError(f"{args.folder} is not a study folder (no {STUDY_FILE}); create one with mpstudio search "
                            "MODEL --data DIR --study DIR")
    with ExitStack() as stack, progress_bar(not args.quiet) as progress:
        study = stack.enter_context(Study.open(args.folder))
        progress.log_to(study.folder)
        plan = resolve(study, args.plan)
        runner = open_runner(args, stack)
        versus = resolve(study, args.versus) if args.versus else None
        if versus is not None:  # the plan compared with is evaluated on the same backend and samples
            versus = study.evaluate(versus, args.backend, runner, origin="evaluate", progress=progress)
        done = study.evaluate(plan, args.backend, runner, origin="evaluate", progress=progress)
        paired = study.compare(done.plan_id, versus.plan_id, done.accuracy_source) if versus is not None else None
        note = study.quantizer.range_note(plan)
    for placement in () if args.json else getattr(runner, "placements", ()):
        print(f"ran on Ray: {placement.describe()}")
    if args.json:
        print(json.dumps({"plan_id": done.plan_id, "name": done.name, "metric": done.metric, "value": done.value,
                          "interval": [done.low, done.high] if done.low is not None else None,
                          "resolution": done.resolution,
                          "accuracy_source": done.accuracy_source, "samples": done.samples, "cached": done.cached,
                          "latencies": [{"ms": lat.ms, "source": lat.source, "label": str(lat)}
                                        for lat in done.latencies],
                          "versus": paired.to_json() if paired is not None else None,
                          "warning": note or None}, indent=2))
        return 0
    print(f"plan {done.plan_id} {done.name}: {done.metric} {value_text(done.value)}{done.interval_text()} "
          f"[{done.accuracy_source}, {done.samples} samples]" + (" (already in the study)" if done.cached else ""))
    if paired is not None:
        print(f"  paired: {paired.describe()}")
    for lat in done.latencies:
        print(f"  latency: {lat}")
    if note:
        print(note)
    if not done.latencies:
        print("  latency: none (the cost model could not read this plan's model)")
    return 0


def add_evaluate_parser(sub) -> None:
    e = sub.add_parser("evaluate", help="evaluate one plan of a study (a plan JSON file, a baseline such as "
                                        "a16w8-pc, or a stored plan) on a chosen backend")
    e.add_argument("folder", metavar="STUDY", help="study folder")
    e.add_argument("--plan", required=True,
                   help="a plan JSON file, a baseline (a8w8, a16w8, a8w8-pc, a16w8-pc), or a stored plan's id, name "
                        "or hash (see mpstudio study show)")
    e.add_argument("--backend", default="cpu", choices=["cpu", "htp"],
                   help="where accuracy is measured: ORT's CPU QDQ run, or the HTP (the local emulator, or --agent)")
    e.add_argument("--versus", metavar="PLAN",
                   help="also compare with this plan (same forms as --plan) on the same samples: the difference with "
                        "its 95 %% interval (paired bootstrap), and whether it is within noise")
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    add_runner_args(e)
    add_quiet_arg(e)
    e.set_defaults(func=_evaluate)
