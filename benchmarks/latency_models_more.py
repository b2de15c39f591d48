"""More public architectures rebuilt as ONNX graphs with random weights (onnx.helper, no torch), at the input
sizes Qualcomm AI Hub profiled them (benchmarks/data/aihub_published_latency_more.csv):

    densenet121                    224x224      torchvision DenseNet-121 (BatchNorm before each conv stays an op)
    resnext50                      224x224      torchvision ResNeXt-50 32x4d
    mobilenet_v3_small             224x224      torchvision MobileNet-v3-Small (latency_models.py)
    convnext_tiny                  224x224      torchvision ConvNeXt-Tiny (LayerNorm over channels, GELU)
    resnet_3d                      16x112x112   torchvision video R3D-18
    fcn_resnet50                   520x520      torchvision FCN on a dilated ResNet-50 (output stride 8)
    real_esrgan_general_x4v3       128x128      Real-ESRGAN SRVGGNetCompact (32 convs, PReLU, pixel shuffle x4)
    beit                           224x224      BEiT-base/16 (relative position bias, layer scale, mean pooling)
    opus_mt_en_es__OpusMTEncoder   256 tokens   MarianMT encoder (6 layers, 512 wide, SiLU)
    opus_mt_en_es__OpusMTDecoder   1 token      MarianMT decoder step, KV cache 255 (self) / 256 (cross), LM head
    gear_guard_net                 320x192      the zoo's GearGuardNet (YOLOv5-style on DoubleBlaze blocks)

BatchNorm that follows a convolution is folded into it, as exporters do.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from latency_models import Architecture, Net, _encoder_layer, _image, _out, _rename, mobilenet_v3_small


def _gemm_head(net: Net, y: str, width: int, classes: int = 1000) -> str:
    return net.op("Gemm", [y, net.const(net.rng.normal(0, 0.02, (classes, width)).astype(np.float32)),
                           net.const(np.zeros(classes, np.float32))], transB=1)


def _bn(net: Net, x: str, c: int) -> str:
    return net.op("BatchNormalization", [x, net.const(np.ones(c, np.float32)), net.const(np.zeros(c, np.float32)),
                                         net.const(np.zeros(c, np.float32)), net.const(np.ones(c, np.float32))])


def densenet121(size: int = 224) -> onnx.ModelProto:
    net = Net(11)
    y = net.conv("x", 3, 64, 7, 2, act="relu")
    y = net.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 64
    for i, layers in enumerate((6, 12, 24, 16)):
        feats = [y]
        for _ in range(layers):
            x = net.op("Concat", feats, axis=1) if len(feats) > 1 else feats[0]
            h = net.conv(net.op("Relu", [_bn(net, x, c)]), c, 128, 1, act="relu")  # norm2 folds into conv1
            feats.append(net.conv(h, 128, 32, 3))
            c += 32
        y = net.op("Concat", feats, axis=1)
        if i < 3:
            y = net.conv(net.op("Relu", [_bn(net, y, c)]), c, c // 2, 1)
            y = net.op("AveragePool", [y], kernel_shape=[2, 2], strides=[2, 2])
            c //= 2
    y = net.op("Relu", [_bn(net, y, c)])
    _rename(net, _gemm_head(net, net.op("Flatten", [net.op("GlobalAveragePool", [y])]), c), "logits")
    return net.model("densenet121", _image(size), _out("logits", [1, 1000]))


def _resnet50_trunk(net: Net, groups: int = 1, width_factor: int = 1, dilate=(False, False, False)) -> str:
    y = net.conv("x", 3, 64, 7, 2, act="relu")
    y = net.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin, dilation = 64, 1
    for (planes, blocks, stride), dil in zip([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)],
                                             (False,) + tuple(dilate)):
        previous = dilation
        if dil:
            dilation, stride = dilation * stride, 1
        width = planes * width_factor
        for i in range(blocks):
            s = stride if i == 0 else 1
            d = previous if i == 0 else dilation
            h = net.conv(y, cin, width, 1, act="relu")
            h = net.conv(h, width, width, 3, s, group=groups, dilation=d, act="relu")
            h = net.conv(h, width, planes * 4, 1)
            skip = net.conv(y, cin, planes * 4, 1, s) if (s != 1 or cin != planes * 4) else y
            y, cin = net.op("Relu", [net.op("Add", [h, skip])]), planes * 4
    return y


def resnext50(size: int = 224) -> onnx.ModelProto:
    net = Net(12)
    y = _resnet50_trunk(net, groups=32, width_factor=2)
    _rename(net, _gemm_head(net, net.op("Flatten", [net.op("GlobalAveragePool", [y])]), 2048), "logits")
    return net.model("resnext50", _image(size), _out("logits", [1, 1000]))


def fcn_resnet50(size: int = 520, classes: int = 21) -> onnx.ModelProto:
    net = Net(13)
    y = _resnet50_trunk(net, dilate=(False, True, True))
    y = net.conv(net.conv(y, 2048, 512, 3, act="relu"), 512, classes, 1)
    y = net.resize(y, size=[1, classes, size, size])
    _rename(net, y, "mask")
    return net.model("fcn_resnet50", _image(size), _out("mask", [1, classes, size, size]))


def _layernorm_channels(net: Net, x: str, c: int) -> str:
    """torchvision's LayerNorm2d: permute to channels-last, LayerNorm, permute back."""
    y = net.layernorm(net.op("Transpose", [x], perm=[0, 2, 3, 1]), c)
    return net.op("Transpose", [y], perm=[0, 3, 1, 2])


def convnext_tiny(size: int = 224) -> onnx.ModelProto:
    net = Net(14)
    y = _layernorm_channels(net, net.conv("x", 3, 96, 4, 4, pad=0), 96)
    dims = (96, 192, 384, 768)
    for stage, (depth, c) in enumerate(zip((3, 3, 9, 3), dims)):
        if stage:
            y = net.conv(_layernorm_channels(net, y, dims[stage - 1]), dims[stage - 1], c, 2, 2, pad=0)
        for _ in range(depth):
            h = net.conv(y, c, c, 7, group=c)
            h = net.layernorm(net.op("Transpose", [h], perm=[0, 2, 3, 1]), c)
            h = net.linear(net.linear(h, c, 4 * c, act="gelu"), 4 * c, c)
            h = net.op("Mul", [h, net.const(np.full(c, 1e-6, np.float32), "layer_scale")])
            y = net.op("Add", [y, net.op("Transpose", [h], perm=[0, 3, 1, 2])])
    y = net.layernorm(net.op("Flatten", [net.op("GlobalAveragePool", [y])]), 768)
    _rename(net, _gemm_head(net, y, 768), "logits")
    return net.model("convnext_tiny", _image(size), _out("logits", [1, 1000]))


def _conv3d(net: Net, x: str, cin: int, cout: int, k=(3, 3, 3), s=(1, 1, 1), act: str | None = "relu") -> str:
    w = net.const(net.rng.normal(0, (2 / (cin * np.prod(k))) ** 0.5, (cout, cin, *k)).astype(np.float32), "w")
    b = net.const(np.zeros(cout, np.float32), "b")
    pads = [kk // 2 for kk in k] * 2
    return net.act(net.op("Conv", [x, w, b], kernel_shape=list(k), strides=list(s), pads=pads), act)


def resnet_3d(frames: int = 16, size: int = 112) -> onnx.ModelProto:
    net = Net(15)
    y = _conv3d(net, "x", 3, 64, (3, 7, 7), (1, 2, 2))
    cin = 64
    for c, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for i in range(2):
            s = (stride,) * 3 if i == 0 else (1, 1, 1)
            h = _conv3d(net, _conv3d(net, y, cin, c, s=s), c, c, act=None)
            skip = _conv3d(net, y, cin, c, (1, 1, 1), s, act=None) if (s[0] != 1 or cin != c) else y
            y, cin = net.op("Relu", [net.op("Add", [h, skip])]), c
    y = net.op("Flatten", [net.op("GlobalAveragePool", [y])])
    _rename(net, _gemm_head(net, y, 512, 400), "logits")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, frames, size, size])]
    return net.model("resnet_3d", inputs, _out("logits", [1, 400]))


def real_esrgan_general_x4v3(size: int = 128, feat: int = 64, convs: int = 32, scale: int = 4) -> onnx.ModelProto:
    net = Net(16)

    def prelu(x: str) -> str:
        return net.op("PRelu", [x, net.const(np.full((feat, 1, 1), 0.25, np.float32), "slope")])

    y = prelu(net.conv("x", 3, feat, 3))
    for _ in range(convs):
        y = prelu(net.conv(y, feat, feat, 3))
    y = net.op("DepthToSpace", [net.conv(y, feat, 3 * scale * scale, 3)], blocksize=scale, mode="CRD")
    y = net.op("Add", [y, net.resize("x", float(scale), mode="nearest")])
    _rename(net, y, "upscaled")
    return net.model("real_esrgan_general_x4v3", _image(size), _out("upscaled", [1, 3, size * scale, size * scale]))


def beit(size: int = 224, width: int = 768, depth: int = 12, heads: int = 12, patch: int = 16) -> onnx.ModelProto:
    net = Net(17)
    tokens = (size // patch) ** 2 + 1
    y = net.conv("x", 3, width, patch, patch, pad=0)
    y = net.op("Transpose", [net.reshape(y, [1, width, tokens - 1])], perm=[0, 2, 1])
    y = net.op("Concat", [net.const(net.rng.normal(0, 0.02, (1, 1, width)).astype(np.float32), "cls"), y], axis=1)
    for _ in range(depth):
        # Each layer's relative position bias is a constant [1, heads, T, T] added to the attention scores.
        bias = net.const(net.rng.normal(0, 0.02, (1, heads, tokens, tokens)).astype(np.float32), "rel_bias")
        y = _encoder_layer(net, y, tokens, width, heads, 4 * width, mask=bias)
    y = net.op("ReduceMean", [net.op("Slice", [y, net.const(np.array([1], np.int64)),
                                               net.const(np.array([tokens], np.int64)),
                                               net.const(np.array([1], np.int64))])], axes=[1], keepdims=0)
    _rename(net, _gemm_head(net, net.layernorm(y, width), width), "logits")
    return net.model("beit", _image(size), _out("logits", [1, 1000]))


def _marian_layer(net: Net, x: str, tokens: int, width: int, heads: int, mlp: int, mask: str) -> str:
    """A post-norm Marian encoder layer: self-attention, then a SiLU feed-forward."""
    y = _encoder_layer(net, x, tokens, width, heads, mlp, mask=mask, pre_norm=False, mlp_act="silu")
    return y


def opus_mt_encoder(tokens: int = 256, width: int = 512, layers: int = 6, heads: int = 8,
                    vocab: int = 65001) -> onnx.ModelProto:
    net = Net(18)
    words = net.const(net.rng.normal(0, 0.02, (vocab, width)).astype(np.float32), "words")
    y = net.op("Mul", [net.op("Gather", [words, "input_ids"], axis=0), net.const(np.float32(width ** 0.5))])
    y = net.op("Add", [y, net.const(net.rng.normal(0, 0.02, (1, tokens, width)).astype(np.float32), "pos")])
    m = net.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    m = net.reshape(net.op("Mul", [net.op("Sub", [net.const(np.float32(1)), m]), net.const(np.float32(-1e4))]),
                    [1, 1, 1, tokens])
    for _ in range(layers):
        y = _marian_layer(net, y, tokens, width, heads, 4 * width, m)
    _rename(net, y, "hidden")
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, tokens]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT32, [1, tokens])]
    return net.model("opus_mt_encoder", inputs, _out("hidden", [1, tokens, width]))


def _attend(net: Net, q: str, k: str, v: str, heads: int, d: int, keys: int) -> str:
    scores = net.op("MatMul", [q, net.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = net.op("Div", [scores, net.const(np.float32(d ** 0.5))])
    attn = net.op("MatMul", [net.op("Softmax", [scores], axis=-1), v])
    return net.reshape(net.op("Transpose", [attn], perm=[0, 2, 1, 3]), [1, 1, heads * d])


def opus_mt_decoder(past: int = 255, source: int = 256, width: int = 512, layers: int = 6, heads: int = 8,
                    vocab: int = 65001) -> onnx.ModelProto:
    net = Net(19)
    d = width // heads
    words = net.const(net.rng.normal(0, 0.02, (vocab, width)).astype(np.float32), "words")
    y = net.op("Mul", [net.op("Gather", [words, "input_ids"], axis=0), net.const(np.float32(width ** 0.5))])
    y = net.op("Add", [y, net.const(net.rng.normal(0, 0.02, (1, 1, width)).astype(np.float32), "pos")])
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, 1])]
    outputs = []
    for layer in range(layers):
        names = [f"past_{kind}_{layer}" for kind in ("key", "value", "cross_key", "cross_value")]
        for name, length in zip(names, (past, past, source, source)):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, heads, length, d]))
        q, k, v = (net.op("Transpose", [net.reshape(net.linear(y, width, width), [1, 1, heads, d])],
                          perm=[0, 2, 1, 3]) for _ in range(3))
        k = net.op("Concat", [names[0], k], axis=2)
        v = net.op("Concat", [names[1], v], axis=2)
        for t, kind in ((k, "key"), (v, "value")):
            _rename(net, t, f"present_{kind}_{layer}")
            outputs += _out(f"present_{kind}_{layer}", [1, heads, past + 1, d])
        k, v = f"present_key_{layer}", f"present_value_{layer}"
        y = net.layernorm(net.op("Add", [y, net.linear(_attend(net, q, k, v, heads, d, past + 1), width, width)]),
                          width)
        q = net.op("Transpose", [net.reshape(net.linear(y, width, width), [1, 1, heads, d])], perm=[0, 2, 1, 3])
        cross = _attend(net, q, names[2], names[3], heads, d, source)
        y = net.layernorm(net.op("Add", [y, net.linear(cross, width, width)]), width)
        y = net.layernorm(net.op("Add", [y, net.linear(net.linear(y, width, 4 * width, act="silu"), 4 * width,
                                                                   width)]), width)
    logits = net.linear(y, width, vocab)
    _rename(net, logits, "logits")
    return net.model("opus_mt_decoder", inputs, _out("logits", [1, 1, vocab]) + outputs)


def _double_blaze(net: Net, x: str, cin: int, cout: int, k: int = 5) -> str:
    """The zoo's DoubleBlazeBlock (stride 1): two depthwise + pointwise pairs, a residual (1x1 where widths
    differ), ReLU."""
    hidden = max(cin, cout) // 2
    h = net.conv(net.conv(x, cin, cin, k, group=cin), cin, hidden, 1, act="relu")
    h = net.conv(net.conv(h, hidden, hidden, k, group=hidden), hidden, cout, 1)
    skip = net.conv(x, cin, cout, 1) if cin != cout else x
    return net.op("Relu", [net.op("Add", [h, skip])])


def _pick(net: Net, x: str, index: int) -> str:
    """x[..., index] (a Gather on the last axis, as the exporter writes an integer index)."""
    return net.op("Gather", [x, net.const(np.array(index, np.int64), "i")], axis=-1)


def _yolo5_decode(net: Net, out: str, rows: int, cols: int, stride: int, classes: int) -> str:
    """The zoo's GearGuardNet._decode_scale: [1, cells x 3, 5 + classes] of centre, size, objectness and class
    scores from one scale's raw map (sigmoids, grid offsets, anchor sizes), as exported."""
    n, width = rows * cols * 3, classes + 5
    pred = net.reshape(net.op("Transpose", [out], perm=[0, 2, 3, 1]), [1, n, width])
    grid = net.rng.uniform(0, max(rows, cols), (2, 1, n)).astype(np.float32)
    anchors = net.rng.uniform(10, 400, (2, 1, n)).astype(np.float32)
    two, half, four = (net.const(np.float32(v)) for v in (2.0, 0.5, 4.0))
    centre = [net.op("Mul", [net.op("Add", [net.op("Sub", [net.op("Mul", [net.op("Sigmoid", [_pick(net, pred, i)]),
                                                                          two]), half]),
                                             net.const(grid[i], "grid")]), net.const(np.float32(stride))])
              for i in (0, 1)]
    size = [net.op("Mul", [net.op("Mul", [net.op("Pow", [net.op("Sigmoid", [_pick(net, pred, i)]),
                                                         net.const(np.float32(2.0))]), four]),
                           net.const(anchors[i - 2], "anchor")]) for i in (2, 3)]
    objectness = net.op("Sigmoid", [_pick(net, pred, 4)])
    parts = [net.op("Unsqueeze", [p, net.const(np.array([2], np.int64), "axes")])
             for p in centre + size + [objectness]]
    bounds = [net.const(np.array([v], np.int64)) for v in (5, width, 2)]
    scores = net.op("Sigmoid", [net.op("Slice", [pred, *bounds])])
    return net.op("Concat", [net.op("Concat", parts, axis=2), scores], axis=2)


def _detect_postprocess(net: Net, detections: str, count: int, classes: int) -> tuple[str, str, str]:
    """The zoo's yolo detect_postprocess: corner boxes, class scores times objectness, the best class's score and
    index."""
    def cut(start: int, end: int) -> str:
        return net.op("Slice", [detections, *(net.const(np.array([v], np.int64)) for v in (start, end, 2))])

    boxes, conf, scores = cut(0, 4), cut(4, 5), cut(5, 5 + classes)
    cx, cy = _pick(net, boxes, 0), _pick(net, boxes, 1)
    w, h = (net.op("Mul", [_pick(net, boxes, i), net.const(np.float32(0.5))]) for i in (2, 3))
    corners = [net.op(op, [c, d]) for op, c, d in (("Sub", cx, w), ("Sub", cy, h), ("Add", cx, w), ("Add", cy, h))]
    boxes = net.op("Concat", [net.op("Unsqueeze", [c, net.const(np.array([2], np.int64), "axes")]) for c in corners],
                   axis=2)
    scores = net.op("Mul", [scores, conf])
    best = net.op("ReduceMax", [scores], axes=[-1], keepdims=0)  # opset 17: axes an attribute
    index = net.op("Cast", [net.op("ArgMax", [scores], axis=-1, keepdims=0)], to=TensorProto.INT32)
    return boxes, best, index


def gear_guard_net(height: int = 320, width: int = 192, classes: int = 2) -> onnx.ModelProto:
    """The zoo's GearGuardNet (YOLOv5-style, DoubleBlaze blocks, width 0.5, depth 0.33) with the anchor decode and
    the post-processing its published model runs on the device (boxes as corners, scores, class index)."""
    net = Net(20)

    def blocks(y: str, cin: int, cout: int, n: int) -> str:
        for i in range(n):
            y = _double_blaze(net, y, cin if i == 0 else cout, cout)
        return y

    y = net.conv("x", 3, 32, 6, 2, pad=2, act="relu")
    b4 = blocks(net.conv(blocks(net.conv(y, 32, 64, 3, 2, act="relu"), 64, 64, 1), 64, 128, 3, 2, act="relu"),
                128, 128, 1)
    b6 = blocks(net.conv(b4, 128, 256, 3, 2, act="relu"), 256, 256, 3)
    y = blocks(net.conv(b6, 256, 512, 3, 2, act="relu"), 512, 512, 1)
    h10 = net.conv(net.conv(y, 512, 512, 3, act="relu"), 512, 256, 1, act="relu")
    y = blocks(net.op("Concat", [net.resize(h10, 2.0, mode="nearest"), b6], axis=1), 512, 256, 1)
    h14 = net.conv(y, 256, 128, 1, act="relu")
    p3 = blocks(net.op("Concat", [net.resize(h14, 2.0, mode="nearest"), b4], axis=1), 256, 128, 1)
    p4 = blocks(net.op("Concat", [net.conv(p3, 128, 128, 3, 2, act="relu"), h14], axis=1), 256, 256, 1)
    p5 = blocks(net.op("Concat", [net.conv(p4, 256, 256, 3, 2, act="relu"), h10], axis=1), 512, 512, 1)
    decoded = [_yolo5_decode(net, net.conv(feat, ch, 3 * (classes + 5), 1), height // stride, width // stride,
                             stride, classes) for feat, ch, stride in ((p3, 128, 8), (p4, 256, 16), (p5, 512, 32))]
    count = sum(3 * (height // s) * (width // s) for s in (8, 16, 32))
    boxes, scores, class_idx = _detect_postprocess(net, net.op("Concat", decoded, axis=1), count, classes)
    for tensor, name in ((boxes, "boxes"), (scores, "scores"), (class_idx, "class_idx")):
        _rename(net, tensor, name)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, height, width])]
    return net.model("gear_guard_net", inputs, _out("boxes", [1, count, 4]) + _out("scores", [1, count])
                     + [helper.make_tensor_value_info("class_idx", TensorProto.INT32, [1, count])])


MORE_ARCHITECTURES = (
    Architecture("densenet121", densenet121, True),
    Architecture("resnext50", resnext50, True),
    Architecture("mobilenet_v3_small", mobilenet_v3_small, True),
    Architecture("convnext_tiny", convnext_tiny, True),
    Architecture("resnet_3d", resnet_3d, True),
    Architecture("fcn_resnet50", fcn_resnet50, True),
    Architecture("real_esrgan_general_x4v3", real_esrgan_general_x4v3, True),
    Architecture("beit", beit, True),
    Architecture("opus_mt_en_es__OpusMTEncoder", opus_mt_encoder, True),
    Architecture("opus_mt_en_es__OpusMTDecoder", opus_mt_decoder, True),
    Architecture("gear_guard_net", gear_guard_net, True),
)
