"""The rewrites of what torch's exporters write around attention (mpstudio.attention_rewrites): the NaN guard
after the Softmax and the in-order GatherND on the mask, which kept every plan of a torch-exported encoder off
the HTP. Small onnx.helper models with the exporters' patterns; the HTP tests build them at a16w8."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR, requires_qnn
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.runtime import create_session

F = TensorProto.FLOAT
HEADS, TOKENS = 2, 8


def _model(nodes, inputs, inits, opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("y", F, [1, HEADS, TOKENS, 4])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR)


def attention_model(nan_guard: bool = True, gather_nd: str | None = None) -> onnx.ModelProto:
    """scores [1, 2, 8, 8] + mask -> Softmax -> (torch's NaN guard: Where(IsNaN(p), 0, p)) -> MatMul values.

    `gather_nd`: "in order" reads the float mask [1, 8] as the dynamo exporter does, Cast to bool then a GatherND
    whose indices pick every element in order; "shuffled" picks them in another order (a real gather)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(0.0), "zero"),
             numpy_helper.from_array(rng.normal(0, 1, (1, HEADS, TOKENS, 4)).astype(np.float32), "values"),
             numpy_helper.from_array(np.float32(-100.0), "masked")]
    inputs = [helper.make_tensor_value_info("scores", F, [1, HEADS, TOKENS, TOKENS])]
    nodes, scores = [], "scores"
    if gather_nd:
        order = np.arange(TOKENS) if gather_nd == "in order" else np.roll(np.arange(TOKENS), 1)
        indices = np.stack([np.zeros(TOKENS, np.int64), order], -1).reshape(1, 1, 1, TOKENS, 2)
        inits.append(numpy_helper.from_array(indices, "indices"))
        inputs.append(helper.make_tensor_value_info("mask", F, [1, TOKENS]))
        nodes += [helper.make_node("Cast", ["mask"], ["mask_bool"], to=TensorProto.BOOL, name="cast_bool"),
                  helper.make_node("GatherND", ["mask_bool", "indices"], ["picked"], name="gathernd"),
                  helper.make_node("Not", ["picked"], ["padded"], name="not"),
                  helper.make_node("Where", ["padded", "masked", "zero"], ["bias"], name="mask_where"),
                  helper.make_node("Add", ["scores", "bias"], ["masked_scores"], name="add_mask")]
        scores = "masked_scores"
    nodes.append(helper.make_node("Softmax", [scores], ["probs"], axis=-1, name="softmax"))
    probs = "probs"
    if nan_guard:
        nodes += [helper.make_node("IsNaN", ["probs"], ["nan"], name="isnan"),
                  helper.make_node("Where", ["nan", "zero", "probs"], ["guarded"], name="guard")]
        probs = "guarded"
    nodes.append(helper.make_node("MatMul", [probs, "values"], ["y"], name="context"))
    return _model(nodes, inputs, inits)


def feeds(n: int, mask: bool = False) -> list[dict]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        feed = {"scores": rng.normal(0, 2, (1, HEADS, TOKENS, TOKENS)).astype(np.float32)}
        if mask:
            feed["mask"] = (np.arange(TOKENS) < TOKENS - i % 4).astype(np.float32)[None]
        out.append(feed)
    return out


def run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_the_nan_guard_after_a_softmax_is_dropped_and_the_outputs_kept():
    original = attention_model()
    prepared = prepare_model(original, verify=False)
    assert "IsNaN" not in ops(prepared.model) and "Where" not in ops(prepared.model)
    assert [r.name for r in prepared.rewrites] == ["softmax-nan-guard"] and prepared.rewrites[0].nodes == ("guard",)
    assert any(step.startswith("removed 1 NaN guard(s)") for step in prepared.steps)
    for feed in feeds(3):
        np.testing.assert_array_equal(run(prepared.model, feed), run(original, feed))


def test_a_where_on_isnan_of_something_else_is_left_alone():
    model = attention_model()
    guard = next(n for n in model.graph.node if n.name == "guard")
    guard.input[2] = "scores"  # Where(IsNaN(probs), 0, scores): not a guard of what IsNaN tests
    assert "IsNaN" in ops(prepare_model(model, verify=False).model)


def test_an_in_order_gather_nd_becomes_a_reshape_and_a_shuffled_one_stays():
    original = attention_model(nan_guard=False, gather_nd="in order")
    prepared = prepare_model(original, verify=False)
    assert "GatherND" not in ops(prepared.model)
    assert [r.name for r in prepared.rewrites if r.name.startswith("gather")] == ["gather-nd-in-order"]
    assert "indices" not in {t.name for t in prepared.model.graph.initializer}
    for feed in feeds(4, mask=True):
        np.testing.assert_array_equal(run(prepared.model, feed), run(original, feed))

    shuffled = prepare_model(attention_model(nan_guard=False, gather_nd="shuffled"), verify=False)
    assert "GatherND" in ops(shuffled.model)


def _a16w8(prepared, tmp_path, mask: bool = False):
    quantizer = Quantizer(prepared, FeedList(feeds(4, mask)), tmp_path / "cache")
    return quantizer.generate(PrecisionPlan.a16w8())


@pytest.mark.htp
@requires_qnn
def test_the_guarded_attention_builds_at_a16w8_on_the_htp_only_once_rewritten(tmp_path):
    # As the exporters write it, QNN fails to finalize the graph: the pattern this test stands for.
    unrewritten = _a16w8(prepare_model(attention_model(), rewrite=False, verify=False), tmp_path / "as-exported")
    with pytest.raises(MpstudioError, match="QNN_COMMON_ERROR_MEM_ALLOC"):
        create_session(unrewritten, "htp", {"htp_arch": "75"})

    path = _a16w8(prepare_model(attention_model(), verify=False), tmp_path / "prepared")
    session = create_session(path, "htp", {"htp_arch": "75"})  # CPU fallback disabled
    cpu = create_session(path, "cpu")
    for feed in feeds(3):
        reference = cpu.run(None, feed)[0]
        error = session.run(None, feed)[0] - reference
        assert 10 * np.log10((reference ** 2).sum() / (error ** 2).sum()) > 30  # the HTP's numerics, near ORT's


@pytest.mark.htp
@requires_qnn
def test_the_dynamo_mask_gather_runs_on_the_htp_at_a16w8_without_fallback(tmp_path):
    prepared = prepare_model(attention_model(gather_nd="in order"))
    assert prepared.fallback_nodes == ()
    path = _a16w8(prepared, tmp_path, mask=True)
    session = create_session(path, "htp", {"htp_arch": "75"})  # CPU fallback disabled: a CPU node raises
    cpu = create_session(path, "cpu")
    for feed in feeds(4, mask=True):
        reference = cpu.run(None, feed)[0]
        error = session.run(None, feed)[0] - reference
        assert 10 * np.log10((reference ** 2).sum() / (error ** 2).sum()) > 30


def test_the_shape_constants_of_orts_matmul_add_fusion_get_names_of_their_own():
    """ONNX Runtime's MatMul+Add fusion at prepare time writes `gemm_input_shape...` constants; a CPU session's own
    fusion writes the same names again and ORT refused the float model of a torch-exported BERT ("Attempt to
    replace the existing tensor"; not reproduced by a model this small, so the names are checked)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (16, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 1, 16).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", F, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", F, [1, 8, 16])], inits)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)
    prepared = prepare_model(original, verify=False)
    names = [t.name for t in prepared.model.graph.initializer]
    assert "Gemm" in ops(prepared.model) and not any(n.startswith(("gemm_input_shape", "gemm_output_shape"))
                                                    for n in names)
    feed = {"x": rng.normal(0, 1, (1, 8, 16)).astype(np.float32)}
    for numerics in ("fused", "basic", "fake-quant"):
        value = create_session(prepared.model.SerializeToString(), "cpu", numerics=numerics).run(None, feed)[0]
        np.testing.assert_allclose(value, run(original, feed), rtol=1e-5, atol=1e-5)
