"""Mechanisms of the cost formulas found in the per-op breakdowns of the cross-validation's worst rows: a PReLU
is an op of its own overlapped with its matrix op, a channels-last Transpose is free, an activation looks through
a reshape to its matrix op, a Relu after a vector op fuses into it. All are off by default (each added
cross-validation misses). Each is compared with the same model where the mechanism cannot apply."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR
from onnx import TensorProto, helper, numpy_helper

from mpstudio.latency import estimate_latency, htp_arch
from mpstudio.latency.ops import MECHANISMS


def _model(nodes, consts, in_shape, out_shape):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _layernorm_channels_last(perm_in, perm_out, shape_out):
    """ConvNeXt's LayerNorm over channels between two convolutions: Transpose to channels-last, LayerNorm,
    Transpose back."""
    c = 64
    width = c if perm_in == [0, 2, 3, 1] else 56
    consts = {"w": np.random.default_rng(0).normal(0, 0.1, (c, c, 1, 1)).astype(np.float32),
              "g": np.ones(width, np.float32), "b": np.zeros(width, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
             helper.make_node("Transpose", ["h"], ["t"], perm=perm_in, name="to_last"),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1, name="ln"),
             helper.make_node("Transpose", ["n"], ["u"], perm=perm_out, name="back"),
             helper.make_node("Conv", ["u", "w"], ["y"], name="conv_after")]
    return _model(nodes, consts, [1, c, 56, 56], shape_out)


def test_channels_last_transpose_is_free(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "channels_last_transpose", True)  # on by default since issue 22 (third round)
    free = estimate_latency(_layernorm_channels_last([0, 2, 3, 1], [0, 3, 1, 2], [1, 64, 56, 56]))
    # Same data, but the transposes swap two spatial axes: a real data movement on the HTP.
    moved = estimate_latency(_layernorm_channels_last([0, 2, 1, 3], [0, 2, 1, 3], [1, 64, 56, 56]))
    rows = free.ops.set_index("node")
    assert rows.loc["to_last", "engine"] == rows.loc["back", "engine"] == "none"
    assert rows.loc["to_last", "memory_ms"] == 0
    assert set(moved.ops.set_index("node").loc[["to_last", "back"], "engine"]) == {"dma"}
    # Same LayerNorm work either way: the difference is the two data movements.
    assert free.htp_ms < moved.htp_ms
    moved_rows = moved.ops.set_index("node")
    assert moved.htp_ms - free.htp_ms == pytest.approx(
        moved_rows.loc[["to_last", "back"], "ms"].sum() - rows.loc[["to_last", "back"], "ms"].sum(), rel=1e-6)


def _matmul_reshape_gelu(reshape: bool):
    """MatMul -> (Reshape) -> erf GELU: the MatMul-to-Gemm rewrite puts a reshape between them."""
    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(0, 0.05, (256, 1024)).astype(np.float32), "s": np.array([1, 64, 1024], np.int64),
              "r2": np.float32(2 ** 0.5), "one": np.float32(1), "half": np.float32(0.5)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0" if reshape else "h"], name="mm")]
    nodes += [helper.make_node("Reshape", ["h0", "s"], ["h"], name="reshape")] if reshape else []
    nodes += [helper.make_node("Div", ["h", "r2"], ["d"], name="div"),
              helper.make_node("Erf", ["d"], ["e"], name="erf"),
              helper.make_node("Add", ["e", "one"], ["e1"], name="add"),
              helper.make_node("Mul", ["h", "e1"], ["g"], name="mul"),
              helper.make_node("Mul", ["g", "half"], ["y"], name="mul_half")]
    return _model(nodes, consts, [1, 64, 256], [1, 64, 1024])


def test_activation_overlaps_its_matmul_through_a_reshape(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "layout_look_through", True)  # on by default since issue 22 (third round)
    est = estimate_latency(_matmul_reshape_gelu(reshape=True))
    gelu = est.ops[est.ops["op_type"] == "Gelu"].iloc[0]
    assert gelu["hidden_ms"] > 0
    # The same as when nothing stands between them (the reshape itself runs as no op: metadata_ops_free).
    direct = estimate_latency(_matmul_reshape_gelu(reshape=False))
    assert direct.ops[direct.ops["op_type"] == "Gelu"]["hidden_ms"].iloc[0] == pytest.approx(gelu["hidden_ms"])


def test_without_the_mechanism_the_reshape_keeps_them_apart(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "layout_look_through", False)
    est = estimate_latency(_matmul_reshape_gelu(reshape=True))
    assert est.ops[est.ops["op_type"] == "Gelu"]["hidden_ms"].iloc[0] == 0


def _bn_relu(second_reader: bool):
    c = 64
    consts = {"sc": np.ones(c, np.float32), "bi": np.zeros(c, np.float32), "mu": np.zeros(c, np.float32),
              "var": np.ones(c, np.float32)}
    nodes = [helper.make_node("BatchNormalization", ["x", "sc", "bi", "mu", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu")]
    if second_reader:  # the BatchNorm's output is also read unclamped: the Relu must run on its own
        nodes.append(helper.make_node("Add", ["r", "n"], ["y"], name="add"))
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["y"], name="out"))
    return _model(nodes, consts, [1, c, 56, 56], [1, c, 56, 56])


def test_relu_after_batchnorm_fuses_into_it(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "clamp_after_vector", True)  # on by default since issue 22's second round
    fused = estimate_latency(_bn_relu(second_reader=False)).ops.set_index("node")
    assert fused.loc["relu", "engine"] == "fused" and fused.loc["relu", "ms"] == 0
    apart = estimate_latency(_bn_relu(second_reader=True)).ops.set_index("node")
    assert apart.loc["relu", "engine"] == "hvx" and apart.loc["relu", "ms"] > 0


def _conv_prelu():
    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(0, 0.05, (64, 64, 3, 3)).astype(np.float32),
              "slope": np.full((64, 1, 1), 0.25, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("PRelu", ["c", "slope"], ["y"], name="prelu")]
    return _model(nodes, consts, [1, 64, 64, 64], [1, 64, 64, 64])


def test_prelu_is_an_op_of_its_own_overlapped_with_its_conv(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "prelu_overlaps", True)  # on by default: docs/latency.md, "Fit"
    rows = estimate_latency(_conv_prelu()).ops.set_index("node")
    assert rows.loc["prelu", "engine"] == "hvx"
    # Its vector time hides behind the convolution (`overlap` of it): what remains is its fixed per-op cost and
    # the share not hidden.
    busy = max(rows.loc["prelu", "compute_ms"], rows.loc["prelu", "memory_ms"])
    assert busy < max(rows.loc["conv", "compute_ms"], rows.loc["conv", "memory_ms"])
    assert rows.loc["prelu", "hidden_ms"] == pytest.approx(htp_arch("75").costs.overlap * busy, rel=1e-6)
    assert rows.loc["prelu", "ms"] == pytest.approx(rows.loc["prelu", "overhead_ms"] + busy
                                                    - rows.loc["prelu", "hidden_ms"], rel=1e-6)
    monkeypatch.setitem(MECHANISMS, "prelu_overlaps", False)
    assert estimate_latency(_conv_prelu()).ops.set_index("node").loc["prelu", "engine"] == "fused"


def _attention_key_transpose():
    """A transformer's key: [1, 384, 768] projected, split into 12 heads [1, 384, 12, 64] and transposed to
    [1, 12, 64, 384] for Q x K^T: the same permutation (0, 2, 3, 1) as a channels-last one, on a tensor no spatial
    op touches."""
    consts = {"w": np.random.default_rng(0).normal(0, 0.1, (768, 768)).astype(np.float32),
              "shape": np.array([1, 384, 12, 64], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["k"], name="key"),
             helper.make_node("Reshape", ["k", "shape"], ["heads"], name="split"),
             helper.make_node("Transpose", ["heads"], ["y"], perm=[0, 2, 3, 1], name="to_kt")]
    return _model(nodes, consts, [1, 384, 768], [1, 12, 64, 384])


def test_channels_last_transpose_needs_an_image(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "channels_last_transpose", True)
    row = estimate_latency(_attention_key_transpose()).ops.set_index("node").loc["to_kt"]
    assert row["engine"] == "dma" and row["memory_ms"] > 0


def test_layout_look_through_is_on_by_default():
    # On since issue 22's third round (37 -> 35 cross-validated rows outside: docs/latency.md, "Fit").
    est = estimate_latency(_matmul_reshape_gelu(reshape=True))
    assert est.ops[est.ops["op_type"] == "Gelu"]["hidden_ms"].iloc[0] > 0


def test_channels_last_transpose_is_on_by_default():
    # On since issue 22's third round (49 -> 48 cross-validated rows outside: docs/latency.md, "Fit"): the
    # channels-last permutations of an image-like tensor are metadata only, and with metadata_ops_free cost nothing.
    rows = estimate_latency(_layernorm_channels_last([0, 2, 3, 1], [0, 3, 1, 2], [1, 64, 56, 56])).ops.set_index("node")
    assert set(rows.loc[["to_last", "back"], "engine"]) == {"none"}
    assert (rows.loc[["to_last", "back"], "ms"] == 0).all()


def test_clamp_after_vector_is_on_by_default():
    # On since issue 22's second round, with concat_in_place (59 -> 56 cross-validated rows outside: docs/latency.md).
    assert estimate_latency(_bn_relu(second_reader=False)).ops.set_index("node").loc["relu", "engine"] == "fused"
