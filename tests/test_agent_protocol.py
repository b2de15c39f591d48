"""Agent pieces without a server: ids, safe .npz, latency labels, ORT log and QNN profile parsing, engine retry."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mpstudio.agent import LatencyStats, Placement
from mpstudio.agent.protocol import check_model_id, check_run_id, decode_npz, encode_npz
from mpstudio.agent.worker import Engine, parse_placement, parse_qnn_profile, parse_refusals
from mpstudio.errors import MpstudioError

# Excerpts of ORT 1.31 verbose session logs with the QNN EP (severity 0), as the worker captures them.
FALLBACK_LOG = """\
2026-01-01 00:00:00.1 [V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (QuantizeLinear) :
\tOperator type: QuantizeLinear Node name: x_QuantizeLinear Node index: 3
\tREASON : QNN EP is configured to not take Q nodes that consume a graph input.

2026-01-01 00:00:00.2 [V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation PASSED for 5 nodes in OrtNodeUnit (Conv) :
\tOperator type: DequantizeLinear Node name: x_DequantizeLinear Node index: 4
\tOperator type: Conv Node name: conv1 Node index: 5

2026-01-01 00:00:00.3 [V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (Hardmax) :
\tOperator type: Hardmax Node name: my_hardmax Node index: 17
\tREASON : Operators of type `Hardmax` are not supported by QNN EP.Hardmax node `my_hardmax` will not be assigned to QNN EP.

2026-01-01 00:00:00.4 [V:onnxruntime:, session_state.cc:1578 VerifyEachNodeIsAssignedToAnEp] Node placements
2026-01-01 00:00:00.5 [V:onnxruntime:, session_state.cc:1584 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [QNNExecutionProvider]. Number of nodes: 1
2026-01-01 00:00:00.6 [V:onnxruntime:, session_state.cc:1586 VerifyEachNodeIsAssignedToAnEp]   QNNExecutionProvider_123_1 (QNNExecutionProvider_QNNExecutionProvider_123_1_0)
2026-01-01 00:00:00.7 [V:onnxruntime:, session_state.cc:1584 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2
2026-01-01 00:00:00.8 [V:onnxruntime:, session_state.cc:1586 VerifyEachNodeIsAssignedToAnEp]   QuantizeLinear (x_QuantizeLinear)
2026-01-01 00:00:00.9 [V:onnxruntime:, session_state.cc:1586 VerifyEachNodeIsAssignedToAnEp]   Hardmax (my_hardmax)
"""
NODES = [("x_QuantizeLinear", "QuantizeLinear"), ("x_DequantizeLinear", "DequantizeLinear"), ("conv1", "Conv"),
         ("my_hardmax", "Hardmax")]

QNN_PROFILE = """\
Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier,ONNX Source Ops
0,FINALIZE,12147,US,BACKEND,ROOT,QNN (finalize) time,
0,BACKEND,144037,CYCLES,BACKEND,ROOT,Accelerator (execute) time (cycles),
0,NODE,1110,CYCLES,BACKEND,SUB-EVENT,Input OpId_2 (cycles),
0,NODE,90000,CYCLES,BACKEND,SUB-EVENT,conv1_token_1:OpId_24 (cycles),DequantizeLinear_token_16;x_DequantizeLinear;conv1_token_1
0,BACKEND,127325,CYCLES,BACKEND,ROOT,Accelerator (execute) time (cycles),
0,NODE,100,CYCLES,BACKEND,SUB-EVENT,x_QuantizeLinear:OpId_16 (cycles),x_QuantizeLinear
0,NODE,60000,CYCLES,BACKEND,SUB-EVENT,conv1_token_1:OpId_24 (cycles),DequantizeLinear_token_16;x_DequantizeLinear;conv1_token_1
0,BACKEND,127325,CYCLES,BACKEND,ROOT,Accelerator (execute) time (cycles),
0,NODE,300,CYCLES,BACKEND,SUB-EVENT,x_QuantizeLinear:OpId_16 (cycles),x_QuantizeLinear
0,NODE,40000,CYCLES,BACKEND,SUB-EVENT,conv1_token_1:OpId_24 (cycles),DequantizeLinear_token_16;x_DequantizeLinear;conv1_token_1
"""


def test_ids_accept_only_digests():
    good = "a" * 64
    assert check_model_id(good) == good
    for bad in ("../etc/passwd", "A" * 64, "a" * 63, "a" * 64 + "/", "", None):
        with pytest.raises(MpstudioError):
            check_model_id(bad)
    assert check_run_id("0" * 32)
    with pytest.raises(MpstudioError):
        check_run_id("../../x")


def test_npz_round_trip_and_pickle_refusal():
    arrays = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "ids": np.array([1, 2], np.int64)}
    back = decode_npz(encode_npz(arrays))
    assert set(back) == set(arrays) and all(np.array_equal(back[k], arrays[k]) for k in arrays)
    buffer = io.BytesIO()
    np.savez(buffer, evil=np.array([print], dtype=object))
    with pytest.raises(MpstudioError, match="pickle"):
        decode_npz(buffer.getvalue())
    with pytest.raises(MpstudioError, match="not a valid .npz"):
        decode_npz(b"not a zip")
    with pytest.raises(MpstudioError, match="object"):
        encode_npz({"x": np.array([object()], dtype=object)})


def test_latency_is_labelled_by_source():
    emulator = LatencyStats.from_times([2_000_000, 1_000_000, 3_000_000], source="emulator", device="pc",
                                       backend="htp")
    assert emulator.n == 3 and emulator.min_ms == 1.0 and emulator.median_ms == 2.0
    assert not emulator.is_device_latency and "not device latency" in emulator.label
    device = LatencyStats.from_times([1_000_000], source="measured", device="Snapdragon X Elite", backend="htp")
    assert device.is_device_latency and "Snapdragon X Elite" in device.label
    with pytest.raises(ValueError):
        LatencyStats.from_times([1], source="estimate", device="x", backend="htp")


def test_placement_from_verbose_log():
    placement = parse_placement(FALLBACK_LOG, NODES)
    assert placement.htp_partitions == 1
    assert placement.on_htp == ("x_DequantizeLinear", "conv1")
    cpu = {f.node: f for f in placement.on_cpu}
    assert "not supported" in cpu["my_hardmax"].reason
    assert cpu["x_QuantizeLinear"].reason.startswith("graph input/output")
    assert not placement.fully_on_htp
    assert Placement.from_dict(placement.to_dict()) == placement


def test_refusals_skip_graph_io_quantization():
    refused = parse_refusals(FALLBACK_LOG)
    assert [(f.node, f.op_type) for f in refused] == [("my_hardmax", "Hardmax")]


def test_qnn_profile_maps_ops_to_onnx_nodes_and_skips_first_run():
    ops = {op.op: op for op in parse_qnn_profile(QNN_PROFILE, NODES, skip_runs=1)}
    conv = ops["conv1_token_1"]
    assert conv.node == "conv1" and conv.op_type == "Conv" and conv.cost == 50000
    assert conv.onnx_nodes == ("x_DequantizeLinear", "conv1")
    assert ops["x_QuantizeLinear"].cost == 200 and "Input OpId_2" not in ops


class _Meta:
    def __init__(self, name, shape):
        self.name, self.shape = name, shape


class _FlakySession:
    """Stands in for an ORT session whose first run hits an HTP subsystem restart."""

    created = 0

    def __init__(self):
        type(self).created += 1
        self.fail = type(self).created == 1

    def get_inputs(self):
        return [_Meta("x", [1, 2])]

    def get_outputs(self):
        return [_Meta("y", [1, 2])]

    def run(self, names, feeds):
        if self.fail:
            from onnxruntime.capi.onnxruntime_pybind11_state import EngineError

            raise EngineError("QNN graph execute failed: ENGINE_ERROR (HTP subsystem restart)")
        return [feeds["x"] * 2]


def test_engine_error_recreates_the_session_and_retries_once(tmp_path, monkeypatch):
    from mpstudio import runtime

    monkeypatch.setattr(runtime, "create_session", lambda *a, **k: _FlakySession())
    engine = Engine(tmp_path, {"device": "test", "emulated": True})
    request = {"op": "run", "model_id": "m" * 64, "model_path": "unused", "backend": "htp", "provider_options": {},
               "inputs": {"x": np.ones((1, 2), np.float32)}, "warmup": 0, "iterations": 2}
    result = engine.run(request)
    assert result["session_retried"] and _FlakySession.created == 2
    np.testing.assert_array_equal(result["outputs"]["y"], np.full((1, 2), 2, np.float32))
    assert result["latency"]["source"] == "emulator"
