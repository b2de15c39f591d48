"""Worker processes started from a user's script without an `if __name__ == "__main__":` guard: the script runs
once (a spawned worker does not import it again), and a metric defined in such a script still reaches them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import requires_qnn

TESTS = Path(__file__).resolve().parent

PRELUDE = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import onnx
from conftest import chain_feeds, make_chain_model
from mpstudio.data import FeedList
from mpstudio.plan import PrecisionPlan
from mpstudio.study import Study

print("script started", flush=True)
folder = sys.argv[1]
onnx.save(make_chain_model(blocks=4), folder + "/chain.onnx")
study = Study.create(folder + "/study", folder + "/chain.onnx", FeedList(chain_feeds(6)), FeedList(chain_feeds(5, seed=3)))
"""


def _run(tmp_path, body: str, **env) -> subprocess.CompletedProcess:
    script = tmp_path / "user_script.py"  # no main guard, as users write them
    script.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env}, cwd=tmp_path)


def test_sensitivity_workers_do_not_run_the_users_script_again(tmp_path):
    out = _run(tmp_path, """
        report = study.sensitivity(samples=4, isolation_samples=2, workers=2)
        print("ranked", len(report.ranking), flush=True)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("script started") == 1 and "ranked" in out.stdout


def test_a_metric_defined_in_the_script_still_reaches_the_workers(tmp_path):
    """A metric function from the user's script travels to the workers by reference, so they import the script
    (guarded, as multiprocessing requires for that) and really compute with it."""
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import numpy as np
        import onnx
        from conftest import chain_feeds, make_chain_model
        from mpstudio.data import FeedList, TaskMetric
        from mpstudio.sensitivity import analyze_progressive
        from mpstudio.study import Study

        def mean_abs(outputs, reference):
            return float(np.mean([np.abs(o["y"] - r["y"]).mean() for o, r in zip(outputs, reference)]))

        if __name__ == "__main__":
            folder = sys.argv[1]
            onnx.save(make_chain_model(blocks=4), folder + "/chain.onnx")
            study = Study.create(folder + "/study", folder + "/chain.onnx", FeedList(chain_feeds(6)))
            metric = TaskMetric("mean abs", mean_abs, higher_is_better=False, needs_reference=True)
            report = analyze_progressive(study.quantizer, study.calibration.head(4), isolation_samples=2, workers=2,
                                         metric=metric)
            print("ranked", len(report.ranking), "workers", report.meta["workers"], flush=True)
    """))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ranked" in done.stdout and "workers 2" in done.stdout


@requires_qnn
@pytest.mark.htp
def test_htp_workers_do_not_run_the_users_script_again(tmp_path):
    out = _run(tmp_path, """
        evaluation = study.evaluate(PrecisionPlan.a8w8(), "htp")
        print("evaluated", evaluation.accuracy_source, flush=True)
    """, MPSTUDIO_HTP_WORKERS="2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("script started") == 1 and "evaluated HTP" in out.stdout
