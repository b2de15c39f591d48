"""AIMET's side of the exchange, run by an interpreter with aimet-onnx (never imported by mpstudio itself).

    <aimet python> benchmarks/aimet_side.py strict FLOAT.onnx ENCODINGS [--eval FEEDS.npz --outputs OUT.npz]
    <aimet python> benchmarks/aimet_side.py own FLOAT.onnx --calibration FEEDS.npz --eval FEEDS.npz --out DIR
        [--param-type int8] [--activation-type int8] [--config htp_v75]

`strict` builds a QuantizationSimModel of the float model, sets its quantizers as the file has them
(`mpstudio.export_aimet.configure_aimet_sim`) and loads the file with `load_encodings_to_sim(..., strict=True)`;
with `--eval` it runs AIMET's sim on those inputs and saves the first output of each. `own` is AIMET's own
quantization: compute_encodings over the calibration inputs, the sim's outputs on the evaluation inputs, the
export in both encodings versions (`aimet.1.0.0.encodings`, `aimet.0.6.1.encodings`) and `to_onnx_qdq`
(`aimet_qdq.onnx`). A FEEDS.npz holds one array per input name, samples stacked along a new first axis.
Prints one JSON line with what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx


def read_feeds(path: str) -> list[dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    count = len(next(iter(arrays.values())))
    return [{name: values[i] for name, values in arrays.items()} for i in range(count)]


def sim_outputs(sim, feeds) -> np.ndarray:
    return np.stack([sim.session.run(None, feed)[0] for feed in feeds])


def make_sim(model_path: str, param_type: str, activation_type: str, config: str):
    from aimet_onnx.quantsim import QuantizationSimModel

    return QuantizationSimModel(onnx.load(model_path), param_type=param_type, activation_type=activation_type,
                                config_file=config)


def strict(args) -> dict:
    from aimet_onnx.quantsim import load_encodings_to_sim
    from mpstudio.export_aimet import configure_aimet_sim, encodings_for_sim

    sim = make_sim(args.model, args.param_type, args.activation_type, args.config)
    configure_aimet_sim(sim, args.encodings)
    encodings, left_out = encodings_for_sim(args.encodings, sim)
    mismatches = load_encodings_to_sim(sim, encodings, strict=True)
    result = {"loaded_strictly": True, "left_out": left_out, "mismatches": len(mismatches or [])}
    if args.eval:
        np.savez(args.outputs, outputs=sim_outputs(sim, read_feeds(args.eval)))
    return result


def own(args) -> dict:
    sim = make_sim(args.model, args.param_type, args.activation_type, args.config)
    sim.compute_encodings(read_feeds(args.calibration))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "aimet_sim_outputs.npz", outputs=sim_outputs(sim, read_feeds(args.eval)))
    for version in ("1.0.0", "0.6.1"):
        with tempfile.TemporaryDirectory() as scratch:
            sim.export(scratch, "aimet", export_model=False, encoding_version=version)
            shutil.copy(Path(scratch) / "aimet.encodings", out / f"aimet.{version}.encodings")
    onnx.save(sim.to_onnx_qdq(), str(out / "aimet_qdq.onnx"))
    return {"exported": sorted(p.name for p in out.iterdir())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("strict", "own"))
    parser.add_argument("model")
    parser.add_argument("encodings", nargs="?")
    parser.add_argument("--calibration")
    parser.add_argument("--eval")
    parser.add_argument("--outputs")
    parser.add_argument("--out")
    parser.add_argument("--param-type", default="int8")
    parser.add_argument("--activation-type", default="int8")
    parser.add_argument("--config", default="htp_v75")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpstudio.export_aimet (no AIMET import)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = strict(args) if args.mode == "strict" else own(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
