"""`mpstudio evaluate STUDY`: one plan of a study evaluated on a chosen backend (a plan JSON file, a baseline
such as a16w8-pc, or a stored plan's id or name), its value, latency and where each comes from printed."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MpstudioError
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
        done = study.evaluate(plan, args.backend, runner, origin="evaluate", progress=progress)
    for placement in () if args.json else getattr(runner, "placements", ()):
        print(f"ran on Ray: {placement.describe()}")
    if args.json:
        print(json.dumps({"plan_id": done.plan_id, "name": done.name, "metric": done.metric, "value": done.value,
                          "accuracy_source": done.accuracy_source, "samples": done.samples, "cached": done.cached,
                          "latencies": [{"ms": lat.ms, "source": lat.source, "label": str(lat)}
                                        for lat in done.latencies]}, indent=2))
        return 0
    print(f"plan {done.plan_id} {done.name}: {done.metric} {done.value:.4f} [{done.accuracy_source}, "
          f"{done.samples} samples]" + (" (already in the study)" if done.cached else ""))
    for lat in done.latencies:
        print(f"  latency: {lat}")
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
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    add_runner_args(e)
    add_quiet_arg(e)
    e.set_defaults(func=_evaluate)
