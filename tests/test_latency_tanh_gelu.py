"""The tanh GELU written out as separate ops (transformers' gelu_new) runs as one Gelu op, as QNN fuses it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR
from onnx import TensorProto, helper, numpy_helper

from mpstudio.data import FeedList
from mpstudio.latency import estimate_latency
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer


def _tanh_gelu_model(half_first: bool):
    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(0, 0.1, (64, 64)).astype(np.float32), "three": np.float32(3),
              "k": np.float32(0.044715), "c": np.float32((2 / np.pi) ** 0.5), "one": np.float32(1),
              "half": np.float32(0.5)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Pow", ["h", "three"], ["cube"], name="pow"),
             helper.make_node("Mul", ["cube", "k"], ["kc"], name="mul_k"),
             helper.make_node("Add", ["h", "kc"], ["inner"], name="add_inner"),
             helper.make_node("Mul", ["inner", "c"], ["scaled"], name="mul_c"),
             helper.make_node("Tanh", ["scaled"], ["t"], name="tanh"),
             helper.make_node("Add", ["t", "one"], ["t1"], name="add_one")]
    if half_first:  # 0.5 * x * (1 + tanh(...))
        nodes += [helper.make_node("Mul", ["h", "half"], ["hx"], name="mul_half"),
                  helper.make_node("Mul", ["hx", "t1"], ["y"], name="mul")]
    else:  # x * (1 + tanh(...)) * 0.5
        nodes += [helper.make_node("Mul", ["h", "t1"], ["g"], name="mul"),
                  helper.make_node("Mul", ["g", "half"], ["y"], name="mul_half")]
    graph = helper.make_graph(nodes, "tanh_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


@pytest.mark.parametrize("half_first", [True, False])
def test_tanh_gelu_written_out_runs_as_one_op(tmp_path, half_first):
    model = _tanh_gelu_model(half_first)
    feeds = [{"x": np.random.default_rng(i).normal(0, 1, (1, 16, 64)).astype(np.float32)} for i in range(2)]
    q = Quantizer(prepare_model(model), FeedList(feeds), tmp_path)
    for path in (q.float_path, q.generate(PrecisionPlan.a8w8())):
        ops = estimate_latency(path).ops
        running = ops[(ops["engine"] != "fused") & (ops["kind"] == "compute")]
        assert sorted(set(running["op_type"]) - {"Reshape"}) == ["Gelu", "MatMul"], running["op_type"].tolist()
        assert (running["op_type"] == "Gelu").sum() == 1
