"""Integer and boolean outputs (labels, indices) are decisions, not values: output SNR and cosine compare a
model's float outputs, and the analysis says what it left out, or that nothing is left to compare."""

import numpy as np
from onnx import TensorProto, helper

from conftest import conv_feeds, make_conv_model
from mpstudio.data import FeedList
from mpstudio.metrics import ErrorAccumulator, output_agreement
from mpstudio.model import prepare_model
from mpstudio.quantize import Quantizer
from mpstudio.sensitivity import analyze


def with_label(keep_float: bool):
    """The conv model with an ArgMax label output, beside its float output or instead of it."""
    model = make_conv_model()
    model.graph.node.append(helper.make_node("Flatten", ["y"], ["flat"], name="/head/Flatten"))
    model.graph.node.append(helper.make_node("ArgMax", ["flat"], ["label"], name="/head/ArgMax", axis=1, keepdims=0))
    if not keep_float:
        del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("label", TensorProto.INT64, [1]))
    return model


def test_integer_outputs_do_not_enter_the_output_snr():
    reference = {"y": np.array([1.0, 2.0, 3.0], np.float32), "label": np.array([7], np.int64)}
    flipped = {"y": np.array([1.0, 2.0, 3.1], np.float32), "label": np.array([0], np.int64)}
    alone = output_agreement([{"y": reference["y"]}], [{"y": flipped["y"]}])
    assert output_agreement([reference], [flipped]) == alone
    acc = ErrorAccumulator()
    acc.add(np.array([1, 2], np.int64), np.array([5, 9], np.int64))
    acc.add(np.array([True]), np.array([False]))
    assert acc.count == 0 and acc.noise == 0.0


def test_the_analysis_names_the_outputs_it_leaves_out(tmp_path):
    data = FeedList(conv_feeds(4))
    mixed = analyze(Quantizer(prepare_model(with_label(True)), data, tmp_path / "a"), data, isolation_samples=2)
    assert "note: output SNR and cosine compare the float outputs; label (int64) left out" in mixed.status()
    labels = analyze(Quantizer(prepare_model(with_label(False)), data, tmp_path / "b"), data, isolation_samples=2)
    assert "warning: every output of the model is an integer or boolean (label (int64))" in labels.status()
    plain = analyze(Quantizer(prepare_model(make_conv_model()), data, tmp_path / "c"), data, isolation_samples=2)
    assert "output" not in plain.status()
