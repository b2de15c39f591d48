"""What an import reports beyond encodings: the biases the source computes in float and the weights whose integer
codes differ from the source's, on AIMET's recorded export (tests/data/aimet, no AIMET needed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from test_aimet_exchange import DATA, eltwise_feeds, make_eltwise_model


def _study(tmp_path):
    from mpstudio.data import FeedList
    from mpstudio.study import Study

    return Study.create(tmp_path / "study", make_eltwise_model(), FeedList(eltwise_feeds(4)))


def test_aimets_qdq_model_reports_its_float_bias_and_matching_weight_codes(tmp_path):
    with _study(tmp_path) as study:
        imported = study.import_plan(DATA / "eltwise_qdq.onnx")
        # AIMET's to_onnx_qdq reads conv.bias as a float initializer; the plan's model has ORT's int32 bias.
        assert imported.float_biases == ("conv.bias",)
        assert "1 bias(es) the source computes in float" in imported.describe()
        # AIMET's weight is its fake-quantized value: at the pinned scales the plan's model has the same codes.
        assert imported.weight_codes == ()
        # The encodings file lists no bias either: the report says the plan's model derives it.
        from_file = study.import_plan(DATA / "eltwise.encodings", name="from file")
        assert from_file.float_biases == ("conv.bias",) and "not in the file" in from_file.describe()


def test_the_plans_model_takes_the_weight_codes_the_source_rounded_another_way(tmp_path):
    model = onnx.load(str(DATA / "eltwise_qdq.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    weight = numpy_helper.to_array(inits["conv.weight"]).copy()
    scale = numpy_helper.to_array(inits["conv.weight_scale"])
    weight[2, 1, 0, 0] += scale[2]  # one code one step up, as another rounding of a tie would give
    weight[5, 0, 2, 2] -= scale[5]
    inits["conv.weight"].CopyFrom(numpy_helper.from_array(weight, "conv.weight"))
    changed = tmp_path / "changed_qdq.onnx"
    onnx.save(model, str(changed))
    # AIMET's weight is codes x scale: its codes are the weight over the scale, exactly.
    aimets_codes = np.rint(weight / scale.reshape(-1, 1, 1, 1)).astype(np.int64)
    with _study(tmp_path) as study:
        plain = study.quantizer.generate(study.import_plan(DATA / "eltwise_qdq.onnx").plan)
        imported = study.import_plan(changed, name="changed")
        assert imported.source_codes == (("conv.weight", 2, weight.size),) and imported.weight_codes == ()
        assert "'conv.weight' (2 of 216)" in imported.describe()
        ours = study.quantizer.generate(imported.plan)
        stored = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(ours)).graph.initializer}
        np.testing.assert_array_equal(stored["conv.weight_quantized"], aimets_codes)
        before = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(plain)).graph.initializer}
        assert np.count_nonzero(before["conv.weight_quantized"] != aimets_codes) == 2  # what ORT alone gives
        # The outputs follow: the plan's model computes what the changed source computes on ORT's CPU.
        from mpstudio.data import FeedList
        from mpstudio.loop.inprocess import run_outputs

        feeds = FeedList(eltwise_feeds(4, seed=2))
        source_out = np.stack([o["y"] for o in run_outputs(changed, feeds)])
        plan_out = np.stack([o["y"] for o in run_outputs(ours, feeds)])
        plain_out = np.stack([o["y"] for o in run_outputs(plain, feeds)])
        assert np.abs(plan_out - source_out).max() <= np.abs(plain_out - source_out).max()


def test_a_plans_own_qdq_model_imports_with_no_such_difference(tmp_path):
    with _study(tmp_path) as study:
        first = study.import_plan(DATA / "eltwise_qdq.onnx")
        own = study.quantizer.generate(first.plan)  # int32 biases, stored weight codes
        again = study.import_plan(own, name="again")
        assert again.float_biases == () and again.weight_codes == ()
        # conv_out and add_out are fused into their Relu and Clip: neither model quantizes them, so the import
        # does not list them as tensors the study calibrates in the source's place.
        assert again.calibrated == () and "not in the import" not in again.describe()
        codes = numpy_helper.to_array({i.name: i for i in onnx.load(str(own)).graph.initializer}
                                      ["conv.weight_quantized"])
        assert codes.dtype == np.int8


def test_a_source_written_with_one_quantizer_per_tensor_reports_the_ops_the_htp_would_compute_in_float(tmp_path):
    """AIMET's layout of a mixed plan: mul_out at 16 bits, read directly by the 8-bit Add. ORT's QNN EP does not
    quantize the Mul (8-bit in, 16-bit out) or the Add (16- and 8-bit in): the import says so, with the source's
    estimated latency as written beside the plan's model, which writes a convert instead."""
    from onnx import TensorProto, helper

    model = onnx.load(str(DATA / "eltwise_qdq.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    zero = int(numpy_helper.to_array(inits["mul_out_zero_point"]))
    scale = numpy_helper.to_array(inits["mul_out_scale"]) / 257
    inits["mul_out_zero_point"].CopyFrom(helper.make_tensor("mul_out_zero_point", TensorProto.UINT16, [], [zero * 257]))
    inits["mul_out_scale"].CopyFrom(numpy_helper.from_array(scale.astype(np.float32), "mul_out_scale"))
    mixed = tmp_path / "mixed_qdq.onnx"
    onnx.save(model, str(mixed))
    with _study(tmp_path) as study:
        plain = study.import_plan(DATA / "eltwise_qdq.onnx")
        assert plain.source_float_ops == () and "compute in float" not in plain.describe()
        imported = study.import_plan(mixed, name="mixed")
        assert imported.plan.overrides["mul_out"].type == "uint16"
        assert imported.source_float_ops == ("/add/Add", "/scale/Mul")
        assert imported.source_ms > imported.plan_ms  # two fp16 ops and their Q/DQ against one convert
        assert "2 op(s) of the source would compute in float on the HTP" in imported.describe()


def _layer_norm_model() -> onnx.ModelProto:
    """x[1,8,16] -> MatMul -> LayerNormalization (gamma, beta) -> y: ORT's QDQ quantizer writes the
    LayerNormalization's bias (its third input) as int32, as it does a Gemm's or a Conv's."""
    from onnx import TensorProto, helper

    from conftest import IR

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.normal(0, 0.2, 16).astype(np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["y"], axis=-1, name="norm")]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_a_plans_own_qdq_model_with_a_layer_norm_imports(tmp_path):
    from mpstudio.data import FeedList
    from mpstudio.graph import BIAS
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study

    rng = np.random.default_rng(1)
    feeds = FeedList([{"x": rng.normal(0, 1, (1, 8, 16)).astype(np.float32)} for _ in range(4)])
    with Study.create(tmp_path / "study", _layer_norm_model(), feeds) as study:
        assert study.graph.tensors["beta"].kind == BIAS
        own = study.quantizer.generate(PrecisionPlan.a8w8_pc().promote(["h"]))
        beta = [n for n in onnx.load(str(own)).graph.node if n.output == ["beta"]]
        assert beta and beta[0].op_type == "DequantizeLinear"  # ORT's int32 bias
        imported = study.import_plan(own, name="own")
        h = imported.plan.overrides.get("h")
        assert (h.type if h else imported.plan.activation_type) == "uint16"
        assert ("beta", "a bias: ORT derives its int32 encoding from the input and weight scales") in imported.skipped



def _chain_model() -> onnx.ModelProto:
    """x[1,4,8,8] -> Mul -> a -> Add -> b -> Mul -> c -> Add -> y, each with a constant operand."""
    from onnx import TensorProto, helper

    from conftest import IR

    rng = np.random.default_rng(0)
    inits, nodes, previous = [], [], "x"
    for i, (op, out) in enumerate([("Mul", "a"), ("Add", "b"), ("Mul", "c"), ("Add", "y")]):
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, 4, 1, 1)).astype(np.float32), f"k{i}"))
        nodes.append(helper.make_node(op, [previous, f"k{i}"], [out], name=f"{op.lower()}{i}"))
        previous = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def test_a_mixed_plans_own_qdq_model_imports_as_a_plan_that_regenerates_it(tmp_path):
    """Promoting b makes ORT write c at 16 bits (its producer computes at 16) and convert it to 8 for the last Add:
    the imported plan must not promote c itself, which would pull the last Add (and y) to 16 bits too."""
    from mpstudio import qdq
    from mpstudio.data import FeedList
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study

    def types(path):
        return {t.name: (t.encoding.dtype, tuple(c.dtype for c in t.converts))
                for t in qdq.read(path).tensors.values() if t.kind == "activation"}

    rng = np.random.default_rng(1)
    feeds = FeedList([{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(4)])
    for base in (PrecisionPlan.a8w8(), PrecisionPlan.a16w8()):
        with Study.create(tmp_path / base.activation_type, _chain_model(), feeds) as study:
            other = "uint8" if base.activation_type == "uint16" else "uint16"
            source = study.quantizer.generate(base.with_overrides({"b": other}))
            written = types(source)
            assert written["c"] == (other, (base.activation_type,))  # written wide, converted back for the last Add
            imported = study.import_plan(source, name="own")
            assert "c" not in imported.plan.overrides
            assert types(study.quantizer.generate(imported.plan)) == written
            assert imported.unapplied == ()
