"""Model preparation: loading, validation, IR version, static shapes, constant folding, QNN report."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR, conv_feeds, make_conv_model, make_loop_model
from mpstudio import MpstudioError
from mpstudio.model import load_model, parse_shape_args, prepare_model


def test_prepare_folds_constants_and_keeps_outputs(conv_model_path):
    prepared = prepare_model(conv_model_path)
    ops = [n.op_type for n in prepared.model.graph.node]
    assert "Constant" not in ops
    assert any(i.name for i in prepared.model.graph.initializer)
    assert [s.name for s in prepared.inputs] == ["x"] and prepared.inputs[0].shape == (1, 3, 16, 16)
    assert prepared.qnn_ready
    # The prepared model computes what the original does.
    feed = conv_feeds(1)[0]
    original = ort.InferenceSession(str(conv_model_path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    folded = ort.InferenceSession(prepared.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(original, folded, rtol=1e-5, atol=1e-6)
    assert "folded constants" in prepared.report()


def test_corrupt_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(make_conv_model().SerializeToString()[:200])
    with pytest.raises(MpstudioError, match="not a readable ONNX model"):
        prepare_model(bad)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xffnot a model at all" * 10)
    with pytest.raises(MpstudioError):
        prepare_model(junk)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(MpstudioError, match="not found"):
        load_model(tmp_path / "nope.onnx")
    with pytest.raises(MpstudioError, match="is a folder"):
        load_model(tmp_path)


def test_dynamic_shape_is_refused_with_the_input_named(tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(make_conv_model(dynamic_batch=True), path)
    with pytest.raises(MpstudioError) as info:
        prepare_model(path)
    message = str(info.value)
    assert "x ['N', 3, 16, 16]" in message and "--shape x=" in message and "input_shapes" in message


def test_dynamic_shape_fixed_when_given(tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(make_conv_model(dynamic_batch=True), path)
    prepared = prepare_model(path, {"x": [1, 3, 16, 16]})
    assert prepared.inputs[0].shape == (1, 3, 16, 16)
    assert prepared.outputs[0].shape == (1, 4, 1, 1)
    assert any("fixed input x" in s for s in prepared.steps)


@pytest.mark.parametrize(
    "shapes, match",
    [({"x": [1, 3, 16]}, "rank"), ({"x": [1, 3, 8, 16]}, "fixed dimension 16"), ({"z": [1]}, "does not have as inputs"),
     ({"x": [0, 3, 16, 16]}, "positive")],
)
def test_bad_shapes_are_errors(tmp_path, shapes, match):
    path = tmp_path / "dyn.onnx"
    onnx.save(make_conv_model(dynamic_batch=True), path)
    with pytest.raises(MpstudioError, match=match):
        prepare_model(path, shapes)



def _down_up_model() -> onnx.ModelProto:
    """x[1,1,H,W] + upsampled(AveragePool stride 2 of x): as a detector's FPN, it takes only even H and W."""
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Resize", ["p", "", "scales"], ["u"], mode="nearest", name="up"),
             helper.make_node("Add", ["x", "u"], ["y"], name="merge")]
    graph = helper.make_graph(nodes, "fpn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])], [scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR)


def test_a_shape_the_model_cannot_take_names_the_shape_given(tmp_path):
    path = tmp_path / "fpn.onnx"
    onnx.save(_down_up_model(), path)
    assert prepare_model(path, {"x": [1, 1, 8, 8]}).outputs[0].shape == (1, 1, 8, 8)
    with pytest.raises(MpstudioError, match=r"Incompatible dimensions.*x=1,1,9,8.*multiple of") as caught:
        prepare_model(path, {"x": [1, 1, 9, 8]})
    assert "--shape" in str(caught.value)

def _branching_model() -> onnx.ModelProto:
    """x[?, ?] @ w[4, 2] in both branches of an If on `flag`: ORT's shape inference checks the branches only
    once x's shape is fixed, as in an exported voice-activity detector whose If picks a sample rate."""
    w = numpy_helper.from_array(np.ones((4, 2), np.float32), "w")
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])
    branches = {key: helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name=f"{key}_matmul")], key, [],
                                       [out]) for key in ("then_branch", "else_branch")}
    graph = helper.make_graph([helper.make_node("If", ["flag"], ["y"], name="rate_if", **branches)], "branching",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"]),
                               helper.make_tensor_value_info("flag", TensorProto.BOOL, [])], [out], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_a_shape_refused_inside_a_control_flow_subgraph_says_to_export_without_it(tmp_path):
    path = tmp_path / "branching.onnx"
    onnx.save(_branching_model(), path)
    with pytest.raises(MpstudioError, match=r"rate_if.*control-flow node.*x=1,5.*without control flow") as caught:
        prepare_model(path, {"x": [1, 5]})
    assert "multiple of" not in str(caught.value)  # not a spatial size to choose


def test_ir_version_is_lowered_to_what_ort_accepts():
    from mpstudio.model import ort_max_ir_version

    if ort_max_ir_version() >= onnx.IR_VERSION:
        pytest.skip("this ONNX Runtime loads every IR version this onnx writes")
    model = make_conv_model()
    model.ir_version = onnx.IR_VERSION  # newer than ORT 1.31 loads
    prepared = prepare_model(model)
    ort.InferenceSession(prepared.model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert any("IR version" in s for s in prepared.steps)


def test_old_opset_is_raised_for_per_channel():
    model = make_conv_model()
    model.opset_import[0].version = 12
    prepared = prepare_model(model)
    assert next(o.version for o in prepared.model.opset_import if o.domain == "") >= 13


def test_checker_failure_is_reported():
    model = make_conv_model()
    model.graph.node[0].input[1] = "no_such_weight"
    with pytest.raises(MpstudioError, match="checker|cannot load"):
        prepare_model(model)


def test_unsupported_op_is_in_the_report():
    prepared = prepare_model(make_loop_model())
    assert not prepared.qnn_ready
    loops = [i for i in prepared.support_issues if i.op_type == "Loop"]
    assert loops and loops[0].node == "repeat_loop" and loops[0].severity == "fallback"
    assert "repeat_loop" in prepared.report()


def test_unnamed_nodes_get_names():
    model = make_conv_model()
    for node in model.graph.node:
        node.name = ""
    prepared = prepare_model(model, optimize=False)
    names = [n.name for n in prepared.model.graph.node]
    assert all(names) and len(set(names)) == len(names)



def _hardswish_model() -> onnx.ModelProto:
    """x -> Conv -> HardSwish -> y, every node named: ONNX Runtime's optimizations expand the HardSwish into an
    unnamed HardSigmoid and Mul (as in a torch export of MobileNetV3)."""
    weight = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32),
                                     "conv.weight")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
         helper.make_node("HardSwish", ["c"], ["y"], name="/act/HardSwish")],
        "hardswish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], initializer=[weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_nodes_the_optimizations_leave_unnamed_get_names_and_mixed_plans_quantize(tmp_path):
    from mpstudio.data import FeedList
    from mpstudio.plan import PrecisionPlan
    from mpstudio.quantize import Quantizer

    model = _hardswish_model()
    model.graph.node.insert(0, helper.make_node("Relu", ["x"], ["x1"], name="HardSigmoid_2"))
    model.graph.node[1].input[0] = "x1"
    prepared = prepare_model(model)
    assert [n.op_type for n in prepared.model.graph.node] == ["Relu", "Conv", "HardSigmoid", "Mul"]
    names = [n.name for n in prepared.model.graph.node]
    assert all(names) and len(set(names)) == len(names), names  # never a name another node has
    assert any("left unnamed" in step for step in prepared.steps)
    # ORT's quantizer refused the plan with an override ("Node of type Mul ... does not have a name!").
    quantizer = Quantizer(prepared, FeedList(conv_feeds(2)), tmp_path / "cache")
    qdq = onnx.load(quantizer.generate(PrecisionPlan.a8w8().promote(["c"])))
    assert any(n.op_type == "QuantizeLinear" for n in qdq.graph.node)

def test_parse_shape_args():
    assert parse_shape_args(["x=1,3,48,320", "y=2x4"]) == {"x": [1, 3, 48, 320], "y": [2, 4]}
    with pytest.raises(MpstudioError, match="bad --shape"):
        parse_shape_args(["x:1,2"])


def test_hash_is_stable_for_the_same_model(conv_model_path):
    assert prepare_model(conv_model_path).sha256 == prepare_model(conv_model_path).sha256


def test_an_output_axis_of_unknown_size_reads_as_a_question_mark():
    from mpstudio.model import TensorSpec

    assert TensorSpec("y", (0, 1), "float32").describe() == "y: float32[?, 1]"
    assert TensorSpec("x", (1, 3, 8, 8), "float32").describe() == "x: float32[1, 3, 8, 8]"
