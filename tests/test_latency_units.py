"""Node units ORT's QNN EP does not group (one quantizer per tensor, as AIMET exports a mixed-precision model): the
HTP computes them in float beside their own Q/DQ ops, the cost model reads them so, and the HTP itself agrees."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mpstudio.htp_build import htp_build, read_schematic
from mpstudio.latency import estimate_latency
from mpstudio.latency.units import built_units, float_units
from mpstudio.qdq import read

from conftest import requires_qnn

N = 384
_BITS = {8: (TensorProto.UINT8, 128, 255), 16: (TensorProto.UINT16, 32768, 65535)}


def _qdq(value: str, bits: int, inits: list) -> tuple[list, str]:
    """Q/DQ of `value` at `bits`, one quantizer of its own (range -4..4)."""
    elem, zero, top = _BITS[bits]
    inits += [numpy_helper.from_array(np.array(8.0 / top, np.float32), f"{value}_s"),
              helper.make_tensor(f"{value}_z", elem, [], [zero])]
    nodes = [helper.make_node("QuantizeLinear", [value, f"{value}_s", f"{value}_z"], [f"{value}_q"],
                              name=f"{value}_quantize"),
             helper.make_node("DequantizeLinear", [f"{value}_q", f"{value}_s", f"{value}_z"], [f"{value}_d"],
                              name=f"{value}_dequantize")]
    return nodes, f"{value}_d"


def _model(mixed: bool) -> onnx.ModelProto:
    """x (16-bit when `mixed`, else 8-bit) + y (8-bit) -> Add (8-bit out) -> LayerNormalization (8-bit gamma; its
    bias a float constant when `mixed`, else int32 codes) -> Mul by an 8-bit constant -> out. With `mixed` the
    Add's and the LayerNormalization's groups are ungrouped; the Mul's is grouped either way."""
    inits: list = []
    nodes: list = []
    for name, bits in (("x", 16 if mixed else 8), ("y", 8)):
        n, _ = _qdq(name, bits, inits)
        nodes += n
    nodes.append(helper.make_node("Add", ["x_d", "y_d"], ["a"], name="the_add"))
    n, a = _qdq("a", 8, inits)
    nodes += n
    rng = np.random.default_rng(0)
    inits += [numpy_helper.from_array(rng.integers(100, 200, N).astype(np.uint8), "gamma_q"),
              numpy_helper.from_array(np.array(0.01, np.float32), "gamma_s"),
              numpy_helper.from_array(np.array(0, np.uint8), "gamma_z")]
    nodes.append(helper.make_node("DequantizeLinear", ["gamma_q", "gamma_s", "gamma_z"], ["gamma"], name="gamma_dq"))
    beta = rng.normal(0, 0.1, N).astype(np.float32)
    if mixed:
        inits.append(numpy_helper.from_array(beta, "beta"))
    else:
        inits += [numpy_helper.from_array(np.rint(beta / 1e-4).astype(np.int32), "beta_q"),
                  numpy_helper.from_array(np.array(1e-4, np.float32), "beta_s"),
                  numpy_helper.from_array(np.array(0, np.int32), "beta_z")]
        nodes.append(helper.make_node("DequantizeLinear", ["beta_q", "beta_s", "beta_z"], ["beta"], name="beta_dq"))
    nodes.append(helper.make_node("LayerNormalization", [a, "gamma", "beta"], ["n"], axis=-1, name="the_norm"))
    n, nd = _qdq("n", 8, inits)
    nodes += n
    inits += [numpy_helper.from_array(rng.integers(0, 255, N).astype(np.uint8), "k_q"),
              numpy_helper.from_array(np.array(0.01, np.float32), "k_s"),
              numpy_helper.from_array(np.array(128, np.uint8), "k_z")]
    nodes.append(helper.make_node("DequantizeLinear", ["k_q", "k_s", "k_z"], ["k"], name="k_dq"))
    nodes.append(helper.make_node("Mul", [nd, "k"], ["m"], name="the_mul"))
    n, md = _qdq("m", 8, inits)
    nodes += n
    nodes.append(helper.make_node("Identity", [md], ["out"]))
    shape = [1, 64, N]
    graph = helper.make_graph(nodes, "units", [helper.make_tensor_value_info(v, TensorProto.FLOAT, shape)
                                               for v in ("x", "y")],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_the_rule_finds_the_groups_the_qnn_ep_leaves_float_and_their_own_q_dq():
    assert float_units(read(_model(mixed=False))).float_ops == frozenset()
    units = float_units(read(_model(mixed=True)))
    assert units.float_ops == {"the_add", "the_norm"}  # the grouped Mul is not among them
    # the Add's two inputs are dequantized on their own, its output quantized; the norm's output too
    assert {"x_dequantize", "y_dequantize", "a_quantize", "a_dequantize", "n_quantize"} <= units.standalone
    assert "m_quantize" not in units.standalone


def test_an_ungrouped_unit_is_priced_in_fp16_with_its_own_q_dq_ops():
    uniform, mixed = estimate_latency(_model(mixed=False)), estimate_latency(_model(mixed=True))
    ops = mixed.ops.set_index("node")
    assert ops.loc["the_add", "act_type"] == "float16" and ops.loc["the_norm", "act_type"] == "float16"
    assert ops.loc["the_mul", "act_type"] == "uint8"
    assert {"x_dequantize", "a_quantize"} <= set(mixed.ops.loc[mixed.ops["kind"] == "convert", "node"])
    assert uniform.ops.set_index("node").loc["the_add", "act_type"] == "uint8"
    assert mixed.htp.ms > uniform.htp.ms


def _entry(op_id: int, operation: str, dtype: str) -> str:
    """One op of a schematic's graph, as QNN writes it."""
    return (f"\t0x{op_id:016x}: {{\n\t\t'operation':'{operation}',\n\t\t'inputs' : [],\n\t\t'outputs' : [\t{{\n"
            f"\t\t\t'dtype': '{dtype}', 'rank': 4,\n\t\t\t}},\n\t\t],\n\t}},\n")


def test_the_schematic_reader_names_the_float_ops_and_the_standalone_q_dq():
    ops = [(0x10, "q::QNN_Dequantize", "Float32", "x_dequantize"),
           (0x11, "q::QNN_ElementWiseAdd", "Float32", "the_add"),
           (0x12, "q::QNN_ElementWiseMultiply", "QUInt8", "the_mul")]
    text = ("graph_before_optimization = { # :::BEGIN:graph_before_optimization:::\n"
            + "".join(_entry(i, op, dtype) for i, op, dtype, _ in ops)
            + "# :::END:graph_before_optimization:::\nqnn_name_translations = {\n"
            + "".join(f"0x{i:016x}: '{name}',\n" for i, _, _, name in ops) + "}\n")
    build = read_schematic(text)
    assert build.float_nodes == {"the_add"} and build.standalone == {"x_dequantize"}
    assert "1 computing in float, 1 standalone" in build.summary()


@requires_qnn
def test_the_htp_builds_the_ungrouped_units_in_float_as_the_rule_says(tmp_path):
    for mixed in (False, True):
        path = tmp_path / f"units-{mixed}.onnx"
        onnx.save(_model(mixed), path)
        build = htp_build(path)
        qdq = read(_model(mixed))
        rule, htp = float_units(qdq), built_units(qdq, build)
        assert htp.float_ops == rule.float_ops, (mixed, build.summary())
        # the HTP also runs the float norm's weight DQ on its own: a constant, not priced by the rule
        constants = {n.name for n in qdq.model.graph.node if n.op_type == "DequantizeLinear"
                     and n.input[0] in qdq.initializers}
        assert rule.standalone == htp.standalone - constants, (htp.standalone, rule.standalone)
        if mixed:
            # priced with the HTP's answer as with the rule: the same ops in fp16
            built = estimate_latency(path, build=build).ops.set_index("node")
            assert built.loc["the_add", "act_type"] == "float16" and built.loc["the_mul", "act_type"] == "uint8"
