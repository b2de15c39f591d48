"""The last three architectures of the published latencies (benchmarks/data/aihub_published_latency_more.csv),
rebuilt with random weights (onnx.helper, no torch) at the input sizes Qualcomm AI Hub profiled them:

    yolov10_det         640x640   Ultralytics YOLOv10-N: YOLOv8-N's trunk with SCDown (1x1 + strided depthwise),
                                  PSA attention at stride 32, C2fCIB (depthwise 3x3 / 7x7) and the one-to-one head
                                  (depthwise-separable class branch), with its DFL box decoding
    face_det_lite       480x640   the zoo's FaceDetLite: a grey-image MobileNet-v3-style backbone (full 3x3
                                  convolutions, squeeze-excite), two nearest-upsampling merges, a context module and
                                  three 1x1 heads at stride 8
    depth_anything_v2   518x518   Depth Anything V2 Small: DINOv2 ViT-S/14 (1370 tokens, layer scale), four
                                  reassembled feature maps (transposed convs, strided conv), the DPT fusion stages
                                  (pre-activation residual units, bilinear x2) and the depth head at 518x518

BatchNorm that follows a convolution is folded into it, as exporters do.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from latency_models import Architecture, Net, _c2f, _encoder_layer, _out, _rename, _sppf


# ---- YOLOv10-N ------------------------------------------------------------------------------------------------
def _sc_down(net: Net, x: str, cin: int, cout: int) -> str:
    """SCDown: a 1x1 conv (SiLU), then a stride-2 depthwise 3x3 conv without activation."""
    return net.conv(net.conv(x, cin, cout, 1, act="silu"), cout, cout, 3, 2, group=cout)


def _psa(net: Net, x: str, c: int, h: int, w: int) -> str:
    """PSA: split a 1x1 conv's output, run attention (heads of 64, keys of 32, a depthwise positional conv) and
    a feed-forward on one half, concatenate."""
    half, heads = c // 2, max(c // 2 // 64, 1)
    key, head = 32, 64
    a, b = net.op("Split", [net.conv(x, c, c, 1, act="silu"), net.const(np.array([half, half], np.int64), "split")],
                  n_out=2, axis=1)
    qkv = net.reshape(net.conv(b, half, half + 2 * key * heads, 1), [1, heads, 2 * key + head, h * w])
    q, k, v = net.op("Split", [qkv, net.const(np.array([key, key, head], np.int64), "split")], n_out=3, axis=2)
    attn = net.op("Mul", [net.op("MatMul", [net.op("Transpose", [q], perm=[0, 1, 3, 2]), k]),
                          net.const(np.float32(key ** -0.5))])
    attn = net.op("Softmax", [attn], axis=-1)
    y = net.reshape(net.op("MatMul", [v, net.op("Transpose", [attn], perm=[0, 1, 3, 2])]), [1, half, h, w])
    y = net.op("Add", [y, net.conv(net.reshape(v, [1, half, h, w]), half, half, 3, group=half)])
    b = net.op("Add", [b, net.conv(y, half, half, 1)])
    b = net.op("Add", [b, net.conv(net.conv(b, half, 2 * half, 1, act="silu"), 2 * half, half, 1)])
    return net.conv(net.op("Concat", [a, b], axis=1), c, c, 1, act="silu")


def _c2f_cib(net: Net, x: str, c1: int, c2: int) -> str:
    """C2fCIB (one block, shortcut, large kernel): C2f whose bottleneck is depthwise 3x3, 1x1, depthwise 7x7 (the
    re-parameterised RepVGGDW), 1x1, depthwise 3x3, all with SiLU."""
    c = c2 // 2
    parts = net.op("Split", [net.conv(x, c1, 2 * c, 1, act="silu"), net.const(np.array([c, c], np.int64), "split")],
                   n_out=2, axis=1)
    h = net.conv(parts[1], c, c, 3, group=c, act="silu")
    h = net.conv(net.conv(h, c, 2 * c, 1, act="silu"), 2 * c, 2 * c, 7, group=2 * c, act="silu")
    h = net.conv(net.conv(h, 2 * c, c, 1, act="silu"), c, c, 3, group=c, act="silu")
    h = net.op("Add", [parts[1], h])
    return net.conv(net.op("Concat", [*parts, h], axis=1), 3 * c, c2, 1, act="silu")


def _v10_head(net: Net, feats, nc: int = 80, reg_max: int = 16) -> tuple[str, str]:
    """v10Detect's one-to-one branches (boxes: two 3x3 convs; classes: two depthwise-separable pairs) with
    YOLOv8's DFL decoding: (boxes [1, 4, A], class scores [1, nc, A])."""
    c2, c3 = max(16, feats[0][1] // 4, reg_max * 4), max(feats[0][1], min(nc, 100))
    boxes, scores, anchors = [], [], 0
    for x, ch, hw in feats:
        b = net.conv(net.conv(net.conv(x, ch, c2, 3, act="silu"), c2, c2, 3, act="silu"), c2, 4 * reg_max, 1)
        s = net.conv(net.conv(x, ch, ch, 3, group=ch, act="silu"), ch, c3, 1, act="silu")
        s = net.conv(net.conv(s, c3, c3, 3, group=c3, act="silu"), c3, c3, 1, act="silu")
        boxes.append(net.reshape(b, [1, 4 * reg_max, hw * hw]))
        scores.append(net.reshape(net.conv(s, c3, nc, 1), [1, nc, hw * hw]))
        anchors += hw * hw
    d = net.op("Softmax", [net.op("Transpose", [net.reshape(net.op("Concat", boxes, axis=2), [1, 4, reg_max, anchors])],
                                  perm=[0, 2, 1, 3])], axis=1)
    w = net.const(np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1), "dfl")
    d = net.reshape(net.op("Conv", [d, w], kernel_shape=[1, 1]), [1, 4, anchors])
    lt, rb = net.op("Split", [d, net.const(np.array([2, 2], np.int64), "split")], n_out=2, axis=1)
    points = net.const(net.rng.uniform(0, 80, (1, 2, anchors)).astype(np.float32), "anchors")
    strides = net.const(net.rng.choice([8.0, 16.0, 32.0], (1, 1, anchors)).astype(np.float32), "strides")
    box = net.op("Mul", [net.op("Concat", [net.op("Sub", [points, lt]), net.op("Add", [points, rb])], axis=1), strides])
    return box, net.op("Sigmoid", [net.op("Concat", scores, axis=2)])


def yolov10_det(size: int = 640) -> onnx.ModelProto:
    net = Net(21)
    y = net.conv(net.conv("x", 3, 16, 3, 2, act="silu"), 16, 32, 3, 2, act="silu")
    y = _c2f(net, y, 32, 32, 1, True)
    p3 = _c2f(net, net.conv(y, 32, 64, 3, 2, act="silu"), 64, 64, 2, True)
    p4 = _c2f(net, _sc_down(net, p3, 64, 128), 128, 128, 2, True)
    p5 = _sppf(net, _c2f(net, _sc_down(net, p4, 128, 256), 256, 256, 1, True), 256, 256)
    p5 = _psa(net, p5, 256, size // 32, size // 32)
    h4 = _c2f(net, net.op("Concat", [net.resize(p5, 2.0, mode="nearest"), p4], axis=1), 384, 128, 1, False)
    n3 = _c2f(net, net.op("Concat", [net.resize(h4, 2.0, mode="nearest"), p3], axis=1), 192, 64, 1, False)
    n4 = _c2f(net, net.op("Concat", [net.conv(n3, 64, 64, 3, 2, act="silu"), h4], axis=1), 192, 128, 1, False)
    n5 = _c2f_cib(net, net.op("Concat", [_sc_down(net, n4, 128, 128), p5], axis=1), 384, 256)
    s = size // 8
    boxes, scores = _v10_head(net, [(n3, 64, s), (n4, 128, s // 2), (n5, 256, s // 4)])
    _rename(net, boxes, "boxes")
    _rename(net, scores, "scores")
    anchors = s * s + (s // 2) ** 2 + (s // 4) ** 2
    return net.model("yolov10_det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                     _out("boxes", [1, 4, anchors]) + _out("scores", [1, 80, anchors]))


# ---- FaceDetLite ----------------------------------------------------------------------------------------------
def _squeeze_excite(net: Net, x: str, c: int) -> str:
    g = net.conv(net.op("GlobalAveragePool", [x]), c, c // 4, 1, act="relu")
    return net.op("Mul", [x, net.op("Sigmoid", [net.conv(g, c // 4, c, 1)])])


def _block3x3(net: Net, x: str, k: int, cin: int, expand: int, cout: int, se: bool, stride: int) -> str:
    """The zoo's Block3x3: 1x1 expand, full 3x3 convs (two when k is 5, the second strided), squeeze-excite,
    residual at stride 1 (a 1x1 conv where widths differ)."""
    h = net.conv(net.conv(x, cin, expand, 1, act="relu"), expand, cout, 3, 1 if k == 5 else stride, act="relu")
    if k == 5:
        h = net.conv(h, cout, cout, 3, stride, act="relu")
    if se:
        h = _squeeze_excite(net, h, cout)
    if stride != 1:
        return h
    return net.op("Add", [h, x if cin == cout else net.conv(x, cin, cout, 1)])


def face_det_lite(height: int = 480, width: int = 640, wide: int = 32) -> onnx.ModelProto:
    net = Net(22)
    y = net.conv("x", 1, 16, 3, 2, act="relu")
    kept = []
    for i, spec in enumerate([(3, 16, 16, 16, False, 2), (3, 16, 64, 32, False, 2), (3, 32, 96, 32, False, 1),
                              (5, 32, 96, 32, True, 2), (5, 32, 224, 32, True, 1), (5, 32, 224, 32, True, 1),
                              (5, 32, 128, 64, True, 1), (5, 64, 160, 64, True, 1), (5, 64, 256, 96, True, 2)]):
        y = _block3x3(net, y, *spec)
        if i in (2, 7):
            kept.append(y)
    s8, s16 = kept
    y = net.conv(y, 96, wide, 1, act="relu")
    for skip, c in ((s16, 64), (s8, 32)):
        up = net.conv(net.resize(y, 2.0, mode="nearest"), wide, wide, 3, act="relu")
        y = net.op("Add", [up, net.conv(skip, c, wide, 1, act="relu")])
    quarter = wide // 4
    inner = net.conv(y, wide, quarter, 3, act="relu")
    context = net.op("Concat", [net.conv(inner, quarter, quarter, 3, act="relu"),
                                net.conv(net.conv(inner, quarter, quarter, 3, act="relu"), quarter, quarter, 3,
                                         act="relu")], axis=1)
    y = net.op("Concat", [net.conv(y, wide, wide // 2, 3, act="relu"), context], axis=1)
    outputs = []
    for name, c in (("heatmap", 1), ("bbox", 4), ("landmark", 10)):
        _rename(net, net.conv(y, wide, c, 1), name)
        outputs += _out(name, [1, c, height // 8, width // 8])
    return net.model("face_det_lite", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, height, width])],
                     outputs)


# ---- Depth Anything V2 Small ----------------------------------------------------------------------------------
def _residual_unit(net: Net, x: str, c: int) -> str:
    """The DPT fusion's pre-activation residual unit: ReLU, 3x3, ReLU, 3x3, plus the input."""
    h = net.conv(net.op("Relu", [x]), c, c, 3, act="relu")
    return net.op("Add", [x, net.conv(h, c, c, 3)])


def depth_anything_v2(size: int = 518, width: int = 384, depth: int = 12, heads: int = 6, patch: int = 14,
                      fusion: int = 64) -> onnx.ModelProto:
    net = Net(23)
    side = size // patch
    tokens = side * side + 1
    y = net.conv("x", 3, width, patch, patch, pad=0)
    y = net.op("Transpose", [net.reshape(y, [1, width, tokens - 1])], perm=[0, 2, 1])
    y = net.op("Concat", [net.const(net.rng.normal(0, 0.02, (1, 1, width)).astype(np.float32), "cls"), y], axis=1)
    y = net.op("Add", [y, net.const(net.rng.normal(0, 0.02, (1, tokens, width)).astype(np.float32), "pos")])
    taps = []
    for layer in range(depth):
        y = _encoder_layer(net, y, tokens, width, heads, 4 * width)  # DINOv2's layer scales fold into the linears
        if layer in (2, 5, 8, 11):
            t = net.op("Slice", [net.layernorm(y, width), net.const(np.array([1], np.int64)),
                                 net.const(np.array([tokens], np.int64)), net.const(np.array([1], np.int64))])
            taps.append(net.reshape(net.op("Transpose", [t], perm=[0, 2, 1]), [1, width, side, side]))
    maps = []
    for tap, channels, factor in zip(taps, (48, 96, 192, 384), (4, 2, 1, 0.5)):
        h = net.conv(tap, width, channels, 1)
        if factor > 1:
            k = int(factor)
            w = net.const(net.rng.normal(0, 0.02, (channels, channels, k, k)).astype(np.float32), "w")
            h = net.op("ConvTranspose", [h, w, net.const(np.zeros(channels, np.float32), "b")], kernel_shape=[k, k],
                       strides=[k, k])
        elif factor < 1:
            h = net.conv(h, channels, channels, 3, 2)
        maps.append(net.conv(h, channels, fusion, 3))
    sizes = [side * 4, side * 2, side, -(-side // 2)]
    y = None
    for i in (3, 2, 1, 0):
        y = maps[i] if y is None else _residual_unit(net, net.op("Add", [y, _residual_unit(net, maps[i], fusion)]),
                                                     fusion)
        if y is maps[i]:
            y = _residual_unit(net, y, fusion)
        target = sizes[i - 1] if i else sizes[0] * 2
        y = net.conv(net.resize(y, size=[1, fusion, target, target]), fusion, fusion, 1)
    y = net.conv(y, fusion, fusion // 2, 3)
    y = net.conv(net.resize(y, size=[1, fusion // 2, size, size]), fusion // 2, fusion // 2, 3, act="relu")
    y = net.conv(y, fusion // 2, 1, 1, act="relu")
    _rename(net, y, "depth")
    return net.model("depth_anything_v2", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                     _out("depth", [1, 1, size, size]))


ADDED_ARCHITECTURES = (
    Architecture("yolov10_det", yolov10_det, True),
    Architecture("face_det_lite", face_det_lite, True),
    Architecture("depth_anything_v2", depth_anything_v2, True),
)
