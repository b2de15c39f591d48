"""Encodings exchanged with AIMET: a real aimet-onnx 2.42 export (kept as test data) imports as a plan, with every
encoding the plan's model does not apply listed; and, where an interpreter with aimet-onnx is given
(MPSTUDIO_AIMET_PYTHON), AIMET loads mpstudio's exported encodings under its default strict check."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR

DATA = Path(__file__).parent / "data" / "aimet"


def make_eltwise_model() -> onnx.ModelProto:
    """x[1,3,8,8] -> /conv/Conv -> /relu/Relu -> /scale/Mul(constant) -> /add/Add(+relu) -> /clip/Clip(0, 6) -> y.

    The Mul's constant operand is what AIMET lists under activation_encodings; the Add feeds only the Clip, so
    ORT's QDQ model quantizes the Clip's output only, where AIMET gives the Add's output an encoding of its own.
    """
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "conv.weight"),
             numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "conv.bias"),
             numpy_helper.from_array(rng.uniform(0.5, 2.0, (1, 8, 1, 1)).astype(np.float32), "scale.k"),
             numpy_helper.from_array(np.array(0.0, np.float32), "clip.min"),
             numpy_helper.from_array(np.array(6.0, np.float32), "clip.max")]
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["conv_out"], name="/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv_out"], ["relu_out"], name="/relu/Relu"),
             helper.make_node("Mul", ["relu_out", "scale.k"], ["mul_out"], name="/scale/Mul"),
             helper.make_node("Add", ["mul_out", "relu_out"], ["add_out"], name="/add/Add"),
             helper.make_node("Clip", ["add_out", "clip.min", "clip.max"], ["y"], name="/clip/Clip")]
    graph = helper.make_graph(nodes, "eltwise_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def eltwise_feeds(n: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


# ---- importing AIMET's own export ------------------------------------------------------------------------------
# Recorded by aimet-onnx 2.42.0 itself (tests/data/aimet/record.py; README.md there): QuantizationSimModel(
# make_eltwise_model(), param_type="int8", activation_type="int8", config_file="htp_v75"), compute_encodings over
# eltwise_feeds(4), then sim.export() in 1.0.0 (eltwise.encodings) and 0.6.1, sim.to_onnx_qdq() (eltwise_qdq.onnx)
# and the sim's outputs on eltwise_feeds(8, seed=2) (eltwise_sim_outputs.npz).
SOURCES = ("eltwise.encodings", "eltwise.0.6.1.encodings", "eltwise_qdq.onnx")


def _entries(source: Path) -> set[str]:
    data = json.loads(source.read_text())
    return {e["name"] if isinstance(e, dict) and "name" in e else e
            for section in ("activation_encodings", "param_encodings") for e in data[section]}


def test_aimets_own_export_imports_with_constants_placed_and_unapplied_encodings_listed(tmp_path):
    from mpstudio.data import FeedList
    from mpstudio.export import read_quantized_tensors
    from mpstudio.study import Study

    with Study.create(tmp_path / "study", make_eltwise_model(), FeedList(eltwise_feeds(4))) as study:
        for name in ("eltwise.encodings", "eltwise.0.6.1.encodings"):
            source = DATA / name
            assert {"scale.k", "clip.min", "clip.max", "add_out"} <= _entries(source)  # as AIMET writes them
            imported = study.import_plan(source)
            tensors = read_quantized_tensors(study.quantizer.generate(imported.plan))
            # The Mul's constant is pinned where the model has it: a parameter, with AIMET's scale.
            assert "scale.k" in imported.pinned and tensors["scale.k"].kind == "param"
            # The Conv's weight sets the plan's weight type, not the constants AIMET lists beside it.
            assert imported.plan.weight_type == "int8" and imported.plan.per_channel
            # The Add before the Clip keeps AIMET's own encoding: the plan's model quantizes it there.
            assert "add_out" in imported.pinned
            add = tensors["add_out"].encoding
            assert add.scale != tensors["y"].encoding.scale
            assert add.scale[0] == pytest.approx(study.quantizer.pinned(imported.plan)["add_out"].scale[0], rel=1e-6)
            unapplied = dict(imported.unapplied)
            assert set(unapplied) == {"clip.min", "clip.max"}
            assert all("leaves in float" in why for why in unapplied.values())
            assert set(imported.pinned).isdisjoint(unapplied)
            assert set(imported.pinned) | set(unapplied) | {n for n, _ in imported.skipped} == _entries(source)
            text = imported.describe()
            assert "2 imported encoding(s) the plan's model does not apply" in text
            assert "clip.min: a constant the plan's model leaves in float" in text
            assert imported.before_activation == ("add_out",)
            assert "1 of them are an op's output before its Relu/Clip" in text


def test_aimets_0_6_1_and_1_0_0_exports_import_as_one_plan(tmp_path):
    from mpstudio.data import FeedList
    from mpstudio.study import Study

    with Study.create(tmp_path / "study", make_eltwise_model(), FeedList(eltwise_feeds(4))) as study:
        first = study.import_plan(DATA / "eltwise.encodings")
        second = study.import_plan(DATA / "eltwise.0.6.1.encodings", name=first.plan.name)
        assert second.source == "encodings 0.6.1" and first.source == "encodings 1.0.0"
        assert second.plan.hash == first.plan.hash and second.plan_id == first.plan_id
        assert sorted(second.pinned) == sorted(first.pinned)


@pytest.mark.parametrize("source", SOURCES)
def test_imported_aimet_quantization_computes_what_aimet_computed(source, tmp_path):
    """The plan mpstudio imports from each AIMET export gives AIMET's sim outputs (recorded) sample by sample, to
    one element in a thousand, within one step of the Add's encoding: the rounding of a float bias (AIMET's) against
    ORT's int32 one. With the Add's own encoding left out (as before), 776 of the 4096 elements differed. Both run on
    ORT's own CPU numerics, as AIMET's sim computes (mpstudio's default CPU numerics round a float input as the HTP
    does, which AIMET's sim does not): the QDQ graph simulated in float, with ORT's own rounding."""
    import onnxruntime as ort

    from mpstudio.data import FeedList
    from mpstudio.study import Study

    evaluation = FeedList(eltwise_feeds(8, seed=2))

    def on_orts_cpu(model):
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_quant_qdq", "1")  # no fused integer kernels
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        return np.stack([session.run(["y"], feed)[0] for feed in evaluation.feeds()])
    with np.load(DATA / "eltwise_sim_outputs.npz") as recorded:
        sim = recorded["outputs"]
    assert np.array_equal(on_orts_cpu(DATA / "eltwise_qdq.onnx"), sim)  # AIMET's own QDQ model in ORT is its sim
    with Study.create(tmp_path / "study", make_eltwise_model(), FeedList(eltwise_feeds(4)), evaluation) as study:
        imported = study.import_plan(DATA / source)
        model = study.quantizer.generate(imported.plan)
        pinned = study.quantizer.pinned(imported.plan)
        add_step, step = pinned["add_out"].scale[0], pinned["y"].scale[0]
    ours = on_orts_cpu(model)
    differ = ours != sim
    assert differ.sum() <= sim.size // 1000, f"{differ.sum()} of {sim.size} outputs differ from AIMET's"
    assert np.abs(ours - sim).max() <= add_step + step / 2 + 1e-6  # one step of the Add's, rounded to the output's


def test_imported_aimet_plan_on_htp_is_aimets_qdq_model_on_htp(tmp_path):
    """On the HTP backend (the emulator here: real HTP numerics), the plan imported from AIMET's encodings and
    AIMET's own to_onnx_qdq model give identical outputs, sample by sample. (HTP fuses the Add with the Clip
    after it, so the Add's own quantizer changes nothing there, with or without it in the plan's model; on ORT's
    CPU it does, which test_imported_aimet_quantization_computes_what_aimet_computed covers.)"""
    from mpstudio.data import FeedList
    from mpstudio.loop.inprocess import run_outputs
    from mpstudio.study import Study

    evaluation = FeedList(eltwise_feeds(8, seed=2))
    aimets = np.stack([o["y"] for o in run_outputs(DATA / "eltwise_qdq.onnx", evaluation, backend="htp")])
    with Study.create(tmp_path / "study", make_eltwise_model(), FeedList(eltwise_feeds(4)), evaluation) as study:
        model = study.quantizer.generate(study.import_plan(DATA / "eltwise.encodings").plan)
    ours = np.stack([o["y"] for o in run_outputs(model, evaluation, backend="htp")])
    assert np.array_equal(ours, aimets)


# ---- with aimet-onnx (MPSTUDIO_AIMET_PYTHON) --------------------------------------------------------------------
ROOT = Path(__file__).parent.parent
SIDE = ROOT / "benchmarks" / "aimet_side.py"  # AIMET's side, run in its own interpreter
needs_aimet = pytest.mark.skipif(not os.environ.get("MPSTUDIO_AIMET_PYTHON"), reason=(
    "set MPSTUDIO_AIMET_PYTHON to a Python with aimet-onnx (pip install mpstudio[aimet])"))


def make_small_cnn() -> onnx.ModelProto:
    """x[1,3,16,16] -> Conv+Clip(0,6) -> depthwise Conv+Clip(0,6) -> Conv -> Add(residual) -> GlobalAveragePool ->
    Flatten -> Gemm -> logits[1,10]: the Conv->Clip pairs AIMET quantizes between, a Flatten it gives no quantizer."""
    rng = np.random.default_rng(3)

    def const(name, shape, std):
        return numpy_helper.from_array(rng.normal(0, std, shape).astype(np.float32), name)

    inits = [const("c1.w", (8, 3, 3, 3), 0.3), const("c1.b", (8,), 0.1), const("dw.w", (8, 1, 3, 3), 0.4),
             const("dw.b", (8,), 0.1), const("c2.w", (8, 8, 1, 1), 0.3), const("c2.b", (8,), 0.1),
             const("fc.w", (10, 8), 0.3), const("fc.b", (10,), 0.1),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    nodes = [helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["c1"], name="/c1/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c1", "zero", "six"], ["a1"], name="/c1/Clip"),
             helper.make_node("Conv", ["a1", "dw.w", "dw.b"], ["dw"], name="/dw/Conv", pads=[1, 1, 1, 1], group=8),
             helper.make_node("Clip", ["dw", "zero", "six"], ["a2"], name="/dw/Clip"),
             helper.make_node("Conv", ["a2", "c2.w", "c2.b"], ["c2"], name="/c2/Conv"),
             helper.make_node("Add", ["c2", "a1"], ["res"], name="/res/Add"),
             helper.make_node("GlobalAveragePool", ["res"], ["pool"], name="/pool/GlobalAveragePool"),
             helper.make_node("Flatten", ["pool"], ["flat"], name="/flat/Flatten"),
             helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="/fc/Gemm", transB=1)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])]
    graph = helper.make_graph(nodes, "small_cnn", inputs,
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def cnn_feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(n)]


def run_aimet(*args: str) -> dict:
    run = subprocess.run([os.environ["MPSTUDIO_AIMET_PYTHON"], str(SIDE), *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _save_feeds(feeds, path: Path) -> Path:
    np.savez(path, **{name: np.stack([f[name] for f in feeds]) for name in feeds[0]})
    return path


def _strict_plans(activations: list[str]) -> dict:
    from mpstudio.plan import PrecisionPlan

    return {"a8w8": PrecisionPlan.a8w8(),
            "a8w8-pc+3x16": PrecisionPlan(weight_type="int8", per_channel=True).promote(activations),
            "a16w8-pc": PrecisionPlan(activation_type="uint16", weight_type="int8", per_channel=True)}


@pytest.mark.slow
@needs_aimet
@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
@pytest.mark.parametrize("which", ["a8w8", "mixed", "per-channel-int8"])
def test_aimet_loads_exported_encodings_with_strict_true(which, version, tmp_path):
    from conftest import conv_feeds, make_conv_model
    from mpstudio.data import FeedList
    from mpstudio.export import export_plan
    from mpstudio.model import prepare_model
    from mpstudio.plan import PrecisionPlan
    from mpstudio.quantize import Quantizer

    plan = {"a8w8": PrecisionPlan.a8w8(), "mixed": PrecisionPlan.a8w8().promote(["conv1_out", "relu1_out"]),
            "per-channel-int8": PrecisionPlan(weight_type="int8", per_channel=True).promote(["add_out"])}[which]
    quantizer = Quantizer(prepare_model(make_conv_model()), FeedList(conv_feeds(4)), tmp_path / "q")
    result = export_plan(quantizer, plan, tmp_path, formats=("qnn", "float"), encodings_version=version, name="p")
    loaded = run_aimet("strict", str(result.float_model), str(result.encodings))
    assert loaded["loaded_strictly"] and loaded["left_out"] == [] and loaded["mismatches"] == 0


@pytest.mark.slow
@needs_aimet
@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
def test_aimet_loads_a_cnns_plans_strictly_and_its_sim_computes_the_plans_model(version, tmp_path):
    """A CNN with Conv->Clip pairs and a Flatten: every plan loads with strict=True once the sim is set up
    (`configure_aimet_sim`) and the Flatten (no quantizer in AIMET's sim) is left out (`encodings_for_sim`); AIMET's
    sim holding the file then computes what the plan's model computes in ORT."""
    from mpstudio.data import FeedList
    from mpstudio.export import export_plan
    from mpstudio.runtime import create_session
    from mpstudio.study import Study

    evaluation = cnn_feeds(8, 2)
    feeds = _save_feeds(evaluation, tmp_path / "eval.npz")
    with Study.create(tmp_path / "study", make_small_cnn(), FeedList(cnn_feeds(8, 1)), FeedList(evaluation)) as study:
        for label, plan in _strict_plans(["a2", "c2", "res"]).items():
            result = export_plan(study.quantizer, plan, tmp_path / label, formats=("qnn", "float"),
                                 encodings_version=version, name=label)
            loaded = run_aimet("strict", str(result.float_model), str(result.encodings), "--eval", str(feeds),
                               "--outputs", str(tmp_path / f"{label}.npz"))
            assert loaded["loaded_strictly"] and loaded["left_out"] == ["flat"], (label, loaded)
            model = study.quantizer.generate(plan)
            # The plan's model as ORT computes QDQ as written (AIMET's sim does the same): not the study's CPU
            # numerics, which follow the HTP's accumulator rounding (16-bit sums shifted right by 8 bits).
            session = create_session(model, numerics="basic")
            ours = np.stack([session.run(["logits"], feed)[0] for feed in evaluation])
            with np.load(tmp_path / f"{label}.npz") as data:
                theirs = data["outputs"]
            step = read_quantized_step(model, "logits")
            assert np.abs(ours - theirs).max() <= 2 * step + 1e-6, label  # a float bias against an int32 one


def read_quantized_step(model, name: str) -> float:
    from mpstudio.export import read_quantized_tensors

    return float(read_quantized_tensors(model)[name].encoding.scale[0])


@pytest.mark.slow
@needs_aimet
def test_aimets_own_quantization_of_a_cnn_imports_and_reproduces_its_outputs(tmp_path):
    """AIMET's own a8w8 quantization of the CNN (the depthwise Conv before its Clip gets an encoding of its own), run
    live: the plans imported from its 1.0.0 and 0.6.1 exports and its QDQ model give its sim's outputs."""
    from mpstudio.data import FeedList
    from mpstudio.loop.inprocess import run_outputs
    from mpstudio.study import Study

    evaluation = cnn_feeds(8, 2)
    onnx.save(make_small_cnn(), str(tmp_path / "cnn.onnx"))
    run_aimet("own", str(tmp_path / "cnn.onnx"), "--calibration", str(_save_feeds(cnn_feeds(8, 1), tmp_path / "c.npz")),
              "--eval", str(_save_feeds(evaluation, tmp_path / "e.npz")), "--out", str(tmp_path / "aimet"))
    with np.load(tmp_path / "aimet" / "aimet_sim_outputs.npz") as data:
        sim = data["outputs"]
    with Study.create(tmp_path / "study", make_small_cnn(), FeedList(cnn_feeds(8, 1)), FeedList(evaluation)) as study:
        for source in ("aimet.1.0.0.encodings", "aimet.0.6.1.encodings", "aimet_qdq.onnx"):
            imported = study.import_plan(tmp_path / "aimet" / source)
            assert "dw" in imported.pinned, imported.describe()  # the depthwise Conv before its Clip
            model = study.quantizer.generate(imported.plan)
            ours = np.stack([o["logits"] for o in run_outputs(model, FeedList(evaluation))])
            step = read_quantized_step(model, "logits")
            assert np.abs(ours - sim).max() <= 2 * step + 1e-6, source


@pytest.mark.slow
@needs_aimet
def test_aimet_loads_the_demos_plans_strictly(tmp_path):
    """The built-in demo's exported encodings, both versions, for a8w8, a8w8-pc with three 16-bit tensors and
    a16w8-pc: strict loading after `configure_aimet_sim` and `encodings_for_sim`."""
    pytest.importorskip("rapidocr_onnxruntime")
    from mpstudio.export import export_plan
    from mpstudio.study import Study

    with Study.demo(tmp_path / "demo", calibration_lines=8, evaluation_lines=8) as study:
        for label, plan in _strict_plans(["p2o.Pow.3", "conv2d_189.tmp_0", "p2o.Add.223"]).items():
            for version in ("1.0.0", "0.6.1"):
                result = export_plan(study.quantizer, plan, tmp_path / f"{label}-{version}", formats=("qnn", "float"),
                                     encodings_version=version, name=label)
                loaded = run_aimet("strict", str(result.float_model), str(result.encodings))
                assert loaded["loaded_strictly"] and loaded["mismatches"] == 0, (label, version)
