"""The benchmarks can fail: a missed target exits non-zero, a met one exits zero (real runs on a small study)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from conftest import chain_feeds, make_chain_model
from mpstudio.data import FeedList
from mpstudio.study import Study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_study(tmp_path):
    """A six-block Conv/Relu chain scored by output SNR (the studies' default metric)."""
    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=6, size=16), path)
    Study.create(tmp_path / "given", path, FeedList(chain_feeds(8)), FeedList(chain_feeds(6, seed=5))).close()
    return tmp_path / "given"


def _search_benchmark(study: Path, target: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPSTUDIO_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search.py"), "--study", str(study),
                           "--target", target, "--keep", str(tmp_path / "run"), *extra],
                          capture_output=True, text=True, env=env, timeout=300)


def _aimet_installed() -> bool:
    return bool(os.environ.get("MPSTUDIO_AIMET_PYTHON"))  # AIMET runs only in that interpreter


def test_search_benchmark_exits_non_zero_on_an_impossible_target(small_study, tmp_path):
    out = _search_benchmark(small_study, "1000", tmp_path)  # an output SNR of 1000 dB: no plan reaches it
    assert out.returncode == 1, out.stdout + out.stderr
    assert "MISSED: mpstudio's pick misses the target" in out.stdout
    assert "mpstudio search" in out.stdout and "MISSED" in out.stdout.split("mpstudio search", 1)[1].splitlines()[0]
    if not _aimet_installed():
        assert "skipped: set MPSTUDIO_AIMET_PYTHON" in out.stdout


def test_search_benchmark_exits_zero_when_every_gate_is_met(small_study, tmp_path):
    # The all-8-bit baseline's own SNR: reached at once. AIMET's rows would add a gate of their own.
    out = _search_benchmark(small_study, "a8w8", tmp_path, "--no-aimet")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all gates met" in out.stdout and "skipped: --no-aimet" in out.stdout


def test_the_loop_benchmark_gates_on_the_medians(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import loop
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def row(k, predicted, first):
        return {"round": k, "tensor": f"t{k}", "predicted_s": predicted, "first_s": first, "full_s": 30.0,
                "predicted": 0.1, "first": 0.1, "low": 0.05, "high": 0.2, "status": "measured on 12 of 100 samples",
                "full": 0.1}
    fast = [row(k, 0.4, 6.0) for k in range(5)]
    assert loop.report(fast) == 0
    # One slow round does not move the median; three do. A promotion whose predicted point never showed counts
    # as infinitely slow.
    assert loop.report([*fast[:4], row(5, 9.0, 60.0)]) == 0
    assert loop.report([*fast[:2], *(row(k, 1.5, 6.0) for k in range(3))]) == 1
    assert loop.report([*fast[:2], *(row(k, None, 6.0) for k in range(3))]) == 1
    assert loop.report([*fast[:2], *(row(k, 0.4, 12.0) for k in range(3))]) == 1
    assert loop.report([]) == 1
    assert "FAIL: measured" in capsys.readouterr().out


def _weights_quantized_in_the_graph() -> onnx.ModelProto:
    """x -> Conv(DQ(Q(float weight)) per channel, DQ(Q(float bias)) uint16) -> y: the form AIMET's to_onnx_qdq
    leaves after Lite-MP's flips, with weight codes exactly on rounding ties (w/s = 2.5, -0.5, ...)."""
    import numpy as np
    from onnx import helper, numpy_helper

    scale = np.array([0.1, 0.2], np.float32)
    w = (np.array([2.5, -0.5, 1.49, 127.6], np.float32)[None, :, None, None] * scale[:, None, None, None])
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"),
             numpy_helper.from_array(scale, "w_scale"), numpy_helper.from_array(np.zeros(2, np.int8), "w_zero"),
             numpy_helper.from_array(np.array([0.37, -1.0, 700.0], np.float32), "b"),
             numpy_helper.from_array(np.array(0.01, np.float32), "b_scale"),
             numpy_helper.from_array(np.array(100, np.uint16), "b_zero")]
    nodes = [helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zero"], ["w_q"], axis=0),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"], axis=0),
             helper.make_node("QuantizeLinear", ["b", "b_scale", "b_zero"], ["b_q"]),
             helper.make_node("DequantizeLinear", ["b_q", "b_scale", "b_zero"], ["b_dq"]),
             helper.make_node("Slice", ["b_dq", "starts", "ends"], ["b_used"]),
             helper.make_node("Conv", ["x", "w_dq", "b_used"], ["y"])]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "starts"),
              numpy_helper.from_array(np.array([2], np.int64), "ends")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 3, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 3, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_the_search_benchmark_quantizes_constants_as_ort_does(tmp_path):
    import numpy as np
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from search import constants_quantized
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    path = tmp_path / "q.onnx"
    onnx.save(_weights_quantized_in_the_graph(), path)
    folded = constants_quantized(path)
    model = onnx.load(folded)
    assert [n.op_type for n in model.graph.node].count("QuantizeLinear") == 0
    codes = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    assert codes["w_q"].dtype == np.int8 and codes["w_q"][:, :, 0, 0].tolist() == [[2, 0, 1, 127], [2, 0, 1, 127]]
    assert codes["b_q"].dtype == np.uint16 and codes["b_q"].tolist() == [137, 0, 65535]  # saturated both ways
    x = {"x": np.random.default_rng(0).normal(0, 1, (1, 4, 3, 3)).astype(np.float32)}

    def run(p):
        return ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, x)[0]

    assert np.array_equal(run(path), run(folded))
    assert constants_quantized(folded) == folded  # nothing left to quantize: the model itself


@pytest.mark.skipif(not _aimet_installed(), reason="needs MPSTUDIO_AIMET_PYTHON (a Python with aimet-onnx)")
def test_the_search_benchmark_runs_aimet_in_its_own_interpreter_and_judges_on_the_htp(small_study, tmp_path):
    out = _search_benchmark(small_study, "a16w8-pc", tmp_path, "--htp")
    lines = {line.split("  ")[0].strip(): line for line in out.stdout.splitlines()}
    for method in ("mpstudio search", "AIMET a8w8 (no search)", "AIMET Lite-MP 10%", "AIMET Lite-MP 20%", "AIMET AMP"):
        assert method in lines, out.stdout + out.stderr
        assert len(lines[method].split()) > 8, lines[method]  # a value, an HTP value, a verdict, ms, 16-bit count
    assert "HTP = the same model and samples on the HTP emulator" in out.stdout
    assert (tmp_path / "run" / "aimet" / "aimet-amp.onnx").exists()
