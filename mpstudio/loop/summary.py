"""A study as plain text (`mpstudio study show`): what it is, every evaluation of one latency source with the
front marked, the plans another accuracy source scored too, and the plans a backend could not build."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..metrics import MetricSpec
from ..value_text import step_text, value_text


def summary_text(name: str, folder: Path, spec: MetricSpec, samples: int, htp_arch: str, front: pd.DataFrame,
                 checks: pd.DataFrame, float_value: float | None, latency_source: str, unbuilt=()) -> str:
    """Study `name` in `folder` (metric `spec`, `samples` evaluation samples, target `htp_arch`), then `front`
    (`front.front` of `latency_source`) as a table, then `checks` (`front.cross_checks`), then `unbuilt` (the
    `build_failures.BuildFailure`s of the study). `float_value`: the float model's metric when it is known."""
    return "\n".join([_evaluated(name, folder, spec, samples, htp_arch, front, checks, float_value, latency_source),
                      *unbuilt_lines(unbuilt)])


def unbuilt_lines(unbuilt) -> list[str]:
    """One line per plan a backend could not build: "cannot build on <backend>: <reason>", its estimate, tries."""
    lines = []
    for f in unbuilt:
        estimate = f"; estimated {f.estimate_ms:.3f} ms" if f.estimate_ms is not None else ""
        tried = (f"; built {f.attempts} times, the last with onnxruntime-qnn {f.toolchain.get('onnxruntime_qnn')}"
                 if f.attempts > 1 else "")
        lines.append(f"plan {f.plan_id} {f.name} cannot build on {f.where} ({f.target}): {f.reason}{estimate}{tried}")
    if lines:
        lines.append(f"{len(lines)} plan(s) cannot be built; a search avoids them, and they are built again only when "
                     "onnxruntime, onnxruntime-qnn or the target architecture changes")
    return lines


def _evaluated(name: str, folder: Path, spec: MetricSpec, samples: int, htp_arch: str, front: pd.DataFrame,
               checks: pd.DataFrame, float_value: float | None, latency_source: str) -> str:
    metric_name = spec.name
    lines = [f"study {name} ({folder})",
             f"metric: {spec.describe()} ({'higher' if spec.higher_is_better else 'lower'} is better); "
             f"evaluation samples: {samples}; target HTP v{htp_arch}"]
    if front.empty:
        lines.append(f"no evaluations with {latency_source} latency yet")
        return "\n".join(lines)
    lines.append(f"accuracy from {front['accuracy_source'].iloc[0]}; latency: {front['latency_label'].iloc[0]}")
    if float_value is not None:
        lines.append(f"float model (ORT CPU): {metric_name} {value_text(float_value)}")
    show = front[["plan_id", "name", "origin", "sixteen_bit", "value", "latency_ms", "pareto"]].copy()
    if front["latency_low_ms"].notna().any():  # an estimate's interval, beside it
        show.insert(6, "interval (ms)", [f"{lo:.3f}-{hi:.3f}" if lo == lo else "-"
                                         for lo, hi in zip(front["latency_low_ms"], front["latency_high_ms"])])
    if "value_low" in front and front["value_low"].notna().any():  # the value's interval over the samples
        show.insert(5, "95 % interval", [f"{value_text(lo)}-{value_text(hi)}" if lo == lo else "-"
                                          for lo, hi in zip(front["value_low"], front["value_high"])])
    show["pareto"] = show["pareto"].map({True: "*", False: ""})
    show["value"] = [value_text(v) for v in show["value"]]  # a cosine near 1 keeps the digits that tell plans apart
    show = show.rename(columns={"value": metric_name, "latency_ms": "latency (ms)", "pareto": "front",
                                "sixteen_bit": "16-bit"})
    lines.append(show.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    lines.append(f"{int(front['pareto'].sum())} plan(s) on the front; * marks them")
    steps = front["resolution"].dropna() if "resolution" in front else ()
    if len(steps):
        lines.append(f"resolution: one count of {metric_name} weighs {step_text(steps.max())} (a difference smaller "
                     "than "
                     "that, or inside the intervals, is within noise; compare two plans with mpstudio evaluate "
                     "--versus)")
    for source, rows in checks.groupby("other_source", sort=False):
        lines.append(f"also scored on {source}: " + "; ".join(
            f"plan {r.plan_id} {r.name} {value_text(r.other_value)} ({value_text(r.value)} above)"
            for r in rows.itertuples()))
    return "\n".join(lines)
