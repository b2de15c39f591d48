"""The rewrite of rank-6 Transposes (mpstudio.rank_rewrites): a Swin window partition and its reverse, whose
rank-6 Reshapes QNN HTP rejected, so every plan of a Swin ran them on the CPU. A small onnx.helper model with
the pattern torch exports; the HTP test builds it with CPU fallback disabled."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR, requires_qnn
from mpstudio.data import FeedList
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.rank_rewrites import lowered_transpose
from mpstudio.runtime import create_session

F = TensorProto.FLOAT
SIDE, WINDOW, CHANNELS = 8, 4, 4
GRID = SIDE // WINDOW


def window_model() -> onnx.ModelProto:
    """[1, 8, 8, 4] -> windows [4, 16, 4] -> a linear layer -> back to [1, 8, 8, 4], as Swin partitions."""
    rng = np.random.default_rng(0)
    shapes = {"partition": [1, GRID, WINDOW, GRID, WINDOW, CHANNELS], "windows": [GRID * GRID, WINDOW * WINDOW, CHANNELS],
              "reverse": [1, GRID, GRID, WINDOW, WINDOW, CHANNELS], "map": [1, SIDE, SIDE, CHANNELS]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in shapes.items()]
    inits.append(numpy_helper.from_array(rng.normal(0, 0.5, (CHANNELS, CHANNELS)).astype(np.float32), "w"))
    nodes = [helper.make_node("Reshape", ["x", "partition"], ["p6"], name="partition_reshape"),
             helper.make_node("Transpose", ["p6"], ["t6"], perm=[0, 1, 3, 2, 4, 5], name="partition_transpose"),
             helper.make_node("Reshape", ["t6", "windows"], ["win"], name="windows_reshape"),
             helper.make_node("MatMul", ["win", "w"], ["mixed"], name="linear"),
             helper.make_node("Reshape", ["mixed", "reverse"], ["r6"], name="reverse_reshape"),
             helper.make_node("Transpose", ["r6"], ["u6"], perm=[0, 1, 3, 2, 4, 5], name="reverse_transpose"),
             helper.make_node("Reshape", ["u6", "map"], ["y"], name="map_reshape")]
    graph = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", F, shapes["map"])],
                              [helper.make_tensor_value_info("y", F, shapes["map"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def feeds(n: int) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(0, 1, (1, SIDE, SIDE, CHANNELS)).astype(np.float32)} for _ in range(n)]


def ranks(model: onnx.ModelProto) -> set[int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    return {len(v.type.tensor_type.shape.dim) for v in inferred.graph.value_info}


def run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_a_window_partition_moves_the_same_elements_with_no_tensor_above_rank_five():
    original = window_model()
    prepared = prepare_model(original, verify=False)
    assert max(ranks(original)) == 6 and max(ranks(prepared.model)) <= 5
    rewrite = next(r for r in prepared.rewrites if r.name == "high-rank-transpose")
    assert rewrite.nodes == ("partition_transpose", "reverse_transpose")
    assert any(step.startswith("wrote 2 rank-6+ Transpose(s)") for step in prepared.steps)
    for feed in feeds(3):
        np.testing.assert_array_equal(run(prepared.model, feed), run(original, feed))


def test_the_lowest_rank_merges_the_runs_a_permutation_keeps_and_drops_unit_axes():
    assert lowered_transpose([1, 2, 4, 2, 4, 4], [0, 1, 3, 2, 4, 5]) == ([2, 4, 2, 16], [0, 2, 1, 3])
    assert lowered_transpose([2, 3, 1, 5, 7], [4, 3, 2, 1, 0]) == ([2, 3, 5, 7], [3, 2, 1, 0])
    assert lowered_transpose([2, 3, 4, 5, 6, 7], [5, 4, 3, 2, 1, 0]) is None  # six axes that all move apart


@pytest.mark.htp
@requires_qnn
def test_a_window_partition_runs_on_the_htp_once_rewritten(tmp_path):
    as_exported = prepare_model(window_model(), rewrite=False)
    assert {"partition_reshape", "reverse_reshape"} <= set(as_exported.fallback_nodes)

    prepared = prepare_model(window_model())
    assert prepared.fallback_nodes == ()
    path = Quantizer(prepared, FeedList(feeds(4)), tmp_path / "cache").generate(PrecisionPlan.a8w8())
    session = create_session(path, "htp", {"htp_arch": "75"})  # CPU fallback disabled: a CPU node raises
    cpu = create_session(path, "cpu")
    for feed in feeds(3):
        reference = cpu.run(None, feed)[0]
        error = session.run(None, feed)[0] - reference
        assert 10 * np.log10((reference ** 2).sum() / (error ** 2).sum()) > 30
