"""Records this folder's AIMET exports of the element-wise test model (tests/test_aimet_exchange.py).

    MPSTUDIO_AIMET_PYTHON=<python with aimet-onnx> python tests/data/aimet/record.py

Builds `make_eltwise_model()`, then has aimet-onnx (benchmarks/aimet_side.py `own`, in that interpreter)
quantize it as QuantizationSimModel(model, param_type="int8", activation_type="int8", config_file="htp_v75"),
compute_encodings over `eltwise_feeds(4)`, and write:
  eltwise.encodings         sim.export(..., encoding_version="1.0.0")
  eltwise.0.6.1.encodings   sim.export(..., encoding_version="0.6.1")
  eltwise_qdq.onnx          sim.to_onnx_qdq()
  eltwise_sim_outputs.npz   the sim's output on each of `eltwise_feeds(8, seed=2)` (key "outputs")
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_aimet_exchange import eltwise_feeds, make_eltwise_model  # noqa: E402

EVAL_SAMPLES, EVAL_SEED = 8, 2


def stacked(feeds) -> dict[str, np.ndarray]:
    return {name: np.stack([f[name] for f in feeds]) for name in feeds[0]}


def main() -> int:
    python = os.environ.get("MPSTUDIO_AIMET_PYTHON")
    if not python:
        raise SystemExit("set MPSTUDIO_AIMET_PYTHON to a Python with aimet-onnx")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        onnx.save(make_eltwise_model(), str(work / "eltwise.onnx"))
        np.savez(work / "cal.npz", **stacked(eltwise_feeds(4)))
        np.savez(work / "eval.npz", **stacked(eltwise_feeds(EVAL_SAMPLES, EVAL_SEED)))
        run = subprocess.run([python, str(ROOT / "benchmarks" / "aimet_side.py"), "own", str(work / "eltwise.onnx"),
                              "--calibration", str(work / "cal.npz"), "--eval", str(work / "eval.npz"),
                              "--out", str(work / "out")], env={**os.environ, "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(run.stderr[-3000:])
        out = work / "out"
        shutil.copy(out / "aimet.1.0.0.encodings", HERE / "eltwise.encodings")
        shutil.copy(out / "aimet.0.6.1.encodings", HERE / "eltwise.0.6.1.encodings")
        shutil.copy(out / "aimet_qdq.onnx", HERE / "eltwise_qdq.onnx")
        shutil.copy(out / "aimet_sim_outputs.npz", HERE / "eltwise_sim_outputs.npz")
    print(json.dumps(sorted(p.name for p in HERE.iterdir())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
