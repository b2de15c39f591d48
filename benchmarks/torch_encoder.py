"""A BERT encoder written with onnx.helper the way torch's legacy exporter writes one (no torch needed).

What the export of transformers' BertModel (eager attention through torch's scaled_dot_product_attention) holds
and the other encoders here do not: int64 inputs; token-type and position embeddings folded to constants; the
mask as newer transformers build it, `(1 - mask).masked_fill(bool(1 - mask), float32 lowest)`; the attention scale
split as d^-1/4 on the query and on the transposed key; torch's NaN guard `Where(IsNaN(p), 0, p)` after each
Softmax; the exact Erf GELU; LayerNormalization with epsilon 1e-12. Random weights.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from latency_models import Net, _out, _rename

FLOAT32_LOWEST = float(np.finfo(np.float32).min)


def _attention(net: Net, x: str, mask: str, tokens: int, width: int, heads: int) -> str:
    d = width // heads
    scale = net.const(np.float32(d ** -0.25), "scale")

    def split(t: str, perm: list[int]) -> str:
        return net.op("Transpose", [net.reshape(t, [1, tokens, heads, d])], perm=perm)

    q = net.op("Mul", [split(net.linear(x, width, width), [0, 2, 1, 3]), scale])
    k = net.op("Mul", [split(net.linear(x, width, width), [0, 2, 3, 1]), scale])
    v = split(net.linear(x, width, width), [0, 2, 1, 3])
    probs = net.op("Softmax", [net.op("Add", [net.op("MatMul", [q, k]), mask])], axis=-1)
    guarded = net.op("Where", [net.op("IsNaN", [probs]), net.const(np.float32(0), "zero"), probs])
    context = net.op("Transpose", [net.op("MatMul", [guarded, v])], perm=[0, 2, 1, 3])
    return net.linear(net.reshape(context, [1, tokens, width]), width, width)


def _layernorm(net: Net, x: str, width: int) -> str:
    return net.op("LayerNormalization", [x, net.const(np.ones(width, np.float32), "g"),
                                         net.const(np.zeros(width, np.float32), "beta")], axis=-1, epsilon=1e-12)


def torch_export_like(seed: int = 7, tokens: int = 32, layers: int = 2, width: int = 128, heads: int = 4,
                      vocab: int = 30522):
    """input_ids, attention_mask int64 [1, tokens] -> last_hidden_state [1, tokens, width]."""
    net = Net(seed)
    words = net.const(net.rng.normal(0, 0.02, (vocab, width)).astype(np.float32), "words")
    y = net.op("Add", [net.op("Gather", [words, "input_ids"], axis=0),
                       net.const(net.rng.normal(0, 0.02, (1, 1, width)).astype(np.float32), "token_type")])
    y = _layernorm(net, net.op("Add", [y, net.const(net.rng.normal(0, 0.02, (1, tokens, width)).astype(np.float32),
                                                       "position")]), width)
    m = net.op("Unsqueeze", ["attention_mask", net.const(np.array([1, 2], np.int64), "axes")])
    inverted = net.op("Sub", [net.const(np.float32(1), "one"), net.op("Cast", [m], to=TensorProto.FLOAT)])
    mask = net.op("Where", [net.op("Cast", [inverted], to=TensorProto.BOOL), net.const(np.float32(FLOAT32_LOWEST),
                                                                                      "lowest"), inverted])
    for _ in range(layers):
        y = _layernorm(net, net.op("Add", [_attention(net, y, mask, tokens, width, heads), y]), width)
        y = _layernorm(net, net.op("Add", [net.linear(net.linear(y, width, 4 * width, act="gelu"), 4 * width, width),
                                           y]), width)
    _rename(net, y, "last_hidden_state")
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, tokens]) for n in ("input_ids", "attention_mask")]
    return net.model("torch_export_like", inputs, _out("last_hidden_state", [1, tokens, width]))
