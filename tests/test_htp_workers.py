"""HTP samples spread over worker processes: the same outputs as one process, in order, with clear errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import chain_feeds, make_chain_model, qnn_available
from mpstudio.data import Cancelled, FeedList
from mpstudio.errors import MpstudioError
from mpstudio.loop.inprocess import WORKERS_ENV, htp_workers, run_outputs
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer

pytestmark = pytest.mark.skipif(not qnn_available(), reason="onnxruntime-qnn's HTP backend is not available")


@pytest.fixture(scope="module")
def qdq_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("workers")
    quantizer = Quantizer(prepare_model(make_chain_model(blocks=4)), FeedList(chain_feeds(4)), folder)
    return quantizer.generate(PrecisionPlan.a8w8())


def test_workers_give_the_outputs_of_one_process_in_sample_order(qdq_model):
    data = FeedList(chain_feeds(7, seed=5))
    options = {"htp_arch": "75"}
    alone = run_outputs(qdq_model, data, "htp", options, workers=1)
    seen = []
    spread = run_outputs(qdq_model, data, "htp", options, workers=2,
                         progress=lambda done, total, message: seen.append((done, total, message)))
    assert len(spread) == len(alone) == 7
    for a, b in zip(alone, spread):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    assert seen[-1][:2] == (7, 7) and "2 workers" in seen[-1][2]
    # Different samples give different outputs, so the order check above is not vacuous.
    first = next(iter(alone[0]))
    assert not np.array_equal(alone[0][first], alone[1][first])


def test_cancel_stops_a_parallel_run(qdq_model):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        run_outputs(qdq_model, FeedList(chain_feeds(6)), "htp", {"htp_arch": "75"}, cancel=cancel, workers=2)


def test_a_model_the_workers_cannot_open_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(MpstudioError, match="could not create a htp session"):
        run_outputs(bad, FeedList(chain_feeds(4)), "htp", {"htp_arch": "75"}, workers=2)


def test_worker_count_setting(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert htp_workers() == 3
    monkeypatch.setenv(WORKERS_ENV, "0")
    with pytest.raises(MpstudioError, match="at least 1"):
        htp_workers()
    monkeypatch.setenv(WORKERS_ENV, "many")
    with pytest.raises(MpstudioError, match="whole number"):
        htp_workers()
