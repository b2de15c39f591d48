"""Synthetic ONNX models for the graph view and layout: residual blocks in nested namespaces, any size."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR = 10  # ORT 1.31 rejects onnx 1.23's default IR version


def make_residual_model(nodes: int = 2000, channels: int = 4, size: int = 8, blocks_per_stage: int = 10,
                        seed: int = 0) -> onnx.ModelProto:
    """About `nodes` nodes: x -> stem Conv -> blocks of (Conv, Relu, Conv, Add skip, Relu), every third block
    with a second branch (Conv, Concat, Conv), named `/stage{s}/block{b}/<Op>` -> GlobalAveragePool -> y."""
    rng = np.random.default_rng(seed)
    inits, graph_nodes = [], []

    def conv(name, src, cin, cout, k=1):
        w = numpy_helper.from_array(rng.normal(0, 0.5 / np.sqrt(cin * k * k), (cout, cin, k, k)).astype(np.float32),
                                    f"{name}.weight")
        b = numpy_helper.from_array(rng.normal(0, 0.05, (cout,)).astype(np.float32), f"{name}.bias")
        inits.extend([w, b])
        out = f"{name}_output_0"
        graph_nodes.append(helper.make_node("Conv", [src, w.name, b.name], [out], name=name,
                                            pads=[k // 2] * 4 if k > 1 else [0] * 4))
        return out

    def op(kind, name, srcs, **attrs):
        out = f"{name}_output_0"
        graph_nodes.append(helper.make_node(kind, list(srcs), [out], name=name, **attrs))
        return out

    x = conv("/stem/Conv", "x", 3, channels, 3)
    block = 0
    while len(graph_nodes) < nodes - 1:
        prefix = f"/stage{block // blocks_per_stage}/block{block % blocks_per_stage}"
        h = conv(f"{prefix}/conv1/Conv", x, channels, channels)
        h = op("Relu", f"{prefix}/conv1/Relu", [h])
        if block % 3 == 2:
            g = conv(f"{prefix}/branch/Conv", x, channels, channels)
            h = op("Concat", f"{prefix}/Concat", [h, g], axis=1)
            h = conv(f"{prefix}/conv2/Conv", h, 2 * channels, channels)
        else:
            h = conv(f"{prefix}/conv2/Conv", h, channels, channels)
        h = op("Add", f"{prefix}/Add", [h, x])
        x = op("Relu", f"{prefix}/Relu", [h])
        block += 1
    op("GlobalAveragePool", "/head/GlobalAveragePool", [x])
    graph_nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        graph_nodes, "residual_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 1, 1])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)
