"""Public architectures rebuilt as ONNX graphs with random weights, for fitting and checking the cost model.

Latency depends on shapes and op types, not on weight values, so each model is written with onnx.helper at
the input size its Qualcomm AI Hub model card states (qai-hub-models `models/<id>/info.yaml`):

  published (their AI Hub figures are in the calibration data):
    mobilenet_v2               224x224   torchvision MobileNet-v2
    resnet50                   224x224   torchvision ResNet-50
    yolov8_det                 640x640   Ultralytics YOLOv8-N with its box-decoding head
    vit                        224x224   torchvision ViT-B/16
    deeplabv3_plus_mobilenet   513x513   DeepLabV3+ on MobileNet-v2 (output stride 16, ASPP, decoder)
    bert_base_uncased_hf       1x384     BERT-base (12 layers, 768 wide) with attention mask and the masked-LM
                                         head of its model card (a 768x30522 projection at every position)
  held out (never seen by the fit):
    efficientnet_lite0         224x224   EfficientNet-Lite0 (ReLU6, no squeeze-excite)
    mobilenet_v3_small         224x224   MobileNet-v3-Small (hard-swish, squeeze-excite)
    yolo11_block               640x640   a YOLO11-style stem and C3k2 stages (SiLU)
    distilbert                 1x128     DistilBERT (6 layers, 768 wide)

BatchNorm is folded into the convolutions (as exporters do); transformer models keep LayerNormalization as
one op and GELU in the exporters' Erf form.

`python benchmarks/latency_models.py OUT_DIR` writes every model's float, a8w8 and a16w8 QDQ files (mpstudio's
Quantizer, two random calibration samples) and prints their paths.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR = 10  # ONNX Runtime 1.31 rejects onnx 1.23's default IR version
OPSET = 17


class Net:
    """A graph under construction: nodes, random initializers and unique names."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, array, stem: str = "c") -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        name = self.name(op_type.lower())
        outs = [f"{name}_out{i}" if n_out > 1 else name for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs if n_out > 1 else outs[0]

    # ---- convolutional pieces ----
    def conv(self, x: str, cin: int, cout: int, k: int = 1, s: int = 1, group: int = 1, dilation: int = 1,
             act: str | None = None, pad: int | None = None) -> str:
        fan_in = k * k * cin // group
        w = self.const(self.rng.normal(0, (2 / fan_in) ** 0.5, (cout, cin // group, k, k)).astype(np.float32), "w")
        b = self.const(self.rng.normal(0, 0.01, cout).astype(np.float32), "b")
        p = dilation * (k - 1) // 2 if pad is None else pad
        y = self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, group=group,
                    dilations=[dilation, dilation])
        return self.act(y, act)

    def act(self, x: str, act: str | None) -> str:
        if act is None:
            return x
        if act == "relu":
            return self.op("Relu", [x])
        if act == "relu6":
            return self.op("Clip", [x, self.const(np.float32(0), "zero"), self.const(np.float32(6), "six")])
        if act == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if act == "hardswish":
            return self.op("HardSwish", [x])
        if act == "hardsigmoid":
            return self.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5)
        if act == "gelu":  # the exporters' Erf form
            erf = self.op("Erf", [self.op("Div", [x, self.const(np.float32(2 ** 0.5))])])
            half = self.op("Mul", [x, self.const(np.float32(0.5))])
            return self.op("Mul", [half, self.op("Add", [erf, self.const(np.float32(1))])])
        raise ValueError(act)

    def linear(self, x: str, cin: int, cout: int, act: str | None = None) -> str:
        w = self.const(self.rng.normal(0, cin ** -0.5, (cin, cout)).astype(np.float32), "w")
        b = self.const(np.zeros(cout, np.float32), "b")
        return self.act(self.op("Add", [self.op("MatMul", [x, w]), b]), act)

    def layernorm(self, x: str, width: int) -> str:
        return self.op("LayerNormalization", [x, self.const(np.ones(width, np.float32), "g"),
                                              self.const(np.zeros(width, np.float32), "beta")], axis=-1,
                       epsilon=1e-6)

    def reshape(self, x: str, shape) -> str:
        return self.op("Reshape", [x, self.const(np.array(shape, np.int64), "shape")])

    def resize(self, x: str, scale: float | None = None, size=None, mode: str = "linear") -> str:
        if size is not None:
            return self.op("Resize", [x, "", "", self.const(np.array(size, np.int64), "size")], mode=mode)
        return self.op("Resize", [x, "", self.const(np.array([1, 1, scale, scale], np.float32), "scales")],
                       mode=mode)

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR)


def _image(size: int):
    return [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])]


def _out(name: str, shape) -> list:
    return [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)]


def _rename(net: Net, tensor: str, name: str) -> None:
    net.op("Identity", [tensor])
    net.nodes[-1].output[0] = name


# ---- published architectures ----------------------------------------------------------------------------
def _mobilenet_v2_features(net: Net, x: str, dilate_after_16: bool = False) -> tuple[str, str]:
    """MobileNet-v2 inverted residuals; (stride-4 24-channel feature, last 320-channel feature)."""
    y, cin, low = net.conv(x, 3, 32, 3, 2, act="relu6"), 32, ""
    stride_so_far, dilation = 2, 1
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            if dilate_after_16 and stride_so_far * stride > 16:
                dilation, stride = dilation * stride, 1
            stride_so_far *= stride
            hidden = cin * t
            h = y if t == 1 else net.conv(y, cin, hidden, 1, act="relu6")
            h = net.conv(h, hidden, hidden, 3, stride, group=hidden, dilation=dilation, act="relu6")
            h = net.conv(h, hidden, c, 1)
            if stride == 1 and cin == c:
                h = net.op("Add", [y, h])
            y, cin = h, c
            if c == 24 and not low and i == n - 1:
                low = y
    return low, y


def mobilenet_v2(size: int = 224) -> onnx.ModelProto:
    net = Net(1)
    _, y = _mobilenet_v2_features(net, "x")
    y = net.conv(y, 320, 1280, 1, act="relu6")
    y = net.op("Flatten", [net.op("GlobalAveragePool", [y])])
    logits = net.op("Gemm", [y, net.const(net.rng.normal(0, 0.03, (1000, 1280)).astype(np.float32)),
                             net.const(np.zeros(1000, np.float32))], transB=1)
    _rename(net, logits, "logits")
    return net.model("mobilenet_v2", _image(size), _out("logits", [1, 1000]))


def resnet50(size: int = 224) -> onnx.ModelProto:
    net = Net(2)
    y = net.conv("x", 3, 64, 7, 2, act="relu")
    y = net.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            s = stride if i == 0 else 1
            h = net.conv(y, cin, width, 1, act="relu")
            h = net.conv(h, width, width, 3, s, act="relu")
            h = net.conv(h, width, width * 4, 1)
            skip = net.conv(y, cin, width * 4, 1, s) if (s != 1 or cin != width * 4) else y
            y, cin = net.op("Relu", [net.op("Add", [h, skip])]), width * 4
    y = net.op("Flatten", [net.op("GlobalAveragePool", [y])])
    logits = net.op("Gemm", [y, net.const(net.rng.normal(0, 0.02, (1000, 2048)).astype(np.float32)),
                             net.const(np.zeros(1000, np.float32))], transB=1)
    _rename(net, logits, "logits")
    return net.model("resnet50", _image(size), _out("logits", [1, 1000]))


def _c2f(net: Net, x: str, c1: int, c2: int, n: int, shortcut: bool, k3: bool = False) -> str:
    c = c2 // 2
    y = net.conv(x, c1, 2 * c, 1, act="silu")
    parts = net.op("Split", [y, net.const(np.array([c, c], np.int64), "split")], n_out=2, axis=1)
    outs = list(parts)
    last = parts[1]
    for _ in range(n):
        if k3:  # YOLO11's C3k: two bottlenecks behind a 1x1 split of its own
            a = net.conv(last, c, c // 2, 1, act="silu")
            b = net.conv(last, c, c // 2, 1, act="silu")
            for _ in range(2):
                a = net.op("Add", [a, net.conv(net.conv(a, c // 2, c // 2, 3, act="silu"), c // 2, c // 2, 3,
                                                act="silu")])
            h = net.conv(net.op("Concat", [a, b], axis=1), c, c, 1, act="silu")
        else:
            h = net.conv(net.conv(last, c, c, 3, act="silu"), c, c, 3, act="silu")
            if shortcut:
                h = net.op("Add", [last, h])
        outs.append(h)
        last = h
    return net.conv(net.op("Concat", outs, axis=1), (2 + n) * c, c2, 1, act="silu")


def _sppf(net: Net, x: str, c1: int, c2: int) -> str:
    c = c1 // 2
    y = net.conv(x, c1, c, 1, act="silu")
    pools = [y]
    for _ in range(3):
        pools.append(net.op("MaxPool", [pools[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
    return net.conv(net.op("Concat", pools, axis=1), 4 * c, c2, 1, act="silu")


def _detect(net: Net, feats: list[tuple[str, int, int]], nc: int = 80, reg_max: int = 16) -> tuple[str, str]:
    """YOLOv8's detection head with DFL box decoding: (boxes [1, 4, A], class scores [1, nc, A])."""
    c2, c3 = max(16, feats[0][1] // 4, reg_max * 4), max(feats[0][1], min(nc, 100))
    boxes, scores, anchors = [], [], 0
    for x, ch, hw in feats:
        b = net.conv(net.conv(net.conv(x, ch, c2, 3, act="silu"), c2, c2, 3, act="silu"), c2, 4 * reg_max, 1)
        s = net.conv(net.conv(net.conv(x, ch, c3, 3, act="silu"), c3, c3, 3, act="silu"), c3, nc, 1)
        boxes.append(net.reshape(b, [1, 4 * reg_max, hw * hw]))
        scores.append(net.reshape(s, [1, nc, hw * hw]))
        anchors += hw * hw
    box = net.op("Concat", boxes, axis=2)
    score = net.op("Sigmoid", [net.op("Concat", scores, axis=2)])
    # DFL: a softmax over reg_max bins per side, then the expectation (a 1x1 conv with weights 0..reg_max-1).
    d = net.op("Softmax", [net.op("Transpose", [net.reshape(box, [1, 4, reg_max, anchors])], perm=[0, 2, 1, 3])],
               axis=1)
    w = net.const(np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1), "dfl")
    d = net.reshape(net.op("Conv", [d, w], kernel_shape=[1, 1]), [1, 4, anchors])
    lt, rb = net.op("Split", [d, net.const(np.array([2, 2], np.int64), "split")], n_out=2, axis=1)
    points = net.const(net.rng.uniform(0, 80, (1, 2, anchors)).astype(np.float32), "anchors")
    strides = net.const(net.rng.choice([8.0, 16.0, 32.0], (1, 1, anchors)).astype(np.float32), "strides")
    x1y1, x2y2 = net.op("Sub", [points, lt]), net.op("Add", [points, rb])
    centre = net.op("Div", [net.op("Add", [x1y1, x2y2]), net.const(np.float32(2))])
    wh = net.op("Sub", [x2y2, x1y1])
    return net.op("Mul", [net.op("Concat", [centre, wh], axis=1), strides]), score


def yolov8_det(size: int = 640) -> onnx.ModelProto:
    net = Net(3)
    y = net.conv(net.conv("x", 3, 16, 3, 2, act="silu"), 16, 32, 3, 2, act="silu")
    y = _c2f(net, y, 32, 32, 1, True)
    p3 = _c2f(net, net.conv(y, 32, 64, 3, 2, act="silu"), 64, 64, 2, True)
    p4 = _c2f(net, net.conv(p3, 64, 128, 3, 2, act="silu"), 128, 128, 2, True)
    p5 = _sppf(net, _c2f(net, net.conv(p4, 128, 256, 3, 2, act="silu"), 256, 256, 1, True), 256, 256)
    h4 = _c2f(net, net.op("Concat", [net.resize(p5, 2.0, mode="nearest"), p4], axis=1), 384, 128, 1, False)
    n3 = _c2f(net, net.op("Concat", [net.resize(h4, 2.0, mode="nearest"), p3], axis=1), 192, 64, 1, False)
    n4 = _c2f(net, net.op("Concat", [net.conv(n3, 64, 64, 3, 2, act="silu"), h4], axis=1), 192, 128, 1, False)
    n5 = _c2f(net, net.op("Concat", [net.conv(n4, 128, 128, 3, 2, act="silu"), p5], axis=1), 384, 256, 1, False)
    s = size // 8
    boxes, scores = _detect(net, [(n3, 64, s), (n4, 128, s // 2), (n5, 256, s // 4)])
    _rename(net, boxes, "boxes")
    _rename(net, scores, "scores")
    anchors = s * s + (s // 2) ** 2 + (s // 4) ** 2
    return net.model("yolov8_det", _image(size), _out("boxes", [1, 4, anchors]) + _out("scores", [1, 80, anchors]))


def _encoder_layer(net: Net, x: str, tokens: int, width: int, heads: int, mlp: int, mask: str | None = None,
                   pre_norm: bool = True, mlp_act: str = "gelu") -> str:
    d = width // heads
    h = net.layernorm(x, width) if pre_norm else x
    qkv = []
    for _ in range(3):
        t = net.reshape(net.linear(h, width, width), [1, tokens, heads, d])
        qkv.append(t)
    q = net.op("Transpose", [qkv[0]], perm=[0, 2, 1, 3])
    k = net.op("Transpose", [qkv[1]], perm=[0, 2, 3, 1])
    v = net.op("Transpose", [qkv[2]], perm=[0, 2, 1, 3])
    scores = net.op("Div", [net.op("MatMul", [q, k]), net.const(np.float32(d ** 0.5))])
    if mask is not None:
        scores = net.op("Add", [scores, mask])
    attn = net.op("MatMul", [net.op("Softmax", [scores], axis=-1), v])
    attn = net.reshape(net.op("Transpose", [attn], perm=[0, 2, 1, 3]), [1, tokens, width])
    x = net.op("Add", [x, net.linear(attn, width, width)])
    if not pre_norm:
        x = net.layernorm(x, width)
    h = net.layernorm(x, width) if pre_norm else x
    x = net.op("Add", [x, net.linear(net.linear(h, width, mlp, act=mlp_act), mlp, width)])
    return x if pre_norm else net.layernorm(x, width)


def vit(size: int = 224, width: int = 768, depth: int = 12, heads: int = 12, patch: int = 16) -> onnx.ModelProto:
    net = Net(4)
    tokens = (size // patch) ** 2
    y = net.conv("x", 3, width, patch, patch, pad=0)
    y = net.op("Transpose", [net.reshape(y, [1, width, tokens])], perm=[0, 2, 1])
    cls = net.const(net.rng.normal(0, 0.02, (1, 1, width)).astype(np.float32), "cls")
    y = net.op("Concat", [cls, y], axis=1)
    y = net.op("Add", [y, net.const(net.rng.normal(0, 0.02, (1, tokens + 1, width)).astype(np.float32), "pos")])
    for _ in range(depth):
        y = _encoder_layer(net, y, tokens + 1, width, heads, 4 * width)
    y = net.layernorm(y, width)
    y = net.reshape(net.op("Gather", [y, net.const(np.array(0, np.int64), "index")], axis=1), [1, width])
    logits = net.op("Gemm", [y, net.const(net.rng.normal(0, 0.02, (1000, width)).astype(np.float32)),
                             net.const(np.zeros(1000, np.float32))], transB=1)
    _rename(net, logits, "logits")
    return net.model("vit", _image(size), _out("logits", [1, 1000]))


def deeplabv3_plus_mobilenet(size: int = 513, classes: int = 21) -> onnx.ModelProto:
    net = Net(5)
    low, high = _mobilenet_v2_features(net, "x", dilate_after_16=True)
    hs = -(-size // 16)  # 33 at 513
    ls = -(-size // 4)  # 129
    branches = [net.conv(high, 320, 256, 1, act="relu")]
    for rate in (6, 12, 18):
        branches.append(net.conv(high, 320, 256, 3, dilation=rate, act="relu"))
    pooled = net.conv(net.op("GlobalAveragePool", [high]), 320, 256, 1, act="relu")
    branches.append(net.resize(pooled, size=[1, 256, hs, hs]))
    y = net.conv(net.op("Concat", branches, axis=1), 1280, 256, 1, act="relu")
    y = net.resize(y, size=[1, 256, ls, ls])
    low = net.conv(low, 24, 48, 1, act="relu")
    y = net.conv(net.op("Concat", [y, low], axis=1), 304, 256, 3, act="relu")
    y = net.conv(y, 256, 256, 3, act="relu")
    y = net.resize(net.conv(y, 256, classes, 1), size=[1, classes, size, size])
    _rename(net, y, "mask")
    return net.model("deeplabv3_plus_mobilenet", _image(size), _out("mask", [1, classes, size, size]))


def _bert(name: str, seed: int, tokens: int, layers: int, width: int = 768, heads: int = 12,
          vocab: int = 30522, mlm_head: bool = False) -> onnx.ModelProto:
    net = Net(seed)
    words = net.const(net.rng.normal(0, 0.02, (vocab, width)).astype(np.float32), "words")
    y = net.op("Gather", [words, "input_ids"], axis=0)
    y = net.op("Add", [y, net.const(net.rng.normal(0, 0.02, (1, tokens, width)).astype(np.float32), "pos")])
    y = net.layernorm(y, width)
    # The additive attention mask: (1 - mask) * -10000, broadcast over heads and query positions.
    m = net.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    m = net.op("Mul", [net.op("Sub", [net.const(np.float32(1)), m]), net.const(np.float32(-10000))])
    m = net.reshape(m, [1, 1, 1, tokens])
    for _ in range(layers):
        y = _encoder_layer(net, y, tokens, width, heads, 4 * width, mask=m, pre_norm=False)
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, tokens]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT32, [1, tokens])]
    if mlm_head:  # BertForMaskedLM: transform (dense, GELU, LayerNorm), then the vocabulary projection
        y = net.linear(net.layernorm(net.linear(y, width, width, act="gelu"), width), width, vocab)
        _rename(net, y, "logits")
        return net.model(name, inputs, _out("logits", [1, tokens, vocab]))
    _rename(net, y, "hidden")
    return net.model(name, inputs, _out("hidden", [1, tokens, width]))


def bert_base_uncased_hf(tokens: int = 384) -> onnx.ModelProto:
    return _bert("bert_base_uncased_hf", 6, tokens, 12, mlm_head=True)


# ---- held-out architectures --------------------------------------------------------------------------------
def efficientnet_lite0(size: int = 224) -> onnx.ModelProto:
    net = Net(7)
    y, cin = net.conv("x", 3, 32, 3, 2, act="relu6"), 32
    for t, k, s, c, n in [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                          (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]:
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            h = y if t == 1 else net.conv(y, cin, hidden, 1, act="relu6")
            h = net.conv(net.conv(h, hidden, hidden, k, stride, group=hidden, act="relu6"), hidden, c, 1)
            y, cin = (net.op("Add", [y, h]) if stride == 1 and cin == c else h), c
    y = net.op("Flatten", [net.op("GlobalAveragePool", [net.conv(y, 320, 1280, 1, act="relu6")])])
    logits = net.op("Gemm", [y, net.const(net.rng.normal(0, 0.03, (1000, 1280)).astype(np.float32)),
                             net.const(np.zeros(1000, np.float32))], transB=1)
    _rename(net, logits, "logits")
    return net.model("efficientnet_lite0", _image(size), _out("logits", [1, 1000]))


def mobilenet_v3_small(size: int = 224) -> onnx.ModelProto:
    net = Net(8)
    y, cin = net.conv("x", 3, 16, 3, 2, act="hardswish"), 16
    for k, exp, c, se, act, s in [(3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2),
                                  (3, 88, 24, False, "relu", 1), (5, 96, 40, True, "hardswish", 2),
                                  (5, 240, 40, True, "hardswish", 1), (5, 240, 40, True, "hardswish", 1),
                                  (5, 120, 48, True, "hardswish", 1), (5, 144, 48, True, "hardswish", 1),
                                  (5, 288, 96, True, "hardswish", 2), (5, 576, 96, True, "hardswish", 1),
                                  (5, 576, 96, True, "hardswish", 1)]:
        h = y if exp == cin else net.conv(y, cin, exp, 1, act=act)
        h = net.conv(h, exp, exp, k, s, group=exp, act=act)
        if se:
            squeeze = max(8, (exp // 4 + 4) // 8 * 8)
            g = net.conv(net.op("GlobalAveragePool", [h]), exp, squeeze, 1, act="relu")
            h = net.op("Mul", [h, net.conv(g, squeeze, exp, 1, act="hardsigmoid")])
        h = net.conv(h, exp, c, 1)
        y, cin = (net.op("Add", [y, h]) if s == 1 and cin == c else h), c
    y = net.op("GlobalAveragePool", [net.conv(y, 96, 576, 1, act="hardswish")])
    y = net.op("Flatten", [net.conv(y, 576, 1024, 1, act="hardswish")])
    logits = net.op("Gemm", [y, net.const(net.rng.normal(0, 0.03, (1000, 1024)).astype(np.float32)),
                             net.const(np.zeros(1000, np.float32))], transB=1)
    _rename(net, logits, "logits")
    return net.model("mobilenet_v3_small", _image(size), _out("logits", [1, 1000]))


def yolo11_block(size: int = 640) -> onnx.ModelProto:
    """YOLO11-N's backbone (C3k2 stages, SPPF) with a 1x1 head per stride: SiLU everywhere."""
    net = Net(9)
    y = net.conv(net.conv("x", 3, 16, 3, 2, act="silu"), 16, 32, 3, 2, act="silu")
    y = _c2f(net, y, 32, 64, 1, True)
    p3 = _c2f(net, net.conv(y, 64, 64, 3, 2, act="silu"), 64, 128, 1, True)
    p4 = _c2f(net, net.conv(p3, 128, 128, 3, 2, act="silu"), 128, 128, 1, True, k3=True)
    p5 = _sppf(net, _c2f(net, net.conv(p4, 128, 256, 3, 2, act="silu"), 256, 256, 1, True, k3=True), 256, 256)
    outs = []
    for i, (feat, ch) in enumerate(((p3, 128), (p4, 128), (p5, 256))):
        out = net.conv(feat, ch, 84, 1)
        _rename(net, out, f"head{i}")
        outs += _out(f"head{i}", [1, 84, size // 8 >> i, size // 8 >> i])
    return net.model("yolo11_block", _image(size), outs)


def distilbert(tokens: int = 128) -> onnx.ModelProto:
    return _bert("distilbert", 10, tokens, 6)


@dataclass(frozen=True)
class Architecture:
    name: str
    build: Callable[[], onnx.ModelProto]
    published: bool  # True: AI Hub publishes its latencies (the fit may use them); False: held out


ARCHITECTURES = (
    Architecture("mobilenet_v2", mobilenet_v2, True),
    Architecture("resnet50", resnet50, True),
    Architecture("yolov8_det", yolov8_det, True),
    Architecture("vit", vit, True),
    Architecture("deeplabv3_plus_mobilenet", deeplabv3_plus_mobilenet, True),
    Architecture("bert_base_uncased_hf", bert_base_uncased_hf, True),
    Architecture("efficientnet_lite0", efficientnet_lite0, False),
    Architecture("mobilenet_v3_small", mobilenet_v3_small, False),
    Architecture("yolo11_block", yolo11_block, False),
    Architecture("distilbert", distilbert, False),
)
PRECISIONS = ("float", "w8a8", "w8a16")


def random_feeds(model: onnx.ModelProto, count: int = 2, seed: int = 0) -> list[dict]:
    """Calibration samples: normal images, or token ids and an all-ones mask."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        feed = {}
        for vi in model.graph.input:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            if vi.type.tensor_type.elem_type == TensorProto.INT32:
                feed[vi.name] = (rng.integers(0, 30000, shape) if vi.name == "input_ids"
                                 else np.ones(shape)).astype(np.int32)
            else:
                feed[vi.name] = rng.normal(0, 1, shape).astype(np.float32)
        feeds.append(feed)
    return feeds


def build(arch: Architecture, cache_dir: Path) -> dict[str, Path]:
    """{precision: model file}: the float model and its a8w8 / a16w8 QDQ models, cached in `cache_dir`."""
    from mpstudio.data import FeedList
    from mpstudio.model import prepare_model
    from mpstudio.plan import PrecisionPlan
    from mpstudio.quantize import Quantizer

    model = arch.build()
    quantizer = Quantizer(prepare_model(model), FeedList(random_feeds(model)), cache_dir / arch.name)
    return {"float": quantizer.float_path, "w8a8": quantizer.generate(PrecisionPlan.a8w8()),
            "w8a16": quantizer.generate(PrecisionPlan.a16w8())}


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "latency-models")
    names = set(argv[2:])
    for arch in ARCHITECTURES:
        if names and arch.name not in names:
            continue
        for precision, path in build(arch, out).items():
            print(f"{arch.name:26s} {precision:6s} {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
