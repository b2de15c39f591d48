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
    ref = np.concatenate([float_session.run(None, f)[0].ravel() for f in FEEDS])
    errors = {}
    per_channel = {"weight_type": "int8", "per_channel": True}
    plans = (PrecisionPlan.a8w8(), MIXED, PrecisionPlan.a16w8(),
             PrecisionPlan(activation_type="uint8", name="a8w8c", **per_channel),
             PrecisionPlan(activation_type="uint16", name="a16w8c", **per_channel))
    for plan in plans:
        session = create_session(quantizer.generate(plan), "cpu")
        out = np.concatenate([session.run(None, f)[0].ravel() for f in FEEDS])
        errors[plan.name] = float(np.sqrt(np.mean((out - ref) ** 2)))
    # 16-bit activations bring the output nearer float where the weights' own error does not dominate it. With
    # per-tensor uint8 weights it does on this model: the HTP emulator itself puts a8w8 (0.0085) a little nearer
    # float than a16w8 (0.0086), and so do the CPU numerics that follow its 8-bit requantization.
    assert errors["a16w8c"] < errors["a8w8c"], errors
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
    # Two passes: the float model, then the float model carrying the quantized weights.
    assert (len(FEEDS), len(FEEDS), "calibrating") in seen
    assert seen[-1] == (len(FEEDS), len(FEEDS), "calibrating with quantized weights")
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


def test_runs_of_ort_quantizer_take_turns_in_a_process():
    """The patched quantizer holds the process's turn for its whole run: no other thread runs ORT's quantizer
    (patched or not) meanwhile, so callers need no lock of their own."""
    import threading

    from mpstudio.quantize import fast_ort_quantizer, ort_quantizer_turn

    inside, release, order = threading.Event(), threading.Event(), []

    def patched_run():
        with fast_ort_quantizer():
            inside.set()
            release.wait(10)
            order.append("patched run done")

    def other_run():
        inside.wait(10)
        with ort_quantizer_turn():
            order.append("other run")

    threads = [threading.Thread(target=patched_run), threading.Thread(target=other_run)]
    for thread in threads:
        thread.start()
    inside.wait(10)
    threading.Event().wait(0.2)  # room for the other thread to get in, were it not kept out
    order.append("released")
    release.set()
    for thread in threads:
        thread.join(10)
    assert order == ["released", "patched run done", "other run"]


def test_threads_generating_at_once_write_what_one_thread_writes(prepared, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    plans = [MIXED, PrecisionPlan.a16w8(), PrecisionPlan(weight_type="int8", per_channel=True, name="pc"),
             PrecisionPlan.a8w8()]
    alone = Quantizer(prepared, FeedList(FEEDS), tmp_path / "alone")
    expected = [onnx.load(alone.generate(plan)).SerializeToString() for plan in plans]
    shared = [Quantizer(prepared, FeedList(FEEDS), tmp_path / f"shared{i}") for i in range(2)]
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda i: shared[i % 2].generate(plans[i]), range(len(plans))))
    assert [onnx.load(p).SerializeToString() for p in paths] == expected


def test_caches_are_keyed_by_the_toolchain(quantizer, monkeypatch):
    import mpstudio.quantize.versions as versions

    path, key = quantizer.model_path(MIXED), quantizer.calibration_key()
    monkeypatch.setattr(versions, "toolchain", lambda: {"onnxruntime": "9.9.9", "onnx": "0"})
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


# ---- the HTP layout of generated models ------------------------------------------------------------------
def make_layout_model(seed: int = 0) -> onnx.ModelProto:
    """x -> Conv -> Clip(0, 6) -> MaxPool -> Conv -> Relu -> Transpose -> Reshape -> MatMul -> Add(bias) -> y:
    activations HTP fuses into the op before them, data movement, and a MatMul with its bias."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "c1.weight"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "c1.bias"),
        numpy_helper.from_array(rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "c2.weight"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "c2.bias"),
        numpy_helper.from_array(np.array([1, 512], np.int64), "flat_shape"),
        numpy_helper.from_array(rng.normal(0, 0.05, (512, 10)).astype(np.float32), "fc.weight"),
        numpy_helper.from_array(rng.normal(0, 0.1, (10,)).astype(np.float32), "fc.bias"),
        numpy_helper.from_array(np.array(0.0, np.float32), "clip_min"),
        numpy_helper.from_array(np.array(6.0, np.float32), "clip_max"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["c1_out"], name="/c1/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1_out", "clip_min", "clip_max"], ["clip_out"], name="/c1/Clip"),
        helper.make_node("MaxPool", ["clip_out"], ["pool_out"], name="/pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["pool_out", "c2.weight", "c2.bias"], ["c2_out"], name="/c2/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2_out"], ["relu_out"], name="/c2/Relu"),
        helper.make_node("Transpose", ["relu_out"], ["nhwc"], name="/nhwc", perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["nhwc", "flat_shape"], ["flat"], name="/flat"),
        helper.make_node("MatMul", ["flat", "fc.weight"], ["fc_mm"], name="/fc/MatMul"),
        helper.make_node("Add", ["fc_mm", "fc.bias"], ["y"], name="/fc/Add"),
    ]
    graph = helper.make_graph(nodes, "layout_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


PER_CHANNEL = PrecisionPlan(weight_type="int8", per_channel=True, name="a8w8 per-channel int8")
LAYOUT_PLANS = {
    "a8w8": PrecisionPlan.a8w8(),
    "per-channel": PER_CHANNEL,
    "per-channel-mixed": PER_CHANNEL.promote(["relu_out", "pool_out"], name="mixed"),
}


@pytest.fixture
def layout_quantizer(tmp_path):
    return Quantizer(prepare_model(make_layout_model()), FeedList(conv_feeds(8)), tmp_path / "cache")


@pytest.mark.parametrize("which", list(LAYOUT_PLANS))
def test_generated_models_have_the_htp_layout(layout_quantizer, which):
    from mpstudio import qdq

    plan = LAYOUT_PLANS[which]
    assert {n.op_type for n in layout_quantizer.prepared.model.graph.node} >= {"Gemm", "Clip", "Relu"}
    path = layout_quantizer.generate(plan)
    model = qdq.load(path)
    ops = [n.op_type for n in model.graph.node]
    # Supergroups: the Clip and Relu are gone (each Conv writes its activation's output and encoding) and the
    # MatMul carries its bias (a Gemm): no Q/DQ between an op and what HTP fuses into it.
    assert "Clip" not in ops and "Relu" not in ops and "MatMul" not in ops and "Add" not in ops
    producers = {o: n for n in model.graph.node for o in n.output}
    for name in ("clip_out", "relu_out"):
        assert producers[name].op_type == "Conv"
    read = qdq.read(model)
    acts = read.activations()
    assert acts["clip_out"].encoding.zero == 0 and acts["relu_out"].encoding.zero == 0
    assert "c1_out" not in acts and "c2_out" not in acts
    # Data movement passes on the parameters its input reaches it with (through a convert in a mixed plan).
    def received(tensor):
        return (acts[tensor].converts or (acts[tensor].encoding,))[-1]

    for output, source in (("pool_out", "clip_out"), ("nhwc", "relu_out"), ("flat", "nhwc")):
        assert acts[output].encoding == received(source), output
    params = read.params()
    if plan.per_channel:
        # Signed symmetric per-channel weights: one scale per output channel, every zero point 0.
        for weight, axis, channels in (("c1.weight", 0, 8), ("c2.weight", 0, 8)):
            encoding = params[weight].encoding
            assert (encoding.dtype, encoding.axis, len(encoding.scale)) == ("int8", axis, channels)
            assert set(encoding.zero_point) == {0}
    if plan.overrides:
        # The mixed plan keeps its 16-bit tensors; ORT converts at the boundaries.
        assert acts["relu_out"].encoding.dtype == acts["pool_out"].encoding.dtype == "uint16"
        assert acts["nhwc"].encoding.dtype == "uint16"
        assert acts["clip_out"].encoding.dtype == "uint8"
        assert [c.dtype for c in acts["clip_out"].converts] == ["uint16"]
        assert [c.dtype for c in acts["nhwc"].converts] == ["uint8"]
    else:
        assert {t.encoding.dtype for t in acts.values()} == {"uint8"}
    session = create_session(path, "cpu")
    assert session.run(None, conv_feeds(1)[0])[0].shape == (1, 10)


def test_activation_ranges_see_the_quantized_weights(layout_quantizer):
    """The Relu output's 8-bit range is the one the model's own (quantized) weights produce on the calibration
    data, not the float weights' one."""
    from mpstudio import qdq

    float_model = layout_quantizer.prepared.model
    feeds = conv_feeds(8)

    def relu_max(model):
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info("relu_out"))
        session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        return max(float(session.run(["relu_out"], f)[0].max()) for f in feeds)

    for plan in (PrecisionPlan.a8w8(), PER_CHANNEL):
        read = qdq.read(layout_quantizer.generate(plan))
        carried = onnx.ModelProto()
        carried.CopyFrom(float_model)
        for init in carried.graph.initializer:
            if init.name in ("c1.weight", "c2.weight"):
                encoding = read.params()[init.name].encoding
                codes = numpy_helper.to_array(read.initializers[init.name + "_quantized"]).astype(np.int64)
                shape = (-1, 1, 1, 1) if encoding.axis == 0 else ()
                scale = np.asarray(encoding.scale, np.float32).reshape(shape)
                zero = np.asarray(encoding.zero_point).reshape(shape)
                init.CopyFrom(numpy_helper.from_array(((codes - zero) * scale).astype(np.float32), init.name))
        step = read.activations()["relu_out"].encoding.step
        quantized_max, float_max = relu_max(carried), relu_max(float_model)
        assert abs(quantized_max - float_max) > 1e-3 * float_max, "the weights' quantization changes nothing here"
        assert step * 255 == pytest.approx(quantized_max, rel=1e-5), plan.summary()


def test_calibrations_are_keyed_by_the_weight_form(layout_quantizer):
    """A plan's activation types and overrides share its base's ranges; another weight form gets its own."""
    q = layout_quantizer
    assert q.calibration_key(LAYOUT_PLANS["per-channel-mixed"]) == q.calibration_key(PER_CHANNEL)
    assert q.calibration_key(PrecisionPlan.a16w8()) == q.calibration_key(PrecisionPlan.a8w8()) == q.calibration_key()
    assert q.calibration_key(PER_CHANNEL) != q.calibration_key()
    assert q.calibrate(plan=PER_CHANNEL).path != q.calibrate().path


@pytest.mark.htp
@requires_qnn
def test_layout_model_runs_on_htp(layout_quantizer):
    for plan in LAYOUT_PLANS.values():
        session = create_session(layout_quantizer.generate(plan), "htp", {"htp_arch": "75"})
        assert session.get_providers()[0] == "QNNExecutionProvider"
        cpu = create_session(layout_quantizer.generate(plan), "cpu")
        feed = conv_feeds(1)[0]
        np.testing.assert_allclose(session.run(None, feed)[0], cpu.run(None, feed)[0], atol=0.1)


def test_calibration_files_are_the_same_bytes_in_every_process(tmp_path):
    """ORT's calibrator lists tensors in set order (it changes with the process's hash seed); mpstudio's range
    files and generated models do not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from conftest import conv_feeds, make_conv_model\n"
        "from mpstudio.data import FeedList\n"
        "from mpstudio.model import prepare_model\n"
        "from mpstudio.plan import PrecisionPlan\n"
        "from mpstudio.quantize import Quantizer\n"
        "q = Quantizer(prepare_model(make_conv_model()), FeedList(conv_feeds(8)), sys.argv[1])\n"
        "q.generate(PrecisionPlan(weight_type='int8', per_channel=True).promote(['add_out']))\n"
    )
    tests = str(Path(__file__).parent)
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", script, str(tmp_path / seed), tests], env=env, check=True, timeout=300)
    files = {seed: sorted((tmp_path / seed).glob("calibration/*.json")) for seed in ("1", "2")}
    assert [f.name for f in files["1"]] == [f.name for f in files["2"]] and len(files["1"]) == 4
    for a, b in zip(files["1"], files["2"]):
        if not a.name.endswith(".meta.json"):  # the meta file holds the wall time
            assert a.read_bytes() == b.read_bytes(), a.name
    models = {seed: sorted((tmp_path / seed).glob("models/*.onnx")) for seed in ("1", "2")}
    assert [m.read_bytes() for m in models["1"]] == [m.read_bytes() for m in models["2"]]
