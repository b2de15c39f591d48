"""The sensitivity engine on the demo model: its fidelity (ORT's tools, the naive loop) and its usefulness.

    python benchmarks/sensitivity.py [--samples 64] [--isolation-samples 8] [--naive-tensors 0] [--htp-tensors 0]
                                     [--topk 5,20,50] [--htp-samples 16] [--sections abcde] [--study DIR ...]
                                     [--no-demo] [--demo-study DIR]

(a) Full per-tensor scoring (accumulated SNR of every activation, plus local 8/16-bit error) vs ORT's
    `qdq_loss_debug` (collect_activations on both models + compute_activation_error) on the same samples.
    Each side runs in its own process so its peak memory (max RSS) is its own.
    Targets: >= 3x faster, <= 1/5 of ORT's peak memory.
(b) Isolation scores: the output SNR (all model outputs against the float model, over the first
    `--isolation-samples` evaluation lines) when one activation tensor alone is promoted to 16 bits from the
    all-8-bit plan, for every activation tensor. The switchable model (`SwitchableModel.from_quantizer`,
    then `isolation_scores`) against the naive loop (per tensor: regenerate the QDQ model with
    `Quantizer.generate`, open a session, evaluate; as AIMET's per-layer analysis does), on the same samples.
    Compared: the two per-tensor values ranked (Spearman over every tensor the naive loop ran, all of them by
    default; `--naive-tensors N` runs a random N), and the time per tensor.
    Numerics: both sides run as `isolation.float_qdq_session` runs a QDQ model on ORT's CPU EP: quantization
    simulated in float exactly as the QDQ graph writes it (`session.disable_quant_qdq=1`), without ORT's NCHWc
    layout kernels. Why not ORT's default CPU run: it fuses 8-bit QDQ node groups into integer kernels
    (QLinearConv, QLinearMul ...) with their own requantization rounding, but has none for 16-bit QDQ, so a
    promotion there also swaps the kernels around the tensor, and its "gain" measures that swap as much as
    the precision; neither integer path is HTP's. Why without NCHWc: its blocked kernels sum in another
    order, and ORT uses them or not depending on the graph around each Conv and Pool, so two graphs of the
    same plan compute values an ulp apart; on this model one such ulp can flip an 8-bit rounding of
    p2o.AveragePool.1 (an 8-bit step of 0.34) and move the output SNR by 0.01-0.1 dB, as much as most
    promotion gains. The run also reports, for reference, the correlation with the naive loop on ORT's
    default (fused) CPU run, the switchable model's ranking on the next `--isolation-samples` lines against
    its ranking on these (how reproducible a ranking over so few samples is: half the gains are a few
    thousandths of a dB), and with `--htp-tensors N` the naive loop on the QNN HTP backend (emulated on
    x86_64) for N random tensors.
    Targets: >= 5x faster, Spearman >= 0.9 against the naive loop.
(a) and (b) check fidelity (the engine computes what a slower method computes); (c) and (d) check
usefulness (what its ranking buys on the task and on the target's numerics):
(c), (d) judge the ranking where it is used (benchmarks/ranking_usefulness.py): against the base plan the search
    and the studio start from (per-channel int8 weights where `--weights auto` picks them), with the order the
    search walks, on the demo's study and on every `--study DIR` (e.g. the studies `benchmarks/outcome.py --keep`
    makes). (c): the study's task metric for top-k against k random tensors (3 draws) at every k; (d): the same
    plans on the QNN HTP backend (emulated on x86_64) over `--htp-samples` evaluation samples, output SNR against
    the float model and the study's task metric. Targets, on the task metric on the CPU and on the HTP (the
    output SNR where the metric has no per-sample terms): top-k never worse than the random mean beyond the
    samples' noise, and better beyond it over every k together (a paired bootstrap over the samples: the gap's
    95 % interval excludes zero and the gap is at least one step of a counted metric; a metric without per-sample
    terms: top-k better at every k); the HTP orders alike at least 90 % of the plan pairs the CPU separates beyond
    its sampling noise (Spearman over every plan printed beside it).
(e) The whole analysis as a study runs it (32 calibration lines, isolation on the first 8): the progressive
    path (`analyze_progressive`: cheap scores, screening on one line, isolation where it can change a
    decision, worker processes) against today's exhaustive path (`analyze`: every tensor isolated both ways),
    same data, same run, both from the base plan the search and the studio start from (as in (c): per-channel
    int8 weights where they win). Reported: wall time of each, time to the first partial ranking, tensors
    isolated, top-20 overlap; then what each top-k recommends: CER of the real QDQ model (as in (c)) with each
    path's top-k promoted on the base, against k random tensors (3 draws) promoted on it.
    Targets: progressive wall time <= 1/5 of the exhaustive one; its top-k beats the random mean at every k;
    its top-k CER within 0.02 of the exhaustive top-k's.
    `--old-record FILE` reuses an exhaustive run recorded by `--write-old-record FILE` (with its commit and
    base) instead of running it again (it takes minutes); a record of another base is refused.
(f) The same comparison on another architecture (`--arch`, one of benchmarks/latency_models.py, built with
    random weights at `--arch-size`, 16 random samples): wall times, top-20 overlap, and the output SNR of
    the real QDQ model with each path's top-k promoted against random k. Targets: the time falls (ratio < 1;
    on a model of about a hundred tensors the top 20 of two orders is a large share of them), and the
    progressive top-k beats random at every k.
`--sections` runs a subset.
Exits 1 if a target of a section that ran is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mpstudio.cache import cache_root
from mpstudio.demos import load_demo
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer


def quantizer_for(demo):
    return Quantizer(demo.model, demo.calibration, cache_root() / "demo" / "quantize")


def phase_scores(engine: str, samples: int) -> dict:
    """One side of (a), run in a child process; returns seconds and peak RSS."""
    demo = load_demo()
    quantizer = quantizer_for(demo)
    model_8 = quantizer.generate(PrecisionPlan.a8w8())
    model_16 = quantizer.generate(PrecisionPlan.a16w8())
    data = _fixed(demo, samples)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    if engine == "ort":
        from onnxruntime.quantization.qdq_loss_debug import (collect_activations, compute_activation_error,
                                                             create_activation_matching,
                                                             modify_model_output_intermediate_tensors)

        with tempfile.TemporaryDirectory() as tmp:
            modify_model_output_intermediate_tensors(str(quantizer.float_path), f"{tmp}/f.onnx")
            modify_model_output_intermediate_tensors(str(model_8), f"{tmp}/q.onnx")
            float_acts = collect_activations(f"{tmp}/f.onnx", iter(data.feeds()))
            qdq_acts = collect_activations(f"{tmp}/q.onnx", iter(data.feeds()))
            errors = compute_activation_error(create_activation_matching(qdq_acts, float_acts))
        result = {t: e["xmodel_err"] for t, e in errors.items() if "xmodel_err" in e}
    else:
        from mpstudio import qdq
        from mpstudio.sensitivity import tensor_scores

        params_8 = {t: q.encoding for t, q in qdq.read(model_8).activations().items()}
        params_16 = {t: q.encoding for t, q in qdq.read(model_16).activations().items()}
        frame = tensor_scores(quantizer.float_path, model_8, demo.model.graph, data, params_8, params_16)
        result = dict(zip(frame["tensor"], frame["snr_db"]))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mb": peak / 1024, "before_mb": rss_before / 1024,
            "snr": {k: float(v) for k, v in result.items() if v == v}}


def _fixed(demo, samples):
    """The first `samples` demo lines (evaluation lines, then calibration lines if more are asked for)."""
    from mpstudio.data import FeedList

    feeds = [demo.evaluation.sample(i) for i in range(min(samples, len(demo.evaluation)))]
    feeds += [demo.calibration.sample(i) for i in range(samples - len(feeds))]
    return FeedList(feeds, name=f"demo[{samples}]")


def spearman(a: dict, b: dict) -> float:
    """Spearman rank correlation of two tensor -> value maps over their common tensors."""
    from scipy.stats import spearmanr

    common = sorted(set(a) & set(b))
    return float(spearmanr([a[t] for t in common], [b[t] for t in common]).statistic)


def _htp_loop(quantizer, switchable, scorer, feeds, count: int) -> dict:
    """The naive loop on the QNN HTP backend for `count` random tensors (seed 1), run in a scratch folder
    (QNN leaves files in the working directory); empty when onnxruntime-qnn is missing."""
    import os

    from mpstudio.errors import MpstudioError
    from mpstudio.runtime import create_session

    chosen = random.Random(1).sample(switchable.tensors, min(count, len(switchable.tensors)))
    results = {}
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="mpstudio-htp-") as tmp:
        os.chdir(tmp)
        try:
            for tensor in chosen:
                session = create_session(quantizer.generate(PrecisionPlan.a8w8().promote([tensor])), "htp")
                results[tensor] = scorer.score([session.run(switchable.output_names, feed) for feed in feeds])
        except MpstudioError as exc:
            print(f"    (HTP loop skipped: {exc})")
        finally:
            os.chdir(here)
    return results


HTP_ARCH = "75"


def _htp_agreement(quantizer, plans, data, output_names, task=None):
    """Output SNR of each plan on ORT's CPU (default session and fake-quant) and on the QNN HTP backend, over
    `data`; None when the HTP backend cannot run here. With `task` (outputs, float references -> the task
    metric's per-sample terms, or None), the task metric on the CPU and the HTP too (columns `cpu_task`,
    `htp_task`). HTP runs in a scratch folder (QNN leaves files in the working directory). One HTP inference
    takes about 0.3-2 s on the emulator: keep plans x samples small."""
    import os

    import pandas as pd

    from mpstudio.errors import MpstudioError
    from mpstudio.runtime import create_session
    from mpstudio.sensitivity import OutputScorer
    from mpstudio.sensitivity.isolation import float_qdq_session, float_references

    feeds = list(data.feeds())
    references = float_references(quantizer.float_path, data, output_names)
    scorer = OutputScorer(references, output_names)
    terms = {}  # (plan, backend) -> per-sample (signal, noise) powers, for ranking_usefulness's paired comparisons

    task_terms = {}  # (plan, backend) -> the task metric's per-sample terms on `data` (metric_terms.MetricTerms)
    named_references = [dict(zip(output_names, r)) for r in references]

    def snr(session, key=None):
        outputs = [session.run(output_names, feed) for feed in feeds]
        if key is not None:
            terms[key] = np.array([_powers(reference, values) for reference, values in zip(references, outputs)])
            named = [dict(zip(output_names, values)) for values in outputs]
            found = task(named, named_references) if task else None
            if found is not None:
                task_terms[key] = found
        return scorer.score(outputs)

    rows = []
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="mpstudio-htp-") as tmp:
        os.chdir(tmp)
        try:
            for done, plan in enumerate(plans, 1):
                path = quantizer.generate(plan)
                started = time.perf_counter()
                htp = snr(create_session(path, "htp", {"htp_arch": HTP_ARCH}), (plan.name, "htp"))
                seconds = time.perf_counter() - started
                print(f"    (d) {done}/{len(plans)} {plan.name}: {len(feeds)} lines on the HTP in {seconds:.0f} s",
                      flush=True)
                rows.append({"plan": plan.name, "cpu": snr(create_session(path), (plan.name, "cpu")),
                             "cpu_fake_quant": snr(float_qdq_session(path)), "htp": htp, "htp_seconds": seconds})
        except MpstudioError as exc:
            print(f"(d) the QNN HTP backend cannot run here: {exc}")
            return None
        finally:
            os.chdir(here)
    frame = pd.DataFrame(rows)
    if task_terms:
        for backend in ("cpu", "htp"):
            frame[f"{backend}_task"] = [task_terms[(name, backend)].value() for name in frame["plan"]]
    frame.attrs["terms"] = terms
    frame.attrs["task_terms"] = task_terms
    return frame


def _powers(reference, values) -> tuple[float, float]:
    """One sample's signal and noise powers over every output (their sums over samples give the output SNR)."""
    from mpstudio.metrics import ErrorAccumulator

    acc = ErrorAccumulator(np.float64)
    for r, v in zip(reference, values):
        acc.add(r, v)
    return acc.signal, acc.noise


def run_phase(engine: str, samples: int) -> dict | None:
    """The phase's result, or None when the child was killed (out of memory)."""
    out = subprocess.run([sys.executable, __file__, "--phase", engine, "--samples", str(samples)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--isolation-samples", type=int, default=8)
    parser.add_argument("--naive-tensors", type=int, default=0, help="a random subset for the naive loop (0: all)")
    parser.add_argument("--htp-tensors", type=int, default=0, help="also run the naive loop on HTP for this many")
    parser.add_argument("--topk", default="5,20,50")
    parser.add_argument("--sections", default="abcde",
                        help="which sections to run (default abcde; f on request)")
    # 4 lines ranked the demo's ten close plans by chance (Spearman 0.64); 16 separate them (0.82).
    parser.add_argument("--htp-samples", type=int, default=16,
                        help="evaluation lines per plan for (d) on the HTP backend (0: skip (d))")
    parser.add_argument("--old-record", help="(e): reuse this recorded exhaustive run instead of running it")
    parser.add_argument("--write-old-record", help="(e): record the exhaustive run here (JSON, with the commit)")
    parser.add_argument("--arch", default="efficientnet_lite0", help="(f): an architecture of latency_models.py")
    parser.add_argument("--arch-size", type=int, default=96, help="(f): its input size")
    parser.add_argument("--study", action="append", metavar="DIR",
                        help="(c), (d): also judge the ranking on this study (e.g. one benchmarks/outcome.py --keep made)")
    parser.add_argument("--demo-lines", type=int, default=100, help="(c), (d): the demo study's evaluation lines")
    parser.add_argument("--no-demo", action="store_true", help="(c), (d): only the --study folders")
    parser.add_argument("--demo-study", metavar="DIR", help="(c), (d): keep the demo's study here (default: temporary)")
    parser.add_argument("--phase", choices=["ort", "mpstudio"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase_scores(args.phase, args.samples)))
        return 0

    from mpstudio.data import FeedList
    from mpstudio.runtime import create_session
    from mpstudio.sensitivity import OutputScorer, SwitchableModel, isolation_scores, tensor_regions
    from mpstudio.sensitivity.isolation import float_qdq_session, float_references

    demo = load_demo()
    quantizer = quantizer_for(demo)
    quantizer.calibrate()
    failures = []

    # ---- (a) -------------------------------------------------------------------------------------------------
    if "a" in args.sections:
        ours = run_phase("mpstudio", args.samples)
        print(f"    mpstudio scoring at {args.samples} samples: {ours['seconds']:.1f} s, peak RSS {ours['peak_mb']:.0f} MB")
        ort_side = run_phase("ort", args.samples)
        if ort_side is None:
            # ORT keeps every sample's activations of both models; at 64 demo samples that exceeds this machine's
            # memory. Measure it at a quarter of the samples and extrapolate linearly (its time and its memory
            # above the process baseline both grow linearly with the samples), and say so.
            part = max(1, args.samples // 4)
            print(f"    ORT's qdq_loss_debug was killed at {args.samples} samples (out of memory); measuring it at "
                  f"{part} samples and extrapolating linearly")
            ort_side = run_phase("ort", part)
            factor = args.samples / part
            ort_side["seconds"] *= factor
            ort_side["peak_mb"] = ort_side["before_mb"] + (ort_side["peak_mb"] - ort_side["before_mb"]) * factor
        common = sorted(set(ours["snr"]) & set(ort_side["snr"]))
        worst = max(abs(ours["snr"][t] - ort_side["snr"][t]) for t in common)
        speedup = ort_side["seconds"] / ours["seconds"]
        memory = ours["peak_mb"] / ort_side["peak_mb"]
        print(f"(a) per-tensor scoring, {args.samples} samples, {len(common)} tensors in common "
              f"(largest SNR difference {worst:.3f} dB)")
        print(f"    ORT qdq_loss_debug: {ort_side['seconds']:.1f} s, peak RSS {ort_side['peak_mb']:.0f} MB")
        print(f"    mpstudio:           {ours['seconds']:.1f} s, peak RSS {ours['peak_mb']:.0f} MB "
              f"(also local 8/16-bit error)")
        print(f"    speed-up {speedup:.1f}x (target >= 3), memory ratio {memory:.2f} (target <= 0.20)")
        if speedup < 3:
            failures.append("scoring speed")
        if memory > 0.2:
            failures.append("scoring memory")

    # ---- (e), (f) ------------------------------------------------------------------------------------------
    if "e" in args.sections:
        failures += section_e(args, demo, quantizer)
    if "f" in args.sections:
        failures += section_f(args)
    if set(args.sections) & set("cd"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        usefulness(args, failures)
    if "b" not in args.sections:
        return _finish(failures)

    # ---- (b) -------------------------------------------------------------------------------------------------
    iso_data = demo.evaluation.head(args.isolation_samples)
    started = time.perf_counter()
    switchable = SwitchableModel.from_quantizer(quantizer, threads=2)
    references = float_references(quantizer.float_path, iso_data, switchable.output_names)
    scorer = OutputScorer(references, switchable.output_names)
    fast = isolation_scores(switchable, iso_data, tensor_regions(switchable.tensors), scorer, both_directions=False)
    fast_seconds = time.perf_counter() - started
    fast_per_tensor = fast_seconds / len(switchable.tensors)
    promoted = dict(zip(fast.scores["region"], fast.scores["promoted"]))

    if "b" in args.sections:
        tensors = switchable.tensors
        if 0 < args.naive_tensors < len(tensors):
            tensors = random.Random(0).sample(tensors, args.naive_tensors)
        feeds = list(iso_data.feeds())
        naive, fused = {}, {}
        with tempfile.TemporaryDirectory(prefix="mpstudio-naive-") as tmp:
            naive_quantizer = Quantizer(demo.model, demo.calibration, Path(tmp))
            quantizer.calibrate()
            naive_quantizer._caches = dict(quantizer._caches)  # same ranges; only regeneration is timed
            naive_seconds = 0.0
            for tensor in tensors:
                started = time.perf_counter()
                path = naive_quantizer.generate(PrecisionPlan.a8w8().promote([tensor]))
                session = float_qdq_session(path)
                naive[tensor] = scorer.score([session.run(switchable.output_names, feed) for feed in feeds])
                naive_seconds += time.perf_counter() - started
                session = create_session(path)  # untimed: the same model on ORT's fused integer kernels
                fused[tensor] = scorer.score([session.run(switchable.output_names, feed) for feed in feeds])
            naive_per_tensor = naive_seconds / len(tensors)
            htp = _htp_loop(naive_quantizer, switchable, scorer, feeds, args.htp_tensors) if args.htp_tensors else {}
        rho = spearman(naive, promoted)
        iso_speedup = naive_per_tensor / fast_per_tensor
        worst = max(abs(naive[t] - promoted[t]) for t in naive)
        gains = np.array([promoted[t] - fast.all_8 for t in naive])
        print(f"(b) isolation, {len(switchable.tensors)} activation tensors, {args.isolation_samples} samples each, "
              f"output SNR vs float (all-8-bit {fast.all_8:.3f} dB, all-16-bit {fast.all_16:.3f} dB); "
              f"quantization simulated in float on both sides")
        print(f"    switchable model: {fast_seconds:.1f} s for all tensors ({fast_per_tensor * 1000:.0f} ms per tensor)")
        print(f"    naive loop: {naive_per_tensor * 1000:.0f} ms per tensor over {len(tensors)} tensors"
              + ("" if len(tensors) == len(switchable.tensors) else
                 f" (random, seed 0; {naive_per_tensor * len(switchable.tensors):.0f} s for all)"))
        identical = sum(naive[t] == promoted[t] for t in naive)
        print(f"    same value to the last bit for {identical} of {len(naive)} tensors, largest |switchable - naive| "
              f"{worst:.2g} dB; gains span {gains.min():.4f} .. {gains.max():.4f} dB, {int((gains == 0).sum())} exactly 0, "
              f"median |gain| {np.median(np.abs(gains)):.4f} dB")
        print(f"    speed-up {iso_speedup:.1f}x (target >= 5); Spearman rank correlation over {len(naive)} tensors "
              f"{rho:.3f} (target >= 0.9)")
        print(f"    for reference: vs the naive loop on ORT's fused CPU integer kernels {spearman(fused, promoted):.3f} "
              f"(naive float vs naive fused {spearman(fused, naive):.3f})")
        if htp:
            print(f"    for reference, {len(htp)} random tensors on the QNN HTP backend (naive loop): vs switchable "
                  f"{spearman(htp, promoted):.3f}, vs naive float {spearman(htp, naive):.3f}, "
                  f"vs naive fused CPU {spearman(htp, fused):.3f}")
        next_data = FeedList([demo.evaluation.sample(i) for i in
                              range(args.isolation_samples, min(2 * args.isolation_samples, len(demo.evaluation)))])
        if len(next_data):
            next_scorer = OutputScorer(float_references(quantizer.float_path, next_data, switchable.output_names),
                                       switchable.output_names)
            again = isolation_scores(switchable, next_data, tensor_regions(switchable.tensors), next_scorer,
                                     both_directions=False)
            print(f"    ranking reproducibility: switchable on lines 0-{args.isolation_samples - 1} vs lines "
                  f"{args.isolation_samples}-{args.isolation_samples + len(next_data) - 1}, all tensors: "
                  f"{spearman(dict(zip(again.scores['region'], again.scores['promoted'])), promoted):.3f}")
        if iso_speedup < 5:
            failures.append("isolation speed")
        if not rho >= 0.9:
            failures.append("isolation rank correlation")

    return _finish(failures)


def usefulness(args, failures: list) -> None:
    """(c) and (d) on the demo and on every `--study` (see benchmarks/ranking_usefulness.py)."""
    import ranking_usefulness
    from mpstudio.study import Study

    ks = [int(v) for v in args.topk.split(",")]
    with tempfile.TemporaryDirectory(prefix="mpstudio-usefulness-") as tmp:
        folders = ([] if args.no_demo else [("demo", None)]) + [(Path(f).name, f) for f in args.study or []]
        for label, folder in folders:
            study = (Study.demo(Path(args.demo_study or tmp) / f"demo-{args.demo_lines}", evaluation_lines=args.demo_lines)
                     if folder is None else Study.open(folder))
            with study:
                failures += ranking_usefulness.judge(study, label, ks,
                                                     args.htp_samples if "d" in args.sections else 0, _htp_agreement)


def _finish(failures) -> int:
    if failures:
        print(f"MISSED: {', '.join(failures)}")
        return 1
    print("all targets met")
    return 0


def _timed_paths(quantizer, data, isolation_samples, old_record=None, plan=None, **progressive):
    """Run the progressive path and (unless recorded) the exhaustive one from `plan` (None: all-8-bit with
    per-tensor weights); returns their reports' rankings, seconds, and the progressive run's first partial time
    and report."""
    from mpstudio.sensitivity import analyze, analyze_progressive

    if old_record:  # read first: a record of another base is refused before minutes of work
        record = json.loads(Path(old_record).read_text())
        base = (plan or PrecisionPlan.a8w8()).name
        if record.get("base", "a8w8") != base:
            sys.exit(f"{old_record} records an exhaustive run from {record.get('base', 'a8w8')}, not from {base}: "
                     f"record one with --write-old-record")
        old_seconds, old_order, commit = record["seconds"], record["ranking"], record["commit"]
    first = []
    started = time.perf_counter()
    new = analyze_progressive(quantizer, data, plan, isolation_samples=isolation_samples,
                              on_partial=lambda r: first or first.append(time.perf_counter() - started),
                              **progressive)
    new_seconds = time.perf_counter() - started
    if not old_record:
        started = time.perf_counter()
        old = analyze(quantizer, data, plan, isolation_samples=isolation_samples)
        old_seconds, old_order, commit = time.perf_counter() - started, old.ranking["tensor"].tolist(), _commit()
    return new, new_seconds, first[0] if first else float("nan"), old_order, old_seconds, commit


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "mpstudio"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent).stdout.strip()
    return (out.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def _demo_base(args):
    """The base plan the search and the studio start from on the demo (as in (c)), and why."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ranking_usefulness
    from mpstudio.study import Study

    with tempfile.TemporaryDirectory(prefix="mpstudio-base-") as tmp:
        with Study.demo(Path(tmp) / "demo", evaluation_lines=args.demo_lines) as study:
            return ranking_usefulness.base_of(study)


def section_e(args, demo, quantizer) -> list[str]:
    from mpstudio.loop.inprocess import evaluate

    data = demo.calibration.head(32)
    base, why = _demo_base(args)
    print(f"(e) base: {why}")
    analysed = None if base.hash == PrecisionPlan.a8w8().hash else base
    new, new_seconds, first, old_order, old_seconds, commit = _timed_paths(
        quantizer, data, 8, args.old_record, analysed)
    if args.write_old_record:
        Path(args.write_old_record).write_text(json.dumps(
            {"commit": commit, "seconds": old_seconds, "ranking": old_order, "data": data.name,
             "isolation_samples": 8, "base": base.name}, indent=1) + "\n")
    new_order = new.ranking["tensor"].tolist()
    isolated = len(new.isolation.per_tensor())
    ratio = new_seconds / old_seconds
    print(f"(e) the whole analysis on the demo ({len(data)} calibration lines, isolation on 8, "
          f"{len(new_order)} activation tensors, {new.meta['tensors']} of them quantized)")
    print(f"    exhaustive (analyze, commit {commit}): {old_seconds:.1f} s"
          + (" (recorded)" if args.old_record else ""))
    print(f"    progressive (analyze_progressive, {new.meta['workers']} worker processes): {new_seconds:.1f} s, "
          f"first partial ranking after {first:.1f} s; isolated {isolated} of {new.meta['tensors']} quantized tensors "
          f"({new.meta.get('stopped', 'all')})")
    overlap = len(set(new_order[:20]) & set(old_order[:20]))
    print(f"    wall time ratio {ratio:.3f} (target <= 0.20); top-20 overlap {overlap}/20")

    def cer(plan):
        return evaluate(quantizer.generate(plan), demo.evaluation, demo.metric)

    ks = [int(v) for v in args.topk.split(",")]
    tensors = sorted(new.ranking["tensor"][new.ranking["matched"].astype(bool)])  # random draws independent of the order
    failures = []
    for k in ks:
        top_new = cer(base.promote(new_order[:k]))
        top_old = cer(base.promote(old_order[:k]))
        randoms = [cer(base.promote(random.Random(100 + r).sample(tensors, k))) for r in range(3)]
        ok = top_new < np.mean(randoms) and top_new <= top_old + 0.02
        print(f"    k={k:<3} CER progressive top-k {top_new:.4f}   exhaustive top-k {top_old:.4f}   random k: mean "
              f"{np.mean(randoms):.4f} ({', '.join(f'{v:.4f}' for v in randoms)})   {'ok' if ok else 'MISSED'}")
        if not ok:
            failures.append(f"progressive top-{k} recommendation")
    if ratio > 0.2:
        failures.append("progressive analysis wall time")
    return failures


def section_f(args) -> list[str]:
    """(f): the comparison on another architecture, output SNR of the real QDQ model as the measure."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import latency_models
    from mpstudio.data import FeedList
    from mpstudio.model import prepare_model
    from mpstudio.sensitivity import OutputScorer
    from mpstudio.sensitivity.isolation import float_references
    from mpstudio.runtime import create_session

    arch = next((a for a in latency_models.ARCHITECTURES if a.name == args.arch), None)
    if arch is None:
        print(f"(f) unknown architecture {args.arch!r}")
        return ["(f) architecture"]
    builder = getattr(latency_models, arch.name)
    model = builder(args.arch_size) if args.arch_size else builder()
    feeds = latency_models.random_feeds(model, 24, seed=3)
    with tempfile.TemporaryDirectory(prefix="mpstudio-arch-") as tmp:
        quantizer = Quantizer(prepare_model(model), FeedList(feeds[:8], name="calibration"), Path(tmp))
        quantizer.calibrate()
        data = FeedList(feeds[8:24], name="samples")
        new, new_seconds, first, old_order, old_seconds, commit = _timed_paths(quantizer, data, 8)
        new_order = new.ranking["tensor"].tolist()
        held_out = FeedList(latency_models.random_feeds(model, 8, seed=9), name="held out")
        names = [o.name for o in model.graph.output]
        scorer = OutputScorer(float_references(quantizer.float_path, held_out, names), names)

        def snr(plan):
            session = create_session(quantizer.generate(plan))
            return scorer.score([session.run(names, feed) for feed in held_out.feeds()])

        ratio = new_seconds / old_seconds
        overlap = len(set(new_order[:20]) & set(old_order[:20]))
        print(f"(f) {arch.name} at {args.arch_size} (random weights, {len(new_order)} activation tensors, 16 random "
              f"samples, isolation on 8): exhaustive {old_seconds:.1f} s, progressive {new_seconds:.1f} s (first "
              f"partial after {first:.1f} s, isolated {len(new.isolation.per_tensor())}); ratio {ratio:.3f} "
              f"(target < 1: the time falls); top-20 overlap {overlap}/20")
        print(f"    output SNR (dB) of the real QDQ model on 8 held-out samples: all-8-bit "
              f"{snr(PrecisionPlan.a8w8()):.3f}, all-16-bit {snr(PrecisionPlan.a16w8()):.3f}")
        failures = []
        tensors = sorted(new.ranking["tensor"][new.ranking["matched"].astype(bool)])
        for k in (5, 20):
            top_new = snr(PrecisionPlan.a8w8().promote(new_order[:k]))
            top_old = snr(PrecisionPlan.a8w8().promote(old_order[:k]))
            randoms = [snr(PrecisionPlan.a8w8().promote(random.Random(100 + r).sample(tensors, k))) for r in range(3)]
            ok = top_new > np.mean(randoms)
            print(f"    k={k:<3} progressive top-k {top_new:.3f}   exhaustive top-k {top_old:.3f}   random k: mean "
                  f"{np.mean(randoms):.3f}   {'ok' if ok else 'MISSED'}")
            if not ok:
                failures.append(f"(f) progressive top-{k}")
        if ratio >= 1.0:
            failures.append("(f) progressive analysis wall time")
    return failures


if __name__ == "__main__":
    sys.exit(main())
