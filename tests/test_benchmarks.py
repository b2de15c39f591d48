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
