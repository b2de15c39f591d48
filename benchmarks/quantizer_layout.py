"""mpstudio's quantizer layout for HTP against AIMET's (aimet-onnx), all 8 bits with per-channel int8 weights.

    python benchmarks/quantizer_layout.py [--models demo,mobilenet_v3_small] [--htp-samples 20] [--no-htp] [--no-aimet]

The default is the demo alone (the accuracy target this layout is held to); `--models demo,mobilenet_v3_small`
adds a random-weight MobileNet-v3-Small, on which mpstudio is behind AIMET today (docs/benchmarks.md).

Every row is one QDQ model of the same float model, calibrated on the same samples, all activations 8-bit and
weights signed symmetric per-channel int8 where the layout has them:
- "float ranges": mpstudio's previous layout, ranges calibrated on the float model (ORT's calibrator), then
  `get_qnn_qdq_config` + `quantize_static`.
- "mpstudio": `Quantizer.generate` today: ranges calibrated with the weights quantized (a second pass on the
  float model carrying the weights the first pass quantized), then the same ORT quantizer and the Relu/Clip
  post-pass.
- "AIMET": `QuantizationSimModel(param_type=int8, activation_type=int8, config_file="htp_v75")`,
  `compute_encodings` on the calibration samples, `to_onnx_qdq()`: AIMET's HTP layout (supergroups, tied
  data movement). That export leaves decomposed LayerNorms in float for the QNN converter to fuse, which the
  QNN EP cannot finalize, so its HTP column is blank.
- "AIMET, QNN EP-loadable": the same AIMET model exported with int32 biases, its float tensors given 8-bit
  Q/DQ with ORT's float-model ranges (a Conv output before its Relu takes the Relu's encoding, so the
  supergroup's value is unchanged), and int32 constants of element-wise ops (AIMET's LayerNorm beta) stored
  as uint8: the nearest model to AIMET's layout that runs on the HTP emulator.

Scores: the demo (PP-OCRv4 recognizer) by CER on ORT CPU over all 100 evaluation lines and on the HTP emulator
(htp_arch 75) over the first `--htp-samples` lines; other models (`benchmarks/latency_models.py`
architectures with random weights, 16 random calibration and 16 random evaluation inputs) by output SNR
against the float model in dB, on CPU over all 16 and on HTP over the first `--htp-samples`.

Gate (exit 1): on every model measured on HTP, mpstudio's HTP score is at least AIMET's (the loadable one).
With aimet-onnx installed the comparison is live; without it (or with `--no-aimet`) mpstudio is compared
against the AIMET figures recorded below (aimet-onnx 2.42, onnxruntime 1.32.0, onnxruntime-qnn 2.7.0).
"""

from __future__ import annotations

import argparse
import collections
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpstudio.data import FeedList  # noqa: E402
from mpstudio.loop.inprocess import run_outputs  # noqa: E402
from mpstudio.model import prepare_model  # noqa: E402
from mpstudio.plan import PrecisionPlan  # noqa: E402
from mpstudio.qdq import read  # noqa: E402
from mpstudio.quantize import Quantizer  # noqa: E402

HTP_ARCH = "75"
PLAN = PrecisionPlan(weight_type="int8", per_channel=True, name="a8w8 per-channel int8")
# AIMET's loadable model's HTP score per (model, HTP samples), measured by this script with aimet-onnx 2.42.
RECORDED_AIMET_HTP = {("demo", 20): 0.0481, ("mobilenet_v3_small", 20): 26.3487}


@dataclass(frozen=True)
class Case:
    """A float model with calibration and evaluation data and a score (higher or lower is better)."""

    name: str
    quantizer: Quantizer
    evaluation: object  # DataSource
    score: object  # outputs (list of name -> array) -> float
    unit: str
    higher_is_better: bool


def demo_case(root: Path) -> Case:
    from mpstudio.demos import load_demo

    from mpstudio.ctc_text import cer_metric, ctc_charset

    demo = load_demo()
    charset = ctc_charset(demo.model)

    def cer(outputs) -> float:  # over the first len(outputs) lines
        return cer_metric(demo.texts[:len(outputs)], charset)(outputs)

    return Case("demo", Quantizer(demo.model, demo.calibration, root / "demo"), demo.evaluation, cer, "CER", False)


def architecture_case(name: str, root: Path) -> Case:
    from latency_models import ARCHITECTURES, random_feeds

    arch = next((a for a in ARCHITECTURES if a.name == name), None)
    if arch is None:
        raise SystemExit(f"unknown model {name!r}; use demo or one of {', '.join(a.name for a in ARCHITECTURES)}")
    model = arch.build()
    prepared = prepare_model(model)
    quantizer = Quantizer(prepared, FeedList(random_feeds(model, 16, seed=0)), root / name)
    evaluation = FeedList(random_feeds(model, 16, seed=1))
    references = run_outputs(quantizer.float_path, evaluation, "cpu")

    def snr(outputs) -> float:
        ref = np.concatenate([np.ravel(r[k]) for r in references[:len(outputs)] for k in sorted(r)]).astype(np.float64)
        out = np.concatenate([np.ravel(o[k]) for o in outputs for k in sorted(o)]).astype(np.float64)
        return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((out - ref) ** 2), 1e-30)))

    return Case(name, quantizer, evaluation, snr, "SNR dB", True)


# ---- the models ------------------------------------------------------------------------------------------
def float_ranges_model(quantizer: Quantizer, out: Path) -> Path:
    """The previous layout: `PLAN` quantized from the float model's own ranges."""
    quantizer._quantize(PLAN, quantizer._calibrate_float(None, None), out)
    return out


def aimet_available() -> bool:
    try:
        import aimet_onnx  # noqa: F401
    except ImportError:
        return False
    return True


def aimet_models(quantizer: Quantizer, folder: Path, reference: Path) -> tuple[Path, Path]:
    """AIMET's all-8-bit HTP export, and the same made loadable by the QNN EP (see the module docstring)."""
    from aimet_onnx import QuantizationSimModel, int8
    from aimet_onnx.common.utils import AimetLogger

    for area in AimetLogger.LogAreas:  # AIMET logs every quantizer at INFO
        AimetLogger.set_area_logger_level(area, logging.WARNING)
    calibration = [quantizer.calibration.sample(i) for i in range(len(quantizer.calibration))]
    sim = QuantizationSimModel(onnx.load(quantizer.float_path), param_type=int8, activation_type=int8,
                               config_file=f"htp_v{HTP_ARCH}", path=str(folder / "sim"))
    sim.compute_encodings(calibration)
    plain, loadable = folder / "aimet.onnx", folder / "aimet-loadable.onnx"
    onnx.save(sim.to_onnx_qdq(), plain)
    model = sim.to_onnx_qdq(export_int32_bias=True, prequantize_constants=True)
    onnx.save(loadable_on_qnn_ep(model, reference), loadable)
    return plain, loadable


def _uint8(low: float, high: float) -> tuple[float, int]:
    low, high = min(0.0, low), max(0.0, high)
    scale = (high - low) / 255 or 1.0
    return scale, int(round(-low / scale))


def loadable_on_qnn_ep(model: onnx.ModelProto, reference: Path) -> onnx.ModelProto:
    """AIMET's export with Q/DQ on its float tensors (ORT's ranges from the QDQ model at `reference`, or the
    following Relu's encoding for a Conv output) and int32 element-wise constants stored as uint8."""
    ranges = read(reference).activations()
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"}
    qdq = ("QuantizeLinear", "DequantizeLinear")
    floating = sorted({name for n in graph.node if n.op_type not in qdq + ("Constant",) for name in n.input
                       if name and name not in inits and (producer.get(name) is None and name in constants
                                                          or producer.get(name) is not None
                                                          and producer[name].op_type != "DequantizeLinear")})
    inserted = collections.defaultdict(list)
    for name in floating:
        source = producer.get(name)
        if name in constants:
            scale, zero = _uint8(float(constants[name].min()), float(constants[name].max()))
        elif source.op_type == "Conv" and all(c.op_type == "Relu" for c in consumers[name]):
            relu_q = next(c for c in consumers[consumers[name][0].output[0]] if c.op_type == "QuantizeLinear")
            scale = float(numpy_helper.to_array(inits[relu_q.input[1]]))
            zero = int(numpy_helper.to_array(inits[relu_q.input[2]]))
        else:
            encoding = ranges[name].encoding
            scale, zero = encoding.step, encoding.zero
        graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), f"{name}_layout_scale"),
                                  numpy_helper.from_array(np.array(zero, np.uint8), f"{name}_layout_zero_point")])
        params = [f"{name}_layout_scale", f"{name}_layout_zero_point"]
        for consumer in consumers[name]:
            if consumer.op_type not in qdq:
                consumer.input[:] = [f"{name}_layout_dq" if i == name else i for i in consumer.input]
        inserted[name] = [helper.make_node("QuantizeLinear", [name] + params, [f"{name}_layout_q"]),
                          helper.make_node("DequantizeLinear", [f"{name}_layout_q"] + params, [f"{name}_layout_dq"])]
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        graph.node.append(node)
        for output in node.output:
            graph.node.extend(inserted.pop(output, []))
    for node in graph.node:  # int32 constants of element-wise ops: QNN takes int32 only as a Conv/Gemm bias
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        codes = inits[node.input[0]]
        if codes.data_type != onnx.TensorProto.INT32 or all(
                c.op_type in ("Conv", "ConvTranspose", "Gemm") for c in consumers[node.output[0]]):
            continue
        value = ((numpy_helper.to_array(codes).astype(np.float64) - numpy_helper.to_array(inits[node.input[2]]))
                 * numpy_helper.to_array(inits[node.input[1]]))
        scale, zero = _uint8(float(value.min()), float(value.max()))
        codes.CopyFrom(numpy_helper.from_array(np.clip(np.round(value / scale) + zero, 0, 255).astype(np.uint8),
                                               codes.name))
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(np.array(scale, np.float32), node.input[1]))
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(np.array(zero, np.uint8), node.input[2]))
        for attribute in [a for a in node.attribute if a.name == "axis"]:
            node.attribute.remove(attribute)
    onnx.checker.check_model(model)
    return model


# ---- scoring -----------------------------------------------------------------------------------------------
def score(case: Case, path: Path, backend: str, samples: int | None) -> float | None:
    source = case.evaluation if samples is None else case.evaluation.head(samples)
    options = {"htp_arch": HTP_ARCH} if backend == "htp" else None
    try:
        outputs = run_outputs(path, source, backend, options)
    except Exception as exc:  # AIMET's plain export does not load on the QNN EP
        print(f"  {path.name} on {backend}: {str(exc).splitlines()[0][:160]}", flush=True)
        return None
    return case.score(outputs)


def better_or_equal(a: float, b: float, higher_is_better: bool) -> bool:
    return a >= b if higher_is_better else a <= b


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo",
                        help="comma-separated: demo and/or benchmarks/latency_models.py architectures")
    parser.add_argument("--htp-samples", type=int, default=20, help="evaluation samples on the HTP emulator")
    parser.add_argument("--no-htp", action="store_true", help="score on ORT CPU only (no gate)")
    parser.add_argument("--no-aimet", action="store_true", help="compare with the recorded AIMET figures")
    parser.add_argument("--keep", help="keep the caches and models here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    live = aimet_available() and not args.no_aimet
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mpstudio-bench-layout-"))
    failed = []
    try:
        for name in args.models.split(","):
            started = time.perf_counter()
            case = demo_case(root) if name == "demo" else architecture_case(name, root)
            folder = root / f"{name}-models"
            folder.mkdir(parents=True, exist_ok=True)
            models = {"float ranges": float_ranges_model(case.quantizer, folder / "float-ranges.onnx"),
                      "mpstudio": case.quantizer.generate(PLAN)}
            if live:
                models["AIMET"], models["AIMET, QNN EP-loadable"] = aimet_models(case.quantizer, folder,
                                                                                models["float ranges"])
            print(f"\n{name}: {PLAN.name}; {case.unit} on ORT CPU over {len(case.evaluation)} samples, on the "
                  f"HTP emulator (htp_arch {HTP_ARCH}) over the first {args.htp_samples}", flush=True)
            rows = {}
            for label, path in models.items():
                cpu = score(case, path, "cpu", None)
                htp = None if args.no_htp else score(case, path, "htp", args.htp_samples)
                rows[label] = (cpu, htp)
                fmt = lambda v: "   -   " if v is None else f"{v:7.4f}"  # noqa: E731
                print(f"  {label:<24} cpu {fmt(cpu)}   htp {fmt(htp)}", flush=True)
            if not live and (name, args.htp_samples) in RECORDED_AIMET_HTP:
                rows["AIMET, QNN EP-loadable"] = (None, RECORDED_AIMET_HTP[(name, args.htp_samples)])
                print(f"  {'AIMET (recorded)':<24} cpu    -      htp {rows['AIMET, QNN EP-loadable'][1]:7.4f}")
            ours, theirs = rows["mpstudio"][1], rows.get("AIMET, QNN EP-loadable", (None, None))[1]
            if ours is not None and theirs is not None:
                verdict = better_or_equal(ours, theirs, case.higher_is_better)
                print(f"  mpstudio vs AIMET on HTP: {ours:.4f} vs {theirs:.4f} {case.unit}: "
                      f"{'at least as good' if verdict else 'WORSE'}")
                if not verdict:
                    failed.append(f"{name}: mpstudio {ours:.4f} vs AIMET {theirs:.4f} {case.unit} on HTP")
            print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if failed:
        print("MISSED: " + "; ".join(failed))
        return 1
    print("\nall gates met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
