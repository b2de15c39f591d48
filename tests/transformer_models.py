"""A small random BERT-like encoder written with onnx.helper the way torch's exporter writes one: exact Erf-GELU
in its usual node orders, LayerNormalization, and an additive attention mask of float32's lowest value."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR = 10
FLOAT32_LOWEST = float(np.finfo(np.float32).min)  # -3.4028235e38, what HF's exports multiply the mask by

# The orders torch and hand-written modules export exact GELU in; one per layer, cycling.
GELU_ORDERS = ("div-mul-half", "mul-half-first", "half-x-times", "x-times-half")


class _Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, array, stem: str) -> str:
        name = f"{stem}_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], scope: str, **attrs) -> str:
        self.count += 1
        out = f"{scope}/{op_type}_{self.count}_output_0"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{scope}/{op_type}_{self.count}", **attrs))
        return out

    def linear(self, x: str, cin: int, cout: int, scope: str) -> str:
        w = self.const(self.rng.normal(0, 1 / np.sqrt(cin), (cin, cout)).astype(np.float32), "weight")
        b = self.const(self.rng.normal(0, 0.02, (cout,)).astype(np.float32), "bias")
        return self.op("Add", [self.op("MatMul", [x, w], scope), b], scope)

    def layernorm(self, x: str, width: int, scope: str) -> str:
        return self.op("LayerNormalization", [x, self.const(np.ones(width, np.float32), "ln_weight"),
                                              self.const(np.zeros(width, np.float32), "ln_bias")], scope,
                       axis=-1, epsilon=1e-12)

    def gelu(self, x: str, order: str, scope: str) -> str:
        """Exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))), as exporters write it in `order`."""
        f = lambda v: self.const(np.float32(v), "gelu_const")  # noqa: E731
        if order == "mul-half-first":
            scaled = self.op("Mul", [x, f(1 / np.sqrt(2))], scope)
        else:
            scaled = self.op("Div", [x, f(np.sqrt(2))], scope)
        one = self.op("Add", [self.op("Erf", [scaled], scope), f(1.0)], scope)
        if order == "div-mul-half":  # torch.nn.GELU: (x * (1 + erf)) * 0.5
            return self.op("Mul", [self.op("Mul", [x, one], scope), f(0.5)], scope)
        if order in ("mul-half-first", "half-x-times"):  # HF: (x * 0.5) * (1 + erf)
            return self.op("Mul", [self.op("Mul", [x, f(0.5)], scope), one], scope)
        return self.op("Mul", [x, self.op("Mul", [one, f(0.5)], scope)], scope)  # x * ((1 + erf) * 0.5)


def make_encoder(tokens: int = 8, width: int = 16, heads: int = 2, layers: int = 2, vocab: int = 50, seed: int = 0,
                 mask: str = "mul", opset: int = 17) -> onnx.ModelProto:
    """input_ids, attention_mask [1, tokens] (int64) -> hidden [1, tokens, width].

    `mask`: "mul" writes HF's (1 - mask) * float32.lowest; "masked_fill" newer HF's Where(bool(1 - mask), lowest,
    1 - mask); "where" writes Where(mask == 0, lowest, 0).
    """
    net = _Net(seed)
    d = width // heads
    y = net.op("Gather", [net.const(net.rng.normal(0, 1, (vocab, width)).astype(np.float32), "words"), "input_ids"],
               "/embeddings", axis=0)
    y = net.op("Add", [y, net.const(net.rng.normal(0, 0.1, (1, tokens, width)).astype(np.float32), "positions")],
               "/embeddings")
    y = net.layernorm(y, width, "/embeddings/LayerNorm")
    scope = "/extended_mask"
    m = net.op("Unsqueeze", ["attention_mask", net.const(np.array([1, 2], np.int64), "axes")], scope)
    if mask == "mul":
        m = net.op("Cast", [m], scope, to=TensorProto.FLOAT)
        m = net.op("Sub", [net.const(np.float32(1.0), "one"), m], scope)
        m = net.op("Mul", [m, net.const(np.float32(FLOAT32_LOWEST), "lowest")], scope)
    elif mask == "masked_fill":  # newer HF: inverted.masked_fill(inverted.bool(), lowest)
        inverted = net.op("Sub", [net.const(np.float32(1.0), "one"), net.op("Cast", [m], scope, to=TensorProto.FLOAT)],
                          scope)
        padded = net.op("Cast", [inverted], scope, to=TensorProto.BOOL)
        m = net.op("Where", [padded, net.const(np.float32(FLOAT32_LOWEST), "lowest"), inverted], scope)
    else:
        padded = net.op("Equal", [m, net.const(np.array(0, np.int64), "zero")], scope)
        m = net.op("Where", [padded, net.const(np.float32(FLOAT32_LOWEST), "lowest"),
                             net.const(np.float32(0.0), "zero_f")], scope)
    for layer in range(layers):
        s = f"/encoder/layer.{layer}"
        heads_of = lambda t, perm: net.op("Transpose", [net.op(  # noqa: E731
            "Reshape", [t, net.const(np.array([1, tokens, heads, d], np.int64), "shape")], s)], s, perm=perm)
        q = heads_of(net.linear(y, width, width, f"{s}/attention/query"), [0, 2, 1, 3])
        k = heads_of(net.linear(y, width, width, f"{s}/attention/key"), [0, 2, 3, 1])
        v = heads_of(net.linear(y, width, width, f"{s}/attention/value"), [0, 2, 1, 3])
        scores = net.op("Div", [net.op("MatMul", [q, k], f"{s}/attention"), net.const(np.float32(np.sqrt(d)), "sqrt_d")],
                        f"{s}/attention")
        scores = net.op("Add", [scores, m], f"{s}/attention")
        probs = net.op("Softmax", [scores], f"{s}/attention", axis=-1)
        ctx = net.op("Transpose", [net.op("MatMul", [probs, v], f"{s}/attention")], f"{s}/attention", perm=[0, 2, 1, 3])
        ctx = net.op("Reshape", [ctx, net.const(np.array([1, tokens, width], np.int64), "shape")], f"{s}/attention")
        y = net.layernorm(net.op("Add", [net.linear(ctx, width, width, f"{s}/attention/output"), y], s), width,
                          f"{s}/attention/LayerNorm")
        h = net.gelu(net.linear(y, width, 4 * width, f"{s}/intermediate"), GELU_ORDERS[layer % len(GELU_ORDERS)],
                     f"{s}/intermediate/act")
        y = net.layernorm(net.op("Add", [net.linear(h, 4 * width, width, f"{s}/output"), y], s), width,
                          f"{s}/output/LayerNorm")
    net.nodes.append(helper.make_node("Identity", [y], ["hidden"], name="/output/Identity"))
    graph = helper.make_graph(
        net.nodes, "tiny_bert",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, tokens]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, tokens])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, tokens, width])],
        initializer=net.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR)


def encoder_feeds(n: int, tokens: int = 8, vocab: int = 50, seed: int = 1, padded: bool = True) -> list[dict]:
    """Token ids and masks; with `padded`, every other sample has its last positions masked out."""
    rng = np.random.default_rng(seed)
    feeds = []
    for i in range(n):
        mask = np.ones((1, tokens), np.int64)
        if padded and i % 2:
            mask[0, tokens - 1 - i % (tokens // 2):] = 0
        feeds.append({"input_ids": rng.integers(0, vocab, (1, tokens)).astype(np.int64), "attention_mask": mask})
    return feeds
