"""mpstudio's mixed-precision search against AIMET's (aimet-onnx), on one model, one target, one evaluator.

    MPSTUDIO_AIMET_PYTHON=<python with aimet-onnx> python benchmarks/search.py [--target 0.02] [--study DIR]
        [--no-aimet] [--no-amp] [--sweep-samples 2] [--htp] [--budget-minutes 15] [--keep DIR] [--weights mixed]
        [--ray auto|ADDRESS]

Model and data: the built-in demo (PP-OCRv4 text-line recognizer, 100 calibration and 100 evaluation lines,
scored by CER), or with `--study DIR` the model, data and metric of an existing study. Every method starts
from the same float model (the one mpstudio quantizes) and calibrates on the same calibration samples; a
fresh study folder is made for the run, so no stored result is reused.

The one evaluator, for every row: the QDQ model a method ends with (mpstudio: the model the study generates
for the recommended plan; AIMET: `QuantizationSimModel.to_onnx_qdq()`), run on ONNX Runtime's CPU EP with
mpstudio's default CPU numerics (`runtime.DEFAULT_CPU_NUMERICS`, the run `Study.evaluate` makes) over all evaluation samples and scored by the
study's metric. "est. ms" is mpstudio's HTP cost model (`mpstudio.latency.estimate_latency`) on that same
QDQ model: an estimate, not a measurement. It prices each op in the type the HTP computes it in: a node group
ONNX Runtime's QNN EP does not hand over quantized (a 16-bit input and an 8-bit output, as a per-tensor
layout writes wherever an 8-bit op reads a 16-bit tensor; a LayerNormalization with a float bias) computes in
fp16 beside its own Q/DQ ops. With `--htp` each row is priced as the HTP built it (`mpstudio.htp_build`: the
graph QNN prepared) and the note says what it built.

Rows (wall time from the float model to the scored result, calibration included):
- mpstudio: `mpstudio.search.search` (sensitivity analysis, weights first, gain per latency cost, bisection)
  with its default budget and `--weights` mode. "evals" counts plans scored on the evaluation data (the
  baselines too); its sensitivity analysis is inside its wall time. Below the table: the float model's score
  with the same evaluator, and the pick's estimated latency premium over mpstudio's a8w8 as a share of
  a16w8's premium over a8w8.
- AIMET a8w8: `QuantizationSimModel(param_type=int8, activation_type=int8, config_file="htp_v<arch>")`
  calibrated with `compute_encodings`: AIMET's own HTP layout, all 8 bits, no search. For reference.
- AIMET Lite-MP p%: `analyze_per_layer_sensitivity` (one sim run per op with only that op's quantizers on,
  scored by output PSNR against the float model on the first `--sweep-samples` calibration samples), then
  `flip_layers_to_higher_precision(p, override_precision=(int8, int16))`: the p% least accurate ops get
  16-bit activations and keep 8-bit weights (the space mpstudio searches), then recalibration. Lite-MP
  does not look at the target: the row says whether it reaches it. The a8w8 calibration and the
  sensitivity pass are shared by the three AIMET Lite-MP rows and counted in each one's time.
- AIMET AMP: `analyze_mixed_precision_sensitivity(sim, [w8a8, w8a16], PSNR on the same samples)` (phase 1:
  one sim run per quantizer group per precision, each with only that group quantized) and `apply_amp` with
  an acceptance function that exports the sim's current QDQ model and scores it with the one evaluator
  against the target (phase 2: AIMET's binary search over its cumulative order). "evals" counts acceptance
  calls, which include AIMET's float and all-8/all-16 checks.
"sweeps" counts AIMET's sensitivity runs on `--sweep-samples` samples each; "16-bit" counts the tensors
quantized to 16 bits in the final QDQ model.

AIMET runs in its own interpreter, `$MPSTUDIO_AIMET_PYTHON` (benchmarks/aimet_mixed_side.py, which answers
over a pipe; AMP's acceptance calls come back here to the one evaluator); mpstudio never imports AIMET.

mpstudio's search runs without its HTP confirmation (`confirm=None`) unless `--confirm`: this benchmark
compares methods on the one CPU evaluator. `--htp` judges every row on HTP numerics as well: its final model,
with each QuantizeLinear of a constant replaced by its integer codes (the form QNN takes weights in; the same
numbers), run on the HTP emulator (QNN EP, the study's htp_arch) over the same samples; the HTP value then
decides "met" and the gates. Where QNN refuses part of a model, the row says so and its HTP value has those
nodes on ORT's CPU EP.

Gates (exit 1 when one fails): mpstudio's pick reaches the target; no AIMET result that reaches the target
has a lower estimated latency than mpstudio's pick; the whole run takes at most `--budget-minutes`; with
`--max-premium S` (default 1/3 with `--weights mixed`), the pick costs at most S of a16w8's estimated premium
over a8w8. The demo's figure: `--target float+100% --max-premium 0.33` (within 2x of the float model's CER at
no more than a third of a16w8's premium).
Without `$MPSTUDIO_AIMET_PYTHON` (a Python with `pip install 'mpstudio[aimet]'`) AIMET's rows print as
skipped and only the first and last gates apply.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpstudio.loop.inprocess import run_outputs  # noqa: E402
from mpstudio.latency import estimate_latency  # noqa: E402
from mpstudio.search import meets, search  # noqa: E402
from mpstudio.sensitivity import OutputScorer  # noqa: E402
from mpstudio.sensitivity.isolation import float_references  # noqa: E402
from mpstudio.study import Study  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aimet_mixed_side import PROTOCOL  # noqa: E402  (the protocol only: AIMET runs in its own interpreter)


@dataclass(frozen=True)
class Row:
    """One method's result, as the table prints it."""

    method: str
    evaluations: int | None
    sweeps: int | None
    seconds: float
    value: float | None
    estimate_ms: float | None
    sixteen_bit: int | None
    reached: bool | None
    note: str = ""
    path: Path | None = None  # the QDQ model the method ends with
    htp_value: float | None = None  # that model's score on the HTP emulator (`--htp`)
    htp_note: str = ""


class Evaluator:
    """The one evaluator: a QDQ model on ORT's CPU EP over the study's evaluation data, scored by its metric."""

    def __init__(self, study: Study):
        self.study = study
        outputs = [o.name for o in onnx.load(study.quantizer.float_path, load_external_data=False).graph.output]
        metric = study.task_metric()  # a metric stored by reference is imported here
        references = [] if metric is not None and not metric.needs_reference else float_references(
            study.quantizer.float_path, study.evaluation_data, outputs)
        self.scorer = OutputScorer(references, outputs, metric)
        self._cache: dict[str, float] = {}

    @property
    def higher_is_better(self) -> bool:
        return self.study.higher_is_better

    def score(self, path: Path) -> float:
        key = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        if key not in self._cache:
            runs = run_outputs(path, self.study.evaluation_data, "cpu")
            self._cache[key] = self.scorer.score([[r[n] for n in self.scorer.output_names] for r in runs])
        return self._cache[key]

    def score_htp(self, path: Path, allow_cpu_fallback: bool = False) -> float:
        """The same score on the HTP emulator's numerics (QNN EP, HTP backend, the study's htp_arch); raises
        when QNN refuses part of the model, unless `allow_cpu_fallback` leaves that part to ORT's CPU EP."""
        runs = run_outputs(constants_quantized(path), self.study.evaluation_data, "htp",
                           {"htp_arch": self.study.htp_arch}, allow_cpu_fallback=allow_cpu_fallback)
        return self.scorer.score([[r[n] for n in self.scorer.output_names] for r in runs])

    def estimate_ms(self, path: Path, build=None) -> float:
        return estimate_latency(path, htp_arch=self.study.htp_arch, build=build).ms


def sixteen_bit_tensors(path: Path) -> int:
    """Tensors quantized to 16 bits in a QDQ model: the inputs of QuantizeLinear nodes with a 16-bit zero point."""
    model = onnx.load(path, load_external_data=False)
    types = {i.name: i.data_type for i in model.graph.initializer}
    wide = (onnx.TensorProto.UINT16, onnx.TensorProto.INT16)
    return len({n.input[0] for n in model.graph.node
                if n.op_type == "QuantizeLinear" and len(n.input) > 2 and types.get(n.input[2]) in wide})


# ---- the study ------------------------------------------------------------------------------------------------
def fresh_study(folder: Path, source: str | None) -> Study:
    """A new study in `folder`: the demo's, or a copy of the model, data and metric of the study at `source`."""
    if source is None:
        return Study.demo(folder)
    with Study.open(source) as given:
        return Study.create(folder, given.prepared, given.calibration, given.evaluation_data, given.metric_spec,
                            htp_arch=given.htp_arch, name=f"benchmark copy of {given.name}")


# ---- mpstudio ----------------------------------------------------------------------------------------------------
def run_mpstudio(study: Study, target: str, evaluator: Evaluator, weights: str = "auto", confirm: bool = False,
                 runner=None):
    started = time.perf_counter()
    result = search(study, target, weights=weights, confirm="htp" if confirm else None, runner=runner)
    seconds = time.perf_counter() - started
    path = study.quantizer.generate(study.plan(result.recommended.plan_id))
    value = evaluator.score(path)
    note = f"plan {result.recommended.name}; {result.stop_reason}"
    if not math.isclose(value, result.recommended.value, rel_tol=1e-6, abs_tol=1e-9):
        note += f"; the study stored {result.recommended.value:.4f}"
    row = Row("mpstudio search", result.evaluations, None, seconds, value, evaluator.estimate_ms(path),
              sixteen_bit_tensors(path), meets(value, result.threshold, evaluator.higher_is_better), note, path)
    return row, result


@dataclass(frozen=True)
class Premium:
    """The pick against the float model and the baselines, all through the one evaluator and the cost model."""

    float_value: float
    pick_value: float
    a8w8_ms: float
    a16w8_ms: float
    pick_ms: float

    @property
    def share(self) -> float:
        """The pick's estimated premium over a8w8 as a share of a16w8's premium over a8w8."""
        return (self.pick_ms - self.a8w8_ms) / (self.a16w8_ms - self.a8w8_ms)

    def describe(self, metric: str) -> str:
        return (f"float {metric} {self.float_value:.4f}; pick {self.pick_value:.4f} "
                f"({self.pick_value / self.float_value:.2f}x float); estimated ms: a8w8 {self.a8w8_ms:.3f}, "
                f"a16w8 {self.a16w8_ms:.3f} (premium {self.a16w8_ms - self.a8w8_ms:.3f}), pick {self.pick_ms:.3f} "
                f"(premium {self.pick_ms - self.a8w8_ms:.3f} = {self.share:.2f} of a16w8's)")


def premium(study: Study, evaluator: Evaluator, result, row: Row) -> Premium:
    def ms(name: str) -> float:
        return evaluator.estimate_ms(study.quantizer.generate(study.plan(result.baselines[name].plan_id)))

    return Premium(evaluator.score(study.quantizer.float_path), row.value, ms("a8w8"), ms("a16w8"), row.estimate_ms)


# ---- AIMET -------------------------------------------------------------------------------------------------------
AIMET_PYTHON = "MPSTUDIO_AIMET_PYTHON"
MIXED_SIDE = Path(__file__).resolve().parent / "aimet_mixed_side.py"


def aimet_python() -> str | None:
    """The interpreter with aimet-onnx (`$MPSTUDIO_AIMET_PYTHON`); mpstudio's own never imports AIMET."""
    return os.environ.get(AIMET_PYTHON) or None


def run_aimet(study: Study, evaluator: Evaluator, threshold: float, folder: Path, sweep_samples: int,
              amp: bool = True) -> tuple[list[Row], list[str]]:
    """AIMET's a8w8, Lite-MP and AMP rows (benchmarks/aimet_mixed_side.py in AIMET's interpreter), each row's
    model scored here by the one evaluator; AMP's acceptance calls are answered by that evaluator too."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    samples = [study.calibration.sample(i) for i in range(len(study.calibration))]
    calibration = folder / "calibration.npz"
    np.savez(calibration, **{name: np.stack([s[name] for s in samples]) for name in samples[0]})
    command = [aimet_python(), str(MIXED_SIDE), str(study.quantizer.float_path), "--calibration", str(calibration),
               "--out", str(folder), "--sweep-samples", str(sweep_samples), "--htp-arch", study.htp_arch]
    rows, errors = [], []
    with open(folder / "aimet.log", "w") as log, subprocess.Popen(
            command + ([] if amp else ["--no-amp"]), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            text=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}) as side:
        for line in side.stdout:
            if not line.startswith(PROTOCOL):
                continue
            message = json.loads(line[len(PROTOCOL):])
            if "accept" in message:
                value = evaluator.score(Path(message["accept"]))
                side.stdin.write("1\n" if meets(value, threshold, evaluator.higher_is_better) else "0\n")
                side.stdin.flush()
            elif "row" in message:
                r = message["row"]
                path = Path(r["path"])
                seconds = r["seconds"] + _scoring(evaluator, path)
                value = evaluator.score(path)
                rows.append(Row(r["method"], r["evaluations"], r["sweeps"], seconds, value,
                                evaluator.estimate_ms(path), sixteen_bit_tensors(path),
                                meets(value, threshold, evaluator.higher_is_better), r["note"], path))
                print(f"{r['method']} done: {study.metric_name} {value:.4f}", flush=True)
            elif "error" in message:
                errors.append(message["error"])
                print(f"AIMET failed: {message['error']} (traceback in {folder / 'aimet.log'})", flush=True)
    if side.returncode:
        errors.append(f"AIMET's interpreter exited {side.returncode} (see {folder / 'aimet.log'})")
    return rows, errors


def _scoring(evaluator: Evaluator, path: Path) -> float:
    """Seconds the evaluator takes to score `path` (the result is cached, so the row's scoring is free)."""
    started = time.perf_counter()
    evaluator.score(path)
    return time.perf_counter() - started


# ---- HTP numerics ----------------------------------------------------------------------------------------------
def constants_quantized(path: Path) -> Path:
    """`path` with each QuantizeLinear of a constant (weights, biases) replaced by its integer codes
    (`mpstudio.constant_codes`), the form QNN takes weights in (it leaves a QuantizeLinear of an initializer to the
    CPU): the same numbers, computed once. AIMET's `to_onnx_qdq` keeps such nodes after Lite-MP's flips. Returns
    `path` when there is none."""
    from mpstudio.constant_codes import quantized_constants

    out = path.with_name(path.stem + ".constants-quantized.onnx")
    if out.exists() and out.stat().st_mtime_ns >= path.stat().st_mtime_ns:
        return out  # written for this model already (the HTP's score and its build read the same form)
    model = onnx.load(path)
    folded = quantized_constants(model)
    if folded is model:
        return path
    onnx.save(folded, out)
    return out


def built_on_htp(row: Row, evaluator: Evaluator) -> Row:
    """`row` priced as the HTP built its model (`mpstudio.htp_build`: which ops compute in float, which Q/DQ run on
    their own), with what the HTP built in the note; the row as it was when the HTP cannot prepare it."""
    from mpstudio.htp_build import htp_build

    path = constants_quantized(row.path)
    try:
        build = htp_build(path)
    except Exception as error:
        return replace(row, htp_note="; ".join(n for n in (row.htp_note, f"not priced as built: {error}") if n))
    return replace(row, estimate_ms=evaluator.estimate_ms(path, build),
                   htp_note="; ".join(n for n in (row.htp_note, f"built: {build.summary()}") if n))


def judged_on_htp(rows: list[Row], evaluator: Evaluator, threshold: float) -> list[Row]:
    """Each row's final model scored again on the HTP emulator; "reached" is then the HTP's verdict (None, with
    QNN's error in `htp_note`, when QNN refuses the model). Each row is priced as the HTP built it."""
    judged = []
    for r in rows:
        if r.path is None:
            judged.append(r)
            continue
        r = built_on_htp(r, evaluator)
        try:
            value, note = evaluator.score_htp(r.path), ""
        except Exception:  # QNN refusing part of a model is a result of the comparison, not a crash
            try:
                value = evaluator.score_htp(r.path, allow_cpu_fallback=True)
            except Exception as error:
                text = str(error).strip().splitlines()
                refused = "HTP refused the model: " + (text[-1] if text else type(error).__name__)
                judged.append(replace(r, reached=None, htp_note="; ".join(n for n in (refused, r.htp_note) if n)))
                continue
            note = "QNN EP refused part of the model (ONNX Runtime's log lists the nodes): HTP value with " \
                   "those nodes on ORT's CPU EP"
        judged.append(replace(r, htp_value=value, reached=meets(value, threshold, evaluator.higher_is_better),
                              htp_note="; ".join(n for n in (note, r.htp_note) if n)))
        print(f"{r.method} on the HTP: {value:.4f}", flush=True)
    return judged


# ---- report ------------------------------------------------------------------------------------------------------
def print_table(rows: list[Row], metric: str, threshold: float, higher_is_better: bool) -> None:
    sign = ">=" if higher_is_better else "<="
    htp = any(r.htp_value is not None or r.htp_note for r in rows)
    print(f"\ntarget: {metric} {sign} {threshold:.4f}; one evaluator (QDQ model on ORT CPU, all evaluation "
          "samples)" + ("; HTP = the same model and samples on the HTP emulator (QNN EP), which the target column "
                        "judges" if htp else "") + "; est. ms = HTP cost model estimate")
    header = f"{'method':<24} {'evals':>5} {'sweeps':>6} {'wall s':>7} {'value':>8} " + \
             (f"{'HTP':>8} " if htp else "") + f"{'target':>6} {'est. ms':>7} {'16-bit':>6}  note"
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.value is None:
            print(f"{r.method:<24} {r.note}")
            continue
        on_htp = (f"{r.htp_value:>8.4f} " if r.htp_value is not None else f"{'-':>8} ") if htp else ""
        verdict = "-" if r.reached is None else "met" if r.reached else "MISSED"
        note = "; ".join(n for n in (r.note, r.htp_note) if n)
        print(f"{r.method:<24} {r.evaluations if r.evaluations is not None else '-':>5} "
              f"{r.sweeps if r.sweeps is not None else '-':>6} {r.seconds:>7.1f} {r.value:>8.4f} {on_htp}"
              f"{verdict:>6} {r.estimate_ms:>7.3f} {r.sixteen_bit:>6}  {note}")


def gates(rows: list[Row], elapsed: float, budget_minutes: float) -> list[str]:
    """The failed gates, by name (see the module docstring)."""
    ours, failed = rows[0], []
    if not ours.reached:
        failed.append("mpstudio's pick misses the target")
    cheaper = [r for r in rows[1:] if r.reached and ours.estimate_ms is not None and r.estimate_ms is not None
               and r.estimate_ms < ours.estimate_ms]
    if cheaper:
        failed.append("AIMET reaches the target cheaper (" + ", ".join(
            f"{r.method} {r.estimate_ms:.3f} ms" for r in cheaper) + f" vs {ours.estimate_ms:.3f} ms)")
    if elapsed > budget_minutes * 60:
        failed.append(f"the run took {elapsed / 60:.1f} min (budget {budget_minutes:g} min)")
    return failed


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="0.02",
                        help="the search target: a metric value or a baseline like a16w8+10%% (default 0.02: CER)")
    parser.add_argument("--study", help="use this study's model, data and metric instead of the demo")
    parser.add_argument("--no-aimet", action="store_true", help="skip AIMET's rows even when aimet-onnx is installed")
    parser.add_argument("--sweep-samples", type=int, default=1,
                        help="calibration samples per AIMET sensitivity run (default 1, as AIMET's Lite-MP example)")
    parser.add_argument("--budget-minutes", type=float, default=15.0)
    parser.add_argument("--keep", help="keep the study and the exported models here")
    parser.add_argument("--weights", default="auto", choices=["auto", "per-tensor", "per-channel", "mixed"],
                        help="mpstudio's weight mode (mixed: each matrix weight int4/int8/int16, chosen jointly)")
    parser.add_argument("--max-premium", type=float, metavar="S",
                        help="gate: the pick's estimated premium over a8w8 at most S of a16w8's (default 1/3 with "
                             "--weights mixed, else no gate)")
    parser.add_argument("--confirm", action="store_true",
                        help="let mpstudio's search confirm its front on the HTP emulator (its default outside "
                             "this benchmark); the table still scores every pick with the one CPU evaluator")
    parser.add_argument("--ray", metavar="auto|ADDRESS",
                        help="run mpstudio's evaluations and analysis on this Ray cluster (the table's evaluator "
                             "stays in this process)")
    parser.add_argument("--htp", action="store_true",
                        help="judge every row on HTP numerics: its final model scored again on the HTP emulator, "
                             "whose value decides 'met' and the gates")
    parser.add_argument("--no-amp", action="store_true", help="AIMET's a8w8 and Lite-MP rows only")
    parser.add_argument("--aimet-only", action="store_true",
                        help="AIMET's rows only (the target must be a number), e.g. beside a run that has mpstudio's")
    args = parser.parse_args(argv)
    if args.aimet_only:
        try:
            float(args.target)
        except ValueError:
            parser.error(f"--aimet-only needs a numeric --target (a baseline-relative one needs mpstudio's search "
                         f"to resolve it), not {args.target!r}")
    if args.max_premium is None and args.weights == "mixed":
        args.max_premium = 1 / 3
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mpstudio-bench-search-"))
    shutil.rmtree(root / "study", ignore_errors=True)
    shutil.rmtree(root / "aimet", ignore_errors=True)
    study = fresh_study(root / "study", args.study)
    try:
        evaluator = Evaluator(study)
        print(f"model: {study.name}, {len(study.prepared.model.graph.node)} nodes, "
              f"{len(study.graph.activations())} activation tensors; {len(study.calibration)} calibration and "
              f"{len(study.evaluation_data)} evaluation samples; target {args.target}", flush=True)
        runner = None
        if args.ray:  # the search's evaluations and analysis on a Ray cluster (docs/ray.md)
            from mpstudio.distributed import OverRay, connect

            runner = OverRay(connect(args.ray))
            print(runner.cluster.describe(), flush=True)
        if args.aimet_only:
            threshold, rows = float(args.target), []
        else:
            ours, result = run_mpstudio(study, args.target, evaluator, args.weights, args.confirm, runner)
            print("mpstudio: " + result.describe().replace("\n", "\n  "), flush=True)
            against = premium(study, evaluator, result, ours)
            threshold, rows = result.threshold, [ours]
        if args.no_aimet:
            rows.append(Row("AIMET", None, None, 0.0, None, None, None, None, "skipped: --no-aimet"))
        elif not aimet_python():
            rows.append(Row("AIMET", None, None, 0.0, None, None, None, None,
                            f"skipped: set {AIMET_PYTHON} to a Python with the [aimet] extra (aimet-onnx)"))
        else:
            aimet_rows, errors = run_aimet(study, evaluator, threshold, root / "aimet", args.sweep_samples,
                                           amp=not args.no_amp)
            rows += aimet_rows + [Row("AIMET", None, None, 0.0, None, None, None, None, f"failed: {e}")
                                  for e in errors]
        if args.htp:
            rows = judged_on_htp(rows, evaluator, threshold)
        elapsed = time.perf_counter() - started
        print_table(rows, study.metric_name, threshold, study.higher_is_better)
        if args.aimet_only:  # no pick to judge: only the time gate
            failed = gates([Row("-", None, None, 0.0, None, None, None, True)], elapsed, args.budget_minutes)
        else:
            print("mpstudio's pick: " + against.describe(study.metric_name))
            failed = gates([r for r in rows if r.value is not None], elapsed, args.budget_minutes)
        if not args.aimet_only and args.max_premium is not None and not against.share <= args.max_premium + 1e-9:
            failed.append(f"the pick costs {against.share:.2f} of a16w8's estimated premium (wanted <= "
                          f"{args.max_premium:.2f})")
    finally:
        study.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    # The machine may be shared: the load and the CPU time say how far the wall times are from an idle machine's.
    cpu = sum(os.times()[:4])
    print(f"\nwhole run {elapsed / 60:.1f} min wall, {cpu / 60:.1f} min CPU, on {os.cpu_count()} cores; 1-minute "
          f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if failed:
        print("MISSED: " + "; ".join(failed))
        return 1
    print("all gates met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
