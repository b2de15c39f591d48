"""Export: encodings cover every quantized tensor with the model's values; ORT overrides re-quantize to the same model."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

from conftest import IR, conv_feeds, make_conv_model, requires_qnn
from mpstudio.data import Cancelled, FeedList
from mpstudio.errors import MpstudioError
from mpstudio.export import (ExportResult, check_context_model, export_name, export_plan, load_ort_overrides,
                             ort_overrides, qnn_config_arguments, qnn_encodings, read_quantized_tensors,
                             validate_encodings, validate_ort_overrides)
from mpstudio.graph import ModelGraph
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan, TensorOverride
from mpstudio.quantize import Quantizer, fuse_activations
from mpstudio import qdq

MIXED = PrecisionPlan.a8w8().promote(["conv1_out", "relu1_out"], name="mixed")
CONV_PLANS = {
    "a8w8": PrecisionPlan.a8w8(),
    "a16w8": PrecisionPlan.a16w8(),
    "mixed": MIXED,
    "per-channel-int8": PrecisionPlan(weight_type="int8", per_channel=True, name="pc").promote(["add_out"]),
    "weight-override": PrecisionPlan.a8w8().with_overrides({"conv2.weight": TensorOverride("int8", per_channel=True)}),
}


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return Quantizer(prepare_model(make_conv_model()), FeedList(conv_feeds(8)), tmp_path_factory.mktemp("conv"))


@pytest.fixture(scope="module")
def conv_other_data(conv, tmp_path_factory):
    """The same float model calibrated on different samples: different ranges for every activation."""
    return Quantizer(conv.prepared, FeedList(conv_feeds(8, seed=42)), tmp_path_factory.mktemp("conv-other"))


def requantize(quantizer: Quantizer, plan: PrecisionPlan, overrides_file, out) -> dict:
    """ORT's own path from the exported file: get_qnn_qdq_config(init_overrides=...) + quantize_static."""
    overrides = load_ort_overrides(overrides_file, quantizer.graph)
    config = get_qnn_qdq_config(onnx.load(str(quantizer.float_path)), None, init_overrides=overrides,
                                **qnn_config_arguments(plan))
    quantize_static(quantizer.float_path, out, None, calibration_cache_path=quantizer.calibrate(plan=plan).path,
                    quant_format=QuantFormat.QDQ, activation_type=config.activation_type,
                    weight_type=config.weight_type, op_types_to_quantize=config.op_types_to_quantize,
                    per_channel=config.per_channel, calibrate_method=config.calibrate_method,
                    extra_options=config.extra_options)
    fuse_activations(out)  # mpstudio's post-pass on ORT's output (a Relu/Clip next to a convert)
    return read_quantized_tensors(out)


def write_overrides(quantizer, plan, path, **kw):
    path.write_text(json.dumps(ort_overrides(quantizer, plan, **kw)))
    return path


def qdq_nodes(path):
    """(activation tensors, param tensors) counted straight from the Q/DQ nodes, as an independent reading."""
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    dq_outputs = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    first_q = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in dq_outputs]
    params = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    return first_q, params, inits


def dict_form(encodings):
    """Either version as {section: {tensor: [{"bitwidth", "offset", "scale"}, ...]}} (one dict per channel)."""
    if encodings.get("version") != "1.0.0":
        return encodings
    return {section: {e["name"]: [{"bitwidth": e["bw"], "offset": o, "scale": s}
                                  for s, o in zip(e["scale"], e["offset"])] for e in encodings[section]}
            for section in ("activation_encodings", "param_encodings")}


def check_covers_model(encodings, path):
    """Every Q/DQ of the model is in the encodings with the model's bit width, channel count and values."""
    first_q, params, inits = qdq_nodes(path)
    encodings = dict_form(encodings)
    activations, weights = encodings["activation_encodings"], encodings["param_encodings"]
    if not any(e["bitwidth"] == 32 for entries in weights.values() for e in entries):
        # An export leaves the int32 biases out (QNN derives them); every other parameter is there.
        params = [n for n in params if inits[n.input[2]].data_type != TensorProto.INT32]
    assert len(activations) == len(first_q) and len(weights) == len(params)
    for name, item in qdq.read(path).activations().items():
        (entry,) = activations[name]
        assert entry["scale"] == pytest.approx(item.encoding.step, rel=1e-7)
        assert entry["offset"] == (item.encoding.qmin - item.encoding.zero)
        assert entry["bitwidth"] == item.encoding.bits
    for node in params:
        name = node.input[0].removesuffix("_quantized")
        zero_point = inits[node.input[2]]
        bits = {TensorProto.UINT8: 8, TensorProto.INT8: 8, TensorProto.UINT16: 16, TensorProto.INT16: 16,
                TensorProto.INT32: 32}[zero_point.data_type]
        channels = max(1, int(np.prod(zero_point.dims)))
        assert len(weights[name]) == channels
        assert {e["bitwidth"] for e in weights[name]} == {bits}


# ---- encodings -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
@pytest.mark.parametrize("which", list(CONV_PLANS))
def test_encodings_pass_the_schema_and_cover_every_quantized_tensor(conv, which, version):
    path = conv.generate(CONV_PLANS[which])
    encodings = json.loads(json.dumps(qnn_encodings(path, version)))
    assert encodings["version"] == version
    validate_encodings(encodings, path)
    check_covers_model(encodings, path)


def test_mixed_plan_encodings_give_each_tensor_its_producers_bit_width(conv):
    path = conv.generate(MIXED)
    tensors = read_quantized_tensors(path)
    # x is written at 8 bits and converted to 16 for conv1; add_out the other way round for the pooling.
    assert tensors["x"].encoding.dtype == "uint8" and [c.dtype for c in tensors["x"].converts] == ["uint16"]
    assert tensors["add_out"].encoding.dtype == "uint16" and [c.dtype for c in tensors["add_out"].converts] == ["uint8"]
    encodings = dict_form(qnn_encodings(path))["activation_encodings"]
    assert [encodings[t][0]["bitwidth"] for t in ("x", "relu1_out", "add_out", "y")] == [8, 16, 16, 8]


def _tiny_conv():
    """x[1,4,1,1] -> 1x1 Conv (2 output channels, bias) -> y, with weights chosen for round numbers."""
    weight = np.array([[1.27, 0.5, 0.0, 0.0], [0.0, 0.0, 0.1, -0.635]], np.float32).reshape(2, 4, 1, 1)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1, 1])],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.array([0.1, 0.2], np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_hand_checked_values(tmp_path):
    # The worked example of the QNN SDK's 8-bit algorithm: values [-1.8, -1.0, 0, 0.5] give encoding-min
    # -1.803922 and encoding-max 0.496078 (zero exactly representable, at code 200), step 0.009020.
    x = np.array([-1.8, -1.0, 0.0, 0.5], np.float32).reshape(1, 4, 1, 1)
    quantizer = Quantizer(prepare_model(_tiny_conv()), FeedList([{"x": x}]), tmp_path)
    encodings = qnn_encodings(quantizer.generate(PrecisionPlan.a8w8()), "0.6.1")
    (xe,) = encodings["activation_encodings"]["x"]
    assert xe == {"bitwidth": 8, "dtype": "int", "is_symmetric": "False", "offset": -200,
                  "scale": pytest.approx(0.009020, abs=1e-6), "min": pytest.approx(-1.803922, abs=1e-6),
                  "max": pytest.approx(0.496078, abs=1e-6)}
    # uint8 weight over [-0.635, 1.27]: scale 1.905/255, zero point 85, so offset -85 and min/max the range.
    (we,) = encodings["param_encodings"]["w"]
    assert (we["offset"], we["is_symmetric"]) == (-85, "False")
    assert (we["min"], we["max"]) == (pytest.approx(-0.635, abs=1e-6), pytest.approx(1.27, abs=1e-6))

    # Per-channel symmetric int8: scale = max|w| / 127 per channel, zero point 0, which is offset -128 read
    # unsigned (the seed's per-channel form); the int32 bias has scale x_scale * w_scale per channel.
    per_channel = quantizer.generate(PrecisionPlan(weight_type="int8", per_channel=True))
    encodings = qnn_encodings(per_channel, "0.6.1")
    w = encodings["param_encodings"]["w"]
    assert [e["scale"] for e in w] == [pytest.approx(0.01, rel=1e-6), pytest.approx(0.005, rel=1e-6)]
    assert [(e["offset"], e["is_symmetric"]) for e in w] == [(-128, "True")] * 2
    assert [(e["min"], e["max"]) for e in w] == [(pytest.approx(-1.28, rel=1e-6), pytest.approx(1.27, rel=1e-6)),
                                                 (pytest.approx(-0.64, rel=1e-6), pytest.approx(0.635, rel=1e-6))]
    b = encodings["param_encodings"]["b"]
    assert [(e["bitwidth"], e["offset"], e["is_symmetric"]) for e in b] == [(32, -2 ** 31, "True")] * 2
    assert [e["scale"] for e in b] == [pytest.approx(xe["scale"] * 0.01, rel=1e-6),
                                       pytest.approx(xe["scale"] * 0.005, rel=1e-6)]

    # The same in AIMET's 1.0.0 form: is_sym is the signedness (true for int8 weights and the int32 bias),
    # offsets keep the unsigned reading, per-channel tensors are one entry with lists.
    v1 = {e["name"]: e for e in qnn_encodings(per_channel, "1.0.0")["param_encodings"]}
    assert v1["w"] == {"name": "w", "dtype": "INT", "enc_type": "PER_CHANNEL", "bw": 8, "is_sym": True,
                       "scale": [pytest.approx(0.01, rel=1e-6), pytest.approx(0.005, rel=1e-6)], "offset": [-128, -128]}
    assert (v1["b"]["bw"], v1["b"]["is_sym"], v1["b"]["offset"]) == (32, True, [-2 ** 31] * 2)
    x1, _ = qnn_encodings(quantizer.generate(PrecisionPlan.a8w8()), "1.0.0")["activation_encodings"]  # x, y
    assert x1 == {"name": "x", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 8, "is_sym": False,
                  "scale": [pytest.approx(0.009020, abs=1e-6)], "offset": [-200]}


def test_validate_encodings_lists_what_is_wrong(conv):
    path = conv.generate(PrecisionPlan(weight_type="int8", per_channel=True))
    good = qnn_encodings(path, "0.6.1")

    def broken(change):
        data = json.loads(json.dumps(good))
        change(data)
        with pytest.raises(MpstudioError) as info:
            validate_encodings(data, path)
        return str(info.value)

    acts, params = "activation_encodings", "param_encodings"
    assert "lacks 'relu1_out'" in broken(lambda d: d[acts].pop("relu1_out"))
    assert "missing section(s) ['param_encodings']" in broken(lambda d: d.pop(params))
    assert "did you mean 'relu1_out'" in broken(lambda d: d[acts].update(relu1_oot=d[acts]["relu1_out"]))
    assert "belongs in param_encodings" in broken(lambda d: d[acts].update({"conv1.weight": d[params]["conv1.weight"]}))
    assert "bitwidth must be one of 4, 8, 16, 32" in broken(lambda d: d[acts]["x"][0].update(bitwidth=12))
    assert "bitwidth 16, but the model quantizes it to uint8" in broken(
        lambda d: d[acts]["x"][0].update(bitwidth=16, max=d[acts]["x"][0]["min"] + 65535 * d[acts]["x"][0]["scale"]))
    assert "scale must be > 0" in broken(lambda d: d[acts]["x"][0].update(scale=0.0))
    assert "min 1.0 is above max" in broken(lambda d: d[acts]["x"][0].update(min=1.0, max=-1.0))
    assert "is_symmetric must be the string" in broken(lambda d: d[params]["conv1.weight"][0].update(is_symmetric=True))
    assert "offset must be an integer in (-2^bitwidth, 0]" in broken(lambda d: d[acts]["x"][0].update(offset=121))
    assert "has 7 encoding(s); the model quantizes it with 8 along axis 0" in broken(
        lambda d: d[params]["conv1.weight"].pop())
    assert "missing key(s) ['scale']" in broken(lambda d: d[acts]["y"][0].pop("scale"))
    message = broken(lambda d: (d[acts].pop("x"), d[acts].pop("y")))
    assert "(2 problems)" in message and "lacks 'x'" in message and "lacks 'y'" in message


# ---- ORT overrides -------------------------------------------------------------------------------------
def test_overrides_are_json_with_quant_type_names(conv):
    overrides = ort_overrides(conv, MIXED)
    assert json.loads(json.dumps(overrides)) == overrides
    assert overrides["relu1_out"] == [{"quant_type": "QUInt16"}]
    assert overrides["x"] == [{"quant_type": "QUInt8", "convert": {"quant_type": "QUInt16",
                                                                   "recv_nodes": ["/backbone/conv1/Conv"]}}]
    loaded = load_ort_overrides(overrides, conv.graph)
    assert loaded["relu1_out"] == [{"quant_type": QuantType.QUInt16}]
    assert loaded["x"][0]["convert"]["recv_nodes"] == {"/backbone/conv1/Conv"}


@pytest.mark.parametrize("which", list(CONV_PLANS))
def test_requantizing_with_exported_overrides_gives_the_same_model(conv, conv_other_data, which, tmp_path):
    plan = CONV_PLANS[which]
    evaluated = read_quantized_tensors(conv.generate(plan))
    overrides = write_overrides(conv, plan, tmp_path / "o.json")
    assert requantize(conv, plan, overrides, tmp_path / "same.onnx") == evaluated
    # Other calibration data moves the activation ranges unless the parameters are pinned.
    assert requantize(conv_other_data, plan, overrides, tmp_path / "other.onnx") != evaluated
    pinned = write_overrides(conv, plan, tmp_path / "p.json", with_parameters=True)
    validate_ort_overrides(json.loads(pinned.read_text()), conv.graph, conv.generate(plan), pinned=True)
    assert requantize(conv_other_data, plan, pinned, tmp_path / "pinned.onnx") == evaluated


def test_pinned_overrides_carry_the_models_scales(conv):
    path = conv.generate(MIXED)
    pinned = ort_overrides(conv, MIXED, with_parameters=True)
    for name, item in qdq.read(path).activations().items():
        entry = pinned[name][0]
        assert (entry["scale"], entry["zero_point"]) == (item.encoding.step, item.encoding.zero)
    convert = pinned["x"][0]["convert"]
    assert convert["quant_type"] == "QUInt16" and convert["scale"] == read_quantized_tensors(path)["x"].converts[0].scale[0]
    loaded = load_ort_overrides(pinned, conv.graph)
    assert loaded["x"][0]["scale"].dtype == np.float32 and loaded["x"][0]["zero_point"].dtype == np.uint8


def test_bad_overrides_are_clear_errors(conv, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"relu1_out": [{"quant_type": "QUInt16"}')
    with pytest.raises(MpstudioError, match=r"not valid JSON: .* line 1"):
        load_ort_overrides(bad)
    with pytest.raises(MpstudioError, match="overrides file not found"):
        load_ort_overrides(tmp_path / "missing.json")

    def message(overrides):
        with pytest.raises(MpstudioError) as info:
            load_ort_overrides(overrides, conv.graph)
        return str(info.value)

    assert "unknown tensor 'relu1_oot'" in message({"relu1_oot": [{"quant_type": "QUInt16"}]})
    assert "did you mean 'relu1_out'" in message({"relu1_oot": [{"quant_type": "QUInt16"}]})
    assert "unknown quant_type 'QUint16'; did you mean 'QUInt16'?" in message({"relu1_out": [{"quant_type": "QUint16"}]})
    assert "unknown key(s) ['type']" in message({"relu1_out": [{"type": "QUInt16"}]})
    assert "non-empty list" in message({"relu1_out": {"quant_type": "QUInt16"}})
    assert "give both scale and zero_point" in message({"relu1_out": [{"scale": 0.1}]})
    assert "cannot be given with scale and zero_point" in message(
        {"relu1_out": [{"scale": 0.1, "zero_point": 0, "symmetric": True}]})
    assert "zero_point 300 is outside the range of QUInt8" in message(
        {"relu1_out": [{"quant_type": "QUInt8", "scale": 0.1, "zero_point": 300}]})
    assert "convert applies to activations only" in message({"conv1.weight": [{"convert": {"quant_type": "QUInt16"}}]})
    assert "node '/backbone/conv2/Conv' does not read 'x'" in message(
        {"x": [{"convert": {"quant_type": "QUInt16", "recv_nodes": ["/backbone/conv2/Conv"]}}]})
    assert "3 per-channel entries for 8 channels" in message({"conv1.weight": [{"axis": 0}] * 3})
    assert "apply to weights only" in message({"x": [{"axis": 0}]})
    # Loaded without a graph, names go unchecked but types do not.
    with pytest.raises(MpstudioError, match="unknown quant_type"):
        load_ort_overrides({"anything": [{"quant_type": "uint16"}]})


def test_overrides_that_disagree_with_the_model_are_caught(conv):
    path = conv.generate(MIXED)
    overrides = ort_overrides(conv, MIXED, with_parameters=True)
    validate_ort_overrides(overrides, conv.graph, path, pinned=True)
    wrong_type = json.loads(json.dumps(overrides))
    wrong_type["relu1_out"][0]["quant_type"] = "QUInt8"
    wrong_type["relu1_out"][0]["zero_point"] = 0
    with pytest.raises(MpstudioError, match="quant_type QUInt8, but the model quantizes it to uint16"):
        validate_ort_overrides(wrong_type, conv.graph, path)
    unpinned = json.loads(json.dumps(overrides))
    del unpinned["y"]
    with pytest.raises(MpstudioError, match="'y': the model quantizes it, but its scale and zero point are not pinned"):
        validate_ort_overrides(unpinned, conv.graph, path, pinned=True)
    moved = json.loads(json.dumps(overrides))
    moved["x"][0]["scale"] *= 1.01
    with pytest.raises(MpstudioError, match="pinned scale/zero_point differ from the model's"):
        validate_ort_overrides(moved, conv.graph, path)


# ---- export_plan ---------------------------------------------------------------------------------------
def test_export_plan_writes_validated_files(conv, tmp_path):
    seen = []
    result = export_plan(conv, MIXED, tmp_path / "out", progress=lambda d, t, m: seen.append((d, t, m)))
    assert isinstance(result, ExportResult)
    # MIXED's 16-bit Conv takes uint8 per-tensor weights the HTP requantizes: the HTP's model is written too.
    assert [p.name for p in result.paths()] == ["mixed.plan.json", "mixed.overrides.json", "mixed.encodings.json",
                                              "mixed.qdq.onnx", "mixed.htp.qdq.onnx", "mixed.README.md"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in result.paths())  # no leftovers
    umask = os.umask(0)
    os.umask(umask)
    assert {p.stat().st_mode & 0o777 for p in result.paths()} == {0o666 & ~umask}  # as any file the user writes
    assert PrecisionPlan.load(result.plan) == MIXED
    assert result.model.read_bytes() == conv.generate(MIXED).read_bytes()
    validate_encodings(json.loads(result.encodings.read_text()), result.model)
    assert result.tensors == len(read_quantized_tensors(result.model))
    assert requantize(conv, MIXED, result.overrides, tmp_path / "r.onnx") == read_quantized_tensors(result.model)
    assert seen[-1][0] == seen[-1][1] and [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)


def test_export_plan_refuses_bad_requests(conv, tmp_path):
    with pytest.raises(MpstudioError, match="unknown export format"):
        export_plan(conv, MIXED, tmp_path, formats=("ort", "tflite"))
    with pytest.raises(MpstudioError, match="built on an agent"):
        export_plan(conv, MIXED, tmp_path, formats=("context",))
    with pytest.raises(MpstudioError, match="did you mean 'relu1_out'"):
        export_plan(conv, PrecisionPlan.a8w8().promote(["relu1_oot"]), tmp_path)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        export_plan(conv, MIXED, tmp_path / "cancelled", cancel=cancel)
    assert not list((tmp_path / "cancelled").glob("*.json"))


def test_export_names_files_after_a_safe_plan_name(conv, tmp_path):
    plan = PrecisionPlan.a8w8(name="stem 16-bit / try 2")
    result = export_plan(conv, plan, tmp_path, formats=("qnn",))
    assert result.encodings.name == "stem_16-bit_try_2.encodings.json" and result.overrides is None
    unnamed = export_plan(conv, PrecisionPlan.a8w8(name=""), tmp_path, formats=())
    assert unnamed.plan.name == f"a8w8-{PrecisionPlan.a8w8().hash[:8]}.plan.json"
    # An unnamed plan's files say what it is, as the studio names it, and which one it is.
    promoted = PrecisionPlan.a8w8().promote(conv.graph.activations()[1:3])
    assert promoted.name == "" and promoted.short_name == "a8w8+2x16"
    assert export_name(promoted) == f"a8w8+2x16-{promoted.hash[:8]}"


@pytest.mark.htp
@requires_qnn
def test_context_binary_export_through_a_local_agent(conv, tmp_path):
    from mpstudio.agent import LocalAgent

    with LocalAgent() as agent:
        result = export_plan(conv, MIXED, tmp_path, formats=("model", "context"), agent=agent.client,
                             provider_options={"htp_arch": "75"})
        check_context_model(result.context)
        feeds = conv_feeds(1)[0]
        options = {"htp_arch": "75"}
        from_context = agent.client.run(result.context, feeds, provider_options=options).outputs["y"]
        from_model = agent.client.run(result.model, feeds, provider_options=options).outputs["y"]
    np.testing.assert_array_equal(from_context, from_model)
    with pytest.raises(MpstudioError, match="no EPContext node"):
        check_context_model(result.model)


# ---- the demo (PP-OCRv4 recognizer, 404 nodes) ----------------------------------------------------------
def _demo_plans(demo):
    stem = demo.model.graph.activations()[:30]
    return {
        "a8w8": PrecisionPlan.a8w8(),
        "a16w8": PrecisionPlan.a16w8(),
        "mixed": PrecisionPlan.a8w8().promote(stem, name="demo-mixed").promote(["p2o.Mul.3"]),
        "per-channel-int8": PrecisionPlan(weight_type="int8", per_channel=True, name="demo-pc"),
    }


@pytest.mark.parametrize("which", ["a8w8", "a16w8", "mixed", "per-channel-int8"])
def test_demo_exports_cover_the_model_and_requantize_to_it(demo, demo_quantizer, which, tmp_path):
    plan = _demo_plans(demo)[which]
    result = export_plan(demo_quantizer, plan, tmp_path, formats=("ort", "qnn", "model", "float"))
    encodings = dict_form(json.loads(result.encodings.read_text()))
    check_covers_model(encodings, result.model)
    float_tensors = ModelGraph(onnx.load(str(result.float_model))).tensors
    assert set(encodings["activation_encodings"]) | set(encodings["param_encodings"]) <= set(float_tensors)
    biases = [t for t in read_quantized_tensors(result.model).values() if t.encoding.dtype == "int32"]
    assert result.tensors == len(encodings["activation_encodings"]) + len(encodings["param_encodings"]) + len(biases)
    assert requantize(demo_quantizer, plan, result.overrides, tmp_path / "r.onnx") == \
        read_quantized_tensors(result.model)


def test_demo_pinned_overrides_reproduce_the_model_from_other_data(demo, demo_quantizer, tmp_path):
    plan = _demo_plans(demo)["mixed"]
    other = Quantizer(demo.model, demo.evaluation.head(4), tmp_path / "other")
    pinned = write_overrides(demo_quantizer, plan, tmp_path / "p.json", with_parameters=True)
    assert requantize(other, plan, pinned, tmp_path / "r.onnx") == read_quantized_tensors(demo_quantizer.generate(plan))


def test_the_documented_pipeline_reproduces_the_model(conv, tmp_path, monkeypatch):
    """The stand-alone loader of docs/export.md, run as written on a pinned export and other calibration data."""
    from pathlib import Path

    from mpstudio.data import CalibrationReader

    text = (Path(__file__).parent.parent / "docs" / "export.md").read_text()
    code = text.split("Without mpstudio:", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    export_plan(conv, MIXED, tmp_path, formats=("ort", "float"), with_parameters=True)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/export.md", "exec"), {"reader": CalibrationReader(FeedList(conv_feeds(3, seed=5)))})
    assert read_quantized_tensors(tmp_path / "mixed.mine.onnx") == read_quantized_tensors(conv.generate(MIXED))


def test_the_converts_the_encodings_cannot_carry_are_counted_with_a_few_named(tmp_path):
    """A plan with many precision boundaries (an encoder with a few promoted tensors has dozens) gives one line
    with the count and a few examples, not one line per convert run together into a paragraph."""
    from mpstudio.export_aimet import encodings_cannot_carry

    rng = np.random.default_rng(0)
    inits, nodes, previous = [], [], "x"
    for i in range(10):
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, 4, 1, 1)).astype(np.float32), f"k{i}"))
        nodes.append(helper.make_node("Mul" if i % 2 else "Add", [previous, f"k{i}"], [f"t{i}"], name=f"op{i}"))
        previous = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)
    feeds = FeedList([{"x": rng.normal(0, 1, (1, 4, 4, 4)).astype(np.float32)} for _ in range(2)])
    quantizer = Quantizer(prepare_model(model), feeds, tmp_path / "cache")
    path = quantizer.generate(PrecisionPlan.a8w8().promote(["t1", "t5"]))
    converts = sum(len(t.converts) for t in read_quantized_tensors(path).values())
    assert converts > 3
    lines = encodings_cannot_carry(path, biases=False)
    assert len(lines) == 1 and lines[0].startswith(f"{converts} tensor(s) written at one width")
    assert lines[0].count("scale") == 3 and f"and {converts - 3} more" in lines[0]
    few = encodings_cannot_carry(quantizer.generate(PrecisionPlan.a8w8().promote(["t1"])), biases=False)
    assert len(few) == 1 and "more" not in few[0]
