"""The QNN HTP support checker, on tiny models, and against a real QNN HTP session."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mpstudio import qnn_support
from mpstudio.errors import MpstudioError
from mpstudio.qnn_support import (
    FALLBACK,
    SUPPORTED_OPS,
    WARNING,
    SupportIssue,
    check_qnn_support,
    summarize,
)

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset=21, extra_domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in extra_domains]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def conv_relu_model(shape=(1, 3, 8, 8)):
    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    return _model(nodes, [_vi("x", F, list(shape))], [_vi("y", F, None)], [weight])


def loop_model():
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
        ],
        "body",
        [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("v_in", F, [1, 4])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("v_out", F, [1, 4])],
    )
    inits = [
        numpy_helper.from_array(np.array(3, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "cond"),
    ]
    node = helper.make_node("Loop", ["trips", "cond", "x"], ["y"], name="my_loop", body=body)
    return _model([node], [_vi("x", F, [1, 4])], [_vi("y", F, [1, 4])], inits)


def nms_model():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["selected"])  # no name on purpose
    return _model(
        [node],
        [_vi("boxes", F, [1, 10, 4]), _vi("scores", F, [1, 1, 10])],
        [_vi("selected", TensorProto.INT64, None)],
    )


def dynamic_batch_model():
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", F, ["N", 4, 8, 8])],
                  [_vi("y", F, None)])


def float64_model():
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu64")], [_vi("x", TensorProto.DOUBLE, [1, 4])],
                  [_vi("y", TensorProto.DOUBLE, None)])


def lp_norm_model(p):
    node = helper.make_node("LpNormalization", ["x"], ["y"], name="lpnorm", p=p, axis=1)
    return _model([node], [_vi("x", F, [1, 4, 8, 8])], [_vi("y", F, None)])


_NP = {TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16, TensorProto.INT8: np.int8,
       TensorProto.INT16: np.int16}


def _qdq(src, dst, qtype, tag):
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), f"s_{tag}"),
             numpy_helper.from_array(np.array(0, _NP[qtype]), f"z_{tag}")]
    nodes = [helper.make_node("QuantizeLinear", [src, f"s_{tag}", f"z_{tag}"], [f"q_{tag}"]),
             helper.make_node("DequantizeLinear", [f"q_{tag}", f"s_{tag}", f"z_{tag}"], [dst])]
    return nodes, inits


def _weight(name, shape, qtype):
    inits = [numpy_helper.from_array(np.ones(shape, _NP[qtype]), f"{name}_q"),
             numpy_helper.from_array(np.array(0.01, np.float32), f"{name}_s"),
             numpy_helper.from_array(np.array(0, _NP[qtype]), f"{name}_z")]
    node = helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [name])
    return [node], inits


def qdq_model(op, activation_type, weight_type=TensorProto.UINT8):
    """x -> Q/DQ -> op(x, w) -> Q/DQ -> y, with activations and the weight in the given types."""
    if op == "Conv":
        x_shape, w_shape = [1, 4, 8, 8], (2, 4, 3, 3)
    else:
        x_shape, w_shape = [1, 8], (8, 8)
    n_in, i_in = _qdq("x", "xd", activation_type, "in")
    n_w, i_w = _weight("w", w_shape, weight_type)
    n_out, i_out = _qdq("o", "y", activation_type, "out")
    node = helper.make_node(op, ["xd", "w"], ["o"], name=f"q{op.lower()}")
    return _model(n_in + n_w + [node] + n_out, [_vi("x", F, x_shape)], [_vi("y", F, None)], i_in + i_w + i_out)


def _only(issues, severity=FALLBACK):
    assert len(issues) == 1, issues
    assert issues[0].severity == severity
    return issues[0]


def test_table_is_the_documented_list():
    table = qnn_support.SUPPORTED_OPERATORS
    keys = [(op.domain, op.op_type) for op in table]
    assert len(keys) == len(set(keys)), "an operator is listed twice"
    # Every entry is a real operator of its domain (a typo would silently mark a real op unsupported).
    unknown = [k for k in keys if not onnx.defs.has(k[1], "" if k[0] == "ai.onnx" else k[0])
               and k[0] != "com.microsoft"]
    assert unknown == []
    assert {"Conv", "Relu", "MatMul", "PRelu", "com.microsoft:Gelu"} <= SUPPORTED_OPS
    assert not {"Loop", "If", "NonMaxSuppression", "Erf"} & SUPPORTED_OPS
    assert qnn_support.operator_notes("LpNormalization") == "p == 2"
    assert qnn_support.operator_notes("QuantizeLinear", "com.microsoft").startswith("Provides 16-bit")
    assert qnn_support.is_supported("Gelu", "com.microsoft")
    assert not qnn_support.is_supported("FastGelu", "com.microsoft")


def test_supported_conv_relu_has_no_issue():
    issues = check_qnn_support(conv_relu_model())
    assert issues == []
    assert "no issues" in summarize(issues)


def test_loop_is_reported_by_name():
    issue = _only(check_qnn_support(loop_model()))
    assert issue == SupportIssue("my_loop", "Loop", issue.reason, FALLBACK)
    assert issue.reason.startswith(qnn_support.UNSUPPORTED_OP) and "control flow" in issue.reason


def test_unnamed_nms_is_described_by_op_and_output():
    issue = _only(check_qnn_support(nms_model()))
    assert issue.node == "NonMaxSuppression -> selected"
    assert issue.op_type == "NonMaxSuppression"
    assert "not in the supported-operator list" in issue.reason


def test_dynamic_input_shape_is_reported():
    issue = _only(check_qnn_support(dynamic_batch_model()))
    assert issue.node == "relu"
    assert issue.reason.startswith(qnn_support.DYNAMIC_SHAPE) and "'N'" in issue.reason


def test_float64_tensor_is_reported():
    issue = _only(check_qnn_support(float64_model()))
    assert issue.node == "relu64"
    assert issue.reason.startswith(qnn_support.UNSUPPORTED_TYPE) and "float64" in issue.reason


def test_constant_nodes_and_listed_contrib_ops_pass():
    const = helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones((1, 4, 8, 8), np.float32)))
    gelu = helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft", name="ms_gelu")
    add = helper.make_node("Add", ["g", "k"], ["y"], name="add")
    model = _model([const, gelu, add], [_vi("x", F, [1, 4, 8, 8])], [_vi("y", F, [1, 4, 8, 8])],
                   extra_domains=["com.microsoft"])
    # ONNX cannot infer the contrib op's output shape; it is static because its input is.
    assert check_qnn_support(model) == []


def test_unlisted_contrib_op_falls_back():
    node = helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")
    model = _model([node], [_vi("x", F, [1, 4])], [_vi("y", F, [1, 4])], extra_domains=["com.microsoft"])
    issue = _only(check_qnn_support(model))
    assert issue.node == "FastGelu -> y" and "com.microsoft:FastGelu" in issue.reason


def test_unlisted_but_accepted_op_is_a_warning():
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "s")
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="flat")], [_vi("x", F, [1, 4, 8, 8])],
                   [_vi("y", F, None)], [shape])
    assert _only(check_qnn_support(model), WARNING).reason.startswith(qnn_support.UNLISTED_OP)


def test_lp_normalization_needs_p2():
    assert check_qnn_support(lp_norm_model(2)) == []
    assert "p=1" in _only(check_qnn_support(lp_norm_model(1))).reason


def test_gather_negative_constant_indices_warn():
    indices = numpy_helper.from_array(np.array([-1, 0], np.int64), "i")
    model = _model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1, name="gather")],
                   [_vi("x", F, [1, 4, 8])], [_vi("y", F, None)], [indices])
    assert "negative" in _only(check_qnn_support(model), WARNING).reason


def test_signed_int16_activations_fall_back_but_uint16_pass():
    issue = _only(check_qnn_support(qdq_model("Conv", TensorProto.INT16)))
    assert issue.node == "qconv" and issue.reason.startswith(qnn_support.INT16_ACTIVATION)
    assert check_qnn_support(qdq_model("Conv", TensorProto.UINT16)) == []


def test_matmul_type_pairs():
    assert check_qnn_support(qdq_model("MatMul", TensorProto.UINT16, TensorProto.UINT8)) == []
    issue = _only(check_qnn_support(qdq_model("MatMul", TensorProto.UINT16, TensorProto.UINT16)), WARNING)
    assert "(uint16, uint16)" in issue.reason


def test_summary_groups_by_reason():
    issues = check_qnn_support(nms_model()) + check_qnn_support(loop_model()) + check_qnn_support(float64_model())
    text = summarize(issues)
    assert "3 node(s) would fall back to CPU" in text
    assert f"fallback - {qnn_support.UNSUPPORTED_OP} (2):" in text
    assert f"fallback - {qnn_support.UNSUPPORTED_TYPE} (1):" in text
    assert "my_loop [Loop]" in text and "NonMaxSuppression -> selected [NonMaxSuppression]" in text


# --- Against a real QNN HTP session (the x86_64 emulator), CPU fallback disabled --------------------------

def _htp_available() -> bool:
    from mpstudio.runtime import qnn_library_path

    return qnn_library_path() is not None


htp = pytest.mark.skipif(not _htp_available(), reason="onnxruntime-qnn is not installed here")

FLAGGED = {
    "loop": loop_model,
    "nms": nms_model,
    "dynamic": dynamic_batch_model,
    "float64": float64_model,
    "lpnorm_p1": lambda: lp_norm_model(1),
    "int16_conv": lambda: qdq_model("Conv", TensorProto.INT16),
}
PASSING = {
    "conv_relu": conv_relu_model,
    "qdq_u16_conv": lambda: qdq_model("Conv", TensorProto.UINT16),
    "qdq_u16u16_matmul_warning": lambda: qdq_model("MatMul", TensorProto.UINT16, TensorProto.UINT16),
}


@pytest.fixture
def in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # QNN may leave trace files in the working directory


@htp
@pytest.mark.htp
@pytest.mark.parametrize("case", sorted(FLAGGED))
def test_flagged_model_is_rejected_on_htp(case, in_tmp_dir):
    from mpstudio.runtime import create_session

    model = FLAGGED[case]()
    assert any(i.severity == FALLBACK for i in check_qnn_support(model))
    with pytest.raises(MpstudioError):
        create_session(model.SerializeToString(), "htp")


@htp
@pytest.mark.htp
@pytest.mark.parametrize("case", sorted(PASSING))
def test_passing_model_runs_on_htp(case, in_tmp_dir):
    from mpstudio.runtime import QNN_PROVIDER, create_session

    model = PASSING[case]()
    assert all(i.severity == WARNING for i in check_qnn_support(model))
    session = create_session(model.SerializeToString(), "htp")
    assert QNN_PROVIDER in session.get_providers()
    if case == "conv_relu":
        x = np.random.default_rng(1).normal(size=(1, 3, 8, 8)).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        assert y.shape == (1, 4, 8, 8) and (y >= 0).all()


# --- Probing what the documentation does not settle (mpstudio.qnn_probe) -----------------------------------

def gathernd_mask_model() -> onnx.ModelProto:
    """The exporter pattern QNN HTP rejects: Cast(float mask -> bool) -> GatherND(int64 indices [4, 2]) -> Cast
    -> Reshape -> Mul with the activations."""
    nodes = [helper.make_node("Cast", ["mask"], ["mask_bool"], to=TensorProto.BOOL, name="cast_bool"),
             helper.make_node("GatherND", ["mask_bool", "idx"], ["picked"], name="gathernd"),
             helper.make_node("Cast", ["picked"], ["picked_f"], to=TensorProto.FLOAT, name="cast_float"),
             helper.make_node("Reshape", ["picked_f", "shape"], ["row"], name="reshape"),
             helper.make_node("Mul", ["x", "row"], ["y"], name="mul")]
    inits = [numpy_helper.from_array(np.array([[0, 1], [1, 2], [2, 3], [3, 0]], np.int64), "idx"),
             numpy_helper.from_array(np.array([1, 4], np.int64), "shape")]
    return _model(nodes, [_vi("mask", F, [4, 8]), _vi("x", F, [3, 4])], [_vi("y", F, [3, 4])], inits)


def gathernd_feeds(n: int) -> list[dict]:
    rng = np.random.default_rng(5)
    return [{"mask": (rng.random((4, 8)) > 0.3).astype(np.float32), "x": rng.normal(0, 1, (3, 4)).astype(np.float32)}
            for _ in range(n)]


@pytest.fixture
def probe_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MPSTUDIO_CACHE_DIR", str(tmp_path / "cache"))  # every probe really runs
    return tmp_path / "cache" / "qnn-probe"


def test_unprobed_nodes_are_reported_unverified(probe_cache):
    from mpstudio.model import prepare_model

    prepared = prepare_model(gathernd_mask_model(), verify=False)
    assert prepared.qnn_ready  # nothing is called a fallback on the documentation's word alone
    reasons = {i.node: i.reason for i in prepared.support_issues}
    assert reasons["gathernd"].startswith("unverified: ") and reasons["reshape"].startswith("unverified: ")
    assert "unverified" in prepared.report() and not probe_cache.exists()


def test_probe_cache_is_keyed_by_the_onnxruntime_qnn_version():
    from mpstudio.qnn_probe import Toolchain, node_probes

    model = onnx.shape_inference.infer_shapes(gathernd_mask_model())
    node = next(n for n in model.graph.node if n.op_type == "GatherND")
    keys = {version: [p.key for p in node_probes(model, node, Toolchain("1.32.0", version, "75"))]
            for version in ("2.7.0", "2.8.0")}
    assert len(keys["2.7.0"]) == 1 and keys["2.7.0"] != keys["2.8.0"]  # bool data: one probe, the node as it is
    assert node_probes(model, node, Toolchain("1.32.0", "2.7.0", "79"))[0].key not in keys["2.7.0"]


@htp
@pytest.mark.htp
def test_gathernd_on_a_bool_mask_is_probed_and_falls_back_with_qnns_reason(probe_cache):
    from mpstudio.model import prepare_model
    from mpstudio.qnn_probe import REJECTED, Toolchain, store_verdict, Verdict, node_probes

    prepared = prepare_model(gathernd_mask_model())
    assert prepared.fallback_nodes == ("gathernd",)
    issue = next(i for i in prepared.support_issues if i.node == "gathernd")
    assert issue.reason.startswith(REJECTED) and "3110" in issue.reason and "GatherNd" in issue.reason
    reshape = next(i for i in prepared.support_issues if i.node == "reshape")
    assert reshape.severity == qnn_support.VERIFIED and "8-bit, 16-bit" in reshape.reason
    assert "1 node(s) would fall back to CPU" in prepared.report()
    cached = sorted(probe_cache.glob("*.json"))
    assert len(cached) == 3  # GatherND as it is; Reshape at 8 and 16 bit

    # The next prepare reads the verdicts; one cached for another onnxruntime-qnn is not used.
    model = onnx.shape_inference.infer_shapes(prepare_model(gathernd_mask_model(), verify=False).model)
    node = next(n for n in model.graph.node if n.op_type == "GatherND")
    installed = Toolchain.installed()
    for toolchain, words in ((installed, "cached words"), (Toolchain(installed.onnxruntime, "0.0.1", "75"), "old")):
        store_verdict(node_probes(model, node, toolchain)[0], Verdict(False, words), toolchain)
    again = next(i for i in prepare_model(gathernd_mask_model()).support_issues if i.node == "gathernd")
    assert again.reason.endswith("cached words")


@htp
@pytest.mark.htp
def test_a_study_refuses_the_probed_fallback_and_evaluates_it_with_allow_fallback(tmp_path, probe_cache):
    from mpstudio.data import FeedList
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study

    with pytest.raises(MpstudioError) as refused:
        Study.create(tmp_path / "refused", gathernd_mask_model(), FeedList(gathernd_feeds(4)))
    assert "gathernd [GatherND]" in str(refused.value) and "3110" in str(refused.value)
    assert "--allow-fallback" in str(refused.value)

    study = Study.create(tmp_path / "s", gathernd_mask_model(), FeedList(gathernd_feeds(4)), allow_fallback=True)
    assert study.config["cpu_fallback_nodes"] == ["gathernd"] and study.cpu_fallback_nodes == ("gathernd",)
    htp_result = study.evaluate(PrecisionPlan.a8w8(), "htp")
    assert htp_result.accuracy_source.endswith(" + 1 nodes on CPU")
    assert htp_result.snr_db > 20
    study.close()


def lstm_model() -> onnx.ModelProto:
    """One LSTM step, as a voice-activity detector's decoder runs it: the QNN EP takes it, then fails to build it."""
    rng = np.random.default_rng(0)
    hidden, width = 16, 8
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
               for name, shape in (("W", (1, 4 * hidden, width)), ("R", (1, 4 * hidden, hidden)), ("B", (1, 8 * hidden)))]
    node = helper.make_node("LSTM", ["x", "W", "R", "B", "", "h0", "c0"], ["y", "hn", "cn"], hidden_size=hidden,
                            name="rnn")
    state = [helper.make_tensor_value_info(n, F, [1, 1, hidden]) for n in ("h0", "c0")]
    graph = helper.make_graph([node], "decoder", [helper.make_tensor_value_info("x", F, [1, 1, width]), *state],
                              [helper.make_tensor_value_info("y", F, [1, 1, 1, hidden]),
                               *[helper.make_tensor_value_info(n, F, [1, 1, hidden]) for n in ("hn", "cn")]], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@htp
@pytest.mark.htp
def test_a_node_the_qnn_ep_takes_and_cannot_build_is_refused_even_with_allow_fallback(tmp_path, probe_cache):
    """With CPU fallback allowed the session failed to finalize all the same: every plan of the study failed."""
    from mpstudio.data import FeedList
    from mpstudio.model import prepare_model
    from mpstudio.study import Study

    issue = next(i for i in prepare_model(lstm_model()).support_issues if i.node == "rnn")
    assert issue.severity == FALLBACK and "Failed to finalize QNN graph" in issue.reason
    assert "ORT cannot run it on the CPU instead" in issue.reason
    rng = np.random.default_rng(1)
    feeds = [{name: rng.normal(size=shape).astype(np.float32) for name, shape in
              (("x", (1, 1, 8)), ("h0", (1, 1, 16)), ("c0", (1, 1, 16)))} for _ in range(4)]
    with pytest.raises(MpstudioError, match=r"cannot be left to ORT's CPU EP.*\n  rnn \[LSTM\].*\nRe-export"):
        Study.create(tmp_path / "s", lstm_model(), FeedList(feeds), allow_fallback=True)
    assert not (tmp_path / "s" / "study.json").exists()
