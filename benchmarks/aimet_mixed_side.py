"""AIMET's mixed precision (Lite-MP and AMP) on one float model, run by an interpreter with aimet-onnx.

    <aimet python> benchmarks/aimet_mixed_side.py FLOAT.onnx --calibration FEEDS.npz --out DIR
        [--sweep-samples 1] [--htp-arch 75] [--percents 10,20] [--no-amp]

benchmarks/search.py starts it (through `$MPSTUDIO_AIMET_PYTHON`) and talks to it over stdin/stdout; mpstudio
never imports AIMET. What it does, in order:
- AIMET a8w8: `QuantizationSimModel(int8, int8, config_file="htp_v<arch>")` + `compute_encodings` over the
  calibration samples, exported with `to_onnx_qdq` (no search).
- Lite-MP p%: `analyze_per_layer_sensitivity` on that sim (output PSNR against the float model on the first
  `--sweep-samples` calibration samples), then `flip_layers_to_higher_precision(p, override_precision=(int8,
  int16))` and recalibration, exported.
- AMP: `analyze_mixed_precision_sensitivity(sim, [w8a8, w8a16], PSNR)` and `apply_amp` whose acceptance
  function exports the sim's current QDQ model and asks the parent whether it reaches the target.

Protocol: every line meant for the parent starts with `PROTOCOL` and carries one JSON object: {"row": {...}}
when a row's model is written, {"accept": PATH} when AMP asks (the parent answers one line, "1" or "0"), {"error":
TEXT} when a stage fails (the other stages still run) and {"done": true} at the end. AIMET's own log lines go to
stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import traceback
from pathlib import Path

PROTOCOL = "MPSTUDIO-AIMET "


def say(message: dict) -> None:
    sys.__stdout__.write(PROTOCOL + json.dumps(message) + "\n")
    sys.__stdout__.flush()


def read_feeds(path: str) -> list[dict]:
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    count = len(next(iter(arrays.values())))
    return [{name: values[i] for name, values in arrays.items()} for i in range(count)]


class Mixed:
    """AIMET's sims of one float model, each stage's QDQ model written to `out`."""

    def __init__(self, args):
        import onnx
        import onnxruntime as ort
        from aimet_onnx.utils import make_psnr_eval_fn

        self.args, self.out = args, Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.float_model = onnx.load(args.model)
        self.calibration = read_feeds(args.calibration)
        session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
        psnr = make_psnr_eval_fn(session, self.calibration[:args.sweep_samples], output_indices=None)
        self.sweeps = 0

        def counted(sim_session) -> float:
            self.sweeps += 1
            return psnr(sim_session)

        self.metric = counted

    def sim(self, name: str):
        from aimet_onnx import QuantizationSimModel, int8

        return QuantizationSimModel(self.float_model, param_type=int8, activation_type=int8,
                                    config_file=f"htp_v{self.args.htp_arch}", path=str(self.out / name))

    def export(self, sim, name: str) -> str:
        import onnx

        path = self.out / f"{name}.onnx"
        onnx.save(sim.to_onnx_qdq(), str(path))
        return str(path)

    def lite_mp(self) -> None:
        from aimet_onnx import analyze_per_layer_sensitivity, int8, int16
        from aimet_onnx.lite_mp import flip_layers_to_higher_precision

        started = time.perf_counter()
        sim = self.sim("lite-mp")
        sim.compute_encodings(self.calibration)
        say({"row": {"method": "AIMET a8w8 (no search)", "path": self.export(sim, "aimet-a8w8"), "evaluations": 1,
                     "sweeps": 0, "seconds": time.perf_counter() - started,
                     "note": "HTP config, per-channel int8 weights"}})
        layers = analyze_per_layer_sensitivity(sim, self.metric)
        shared = time.perf_counter() - started
        for percent in self.args.percents:
            # Flipping the top 20% after the top 10% flips the same set as flipping 20% at once.
            step = time.perf_counter()
            flip_layers_to_higher_precision(sim, layers, percent, override_precision=(int8, int16))
            sim.compute_encodings(self.calibration)
            path = self.export(sim, f"aimet-lite-mp-{percent}")
            flipped = math.ceil(len(layers) * percent / 100)
            say({"row": {"method": f"AIMET Lite-MP {percent}%", "path": path, "evaluations": 1,
                         "sweeps": len(layers), "seconds": shared + time.perf_counter() - step,
                         "note": f"{flipped} of {len(layers)} ops flipped to W8A16"}})

    def amp(self) -> None:
        from aimet_onnx.mixed_precision import analyze_mixed_precision_sensitivity, apply_amp, w8a8, w8a16

        started, before = time.perf_counter(), self.sweeps
        sim = self.sim("amp")
        sensitivity = analyze_mixed_precision_sensitivity(sim, [w8a8, w8a16], self.metric, self.calibration)
        sweeps = self.sweeps - before
        calls = []

        def acceptance(_session) -> bool:
            path = self.export(sim, f"aimet-amp-{len(calls)}")
            say({"accept": path})
            answer = sys.stdin.readline().strip()
            calls.append(answer)
            return answer == "1"

        apply_amp(sim, sensitivity, acceptance)
        say({"row": {"method": "AIMET AMP", "path": self.export(sim, "aimet-amp"), "evaluations": len(calls),
                     "sweeps": sweeps, "seconds": time.perf_counter() - started,
                     "note": "W8A8/W8A16 candidates, binary search"}})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--calibration", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sweep-samples", type=int, default=1)
    parser.add_argument("--htp-arch", default="75")
    parser.add_argument("--percents", default="10,20", type=lambda text: [int(p) for p in text.split(",")])
    parser.add_argument("--no-amp", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout = sys.stderr  # AIMET and torch print; only protocol lines reach the parent's pipe
    from aimet_onnx.common.utils import AimetLogger

    for area in AimetLogger.LogAreas:  # AIMET logs every quantizer at INFO
        AimetLogger.set_area_logger_level(area, logging.WARNING)
    mixed = Mixed(args)
    stages = [("Lite-MP", mixed.lite_mp)] + ([] if args.no_amp else [("AMP", mixed.amp)])
    for name, stage in stages:
        try:
            stage()
        except Exception as error:  # one stage failing leaves the others' rows standing
            traceback.print_exc()
            say({"error": f"{name}: {type(error).__name__}: {error}"})
    say({"done": True})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
