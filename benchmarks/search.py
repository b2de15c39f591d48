"""mpstudio's mixed-precision search against AIMET's (aimet-onnx), on one model, one target, one evaluator.

    python benchmarks/search.py [--target 0.02] [--study DIR] [--no-aimet] [--sweep-samples 2]
                                [--budget-minutes 15] [--keep DIR] [--weights mixed] [--ray auto|ADDRESS]

Model and data: the built-in demo (PP-OCRv4 text-line recognizer, 100 calibration and 100 evaluation lines,
scored by CER), or with `--study DIR` the model, data and metric of an existing study. Every method starts
from the same float model (the one mpstudio quantizes) and calibrates on the same calibration samples; a
fresh study folder is made for the run, so no stored result is reused.

The one evaluator, for every row: the QDQ model a method ends with (mpstudio: the model the study generates
for the recommended plan; AIMET: `QuantizationSimModel.to_onnx_qdq()`), run on ONNX Runtime's CPU EP with
mpstudio's default CPU numerics (`runtime.DEFAULT_CPU_NUMERICS`, the run `Study.evaluate` makes) over all evaluation samples and scored by the
study's metric. "est. ms" is mpstudio's HTP cost model (`mpstudio.latency.estimate_latency`) on that same
QDQ model: an estimate, not a measurement.

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

mpstudio's search runs without its HTP confirmation (`confirm=None`) unless `--confirm`: this benchmark
compares methods on the one CPU evaluator.

Gates (exit 1 when one fails): mpstudio's pick reaches the target; no AIMET result that reaches the target
has a lower estimated latency than mpstudio's pick; the whole run takes at most `--budget-minutes`; with
`--max-premium S` (default 1/3 with `--weights mixed`), the pick costs at most S of a16w8's estimated premium
over a8w8. The demo's figure: `--target float+100% --max-premium 0.33` (within 2x of the float model's CER at
no more than a third of a16w8's premium).
Without aimet-onnx (`pip install 'mpstudio[aimet]'`) its rows print as skipped and only the first and last
gates apply.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpstudio.loop.inprocess import run_outputs  # noqa: E402
from mpstudio.latency import estimate_latency  # noqa: E402
from mpstudio.search import meets, search  # noqa: E402
from mpstudio.sensitivity import OutputScorer  # noqa: E402
from mpstudio.sensitivity.isolation import float_references  # noqa: E402
from mpstudio.study import Study  # noqa: E402

LITE_MP_PERCENTS = (10, 20)


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

    def estimate_ms(self, path: Path) -> float:
        return estimate_latency(path, htp_arch=self.study.htp_arch).ms


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
              sixteen_bit_tensors(path), meets(value, result.threshold, evaluator.higher_is_better), note)
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
def aimet_available() -> bool:
    try:
        import aimet_onnx  # noqa: F401
    except ImportError:
        return False
    return True


class _AimetRun:
    """AIMET's sims on the study's float model and calibration data, exported and scored by the one evaluator."""

    def __init__(self, study: Study, evaluator: Evaluator, threshold: float, folder: Path, sweep_samples: int):
        import onnxruntime as ort
        from aimet_onnx.common.utils import AimetLogger
        from aimet_onnx.utils import make_psnr_eval_fn

        for area in AimetLogger.LogAreas:  # AIMET logs every quantizer at INFO
            AimetLogger.set_area_logger_level(area, logging.WARNING)
        self.study, self.evaluator, self.threshold, self.folder = study, evaluator, threshold, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.float_model = onnx.load(study.quantizer.float_path)
        self.calibration = [study.calibration.sample(i) for i in range(len(study.calibration))]
        float_session = ort.InferenceSession(str(study.quantizer.float_path), providers=["CPUExecutionProvider"])
        psnr = make_psnr_eval_fn(float_session, self.calibration[:sweep_samples], output_indices=None)
        self.sweeps = 0

        def counted_psnr(session) -> float:
            self.sweeps += 1
            return psnr(session)

        self.sensitivity_metric = counted_psnr
        self.exports = 0

    def sim(self, name: str):
        from aimet_onnx import QuantizationSimModel, int8

        return QuantizationSimModel(self.float_model, param_type=int8, activation_type=int8,
                                    config_file=f"htp_v{self.study.htp_arch}", path=str(self.folder / name))

    def export(self, sim, name: str) -> Path:
        self.exports += 1
        path = self.folder / f"{name}.onnx"
        onnx.save(sim.to_onnx_qdq(), path)
        return path

    def row(self, method: str, path: Path, evaluations: int | None, sweeps: int, seconds: float,
            note: str = "") -> Row:
        value = self.evaluator.score(path)
        return Row(method, evaluations, sweeps, seconds, value, self.evaluator.estimate_ms(path),
                   sixteen_bit_tensors(path), meets(value, self.threshold, self.evaluator.higher_is_better), note)

    def lite_mp(self) -> list[Row]:
        from aimet_onnx import analyze_per_layer_sensitivity, int8, int16
        from aimet_onnx.lite_mp import flip_layers_to_higher_precision

        started = time.perf_counter()
        sim = self.sim("lite-mp")
        sim.compute_encodings(self.calibration)
        base = self.export(sim, "aimet-a8w8")
        base_seconds = time.perf_counter() - started
        rows = [self.row("AIMET a8w8 (no search)", base, 1, 0, base_seconds + self._scoring(base),
                         "HTP config, per-channel int8 weights")]
        layers = analyze_per_layer_sensitivity(sim, self.sensitivity_metric)
        shared = time.perf_counter() - started
        for percent in LITE_MP_PERCENTS:
            # Flipping the top 20% after the top 10% flips the same set as flipping 20% at once.
            step = time.perf_counter()
            flip_layers_to_higher_precision(sim, layers, percent, override_precision=(int8, int16))
            sim.compute_encodings(self.calibration)
            path = self.export(sim, f"aimet-lite-mp-{percent}")
            seconds = shared + time.perf_counter() - step + self._scoring(path)
            flipped = math.ceil(len(layers) * percent / 100)
            rows.append(self.row(f"AIMET Lite-MP {percent}%", path, 1, len(layers), seconds,
                                 f"{flipped} of {len(layers)} ops flipped to W8A16"))
        return rows

    def amp(self) -> Row:
        from aimet_onnx.mixed_precision import analyze_mixed_precision_sensitivity, apply_amp, w8a8, w8a16

        started = time.perf_counter()
        before = self.sweeps
        sim = self.sim("amp")
        sensitivity = analyze_mixed_precision_sensitivity(sim, [w8a8, w8a16], self.sensitivity_metric,
                                                          self.calibration)
        sweeps = self.sweeps - before
        calls = []

        def acceptance(_session) -> bool:
            path = self.export(sim, f"aimet-amp-{len(calls)}")
            value = self.evaluator.score(path)
            calls.append(value)
            return meets(value, self.threshold, self.evaluator.higher_is_better)

        apply_amp(sim, sensitivity, acceptance)
        path = self.export(sim, "aimet-amp")
        seconds = time.perf_counter() - started + self._scoring(path)
        return self.row("AIMET AMP", path, len(calls), sweeps, seconds, "W8A8/W8A16 candidates, binary search")

    def _scoring(self, path: Path) -> float:
        """Seconds the evaluator takes to score `path` (the result is cached, so the row's scoring is free)."""
        started = time.perf_counter()
        self.evaluator.score(path)
        return time.perf_counter() - started


# ---- report ------------------------------------------------------------------------------------------------------
def print_table(rows: list[Row], metric: str, threshold: float, higher_is_better: bool) -> None:
    sign = ">=" if higher_is_better else "<="
    print(f"\ntarget: {metric} {sign} {threshold:.4f}; one evaluator (QDQ model on ORT CPU, all evaluation "
          "samples); est. ms = HTP cost model estimate")
    header = f"{'method':<24} {'evals':>5} {'sweeps':>6} {'wall s':>7} {'value':>8} {'target':>6} " \
             f"{'est. ms':>7} {'16-bit':>6}  note"
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.value is None:
            print(f"{r.method:<24} {r.note}")
            continue
        print(f"{r.method:<24} {r.evaluations if r.evaluations is not None else '-':>5} "
              f"{r.sweeps if r.sweeps is not None else '-':>6} {r.seconds:>7.1f} {r.value:>8.4f} "
              f"{'met' if r.reached else 'MISSED':>6} {r.estimate_ms:>7.3f} {r.sixteen_bit:>6}  {r.note}")


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
    args = parser.parse_args(argv)
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
        ours, result = run_mpstudio(study, args.target, evaluator, args.weights, args.confirm, runner)
        print("mpstudio: " + result.describe().replace("\n", "\n  "), flush=True)
        against = premium(study, evaluator, result, ours)
        rows = [ours]
        if args.no_aimet:
            rows.append(Row("AIMET", None, None, 0.0, None, None, None, None, "skipped: --no-aimet"))
        elif not aimet_available():
            rows.append(Row("AIMET", None, None, 0.0, None, None, None, None,
                            "skipped: install the [aimet] extra (pip install 'mpstudio[aimet]')"))
        else:
            aimet = _AimetRun(study, evaluator, result.threshold, root / "aimet", args.sweep_samples)
            rows += aimet.lite_mp()
            print(f"AIMET Lite-MP done, {time.perf_counter() - started:.0f} s into the run", flush=True)
            rows.append(aimet.amp())
        elapsed = time.perf_counter() - started
        print_table(rows, study.metric_name, result.threshold, study.higher_is_better)
        print("mpstudio's pick: " + against.describe(study.metric_name))
        failed = gates([r for r in rows if r.value is not None], elapsed, args.budget_minutes)
        if args.max_premium is not None and not against.share <= args.max_premium + 1e-9:
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
