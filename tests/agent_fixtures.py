"""Small ONNX models and helpers shared by the agent tests (imported explicitly, not a conftest)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

HAS_QNN = importlib.util.find_spec("onnxruntime_qnn") is not None
needs_qnn = pytest.mark.skipif(not HAS_QNN, reason="onnxruntime-qnn is not installed")

INPUT_SHAPE = (1, 3, 16, 16)


def conv_model(dynamic: bool = False, seed: int = 0) -> onnx.ModelProto:
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm: a tiny classifier QNN takes whole."""
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "B"),
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "W2"),
    ]
    batch = "N" if dynamic else 1
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"], name="relu1"),
            helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
            helper.make_node("Flatten", ["p"], ["f"], name="flat"),
            helper.make_node("Gemm", ["f", "W2"], ["y"], name="fc", transB=1),
        ],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def slow_model(size: int = 384, depth: int = 24) -> onnx.ModelProto:
    """A MatMul chain that genuinely takes a while per run on CPU (tens of ms), for timeout and kill tests."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array((rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32), "W")
    nodes, current = [], "x"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [current, "W"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        current = f"t{i}"
    nodes.append(helper.make_node("Identity", [current], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def random_inputs(seed: int = 0, shape=INPUT_SHAPE) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def quantize_qdq(float_path: Path, out_path: Path, activation: str = "QUInt8", overrides: dict | None = None) -> Path:
    """A QDQ model valid for QNN (ORT's get_qnn_qdq_config), optionally with 16-bit tensor overrides."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter([random_inputs(seed) for seed in range(8)])

        def get_next(self):
            return next(self._feeds, None)

    init_overrides = None
    if overrides:
        init_overrides = {name: [{"quant_type": getattr(QuantType, kind)}] for name, kind in overrides.items()}
    config = get_qnn_qdq_config(
        str(float_path), Reader(), activation_type=getattr(QuantType, activation), weight_type=QuantType.QUInt8,
        init_overrides=init_overrides,
    )
    quantize(str(float_path), str(out_path), config)
    return out_path


def with_unsupported_op(qdq_path: Path, out_path: Path) -> Path:
    """The QDQ model with a Hardmax (not in QNN's op list) on its output."""
    model = onnx.load(str(qdq_path))
    output = model.graph.output[0].name
    model.graph.node.append(helper.make_node("Hardmax", [output], ["y_hard"], name="my_hardmax", axis=1))
    model.graph.output[0].name = "y_hard"
    onnx.save(model, str(out_path))
    return out_path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Model files: float, dynamic-shape, a8 QDQ, a16 mixed QDQ, unsupported-op QDQ, slow CPU model."""
    root = tmp_path_factory.mktemp("agent-models")
    paths = {}
    onnx.save(conv_model(), str(root / "float.onnx"))
    paths["float"] = root / "float.onnx"
    onnx.save(conv_model(dynamic=True), str(root / "dynamic.onnx"))
    paths["dynamic"] = root / "dynamic.onnx"
    paths["a8"] = quantize_qdq(paths["float"], root / "a8.onnx")
    paths["mixed"] = quantize_qdq(paths["float"], root / "mixed.onnx", overrides={"r": "QUInt16", "p": "QUInt16"})
    paths["unsupported"] = with_unsupported_op(paths["a8"], root / "unsupported.onnx")
    onnx.save(slow_model(), str(root / "slow.onnx"))
    paths["slow"] = root / "slow.onnx"
    return paths


def direct_run(path: Path, backend: str, feeds: dict, options: dict | None = None) -> dict[str, np.ndarray]:
    """Outputs of an in-process session, the reference the agent must match."""
    from mpstudio.runtime import create_session

    session = create_session(path, backend, options)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))
