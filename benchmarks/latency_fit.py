"""Fit the HTP cost model to Qualcomm AI Hub's published device latencies, and cross-validate the fit.

    python benchmarks/latency_fit.py            # cross-validate (the gate) beside the stored constants' fit
    python benchmarks/latency_fit.py --write    # ... and write the refit constants and the cross-validated
                                                #     intervals into mpstudio/latency/arch.py
    python benchmarks/latency_fit.py --with concat_in_place --table after.csv --against before.csv
                                                # a mechanism switched on: the rows it moves against a table
                                                #     an earlier run wrote (--table before.csv)

Numpy alone (mpstudio.latency.fitting): no scipy needed for any of it.

The published architectures (both files of the shared data) are rebuilt with random weights at the input sizes
AI Hub profiled (benchmarks/latency_models.py, latency_models_more.py, latency_models_added.py), quantized by
mpstudio's Quantizer (a8w8 and a16w8 plans, two random calibration samples) and estimated HTP-only (AI Hub's
figures exclude the CPU's graph I/O); the models and their features are cached under the benchmark's cache folder.
Rows: the S24 (v75), S25 (v79), QCS8550 and X Elite (v73) figures of the runtimes that matter, `qnn_dlc` first,
an `onnx` row only where a model has no `qnn_dlc` row for that precision and device, never a row with layers on
the CPU, and one zoo commit per model (the one of its w8a8 figures) so that ratios stay within one release. tflite
rows are not used.

The fit (mpstudio.latency.fitting): least squares on log(estimate / published) of every figure (w8a8, w8a16,
float) and of the ratios w8a16/w8a8 and float/w8a8 (float/w8a16 without w8a8), each in units of its tolerance
to the power 0.25 (robust to an architecture no constant reaches; --power 2 is the near-minimax fit of before),
with a weak pull of each constant toward its nominal value.

The gate is leave one architecture out: each architecture's rows are predicted by constants fitted without it,
each such fit started from the constants' nominal values (the stored constants, fitted on every row, would carry
the left-out rows into their own prediction; --cv-start stored keeps that start to compare).
Exit status 1 unless every cross-validated ratio row is within +-15 % and every absolute row within +-30 %.
In-sample errors are printed beside, never gated. The intervals are the log half-widths that cover 80 % of the
cross-validated rows per quantity; their coverage is printed, also with each architecture left out of its own
interval's width.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import math
import pickle
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency_models import ARCHITECTURES, build
from latency_models_added import ADDED_ARCHITECTURES
from latency_models_more import MORE_ARCHITECTURES

from mpstudio import latency
from mpstudio.cache import cache_root
from mpstudio.latency import fitting
from mpstudio.latency.fitting import FIT_ARCHS, PER_ARCH, SHARED
from mpstudio.latency.ops import MECHANISMS

DATA = [Path(__file__).resolve().parent / "data" / name
        for name in ("aihub_published_latency.csv", "aihub_published_latency_more.csv")]
DEVICE_ARCH = {"Samsung Galaxy S24": "75", "Samsung Galaxy S25": "79", "QCS8550 (Proxy)": "73",
               "Snapdragon X Elite CRD": "Snapdragon X Elite CRD"}  # the X Elite: v73 with its own rates
RUNTIMES = ("qnn_dlc", "onnx")
# Every architecture rebuilt, by the name its published figures carry.
BUILT = {a.name: a for a in ARCHITECTURES + MORE_ARCHITECTURES + ADDED_ARCHITECTURES if a.published}


# ---- data ------------------------------------------------------------------------------------------------------
def published(paths, device_constants: bool = True) -> pd.DataFrame:
    """One row per (model, device, precision): latency_ms, the runtime and zoo commit it comes from, and the
    generation (`arch`) whose constants price that device."""
    frame = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    frame = frame[frame["runtime"].isin(RUNTIMES) & (frame["layers_cpu"] == 0)
                  & frame["precision"].isin(["float", "w8a8", "w8a16"]) & frame["device"].isin(DEVICE_ARCH)]
    # One commit per model: that of its w8a8 figures (else its most common), so that ratios stay in one release.
    anchor = {}
    for model, group in frame.groupby("model"):
        a8 = group[group["precision"] == "w8a8"]
        anchor[model] = (a8 if len(a8) else group)["commit"].mode().iat[0]
    frame = frame.assign(order=frame["runtime"].map({r: i for i, r in enumerate(RUNTIMES)}),
                         other_commit=frame["commit"] != frame["model"].map(anchor))
    frame = frame.sort_values(["other_commit", "order"], kind="stable")
    frame = frame.drop_duplicates(["model", "device", "precision"])
    arch = frame["device"].map(DEVICE_ARCH)
    if not device_constants:
        arch = arch.map(lambda a: fitting.FIT_DEVICES.get(a, a))
    frame = frame.assign(arch=arch).sort_values(["model", "device", "precision"])
    return frame[["model", "device", "precision", "runtime", "commit", "latency_ms", "arch"]].reset_index(drop=True)


def features(cache: Path, names, reuse: bool = False) -> dict[tuple[str, str], latency.OpFeatures]:
    """{(model, precision): OpFeatures} of every buildable architecture in `names`, read once per model file.
    Each run keeps what it read under its formulas' key; `reuse` takes that instead of rebuilding the models."""
    last = cache / "features" / f"run-{_formulas_key()}.pkl"
    if reuse and last.exists():
        kept = pickle.loads(last.read_bytes())
        if set(names) <= {name for name, _ in kept}:
            print(f"  the features of the last run with these formulas ({last.name}), not rebuilt", flush=True)
            return {k: v for k, v in kept.items() if k[0] in names}
    out = {}
    for arch in BUILT.values():
        if arch.name not in names:
            continue
        started = time.perf_counter()
        for precision, path in build(arch, cache).items():
            key = hashlib.sha256(f"{path}:{path.stat().st_mtime_ns}:{_formulas_key()}".encode()).hexdigest()[:16]
            stored = cache / "features" / f"{arch.name}-{precision}-{key}.pkl"
            if stored.exists():
                out[arch.name, precision] = pickle.loads(stored.read_bytes())
                continue
            feats = latency.op_features(path)
            stored.parent.mkdir(parents=True, exist_ok=True)
            stored.write_bytes(pickle.dumps(feats))
            out[arch.name, precision] = feats
        print(f"  {arch.name}: {time.perf_counter() - started:.1f} s", flush=True)
    last.parent.mkdir(parents=True, exist_ok=True)
    kept = pickle.loads(last.read_bytes()) if last.exists() else {}
    last.write_bytes(pickle.dumps({**kept, **out}))
    return out


@functools.lru_cache(maxsize=1)
def _formulas_key() -> str:
    """What the features depend on besides the model: the cost model's reading code and its switched mechanisms."""
    code = b"".join(p.read_bytes() for p in sorted(Path(latency.__file__).parent.glob("*.py"))
                    # the constants, the fit and the promotion costs do not change features
                    if p.name not in ("arch.py", "fitting.py", "promotion.py"))
    switches = ",".join(f"{k}={v}" for k, v in sorted(MECHANISMS.items()))
    return hashlib.sha256(code + switches.encode()).hexdigest()[:16]


# ---- writing the fitted block ------------------------------------------------------------------------------------
def write_constants(archs, spread: latency.Spread, data_names: list[str]) -> None:
    path = Path(latency.arch.__file__)
    text = path.read_text()
    costs = archs["75"].costs
    shared = ", ".join(f"{name}={_round(getattr(costs, name))}" for name, *_ in SHARED)
    per_arch = ", ".join(f'"{a}": dict(' + ", ".join(f"{n}={_round(getattr(archs[a], n))}" for n, *_ in PER_ARCH)
                         + ")" for a in FIT_ARCHS)
    spread_text = ", ".join(f"{k}={v}" for k, v in vars(spread).items())
    devices = ", ".join(f'"{d}": dict(arch="{a}", hmx={_round(f[0])}, clock={_round(f[1])})'
                        for d, a in fitting.FIT_DEVICES.items() for f in [fitting.device_factors(archs, d)])
    today = datetime.date.today().isoformat()
    block = (
        "# BEGIN FITTED CONSTANTS (written by benchmarks/latency_fit.py --write; do not edit by hand)\n"
        f'FIT_SOURCE = "fitted {today} by benchmarks/latency_fit.py on {len(data_names)} published-latency file(s)"\n'
        f"_FITTED_COSTS = dict({shared})\n"
        f"_FITTED_ARCHS = {{{per_arch}}}\n"
        f"_FITTED_SPREAD = dict({spread_text})\n"
        f"_FITTED_DEVICES = {{{devices}}}\n"
        "# END FITTED CONSTANTS")
    block = _wrap(block)
    new = re.sub(r"# BEGIN FITTED CONSTANTS.*?# END FITTED CONSTANTS", lambda _: block, text, flags=re.S)
    path.write_text(new)


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def _wrap(block: str, width: int = 118) -> str:
    lines = []
    for line in block.splitlines():
        while len(line) > width:
            cut = line.rfind(", ", 0, width) + 1
            if cut <= 4:  # nowhere to break: keep the long line whole
                break
            lines.append(line[:cut])
            line = " " * 4 + line[cut:].lstrip()
        lines.append(line)
    return "\n".join(lines)


# ---- report ------------------------------------------------------------------------------------------------------
def table(rows: pd.DataFrame, cv_ms: np.ndarray, fit_ms: np.ndarray) -> pd.DataFrame:
    """One row per checked quantity: published, cross-validated estimate and error, in-sample error."""
    cv = fitting.log_errors(rows, cv_ms)
    ins = fitting.log_errors(rows, fit_ms)
    cv = cv.assign(cv_err=np.expm1(cv["log_err"]), in_sample_err=np.expm1(ins["log_err"]))
    # Tolerances are relative errors (est/pub - 1), not log errors: gate on those.
    cv["outside"] = cv["cv_err"].abs() > cv["tolerance"]
    return cv.drop(columns=["log_err"])


def print_moved(before: pd.DataFrame, after: pd.DataFrame, points: float = 0.05) -> None:
    """The rows whose cross-validated error moved by more than `points` or crossed its tolerance, before -> after;
    rows only one run has (architectures added) are counted apart."""
    key = ["model", "device", "quantity"]
    both = before[key + ["cv_err", "outside"]].merge(after[key + ["cv_err", "outside"]], on=key,
                                                     suffixes=("_before", "_after"))
    moved = both[((both["cv_err_after"] - both["cv_err_before"]).abs() > points)
                 | (both["outside_before"] != both["outside_after"])]
    print(f"\nrows moved against {len(both)} rows of the earlier run (more than {points:.0%} or across the "
          f"tolerance): {len(moved)}; outside before {int(both['outside_before'].sum())}, after "
          f"{int(both['outside_after'].sum())} on the same rows; {len(after) - len(both)} rows new in this run "
          f"({int(after['outside'].sum()) - int(both['outside_after'].sum())} outside)")
    if len(moved):
        print(moved.sort_values(key).to_string(index=False, float_format=lambda v: f"{v:+.3f}"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="write the constants fitted on every row, and the cross-validated intervals, into "
                             "mpstudio/latency/arch.py")
    parser.add_argument("--data", type=Path, action="append", default=None,
                        help="published latencies (CSV; repeat for several files). Default: both files of "
                             "benchmarks/data")
    parser.add_argument("--cache", type=Path, default=None, help="where the rebuilt models are kept")
    parser.add_argument("--shared-v73", action="store_true",
                        help="price the X Elite with the QCS8550's v73 constants (no device constants)")
    parser.add_argument("--fix", action="append", default=[], metavar="CONSTANT",
                        help="hold a shared constant at its stored value (e.g. depthwise), to see what fitting "
                             "it moves")
    parser.add_argument("--without", action="append", default=[], choices=sorted(MECHANISMS), metavar="MECHANISM",
                        help="switch a mechanism of the cost formulas off, to measure the rows it moves "
                             f"({', '.join(sorted(MECHANISMS))})")
    parser.add_argument("--with", dest="with_", action="append", default=[], choices=sorted(MECHANISMS),
                        metavar="MECHANISM", help="switch a mechanism that is off by default on")
    parser.add_argument("--only", action="append", default=[], metavar="ARCHITECTURE",
                        help="cross-validate leaving out only these architectures (the fits still use every other "
                             "row): a quicker look at the rows a change moves; the gate needs the full run")
    parser.add_argument("--iterations", type=int, default=40, help="Levenberg-Marquardt iterations per fit")
    parser.add_argument("--power", type=float, default=fitting.POWER,
                        help="the power each residual (in tolerance units) is raised to before squaring: 2 weighs "
                             "the worst rows most (near minimax), 1 is plain least squares, below 1 robust to "
                             f"rows no constant can reach (default {fitting.POWER:g})")
    parser.add_argument("--reuse-features", action="store_true",
                        help="take the features the last run with the same formulas read, without rebuilding the "
                             "models (a quicker look after a change to the fit alone)")
    parser.add_argument("--cv-start", choices=("nominal", "stored"), default="nominal",
                        help="where each left-out fit starts: the constants' nominal values (default: nothing the "
                             "left-out architecture's rows shaped) or the stored constants (fitted on every row, "
                             "the left-out ones included: a start that leaks them, kept to compare)")
    parser.add_argument("--table", type=Path, default=None,
                        help="write the cross-validated table (CSV), to compare a later run --against it")
    parser.add_argument("--against", type=Path, default=None,
                        help="a table written by an earlier run's --table: print the rows this run moved "
                             "(before -> after)")
    args = parser.parse_args(argv)
    paths = args.data or DATA
    fitting.POWER = args.power
    for name in args.without:
        MECHANISMS[name] = False
    for name in args.with_:
        MECHANISMS[name] = True
    cache = args.cache or cache_root() / "latency-fit"
    data = published(paths, device_constants=not args.shared_v73)
    buildable = set(BUILT)
    missing = sorted(set(data["model"]) - buildable)
    data = data[data["model"].isin(buildable)].reset_index(drop=True)
    print(f"published rows used: {len(data)} of {data['model'].nunique()} architectures "
          f"({', '.join(f'{k} {v}' for k, v in data['runtime'].value_counts().items())}) from "
          f"{', '.join(p.name for p in paths)}; not built (left out): {', '.join(missing) or 'none'}", flush=True)
    print("building and reading the models (cached):", flush=True)
    priced = fitting.Priced(features(cache, set(data["model"]), reuse=args.reuse_features))
    start = {**latency.HTP_ARCHS, **latency.arch.DEVICE_ARCHS}
    for device, generation in fitting.FIT_DEVICES.items():  # stored constants without a device's own: its generation's
        start.setdefault(device, latency.arch.device_variant(start[generation], device, 1.0, 1.0))
    t0 = time.perf_counter()
    fixed = tuple(args.fix)
    fitted = fitting.fit_constants(priced, data, start, latency.SPREAD, args.iterations, fixed)
    print(f"fit on every row: {time.perf_counter() - t0:.1f} s", flush=True)
    stored_ms = fitting.estimates(start, priced, data)
    fit_ms = fitting.estimates(fitted, priced, data)
    t0 = time.perf_counter()
    cv_start = start if args.cv_start == "stored" else fitting.nominal_archs(latency.SPREAD, start, fixed)
    cv_ms = fitting.cross_validate(priced, data, cv_start, args.iterations, fixed=fixed, models=set(args.only),
                                   progress=lambda m: print(f"  left out {m}: {time.perf_counter() - t0:.0f} s",
                                                            flush=True))
    if args.only:  # a partial look: the rows of the architectures left out, never a gate
        keep = data["model"].isin(args.only).to_numpy()
        data, cv_ms, fit_ms, stored_ms = (data[keep].reset_index(drop=True), cv_ms[keep], fit_ms[keep],
                                          stored_ms[keep])
    result = table(data, cv_ms, fit_ms)
    result["stored_err"] = np.expm1(fitting.log_errors(data, stored_ms)["log_err"])
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 2000)
    print("\nLeave one architecture out (the gate): quantity = published w8a8 / w8a16 / float ms, or r16 = "
          "w8a16/w8a8, rfp = float/w8a8 (float/w8a16 without w8a8);\ncv_err = estimate by constants fitted "
          "without the architecture / published - 1; in_sample_err = fitted on every row (not gated); stored_err "
          "= the constants in arch.py")
    print(result.to_string(index=False, float_format=lambda v: f"{v:+.3f}"))
    summary = result.groupby("quantity").agg(rows=("cv_err", "size"), outside=("outside", "sum"),
                                             median_abs_cv=("cv_err", lambda e: e.abs().median()),
                                             worst_cv=("cv_err", lambda e: e.abs().max()),
                                             median_abs_in_sample=("in_sample_err", lambda e: e.abs().median()))
    print("\nper quantity (tolerance: absolute +-30 %, ratios +-15 %)")
    print(summary.to_string(float_format=lambda v: f"{v:.3f}"))
    per_model = result.groupby("model").agg(rows=("cv_err", "size"), outside=("outside", "sum"),
                                            worst_cv=("cv_err", lambda e: e.abs().max()))
    print("\nper architecture")
    print(per_model.to_string(float_format=lambda v: f"{v:.3f}"))
    errors = fitting.log_errors(data, cv_ms)
    spread_fit = fitting.cv_spread(errors)
    print("\nintervals (log half-width covering 80 % of the cross-validated rows; factor = exp):")
    for q, width in zip(fitting.QUANTITIES, ("absolute", "wide16", "fp16", "ratio16", "ratio_fp")):
        s = getattr(spread_fit.spread, width)
        print(f"  {q:6s} x/÷{math.exp(s):.3f}  coverage {spread_fit.coverage[q]:.1%} of the cross-validated rows, "
              f"{spread_fit.held_out_coverage[q]:.1%} with each architecture left out of its own width")
    outside = result[result["outside"]]
    if args.table:
        result.to_csv(args.table, index=False)
    if args.against:
        print_moved(pd.read_csv(args.against), result)
    print(f"\nrows outside tolerance: {len(outside)} of {len(result)}")
    if len(outside):
        print(outside[["model", "device", "quantity", "cv_err", "tolerance"]].to_string(
            index=False, float_format=lambda v: f"{v:+.3f}"))
    if args.write:
        archs = fitting.with_spread(fitted, spread_fit.spread)
        write_constants(archs, spread_fit.spread, [p.name for p in paths])
        print(f"written to {Path(latency.arch.__file__).name}")
    costs = fitted["75"].costs
    print("fitted on every row: " + ", ".join(f"{n}={getattr(costs, n):.4g}" for n, *_ in SHARED))
    print("  " + "; ".join(f"v{a}: " + ", ".join(f"{n}={getattr(fitted[a], n):.4g}" for n, *_ in PER_ARCH)
                           for a in FIT_ARCHS)
          + "; " + "; ".join(f"{d}: hmx x{f[0]:.3f}, clock x{f[1]:.3f}" for d in fitting.FIT_DEVICES
                             for f in [fitting.device_factors(fitted, d)]))
    ok = not len(outside) and not args.only
    print("\nPASS" if ok else "\nFAIL: cross-validated targets missed (ratios within +-15 %, absolute within +-30 %)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
