"""Weights written as a QuantizeLinear of a float constant (AIMET's QDQ export): the codes computed once are ONNX
Runtime's own, and the cost model prices the model as the device runs it, with integer weights."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mpstudio.constant_codes import constant_quantizers, quantized_constants
from mpstudio.latency import estimate_latency

N = 256


def _model(weights_as_codes: bool, seed: int = 0) -> onnx.ModelProto:
    """x -> Q/DQ (uint8) -> MatMul with an int8 per-channel weight -> Q/DQ (uint8) -> y; the weight either as
    integer codes or as a float constant and a QuantizeLinear of it. The float weights lie on and between the
    codes' steps, halves included, and beyond the int8 range (saturation)."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.01, 0.05, N).astype(np.float32)
    steps = rng.integers(-140, 140, (N, N)) + rng.choice([0.0, 0.5, 0.25, -0.5], (N, N))
    w = (steps * scale[None, :]).astype(np.float32)
    zero = np.zeros(N, np.int8)
    inits = [numpy_helper.from_array(scale, "w_scale"), numpy_helper.from_array(zero, "w_zero"),
             numpy_helper.from_array(np.array(0.02, np.float32), "a_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "a_zero"),
             numpy_helper.from_array(np.array(0.5, np.float32), "y_scale")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "a_scale", "a_zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "a_scale", "a_zero"], ["xd"])]
    if weights_as_codes:
        codes = np.clip(np.rint(w / scale[None, :]), -128, 127).astype(np.int8)
        inits.append(numpy_helper.from_array(codes, "w_q"))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
        nodes.append(helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zero"], ["w_q"], axis=1))
    nodes += [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["wd"], axis=1),
              helper.make_node("MatMul", ["xd", "wd"], ["m"]),
              helper.make_node("QuantizeLinear", ["m", "y_scale", "a_zero"], ["mq"]),
              helper.make_node("DequantizeLinear", ["mq", "y_scale", "a_zero"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, N])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, N])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_codes_are_those_onnx_runtime_computes_and_the_float_constant_goes():
    model = _model(weights_as_codes=False)
    assert len(constant_quantizers(model)) == 1
    folded = quantized_constants(model)
    assert constant_quantizers(folded) == [] and "w" not in {i.name for i in folded.graph.initializer}
    assert quantized_constants(folded) is folded  # nothing left to fold: the same model
    x = np.random.default_rng(1).normal(0, 1, (1, 64, N)).astype(np.float32)
    np.testing.assert_array_equal(_run(model, x), _run(folded, x))
    codes = numpy_helper.to_array(next(i for i in folded.graph.initializer if i.name == "w_q"))
    assert codes.dtype == np.int8 and codes.min() == -128 and codes.max() == 127  # saturated, as ORT does


def test_the_cost_model_prices_a_quantize_of_a_constant_as_integer_weights():
    as_float, as_codes = estimate_latency(_model(False), "75"), estimate_latency(_model(True), "75")
    row = lambda e: e.ops[e.ops["op_type"] == "MatMul"].iloc[0]  # noqa: E731
    assert row(as_codes)["weight_type"] == "int8"
    assert row(as_float)["weight_type"] == "int8"
    assert row(as_float)["weight_bytes"] == row(as_codes)["weight_bytes"]
    assert as_float.ms == as_codes.ms
