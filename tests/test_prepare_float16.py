"""A float16 model prepares as its float32 form, and quantizes, analyses and runs like any float32 model."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import conv_feeds, make_conv_model
from mpstudio import MpstudioError
from mpstudio.data import FeedList, check_feeds
from mpstudio.model import prepare_model
from mpstudio.quantize import Quantizer
from mpstudio.sensitivity import analyze


def float16_model() -> onnx.ModelProto:
    """The conv model as a float16 export writes it: float16 weights, Constant, inputs and outputs, and a
    Cast to float16 inside."""
    model = make_conv_model()
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for node in model.graph.node:
        if node.op_type == "Constant":
            value = numpy_helper.to_array(node.attribute[0].t).astype(np.float16)
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(value))
    relu = next(i for i, n in enumerate(model.graph.node) if n.op_type == "Relu")
    model.graph.node[relu].output[0] = "relu_raw"
    model.graph.node.insert(relu + 1, helper.make_node("Cast", ["relu_raw"], ["relu1_out"], to=TensorProto.FLOAT16,
                                                       name="/backbone/conv1/Cast"))
    for info in list(model.graph.input) + list(model.graph.output):
        info.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def test_a_float16_model_prepares_as_float32_with_the_same_outputs(tmp_path):
    source = float16_model()
    prepared = prepare_model(source)
    assert any("converted the float16 model to float32" in step for step in prepared.steps)
    assert [spec.dtype for spec in prepared.inputs] == ["float32"]
    types = {init.data_type for init in prepared.model.graph.initializer}
    assert TensorProto.FLOAT16 not in types
    feed = conv_feeds(1)[0]
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": feed["x"].astype(np.float16)})[0]
    got = ort.InferenceSession(prepared.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feed)[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=0, atol=2e-2)  # float16's own rounding


def test_a_float16_model_quantizes_and_analyses(tmp_path):
    quantizer = Quantizer(prepare_model(float16_model()), FeedList(conv_feeds(4)), tmp_path / "cache")
    report = analyze(quantizer, FeedList(conv_feeds(4)), isolation_samples=2)
    assert len(report.ranking) and report.ranking["snr_db"].notna().any()


def test_float16_data_for_its_float32_form_says_what_to_do():
    prepared = prepare_model(float16_model())
    data = FeedList([{"x": feed["x"].astype(np.float16)} for feed in conv_feeds(2)])
    with pytest.raises(MpstudioError, match=r"float16 model's float32 form\); convert it with \.astype\(np\.float32\)"):
        check_feeds(data, prepared.inputs)


def test_a_float32_model_is_left_alone():
    prepared = prepare_model(make_conv_model())
    assert not any("float16" in step for step in prepared.steps)
