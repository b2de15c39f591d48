"""mpstudio and AIMET exchanging quantizations, both ways, with the accuracy of each side.

    MPSTUDIO_AIMET_PYTHON=<python with aimet-onnx> python benchmarks/aimet_exchange.py [--models demo,cnn]

Per model (demo: the PP-OCRv4 recognizer, CER over 100 rendered lines; cnn: latency_models.mobilenet_v2 at
64x64 with random weights, output SNR against the float model over 16 random inputs):
1. mpstudio -> AIMET: each plan's encodings, exported in 1.0.0 and 0.6.1, loaded by AIMET with
   `load_encodings_to_sim(..., strict=True)` after `configure_aimet_sim`; the accuracy of mpstudio's plan
   (ORT's CPU run of its QDQ model) and of AIMET's sim holding the 1.0.0 file.
2. AIMET -> mpstudio: AIMET's own a8w8 quantization (int8/int8, htp_v75, min-max over the calibration data),
   the accuracy of its sim and of its `to_onnx_qdq` model (ORT CPU), and of the plans mpstudio imports from its
   1.0.0 export, its 0.6.1 export and its QDQ model, with what each import does not apply.
AIMET runs in its own interpreter (benchmarks/aimet_side.py); mpstudio never imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpstudio.data import FeedList  # noqa: E402
from mpstudio.export import export_plan  # noqa: E402
from mpstudio.loop.inprocess import run_outputs  # noqa: E402
from mpstudio.plan import PrecisionPlan  # noqa: E402
from mpstudio.study import Study  # noqa: E402

SIDE = Path(__file__).resolve().parent / "aimet_side.py"
# The demo's three 16-bit tensors: the decomposed LayerNorm's Pow, the last Conv's output and the Add before it.
DEMO_SIXTEEN = ["p2o.Pow.3", "conv2d_189.tmp_0", "p2o.Add.223"]


def aimet(*args: str) -> dict:
    python = os.environ.get("MPSTUDIO_AIMET_PYTHON")
    if not python:
        raise SystemExit("set MPSTUDIO_AIMET_PYTHON to a Python with aimet-onnx")
    env = {**os.environ, "PYTHONPATH": str(SIDE.parent.parent)}
    run = subprocess.run([python, str(SIDE), *args], capture_output=True, text=True, env=env)
    if run.returncode:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def save_feeds(source, path: Path) -> Path:
    samples = [source.sample(i) for i in range(len(source))]
    np.savez(path, **{name: np.stack([s[name] for s in samples]) for name in samples[0]})
    return path


def demo_case(folder: Path):
    study = Study.demo(folder / "demo")
    from mpstudio.demos.ocr import load_demo

    demo = load_demo()
    plans = {"a8w8-pc+3x16": PrecisionPlan(weight_type="int8", per_channel=True).promote(DEMO_SIXTEEN),
             "a8w8": PrecisionPlan.a8w8(), "a16w8-pc": PrecisionPlan(activation_type="uint16", weight_type="int8",
                                                                      per_channel=True)}
    return study, plans, "CER", lambda outputs: demo.metric.fn(outputs)


def cnn_case(folder: Path):
    from latency_models import mobilenet_v2
    from mpstudio.metrics import output_snr

    def feeds(count, seed):
        rng = np.random.default_rng(seed)
        return FeedList([{"x": rng.normal(0, 1, (1, 3, 64, 64)).astype(np.float32)} for _ in range(count)])

    study = Study.open(folder / "cnn") if (folder / "cnn" / "study.json").exists() else \
        Study.create(folder / "cnn", mobilenet_v2(64), feeds(16, 5), feeds(16, 6))
    reference = study.float_outputs()
    plans = {"a8w8-pc+3x16": PrecisionPlan(weight_type="int8", per_channel=True).promote(
                 [t for t in study.graph.activations()][-3:]),
             "a8w8": PrecisionPlan.a8w8(), "a16w8-pc": PrecisionPlan(activation_type="uint16", weight_type="int8",
                                                                      per_channel=True)}
    return study, plans, "SNR dB", lambda outputs: output_snr(outputs, reference)


CASES = {"demo": demo_case, "cnn": cnn_case}


def as_outputs(study, path: Path) -> list[dict]:
    name = study.prepared.outputs[0].name
    with np.load(path) as data:
        return [{name: x} for x in data["outputs"]]


def exchange(name: str, folder: Path) -> list[str]:
    study, plans, metric, score = CASES[name](folder)
    lines = [f"## {name} ({metric})", "", "| side | plan | accuracy | AIMET strict 1.0.0 | AIMET strict 0.6.1 |",
             "|---|---|---|---|---|"]
    eval_feeds = save_feeds(study.evaluation_data, folder / f"{name}.eval.npz")
    float_model = str(study.folder / "model.onnx")
    for label, plan in plans.items():
        value = study.evaluate(plan, measure_latency=False).value
        loads = {}
        for version in ("1.0.0", "0.6.1"):
            result = export_plan(study.quantizer, plan, folder / f"{name}-{label}-{version}", formats=("qnn",),
                                 encodings_version=version, name=label)
            extra = ["--eval", str(eval_feeds), "--outputs", str(folder / f"{name}-{label}.sim.npz")] \
                if version == "1.0.0" else []
            loads[version] = aimet("strict", float_model, str(result.encodings), *extra)
        sim = score(as_outputs(study, folder / f"{name}-{label}.sim.npz")) \
            if loads["1.0.0"].get("loaded_strictly") else float("nan")
        lines.append(f"| mpstudio plan (ORT CPU) | {label} | {value:.4f} | "
                     + " | ".join(_strict_cell(loads[v]) for v in ("1.0.0", "0.6.1")) + " |")
        lines.append(f"| AIMET sim, mpstudio's 1.0.0 encodings | {label} | {sim:.4f} | | |")
    own_dir = folder / f"{name}-aimet"
    done = aimet("own", float_model, "--calibration", str(save_feeds(study.calibration, folder / "cal.npz")),
                 "--eval", str(eval_feeds), "--out", str(own_dir))
    if "error" in done:
        lines.append(f"AIMET's own export failed: {done['error']}")
        return lines
    sim = score(as_outputs(study, own_dir / "aimet_sim_outputs.npz"))
    lines.append(f"| AIMET sim (its own encodings) | a8w8-pc (AIMET int8/int8, htp_v75) | {sim:.4f} | | |")
    qdq = run_outputs(own_dir / "aimet_qdq.onnx", study.evaluation_data)
    lines.append(f"| AIMET to_onnx_qdq (ORT CPU) | a8w8-pc (AIMET) | {score(qdq):.4f} | | |")
    reports = []
    for source in ("aimet.1.0.0.encodings", "aimet.0.6.1.encodings", "aimet_qdq.onnx"):
        imported = study.import_plan(own_dir / source)
        value = study.evaluate(imported.plan, measure_latency=False).value
        lines.append(f"| mpstudio, imported {source} | a8w8-pc (AIMET) | {value:.4f} | | |")
        reports.append(imported.describe())
    return lines + ["", "```", *(line for report in reports for line in _brief(report)), "```"]


def _brief(report: str, keep: int = 6) -> list[str]:
    lines = report.splitlines()
    return lines[:keep] + ([f"    ... and {len(lines) - keep} more line(s)"] if len(lines) > keep else [])


def _strict_cell(result: dict) -> str:
    if result.get("loaded_strictly"):
        return f"loaded ({len(result['left_out'])} left out: {', '.join(result['left_out'][:3])})"
    return "refused: " + result.get("error", "?")[:120]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="demo,cnn")
    parser.add_argument("--keep", help="folder to keep the studies and files in (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            print("\n".join(exchange(name, folder)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
