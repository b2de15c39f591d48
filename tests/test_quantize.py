"""Calibrate once, regenerate any plan: equal to ORT's own path, cached, valid on CPU and on the HTP emulator."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from conftest import conv_feeds, make_conv_model, requires_qnn
from mpstudio import MpstudioError
from mpstudio.data import CallableSource, FeedList
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan, TensorOverride
from mpstudio.quantize import GENERATOR_VERSION, Quantizer, ort_patch_applies, quantize_plain, toolchain_key
from mpstudio.runtime import create_session

FEEDS = conv_feeds(8)
MIXED = PrecisionPlan.a8w8().promote(["conv1_out", "relu1_out"], name="mixed")


@pytest.fixture
def prepared():
    return prepare_model(make_conv_model())


@pytest.fixture
def quantizer(prepared, tmp_path):
    return Quantizer(prepared, FeedList(FEEDS), tmp_path / "cache")


def counting_source(feeds):
    calls = []

    def sample(i):
        calls.append(i)
        return feeds[i]

    return CallableSource(sample, len(feeds)), calls


def initializers(path):
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def quant_types(path):
    """Element type of every QuantizeLinear output (its zero point's type)."""
    model = onnx.load(str(path))
    zps = {i.name: i.data_type for i in model.graph.initializer}
    return {n.input[0]: zps.get(n.input[2]) for n in model.graph.node if n.op_type == "QuantizeLinear"}


def test_calibration_runs_once_and_is_cached_on_disk(prepared, tmp_path):
    source, calls = counting_source(FEEDS)
    first = Quantizer(prepared, source, tmp_path / "cache")
    cache = first.calibrate()
    assert cache.samples == len(FEEDS) and cache.path.exists()
    read_while_calibrating = len(calls)
    calls.clear()
    second = Quantizer(prepared, source, tmp_path / "cache")
    again = second.calibrate()
    # Only the fingerprint reads the data now; no model runs over it.
    assert len(calls) == len(FEEDS) < read_while_calibrating
    assert again.path == cache.path and again.seconds == cache.seconds
    second.generate(MIXED)


def test_different_data_or_method_gets_its_own_cache(prepared, tmp_path):
    a = Quantizer(prepared, FeedList(FEEDS), tmp_path / "c").calibrate()
    b = Quantizer(prepared, FeedList(conv_feeds(8, seed=9)), tmp_path / "c").calibrate()
    c = Quantizer(prepared, FeedList(FEEDS), tmp_path / "c", method="percentile").calibrate()
    assert len({a.key, b.key, c.key}) == 3


@pytest.mark.parametrize(
    "plan",
    [
        PrecisionPlan.a8w8(),
        PrecisionPlan.a16w8(),
        MIXED,
        PrecisionPlan(weight_type="int8", per_channel=True).promote(["add_out"]),
        PrecisionPlan.a8w8().with_overrides({"conv2.weight": TensorOverride("int8", per_channel=True)}),
    ],
    ids=["a8w8", "a16w8", "mixed", "a8w8-perchannel-mixed", "weight-override"],
)
def test_regenerated_model_equals_orts_own_path(quantizer, prepared, tmp_path, plan):
    """Same QDQ parameters and graph as get_qnn_qdq_config + quantize recalibrating from scratch."""
    fast = quantizer.generate(plan)
    plain = quantize_plain(quantizer.float_path, FeedList(FEEDS), plan, prepared.graph, tmp_path / "plain.onnx")
    a, b = onnx.load(str(fast)), onnx.load(str(plain))
    assert [(n.op_type, list(n.input), list(n.output)) for n in a.graph.node] == \
           [(n.op_type, list(n.input), list(n.output)) for n in b.graph.node]
    ia, ib = initializers(fast), initializers(plain)
    assert ia.keys() == ib.keys()
    for name in ia:
        np.testing.assert_array_equal(ia[name], ib[name], err_msg=name)


def test_mixed_plan_has_16_bit_tensors_and_converts(quantizer):
    path = quantizer.generate(MIXED)
    types = quant_types(path)
    # The Relu folds into the Conv's quantized output, which carries the relu1_out name.
    assert types["relu1_out"] == onnx.TensorProto.UINT16
    assert types["y_QuantizeLinear_Input"] == onnx.TensorProto.UINT8
    # get_qnn_qdq_config converts at the 8/16-bit boundaries (a Q/DQ pair of each type on one tensor).
    model = onnx.load(str(path))
    converts = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and "_convert" in n.output[0]]
    assert len(converts) >= 2
    assert {types[n.input[0]] for n in converts} == {onnx.TensorProto.UINT8, onnx.TensorProto.UINT16}


def test_generated_models_run_on_cpu_close_to_float(quantizer, prepared):
    float_session = ort.InferenceSession(prepared.model.SerializeToString(), providers=["CPUExecutionProvider"])
    errors = {}
    for plan in (PrecisionPlan.a8w8(), MIXED, PrecisionPlan.a16w8()):
        session = create_session(quantizer.generate(plan), "cpu")
        ref = np.concatenate([float_session.run(None, f)[0].ravel() for f in FEEDS])
        out = np.concatenate([session.run(None, f)[0].ravel() for f in FEEDS])
        errors[plan.name] = float(np.sqrt(np.mean((out - ref) ** 2)))
    assert errors["a16w8"] < errors["a8w8"]
    assert all(e < 0.1 for e in errors.values()), errors


def test_models_are_cached_by_plan_hash(quantizer):
    first = quantizer.generate(MIXED)
    stamp = first.stat().st_mtime_ns
    again = quantizer.generate(PrecisionPlan.a8w8().promote(["relu1_out", "conv1_out"], name="same content"))
    assert again == first and again.stat().st_mtime_ns == stamp
    assert first.name == f"g{GENERATOR_VERSION}-{quantizer.calibration_key()}-{MIXED.hash}.onnx"
    assert PrecisionPlan.load(first.with_suffix(".plan.json")) == MIXED


def test_a_cache_folder_shared_by_two_models_keeps_their_qdq_models_apart(prepared, tmp_path):
    other = prepare_model(make_conv_model(seed=7))
    assert other.sha256 != prepared.sha256
    first = Quantizer(prepared, FeedList(conv_feeds(4)), tmp_path / "shared").generate(PrecisionPlan.a8w8())
    second = Quantizer(other, FeedList(conv_feeds(4)), tmp_path / "shared").generate(PrecisionPlan.a8w8())
    assert first != second and first.read_bytes() != second.read_bytes()


def test_unknown_tensor_fails_before_any_work(quantizer):
    with pytest.raises(MpstudioError, match="did you mean 'conv1_out'"):
        quantizer.generate(PrecisionPlan.a8w8().promote(["conv1_oot"]))
    assert not (quantizer.cache_dir / "calibration").exists()


def test_mismatched_calibration_data_is_a_clear_error(prepared, tmp_path):
    wrong = FeedList([{"x": np.zeros((1, 3, 8, 8), np.float32)}])
    with pytest.raises(MpstudioError, match=r"input 'x' has shape \[1, 3, 8, 8\]"):
        Quantizer(prepared, wrong, tmp_path / "c").generate(PrecisionPlan.a8w8())


def test_calibration_progress_and_cancel(prepared, tmp_path):
    import threading

    from mpstudio.data import Cancelled

    seen = []
    Quantizer(prepared, FeedList(FEEDS), tmp_path / "a").calibrate(progress=lambda d, t, m: seen.append((d, t, m)))
    assert seen[-1] == (len(FEEDS), len(FEEDS), "calibrating")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        Quantizer(prepared, FeedList(FEEDS), tmp_path / "b").calibrate(cancel=cancel)


# ---- the demo model on the HTP emulator ---------------------------------------------------------------
def demo_mixed_plan(demo):
    """a8w8 with the first 30 activations (the stem) promoted to 16 bits."""
    return PrecisionPlan.a8w8().promote(demo.model.graph.activations()[:30], name="demo-mixed")


@pytest.mark.htp
@requires_qnn
@pytest.mark.parametrize("which", ["a8w8", "a16w8", "mixed"])
def test_demo_plans_run_on_htp_without_cpu_fallback(demo, demo_quantizer, which):
    plan = {"a8w8": PrecisionPlan.a8w8(), "a16w8": PrecisionPlan.a16w8(), "mixed": demo_mixed_plan(demo)}[which]
    path = demo_quantizer.generate(plan)
    htp = create_session(path, "htp", {"htp_arch": "75"})  # disable_cpu_ep_fallback is set by create_session
    assert htp.get_providers()[0] == "QNNExecutionProvider"
    cpu = create_session(path, "cpu")
    feed = demo.evaluation.sample(0)
    a, b = htp.run(None, feed)[0], cpu.run(None, feed)[0]
    assert a.shape == b.shape == (1, 40, 6625)
    # HTP numerics are not bit-identical to ORT's CPU QDQ run, but they read the same characters.
    assert (a.argmax(-1) == b.argmax(-1)).mean() > 0.9


def test_demo_regeneration_equals_orts_own_path(demo, demo_quantizer, tmp_path):
    """On a real model (404 nodes, shared constants, converts), the fast path changes nothing."""
    plan = demo_mixed_plan(demo).promote(["p2o.Mul.3"])
    fast = demo_quantizer.generate(plan)
    plain = quantize_plain(demo_quantizer.float_path, demo.calibration, plan, demo.model.graph, tmp_path / "p.onnx")
    ia, ib = initializers(fast), initializers(plain)
    assert ia.keys() == ib.keys()
    for name in ia:
        if ia[name].dtype.kind == "f":
            # Ranges merged chunk by chunk may differ from one pass over all samples in the last float bit.
            np.testing.assert_allclose(ia[name], ib[name], rtol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(ia[name], ib[name], err_msg=name)
    assert [n.op_type for n in onnx.load(str(fast)).graph.node] == [n.op_type for n in onnx.load(str(plain)).graph.node]


def test_the_quantizer_patch_writes_what_ort_writes(quantizer, tmp_path, monkeypatch):
    """The indexed lookups change speed, not output: the same plan from the same cached ranges, generated with
    and without the patch, is the same model."""
    assert ort_patch_applies(), "the installed onnxruntime is not one the patch is checked against"
    plans = [MIXED, PrecisionPlan.a16w8(), PrecisionPlan(weight_type="int8", per_channel=True, name="pc")]
    patched = [onnx.load(quantizer.generate(plan)) for plan in plans]
    monkeypatch.setenv("MPSTUDIO_ORT_PATCH", "0")
    assert not ort_patch_applies()
    plain = Quantizer(quantizer.prepared, quantizer.calibration, quantizer.cache_dir)
    for plan, model in zip(plans, patched):
        path = plain.model_path(plan)
        path.unlink()  # regenerate from the same calibration cache, unpatched
        again = onnx.load(plain.generate(plan))
        assert again.graph.SerializeToString() == model.graph.SerializeToString(), plan.summary()


def test_caches_are_keyed_by_the_toolchain(quantizer, monkeypatch):
    import mpstudio.quantize as q

    path, key = quantizer.model_path(MIXED), quantizer.calibration_key()
    monkeypatch.setattr(q, "toolchain", lambda: {"onnxruntime": "9.9.9", "onnx": "0"})
    assert quantizer.model_path(MIXED) != path and quantizer.calibration_key() != key
    assert not ort_patch_applies("9.9.9") and ort_patch_applies("1.32.0")


@requires_qnn
def test_signed_weights_keep_a_layernorm_scale_unsigned_so_htp_takes_the_node(tmp_path):
    from transformer_models import encoder_feeds, make_encoder

    from mpstudio import qdq

    prepared = prepare_model(make_encoder())
    scales = [n.input[1] for n in prepared.model.graph.node if n.op_type == "LayerNormalization"]
    assert scales
    quantizer = Quantizer(prepared, FeedList(encoder_feeds(4)), tmp_path)
    plan = PrecisionPlan(weight_type="int8", per_channel=True, name="a8w8-pc")
    path = quantizer.generate(plan)
    params = qdq.read(path).params()
    assert all(params[s].encoding.dtype == "uint8" for s in scales)
    assert any(q.encoding.dtype == "int8" for t, q in params.items() if t not in scales)
    create_session(path, "htp", {"htp_arch": "75"})  # raises when a node falls back to the CPU
    # A plan's own override of a scale stays the plan's.
    own = quantizer.generate(plan.with_overrides({scales[0]: "uint16"}))
    assert qdq.read(own).params()[scales[0]].encoding.dtype == "uint16"
