"""Shared fixtures: small real ONNX models built in code, and the built-in demo in a per-run cache."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

IR = 10  # ORT 1.31 rejects onnx 1.23's default IR version


def make_conv_model(dynamic_batch: bool = False, seed: int = 0, with_constant: bool = True) -> onnx.ModelProto:
    """x[1,3,16,16] -> /backbone/conv1/Conv -> Relu -> /backbone/conv2/Conv -> /head/Add(const) -> /head/GAP -> y.

    Weights are random but fixed by seed; the Add's operand is a Constant node, as exporters often write.
    """
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "conv1.weight")
    b1 = numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "conv1.bias")
    w2 = numpy_helper.from_array(rng.normal(0, 0.2, (4, 8, 3, 3)).astype(np.float32), "conv2.weight")
    b2 = numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "conv2.bias")
    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["conv1_out"], name="/backbone/conv1/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1_out"], ["relu1_out"], name="/backbone/conv1/Relu"),
        helper.make_node("Conv", ["relu1_out", "conv2.weight", "conv2.bias"], ["conv2_out"], name="/backbone/conv2/Conv", pads=[1, 1, 1, 1]),
    ]
    if with_constant:
        nodes.append(helper.make_node("Constant", [], ["offset"], name="/head/Constant",
                                      value=numpy_helper.from_array(np.full((1, 4, 1, 1), 0.5, np.float32))))
    else:
        nodes.append(helper.make_node("Identity", ["offset_init"], ["offset"], name="/head/Identity"))
    nodes += [
        helper.make_node("Add", ["conv2_out", "offset"], ["add_out"], name="/head/Add"),
        helper.make_node("GlobalAveragePool", ["add_out"], ["y"], name="/head/GlobalAveragePool"),
    ]
    batch = "N" if dynamic_batch else 1
    inits = [w1, b1, w2, b2]
    if not with_constant:
        inits.append(numpy_helper.from_array(np.full((1, 4, 1, 1), 0.5, np.float32), "offset_init"))
    graph = helper.make_graph(
        nodes,
        "conv_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 1, 1])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def make_chain_model(blocks: int = 6, channels: int = 8, size: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x[1,3,size,size] -> `blocks` x (/blockI/Conv -> /blockI/Relu) -> /head/Conv -> y.

    Every other block's Conv has a bias of 20 on one channel that the next block ignores (zero weights), so
    those tensors' 8-bit ranges are mostly wasted on an outlier and some tensors matter much more than
    others: a small model with a real sensitivity ranking. Weights are uniform, which per-tensor uint8 suits.
    """
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    current, cin = "x", 3
    for i in range(blocks):
        bound = np.sqrt(3.0 / (cin * 9))
        w = rng.uniform(-bound, bound, (channels, cin, 3, 3)).astype(np.float32)
        b = rng.uniform(-0.1, 0.1, (channels,)).astype(np.float32)
        if i % 2 == 1:
            b[i % channels] = 20.0
        if i % 2 == 0 and i > 0:
            w[:, (i - 1) % channels] = 0.0  # the previous block's outlier channel goes nowhere
        inits += [numpy_helper.from_array(w, f"block{i}.weight"), numpy_helper.from_array(b, f"block{i}.bias")]
        nodes += [
            helper.make_node("Conv", [current, f"block{i}.weight", f"block{i}.bias"], [f"block{i}_conv"],
                             name=f"/block{i}/Conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"block{i}_conv"], [f"block{i}_out"], name=f"/block{i}/Relu"),
        ]
        current, cin = f"block{i}_out", channels
    head = rng.uniform(-0.5, 0.5, (4, channels, 1, 1)).astype(np.float32)
    if blocks % 2 == 0:
        head[:, (blocks - 1) % channels] = 0.0
    inits.append(numpy_helper.from_array(head, "head.weight"))
    nodes.append(helper.make_node("Conv", [current, "head.weight"], ["y"], name="/head/Conv"))
    graph = helper.make_graph(
        nodes, "chain_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, size, size])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def chain_feeds(n: int, size: int = 16, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 3, size, size)).astype(np.float32)} for _ in range(n)]


def conv_feeds(n: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(n)]


def make_loop_model() -> onnx.ModelProto:
    """A model with a Loop node, an op the QNN EP does not take."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "v_in"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 4])],
    )
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Loop", ["trip", "cond", "r"], ["y"], name="repeat_loop", body=body)],
        "loop_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(np.array(3, np.int64), "trip"),
                     numpy_helper.from_array(np.array(True), "cond")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


@pytest.fixture
def conv_model_path(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(make_conv_model(), path)
    return path


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory):
    """A cache folder for the demo shared by the whole run (the demo's files are deterministic)."""
    return os.environ.get("MPSTUDIO_TEST_DEMO_CACHE") or str(tmp_path_factory.mktemp("demo-cache"))


@pytest.fixture(scope="session")
def demo(demo_cache):
    pytest.importorskip("rapidocr_onnxruntime", reason="the demo model needs `pip install mpstudio[demo]`")
    from mpstudio.demos import load_demo

    return load_demo(cache_dir=demo_cache)


@pytest.fixture(scope="session")
def demo_quantizer(demo, demo_cache):
    from pathlib import Path

    from mpstudio.quantize import Quantizer

    return Quantizer(demo.model, demo.calibration, Path(demo_cache) / "quantize")


def output_codes(model, feeds: dict, step: float, output: str = "out", **session) -> np.ndarray:
    """A one-op QDQ model's `output` on `feeds`, in steps of `step` (its codes minus the zero point), run by
    `runtime.create_session(model, **session)` (the default CPU numerics unless `session` names others)."""
    from mpstudio.runtime import create_session

    return np.round(create_session(model, **session).run([output], feeds)[0] / step)


def qnn_available() -> bool:
    from mpstudio.runtime import qnn_library_path

    return qnn_library_path() is not None


requires_qnn = pytest.mark.skipif(not qnn_available(), reason="onnxruntime-qnn is not installed on this platform")


# ---- the browser tests' Chromium (Debian's chromium, driven by Playwright) --------------------------------------
@pytest.fixture(scope="module")
def browser():
    from gui_support import chromium_path
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A 1600x1000 page that accepts downloads, with a 60 s default timeout."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(60000)
    yield page
    context.close()
