"""AIMET encodings 1.0.0 and the older dict form: round trips, files written from AIMET's documented schema,
imported plans (from encodings files and QDQ models) that reproduce the imported quantization, and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR, conv_feeds, make_conv_model
from mpstudio import encodings, qdq
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.export import export_plan, qnn_encodings, read_quantized_tensors, validate_encodings
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan, TensorOverride
from mpstudio.quantize import Quantizer
from mpstudio.loop.runners import CPU_SOURCE
from mpstudio.study import Study

PER_CHANNEL_MIXED = PrecisionPlan(weight_type="int8", per_channel=True, name="pc").promote(["add_out"])


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return Quantizer(prepare_model(make_conv_model()), FeedList(conv_feeds(8)), tmp_path_factory.mktemp("conv"))


@pytest.fixture
def study(tmp_path):
    with Study.create(tmp_path / "study", make_conv_model(), FeedList(conv_feeds(6)), FeedList(conv_feeds(4, seed=3))) as s:
        yield s


def per_tensor(name, bw, is_sym, scale, offset):
    """One 1.0.0 entry as AIMET's specification writes it."""
    return {"name": name, "dtype": "INT", "enc_type": "PER_TENSOR", "bw": bw, "is_sym": is_sym, "scale": [scale],
            "offset": [offset]}


def aimet_file(weight):
    """An encodings file in AIMET's 1.0.0 format for the conv model (prepared: conv2's bias absorbs the Add's
    constant, so add_out is conv2's output): uint16 activations, symmetric int8 weights, conv1's per channel.

    Offsets follow AIMET's convention, offset = -zero point read unsigned: -32768 puts uint16 zero mid-range,
    -128 is a signed symmetric int8 weight (zero point 0).
    """
    channel_max = np.abs(weight).reshape(weight.shape[0], -1).max(axis=1)
    return {
        "version": "1.0.0",
        "activation_encodings": [
            per_tensor("x", 16, False, 6.0 / 65535, -32768),
            per_tensor("relu1_out", 16, False, 4.0 / 65535, 0),
            per_tensor("add_out", 16, False, 8.0 / 65535, -30000),
            per_tensor("y", 16, False, 3.0 / 65535, -20000),
        ],
        "param_encodings": [
            {"name": "conv1.weight", "dtype": "INT", "enc_type": "PER_CHANNEL", "bw": 8, "is_sym": True,
             "scale": [float(m) / 127 for m in channel_max], "offset": [-128] * len(channel_max)},
            per_tensor("conv2.weight", 8, True, 0.005, -128),
        ],
        "excluded_layers": [],
        "quantizer_args": {"activation_bitwidth": 16, "dtype": "int", "is_symmetric": True, "param_bitwidth": 8,
                           "per_channel_quantization": True, "quant_scheme": "min_max"},
    }


def conv1_weight(study):
    init = next(i for i in study.prepared.model.graph.initializer if i.name == "conv1.weight")
    return numpy_helper.to_array(init)


# ---- round trips -----------------------------------------------------------------------------------------
def test_1_0_0_round_trip_gives_the_models_encodings_back(conv):
    path = conv.generate(PER_CHANNEL_MIXED)
    written = qnn_encodings(path, "1.0.0")
    parsed = encodings.load(json.loads(json.dumps(written)))
    model = read_quantized_tensors(path)
    assert parsed.version == "1.0.0" and set(parsed.entries) == set(model)
    for name, tensor in model.items():
        entry = parsed.entries[name]
        assert entry.kind == tensor.kind
        assert (entry.encoding.dtype, entry.encoding.scale, entry.encoding.zero_point) == \
            (tensor.encoding.dtype, tensor.encoding.scale, tensor.encoding.zero_point)
        assert entry.per_channel == tensor.encoding.per_channel
    assert parsed.entries["conv1.weight"].per_channel and parsed.entries["conv1.weight"].encoding.dtype == "int8"
    again = encodings.write(((e.name, e.kind, e.encoding) for e in parsed.entries.values()), "1.0.0")
    assert again == written


def test_dict_form_round_trip_is_exact(conv):
    path = conv.generate(PrecisionPlan.a8w8().promote(["relu1_out"]))  # uint8 weights, a convert
    written = qnn_encodings(path, "0.6.1")
    parsed = encodings.load(json.loads(json.dumps(written)))
    assert parsed.version == "0.6.1"
    assert encodings.write(((e.name, e.kind, e.encoding) for e in parsed.entries.values()), "0.6.1") == written
    # The same tensors in both forms give the same values.
    v1 = encodings.load(qnn_encodings(path, "1.0.0"))
    assert {n: (e.encoding.scale, e.encoding.offsets) for n, e in parsed.entries.items()} == \
        {n: (e.encoding.scale, e.encoding.offsets) for n, e in v1.entries.items()}


def test_a_file_without_version_is_the_dict_form(conv):
    legacy = qnn_encodings(conv.generate(PrecisionPlan.a8w8()), "0.6.1")
    legacy.pop("version")
    assert encodings.load(legacy).version == "0.6.1"
    assert encodings.load({**legacy, "version": "0.4.0"}).version == "0.6.1"


# ---- a file in AIMET's format, imported as a plan -----------------------------------------------------------
def test_aimet_1_0_0_file_imports_as_a_plan_whose_model_has_the_files_encodings(study, tmp_path):
    data = aimet_file(conv1_weight(study))
    path = tmp_path / "model.encodings"
    path.write_text(json.dumps(data, indent=2))
    imported = study.import_plan(path)

    plan = imported.plan
    assert imported.source == "encodings 1.0.0" and plan.encodings
    assert (plan.activation_type, plan.weight_type, plan.per_channel) == ("uint16", "int8", False)
    assert dict(plan.overrides) == {"conv1.weight": TensorOverride(per_channel=True)}
    assert set(imported.pinned) == {"x", "relu1_out", "add_out", "y", "conv1.weight", "conv2.weight"}
    assert study.plans()["origin"].tolist() == ["import"]
    assert study.plan(imported.plan_id) == plan  # the pin survives the store

    evaluation = study.evaluate(plan)
    model_path = study.quantizer.generate(plan)
    tensors = read_quantized_tensors(model_path)
    # The offset convention, read back from the model's own Q/DQ initializers.
    assert tensors["x"].encoding.dtype == "uint16" and tensors["x"].encoding.zero_point == (32768,)
    assert tensors["conv2.weight"].encoding.dtype == "int8" and tensors["conv2.weight"].encoding.zero_point == (0,)
    assert tensors["conv1.weight"].encoding.axis == 0 and set(tensors["conv1.weight"].encoding.zero_point) == {0}

    # Exported again in 1.0.0, every tensor of the file has the file's encoding.
    exported = export_plan(study.quantizer, plan, tmp_path / "out", formats=("qnn",))
    again = {e["name"]: e for section in ("activation_encodings", "param_encodings")
             for e in json.loads(exported.encodings.read_text())[section]}
    for section in ("activation_encodings", "param_encodings"):
        for entry in data[section]:
            mine = again[entry["name"]]
            assert (mine["bw"], mine["is_sym"], mine["enc_type"], mine["offset"]) == \
                (entry["bw"], entry["is_sym"], entry["enc_type"], entry["offset"]), entry["name"]
            assert mine["scale"] == pytest.approx(entry["scale"], rel=1e-6), entry["name"]

    # The evaluation ran that model: its SNR against the float model is the study's, recomputed here.
    float_out = [ort.InferenceSession(str(study.quantizer.float_path)).run(None, s)[0] for s in
                 (study.evaluation_data.sample(i) for i in range(len(study.evaluation_data)))]
    qdq_out = [ort.InferenceSession(str(model_path)).run(None, s)[0] for s in
               (study.evaluation_data.sample(i) for i in range(len(study.evaluation_data)))]
    signal = sum(float(np.sum(f.astype(np.float64) ** 2)) for f in float_out)
    noise = sum(float(np.sum((f.astype(np.float64) - q) ** 2)) for f, q in zip(float_out, qdq_out))
    assert evaluation.snr_db == pytest.approx(10 * np.log10(signal / noise), abs=0.05)


def test_the_same_file_in_the_dict_form_gives_the_same_plan(study, tmp_path):
    data = aimet_file(conv1_weight(study))
    first = study.import_plan(data)
    legacy = {"version": "0.6.1", "activation_encodings": {}, "param_encodings": {}}
    for section in ("activation_encodings", "param_encodings"):
        for entry in data[section]:
            encoding = encodings.load({"version": "1.0.0", "activation_encodings": [],
                                       "param_encodings": [entry]}).entries[entry["name"]].encoding
            legacy[section][entry["name"]] = encodings.entry_0_6_1(encoding)
    second = study.import_plan(legacy)
    assert second.plan.hash == first.plan.hash and second.plan_id == first.plan_id


def test_a_boundary_between_widths_pins_the_convert(study):
    # add_out at 8 bits after a 16-bit conv2 input: ORT has conv2 write add_out at 16 bits and convert it to 8
    # for the pooling; the file's 8-bit encoding is what the pooling reads.
    data = aimet_file(conv1_weight(study))
    data["activation_encodings"][2] = per_tensor("add_out", 8, False, 0.03, -120)
    data["activation_encodings"][3] = per_tensor("y", 8, False, 0.01, -100)
    imported = study.import_plan(data)
    plan = imported.plan  # two 16-bit and two 8-bit activations: the tie goes to ORT's default, uint8
    assert plan.activation_type == "uint8" and {n: o.type for n, o in plan.overrides.items()} == \
        {"x": "uint16", "relu1_out": "uint16", "conv1.weight": None}
    tensors = read_quantized_tensors(study.quantizer.generate(imported.plan))
    (convert,) = tensors["add_out"].converts
    assert (convert.dtype, convert.zero_point) == ("uint8", (120,)) and convert.scale == pytest.approx((0.03,))
    assert (tensors["y"].encoding.dtype, tensors["y"].encoding.zero_point) == ("uint8", (100,))


def test_editing_an_imported_plan_keeps_the_pins_it_still_can(study):
    imported = study.import_plan(aimet_file(conv1_weight(study)))
    edited = imported.plan.with_overrides({"conv2.weight": "uint8"})
    tensors = read_quantized_tensors(study.quantizer.generate(edited))
    assert tensors["conv2.weight"].encoding.dtype == "uint8"  # the plan's type wins, calibrated by the study
    assert tensors["x"].encoding.zero_point == (32768,)  # the rest stays pinned


# ---- QDQ models as plans -----------------------------------------------------------------------------------
def test_an_ort_qdq_model_from_other_data_imports_with_its_parameters(study, tmp_path):
    other = Quantizer(study.prepared, FeedList(conv_feeds(8, seed=42)), tmp_path / "other")
    a16w8_pc = PrecisionPlan(activation_type="uint16", weight_type="int8", per_channel=True)
    source = other.generate(a16w8_pc)
    imported = study.import_plan(source, name="from elsewhere")
    assert imported.source == "QDQ model" and imported.plan.name == "from elsewhere"
    assert (imported.plan.activation_type, imported.plan.weight_type, imported.plan.per_channel) == \
        ("uint16", "int8", True)
    assert {name for name, _ in imported.skipped} == {"conv1.bias", "ConvAddFusion_B_conv2.bias"}
    regenerated = read_quantized_tensors(study.quantizer.generate(imported.plan))
    calibrated_here = read_quantized_tensors(study.quantizer.generate(a16w8_pc))
    assert regenerated == read_quantized_tensors(source)  # biases too: they follow from the pinned scales
    assert regenerated["x"] != calibrated_here["x"]  # the study's own calibration differs: the pins matter


def _aimet_style_qdq(tmp_path):
    """x -> conv -> y (float), and its QDQ form as aimet-onnx's `to_onnx_qdq(prequantize_constants=True)` names
    things: the weight stored as `w_q`, DQ outputs `*_qdq`, the conv writing `y_updated` before the last Q/DQ."""
    rng = np.random.default_rng(5)
    weight = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    float_graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "aimet_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        initializer=[numpy_helper.from_array(weight, "w")])
    float_model = helper.make_model(float_graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR)
    scales = np.abs(weight).reshape(4, -1).max(axis=1) / 127
    w_q = np.clip(np.round(weight / scales[:, None, None, None]), -128, 127).astype(np.int8)
    inits = [numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(scales.astype(np.float32), "w_scale"),
             numpy_helper.from_array(np.zeros(4, np.int8), "w_zero_point"),
             numpy_helper.from_array(np.array(1e-4, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(32768, np.uint16), "x_zero_point"),
             numpy_helper.from_array(np.array(3e-4, np.float32), "y_scale"),
             numpy_helper.from_array(np.array(30000, np.uint16), "y_zero_point")]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero_point"], ["w_qdq"], axis=0),
             helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero_point"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero_point"], ["x_updated"]),
             helper.make_node("Conv", ["x_updated", "w_qdq"], ["y_updated"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["y_updated", "y_scale", "y_zero_point"], ["y_q"]),
             helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero_point"], ["y"])]
    qdq_graph = helper.make_graph(nodes, "aimet_like_qdq", list(float_graph.input), list(float_graph.output),
                                  initializer=inits)
    qdq_model = helper.make_model(qdq_graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR)
    onnx.save(float_model, tmp_path / "float.onnx")
    onnx.save(qdq_model, tmp_path / "aimet.qdq.onnx")
    return tmp_path / "float.onnx", tmp_path / "aimet.qdq.onnx"


def test_an_aimet_style_qdq_model_maps_its_names_to_the_float_model(tmp_path):
    float_path, qdq_path = _aimet_style_qdq(tmp_path)
    feeds = [{"x": np.random.default_rng(i).normal(size=(1, 3, 8, 8)).astype(np.float32)} for i in range(4)]
    with Study.create(tmp_path / "study", float_path, FeedList(feeds)) as study:
        imported = study.import_plan(qdq_path)
        assert set(imported.pinned) == {"x", "w", "y"}
        regenerated = study.quantizer.generate(imported.plan)
        mine, theirs = read_quantized_tensors(regenerated), qdq.read(qdq_path).tensors
        assert mine["w"].encoding == theirs["w_q"].encoding
        assert (mine["x"].encoding, mine["y"].encoding) == (theirs["x"].encoding, theirs["y_updated"].encoding)
        outputs = [ort.InferenceSession(str(p)).run(None, feeds[0])[0] for p in (regenerated, qdq_path)]
        np.testing.assert_array_equal(outputs[0], outputs[1])  # the same quantization, the same numbers


# ---- errors ------------------------------------------------------------------------------------------------
def _problem(study, data, tmp_path):
    path = tmp_path / "bad.encodings"
    path.write_text(json.dumps(data))
    with pytest.raises(MpstudioError) as info:
        study.import_plan(path)
    assert study.plans().empty and not list((study.folder / "imported").glob("*.json"))  # nothing stored
    return str(info.value)


def test_malformed_files_are_refused_naming_the_tensor_and_field(study, tmp_path):
    good = aimet_file(conv1_weight(study))

    def changed(change):
        data = json.loads(json.dumps(good))
        change(data)
        return _problem(study, data, tmp_path)

    acts, params = "activation_encodings", "param_encodings"
    assert "version '2.0.0' is not read by mpstudio" in changed(lambda d: d.update(version="2.0.0"))
    assert "version must be a string" in changed(lambda d: d.update(version=1.0))
    assert "must be a list of" in changed(lambda d: d.update({acts: {"x": d[acts][0]}}))
    assert "missing section(s) ['param_encodings']" in changed(lambda d: d.pop(params))
    assert "activation_encodings[0] ('x'): missing key(s) ['bw']" in changed(lambda d: d[acts][0].pop("bw"))
    assert "activation_encodings[1] ('relu1_out'): missing key(s) ['scale']" in changed(
        lambda d: d[acts][1].pop("scale"))
    assert "('x'): is_sym must be true or false, got 'False'" in changed(lambda d: d[acts][0].update(is_sym="False"))
    assert "('x'): bw must be one of 4, 8, 16, 32, got '16'" in changed(lambda d: d[acts][0].update(bw="16"))
    assert "('conv2.weight'): scale must be a non-empty list of positive numbers" in changed(
        lambda d: d[params][1].update(scale=[-0.1]))
    assert "('y'): offset must hold integers in (-2^bw, 0]" in changed(lambda d: d[acts][3].update(offset=[12]))
    assert "('y'): offset must be a list of integers" in changed(lambda d: d[acts][3].update(offset=[-1.5]))
    assert "('x'): enc_type PER_BLOCK (block quantization) is not read" in changed(
        lambda d: d[acts][0].update(enc_type="PER_BLOCK", block_size=32))
    assert "('x'): a PER_TENSOR encoding has one scale" in changed(
        lambda d: d[acts][0].update(scale=[0.1, 0.2], offset=[0, 0]))
    assert "activation_encodings[2] must be an object with a tensor 'name'" in changed(
        lambda d: d[acts][2].pop("name"))
    assert "'x' appears twice" in changed(lambda d: d[params].append(dict(d[acts][0])))
    message = changed(lambda d: (d[acts][0].pop("bw"), d[acts][3].update(is_sym=1)))
    assert "(2 problems)" in message and "('x')" in message and "('y')" in message


def test_names_and_shapes_the_model_lacks_are_refused_with_nothing_stored(study, tmp_path):
    good = aimet_file(conv1_weight(study))

    def changed(change):
        data = json.loads(json.dumps(good))
        change(data)
        return _problem(study, data, tmp_path)

    acts, params = "activation_encodings", "param_encodings"
    message = changed(lambda d: d[acts].extend(per_tensor(n, 16, False, 1e-4, 0)
                                               for n in ("relu1_oot", "conv2_out", "a", "b", "c", "d", "e", "f", "g")))
    assert "9 name(s) the float model lacks: 'relu1_oot', 'conv2_out'" in message and "and 1 more" in message
    assert "did you mean 'relu1_out'" in message
    assert "'conv1.weight' has 7 per-channel encoding(s); the weight has 8 channels along axis 0" in changed(
        lambda d: (d[params][0]["scale"].pop(), d[params][0]["offset"].pop()))
    assert "it belongs in param_encodings" in changed(lambda d: d[acts].append(d[params].pop(1)))
    assert "'x' is float16 in the encodings" in changed(
        lambda d: d[acts].__setitem__(0, {"name": "x", "dtype": "FLOAT", "bw": 16, "enc_type": "PER_TENSOR"}))
    assert "'relu1_out' is an activation quantized to uint4" in changed(
        lambda d: d[acts][1].update(bw=4, offset=[0]))


def test_a_float_model_is_not_a_qdq_model_to_import(study):
    with pytest.raises(MpstudioError, match="quantizes no activation"):
        study.import_plan(study.quantizer.float_path)


def test_validate_encodings_reads_1_0_0_and_lists_what_is_wrong(conv):
    path = conv.generate(PER_CHANNEL_MIXED)
    good = qnn_encodings(path, "1.0.0")
    validate_encodings(good, path)

    def broken(change):
        data = json.loads(json.dumps(good))
        change(data)
        with pytest.raises(MpstudioError) as info:
            validate_encodings(data, path)
        return str(info.value)

    acts = "activation_encodings"
    index = {e["name"]: i for i, e in enumerate(good[acts])}
    assert "lacks 'relu1_out'" in broken(lambda d: d[acts].pop(index["relu1_out"]))
    assert "bitwidth 8, but the model quantizes it to uint16" in broken(
        lambda d: d[acts][index["add_out"]].update(bw=8, offset=[-3]))
    assert "has scale" in broken(lambda d: d[acts][index["x"]]["scale"].__setitem__(0, 0.5))
    assert "did you mean 'relu1_out'" in broken(lambda d: d[acts][index["relu1_out"]].update(name="relu1_oot"))


# ---- the command line ----------------------------------------------------------------------------------------
def _cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "mpstudio", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_cli_import_creates_the_study_and_evaluates_the_plan(tmp_path):
    model = tmp_path / "conv.onnx"
    onnx.save(make_conv_model(), model)
    data = tmp_path / "data"
    FeedList(conv_feeds(4)).save_npz(data)
    weight = numpy_helper.to_array(next(i for i in make_conv_model().graph.initializer if i.name == "conv1.weight"))
    (tmp_path / "aimet.encodings").write_text(json.dumps(aimet_file(weight)))

    done = _cli("import", str(tmp_path / "aimet.encodings"), "--study", str(tmp_path / "s"), "--model", str(model),
                "--data", str(data), "--evaluate", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "imported encodings 1.0.0 as plan 1" in done.stdout and "6 tensor(s) keep the imported" in done.stdout
    assert "output SNR (dB)" in done.stdout and f"[{CPU_SOURCE}]" in done.stdout

    shown = _cli("study", "show", str(tmp_path / "s"))
    assert shown.returncode == 0 and "imported aimet" in shown.stdout and "import" in shown.stdout

    bad = dict(aimet_file(weight), version="2.0.0")
    (tmp_path / "v2.encodings").write_text(json.dumps(bad))
    refused = _cli("import", str(tmp_path / "v2.encodings"), "--study", str(tmp_path / "s"))
    assert refused.returncode == 2 and "version '2.0.0' is not read by mpstudio" in refused.stderr
    exported = _cli("export", str(tmp_path / "s"), "--plan", "1", "--format", "qnn", "--encodings-version", "0.6.1",
                    "-o", str(tmp_path / "out"))
    assert exported.returncode == 0, exported.stderr
    legacy = json.loads(next((tmp_path / "out").glob("*.encodings.json")).read_text())
    assert legacy["version"] == "0.6.1" and legacy["activation_encodings"]["x"][0]["offset"] == -32768


def test_a_plans_imported_encodings_are_part_of_its_identity_only_when_present():
    from dataclasses import replace

    plan = PrecisionPlan.a16w8()
    assert "encodings" not in plan.to_json()  # calibrated plans keep the hashes they always had
    pinned = replace(plan, encodings="0123456789abcdef")
    assert pinned.hash != plan.hash and PrecisionPlan.from_json(json.loads(pinned.dumps())) == pinned
    with pytest.raises(MpstudioError, match="'encodings' must be the key of imported encodings"):
        PrecisionPlan.from_json({**plan.to_json(), "encodings": 7})


def test_offsets_written_as_floats_and_a_producer_key_read_as_aimet_writes_them():
    # aimet-onnx writes offsets as floats (-128.0) and a top-level "producer"; both read as the integers they are.
    as_ints = {"version": "1.0.0", "activation_encodings": [per_tensor("x", 16, False, 1e-4, -35437)],
               "param_encodings": [per_tensor("w", 8, True, 0.02, -128)]}
    as_floats = json.loads(json.dumps(as_ints).replace("-35437", "-35437.0").replace("-128", "-128.0"))
    as_floats["producer"] = {"package": "aimet-onnx", "version": "2.42.0"}
    ints, floats = encodings.load(as_ints), encodings.load(as_floats)
    assert floats.entries == ints.entries
    assert floats.entries["x"].encoding.zero_point == (35437,) and floats.entries["w"].encoding.zero_point == (0,)
