"""No mpstudio-* folder is left in the system's temporary folder: a real HTP-worker evaluation, a local agent,
HTP probes and a calibration, each in a process of its own with a private TMPDIR, ended normally and with a
killed child its parent cleans up after."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_fixtures import needs_qnn

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

_HTP_WORKERS = """
    import onnx, numpy as np
    from agent_fixtures import conv_model
    from mpstudio.data import FeedList
    from mpstudio.loop import inprocess
    onnx.save(conv_model(), "model.onnx")
    feeds = FeedList([{"x": np.ones((1, 3, 16, 16), np.float32)} for _ in range(4)])
    assert len(inprocess.run_outputs("model.onnx", feeds, "htp", workers=2)) == 4
    assert list(Path(tempfile.gettempdir()).glob("mpstudio-*")), "the workers work in no folder of the test's"
"""

_HTP_WORKER_KILLED = _HTP_WORKERS + """
    os.kill(next(iter(inprocess._pool._processes)), signal.SIGKILL)
    try:
        inprocess.run_outputs("model.onnx", feeds, "htp", workers=2)
    except Exception as exc:
        print("refused:", exc)
"""

_LOCAL_AGENT = """
    from mpstudio.agent import LocalAgent
    with LocalAgent() as agent:
        assert agent.client.health()["status"] == "ok"
"""

_LOCAL_AGENT_KILLED = """
    from mpstudio.agent import LocalAgent
    agent = LocalAgent().start()
    os.kill(agent.pid, signal.SIGKILL)  # it cannot remove its own work directory
    agent.stop()
"""

_PROBES = """
    from agent_fixtures import conv_model
    from mpstudio.qnn_probe import Probe, run_probes
    verdicts = run_probes([Probe("conv1", "Conv", "a8w8", "probe-1", conv_model().SerializeToString())], "75")
    assert "probe-1" in verdicts
"""

_CALIBRATION = """
    import onnx
    from conftest import chain_feeds, make_chain_model
    from mpstudio.data import FeedList
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study
    onnx.save(make_chain_model(), "chain.onnx")
    study = Study.create("study", "chain.onnx", FeedList(chain_feeds(4)), FeedList(chain_feeds(2, seed=3)))
    study.evaluate(PrecisionPlan.a8w8())  # calibrates, and calibrates again with quantized weights
    study.evaluate(PrecisionPlan.a16w8())
    study.close()
"""

_CALIBRATION_KILLED = """
    import onnx
    from conftest import chain_feeds, make_chain_model
    from mpstudio.data import FeedList
    from mpstudio.study import Study
    onnx.save(make_chain_model(), "chain.onnx")
    study = Study.create("study", "chain.onnx", FeedList(chain_feeds(4)), FeedList(chain_feeds(2, seed=3)))

    def killed(done, total, message):  # the process is killed halfway through its calibration
        if done:
            os.kill(os.getpid(), signal.SIGKILL)

    study.quantizer.calibrate(progress=killed)
"""


def _left_behind(tmp_path: Path, script: str) -> list[str]:
    """Run `script` in a fresh process whose temporary folder is private; the mpstudio-* names left there."""
    private = tmp_path / "tmp"
    private.mkdir()
    env = {**os.environ, "TMPDIR": str(private), "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]),
           "MPSTUDIO_CACHE_DIR": str(tmp_path / "cache")}
    code = "import os, signal, tempfile\nfrom pathlib import Path\n" + textwrap.dedent(script)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    kills_itself = "os.kill(os.getpid(), signal.SIGKILL)" in script
    assert done.returncode == (-9 if kills_itself else 0), done.stderr[-2000:]
    return sorted(path.name for path in private.iterdir() if path.name.startswith("mpstudio"))


@needs_qnn
@pytest.mark.parametrize("script", [_HTP_WORKERS, _HTP_WORKER_KILLED, _LOCAL_AGENT, _LOCAL_AGENT_KILLED, _PROBES,
                                    _CALIBRATION, _CALIBRATION_KILLED],
                         ids=["htp-workers", "htp-worker-killed", "local-agent", "local-agent-killed", "probes",
                              "calibration", "calibration-killed"])
def test_nothing_is_left_in_the_temporary_folder(tmp_path, script):
    assert _left_behind(tmp_path, script) == []
