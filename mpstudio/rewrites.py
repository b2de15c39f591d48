"""Graph rewrites made at prepare time so that models as exporters write them run on, and quantize for, QNN HTP.

Each rewrite keeps the float model's outputs (to float rounding) and returns the sentences the preparation
report shows, naming what it changed:

- exact GELU as torch exports it, `x * 0.5 * (1 + Erf(x / sqrt(2)))` in its usual node orders, becomes one
  `Gelu` node (ONNX `Gelu` from opset 20, else `com.microsoft` `Gelu`, which ORT's CPU EP also runs): the QNN
  EP has no `Erf`, so the pattern would leave its Erf on the CPU;
- attention-mask constants such as float32's lowest value (-3.4e38) or -inf, added to scores before a
  Softmax, become `MASK_FLOOR` (-100): an 8/16-bit quantization range stretched to -3.4e38 has no resolution
  left for the scores themselves, while Softmax weighs a masked score e^-100 times less (0 in float32 unless
  a masked key outscores every visible one by about 90);
- a Where choosing between two constants becomes arithmetic that ORT's QDQ quantizer quantizes;
- a BatchNormalization after a Conv or ConvTranspose (through a per-channel bias Add, as Paddle exports a
  ConvTranspose's bias) is folded into that op's weights and bias: ORT folds it after a Conv but not after a
  ConvTranspose, and QNN HTP's own BatchNormalization computes some channels differently from the QDQ model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import producers_and_consumers

# What an attention mask's "minus infinity" becomes. Measured on a small random BERT-like encoder (2 layers, 8
# samples, half of them padded; ORT CPU QDQ output SNR against float, a8w8 / a16w8): -3.4e38 7.5 / 3.2 dB;
# -1e4 7.5 / 32.8; -1e3 9.2 / 36.8; -100 24.2 / 36.4; -30 28.5 / 36.4; float outputs unchanged in each case.
# -100 keeps a wide float margin.
MASK_FLOOR = -100.0
# Constants at least this large in magnitude (or infinite) are mask sentinels, not values a model computes with.
_MASK_SENTINEL = 1.0e6
# Ops a mask flows through between its constant and the Softmax that consumes it.
_MASK_PATH_OPS = frozenset({"Add", "Sub", "Mul", "Where", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Tile",
                            "Concat", "Slice", "Transpose", "Cast", "Min", "Max"})
_MASK_PATH_DEPTH = 6
_MS_DOMAIN = "com.microsoft"
_STANDARD = ("", "ai.onnx")
GELU_OPSET = 20  # ONNX Gelu appeared in opset 20


@dataclass(frozen=True)
class RewriteResult:
    """What one rewrite did: its name, the nodes it wrote (or changed), and the report's sentence."""

    name: str
    nodes: tuple[str, ...]
    step: str


def rewrite_for_htp(model: onnx.ModelProto) -> list[RewriteResult]:
    """Apply every rewrite to `model` in place; one RewriteResult per rewrite that changed something."""
    results = [fuse_erf_gelu(model), clamp_mask_constants(model), where_to_arithmetic(model),
               fold_batch_norm(model)]
    return [r for r in results if r is not None]


# ---- exact GELU ------------------------------------------------------------------------------------------------
class _Graph:
    """Producers, consumers and scalar constants of a graph, for pattern matching."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.producer, self.consumers = producers_and_consumers(graph)
        self.outputs = {o.name for o in graph.output}
        self.initializers = {t.name: t for t in graph.initializer}

    def scalar(self, name: str) -> float | None:
        tensor = self.initializers.get(name)
        if tensor is None:
            node = self.producer.get(name)
            if node is None or node.op_type != "Constant" or node.domain not in _STANDARD:
                return None
            tensor = next((a.t for a in node.attribute if a.name == "value"), None)
            if tensor is None:
                return None
        if tensor.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            return None
        array = numpy_helper.to_array(tensor)
        return float(array.reshape(-1)[0]) if array.size == 1 else None

    def only_consumer(self, name: str, op_type: str):
        """The single consumer of `name` when it is an `op_type` node and `name` is not a graph output."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        node = users[0]
        return node if node.op_type == op_type and node.domain in _STANDARD else None


def _near(value: float | None, target: float, tol: float = 1e-3) -> bool:
    return value is not None and abs(value - target) <= tol * abs(target)


def _other(node: onnx.NodeProto, name: str) -> str | None:
    """The other input of a two-input node, given one of them."""
    if len(node.input) != 2:
        return None
    if node.input[0] == name:
        return node.input[1]
    if node.input[1] == name:
        return node.input[0]
    return None


def _match_gelu(g: _Graph, erf: onnx.NodeProto) -> tuple[str, str, list[onnx.NodeProto]] | None:
    """(x, output, nodes of the pattern) when `erf` is the Erf of an exact GELU, else None."""
    scale = g.producer.get(erf.input[0]) if erf.input else None
    if scale is None or scale.domain not in _STANDARD or len(scale.input) != 2:
        return None
    if g.only_consumer(scale.output[0], "Erf") is not erf:
        return None
    if scale.op_type == "Div" and _near(g.scalar(scale.input[1]), math.sqrt(2)):
        x = scale.input[0]
    elif scale.op_type == "Mul" and _near(g.scalar(scale.input[1]), 1 / math.sqrt(2)):
        x = scale.input[0]
    elif scale.op_type == "Mul" and _near(g.scalar(scale.input[0]), 1 / math.sqrt(2)):
        x = scale.input[1]
    else:
        return None
    add = g.only_consumer(erf.output[0], "Add")
    if add is None or not _near(g.scalar(_other(add, erf.output[0]) or ""), 1.0):
        return None
    nodes = [scale, erf, add]
    # Then x and 0.5 multiply in, one Mul each in either order, or as one Mul by a separate x * 0.5.
    factors: set[str] = set()
    current = add.output[0]
    while factors != {"x", "half"} and len(nodes) < 6:
        mul = g.only_consumer(current, "Mul")
        other = _other(mul, current) if mul is not None else None
        if other is None:
            return None
        half = g.producer.get(other)
        if other == x and "x" not in factors:
            factors.add("x")
        elif _near(g.scalar(other), 0.5) and "half" not in factors:
            factors.add("half")
        elif (not factors and half is not None and half.op_type == "Mul" and half.domain in _STANDARD
              and x in half.input and _near(g.scalar(_other(half, x) or ""), 0.5)
              and g.only_consumer(other, "Mul") is mul):
            factors.update(("x", "half"))
            nodes.insert(0, half)
        else:
            return None
        nodes.append(mul)
        current = mul.output[0]
    return x, current, nodes


def fuse_erf_gelu(model: onnx.ModelProto) -> RewriteResult | None:
    """Replace each exact Erf-GELU subgraph by one Gelu node (see the module docstring)."""
    graph = model.graph
    g = _Graph(graph)
    matches = [m for m in (_match_gelu(g, n) for n in graph.node if n.op_type == "Erf" and n.domain in _STANDARD)
               if m is not None]
    if not matches:
        return None
    opset = next((o.version for o in model.opset_import if o.domain in _STANDARD), 0)
    domain = "" if opset >= GELU_OPSET else _MS_DOMAIN
    types = _value_types(model) if domain else {}
    taken = {n.name for n in graph.node}
    removed: set[int] = set()
    replacement: dict[int, onnx.NodeProto] = {}
    written = []
    for x, output, nodes in matches:
        erf = nodes[1] if nodes[1].op_type == "Erf" else nodes[2]
        name = _gelu_name(erf.name, taken)
        taken.add(name)
        gelu = helper.make_node("Gelu", [x], [output], name=name, domain=domain)
        last = max(_index(graph, n) for n in nodes)
        removed.update(_index(graph, n) for n in nodes)
        replacement[last] = gelu
        written.append(name)
        if domain and output in types and not any(v.name == output for v in graph.value_info):
            # ONNX's shape inference does not know com.microsoft ops: say what Gelu's output is, so the
            # shapes after it stay static.
            graph.value_info.append(types[output])
    _set_nodes(graph, [replacement.get(i, node) for i, node in enumerate(graph.node)
                       if i not in removed or i in replacement])
    if domain and not any(o.domain == _MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
    op = "Gelu (ONNX opset 20)" if not domain else "com.microsoft Gelu"
    shown = _shown(written)
    return RewriteResult(
        "erf-gelu", tuple(written),
        f"rewrote {len(written)} exact GELU subgraph(s) into {op} (x*0.5*(1+Erf(x/sqrt(2))) as one op, which QNN "
        f"HTP runs; QNN has no Erf): {shown}")


def _gelu_name(erf_name: str, taken: set[str]) -> str:
    # Keep the namespace ("/mlp/act/Erf" -> "/mlp/act/Gelu"), so the graph view groups it where the Erf was.
    scope, sep, last = erf_name.rpartition("/")
    if "Erf" in last:  # torch: ".../act/Erf"; its dynamo exporter: "node_Erf_40"
        base = scope + sep + last.replace("Erf", "Gelu", 1)
    else:
        base = f"{erf_name}/Gelu"
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def _index(graph: onnx.GraphProto, node: onnx.NodeProto) -> int:
    for i, n in enumerate(graph.node):
        if n is node:
            return i
    raise ValueError(f"node {node.name!r} is not in the graph")


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return {}  # prepare_model's own shape inference reports the problem
    return {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}


def _shown(names) -> str:
    """The first few names of a rewrite, for its report line."""
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _set_nodes(graph: onnx.GraphProto, nodes) -> None:
    """`graph` with `nodes` as its nodes, and the initializers no node reads any more dropped."""
    nodes = list(nodes)
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unused_initializers(graph)


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in used]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


# ---- attention-mask constants ----------------------------------------------------------------------------------
def _reaches_softmax(g: _Graph, name: str, depth: int = _MASK_PATH_DEPTH) -> bool:
    if depth == 0:
        return False
    for node in g.consumers.get(name, []):
        if node.domain not in _STANDARD:
            continue
        if node.op_type in ("Softmax", "LogSoftmax"):
            return True
        if node.op_type in _MASK_PATH_OPS and any(_reaches_softmax(g, o, depth - 1) for o in node.output if o):
            return True
    return False


def clamp_mask_constants(model: onnx.ModelProto, floor: float = MASK_FLOOR) -> RewriteResult | None:
    """Bring mask sentinels (|v| >= 1e6 or infinite) in float constants that flow into a Softmax to +-|floor|."""
    graph = model.graph
    g = _Graph(graph)
    changed: list[str] = []
    extremes: list[float] = []
    for tensor in graph.initializer:
        if tensor.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16) or tensor.data_location == \
                TensorProto.EXTERNAL:
            continue
        users = [n for n in g.consumers.get(tensor.name, []) if n.op_type in _MASK_PATH_OPS - {"Cast"}]
        if not users:
            continue
        array = numpy_helper.to_array(tensor)
        sentinel = ~np.isnan(array) & (np.abs(array.astype(np.float64)) >= _MASK_SENTINEL)
        if not sentinel.any() or not any(_reaches_softmax(g, o) for n in users for o in n.output if o):
            continue
        extremes.append(float(array[sentinel].astype(np.float64).min()))
        fixed = np.where(sentinel, np.sign(array) * abs(floor), array).astype(array.dtype)
        tensor.CopyFrom(numpy_helper.from_array(fixed, tensor.name))
        changed.extend(n.name or n.output[0] for n in users)
    if not changed:
        return None
    lowest = min(extremes)
    return RewriteResult(
        "mask-floor", tuple(changed),
        f"clamped attention-mask constants (as low as {lowest:.4g}) to {floor:g} in {len(changed)} node(s) before "
        f"a Softmax, so 8/16-bit ranges keep their resolution (Softmax still weighs masked keys about e^-100 times less): "
        + _shown(changed))


# ---- Where between two constants ------------------------------------------------------------------------------
def where_to_arithmetic(model: onnx.ModelProto) -> RewriteResult | None:
    """Write `Where(c, t, f)` whose branches are both float constants as `f + Cast(c) * (t - f)`.

    ORT's QDQ quantizer quantizes a Where's branches only when they are already quantized activations, so a
    Where choosing between two constants (a mask built as Where(mask == 0, -inf, 0)) stays in float, and QNN
    HTP then fails to finalize the graph (QNN_COMMON_ERROR_MEM_ALLOC, measured); Cast, Mul and Add quantize
    like any other op. A Where with one constant branch ran on HTP and is left alone, as are constants that
    are not finite (0 * inf would make NaNs).
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    taken = {n.name for n in graph.node} | {o for n in graph.node for o in n.output} | set(inits)

    def fresh(stem: str) -> str:
        name, i = stem, 1
        while name in taken:
            name, i = f"{stem}_{i}", i + 1
        taken.add(name)
        return name

    def constant(name: str) -> np.ndarray | None:
        tensor = inits.get(name)
        if tensor is None or tensor.data_type != TensorProto.FLOAT or tensor.data_location == TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(tensor)

    written: list[str] = []
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        branches = [constant(name) for name in node.input[1:]] if node.op_type == "Where" and \
            node.domain in _STANDARD and len(node.input) == 3 else []
        if len(branches) != 2 or any(b is None or not np.isfinite(b).all() for b in branches):
            new_nodes.append(node)
            continue
        t, f = branches
        base = node.name or node.output[0]
        mask, diff = fresh(f"{base}/Cast_output_0"), fresh(f"{base}/difference")
        graph.initializer.append(numpy_helper.from_array((t - f).astype(np.float32), diff))
        new_nodes.append(helper.make_node("Cast", [node.input[0]], [mask], name=fresh(f"{base}/Cast"),
                                          to=TensorProto.FLOAT))
        if not f.any():
            new_nodes.append(helper.make_node("Mul", [mask, diff], [node.output[0]], name=fresh(f"{base}/Mul")))
        else:
            scaled = fresh(f"{base}/Mul_output_0")
            new_nodes.append(helper.make_node("Mul", [mask, diff], [scaled], name=fresh(f"{base}/Mul")))
            new_nodes.append(helper.make_node("Add", [node.input[2], scaled], [node.output[0]],
                                              name=fresh(f"{base}/Add")))
        written.append(base)
    if not written:
        return None
    _set_nodes(graph, new_nodes)
    return RewriteResult(
        "where-constant", tuple(written),
        f"rewrote {len(written)} Where node(s) choosing between two constants as f + Cast(c) * (t - f), which "
        "quantizes for QNN HTP (ORT's quantizer leaves such a Where in float, which HTP failed to finalize): "
        + _shown(written))


# ---- BatchNormalization after a convolution ---------------------------------------------------------------------
def _float_initializer(inits: dict, name: str) -> np.ndarray | None:
    tensor = inits.get(name)
    if tensor is None or tensor.data_type != TensorProto.FLOAT or tensor.data_location == TensorProto.EXTERNAL:
        return None
    return numpy_helper.to_array(tensor).astype(np.float64)


def fold_batch_norm(model: onnx.ModelProto) -> RewriteResult | None:
    """Fold each inference BatchNormalization whose input is a Conv's or ConvTranspose's output, directly or through
    an Add of a per-channel constant, into that op's weights and bias.

    QNN HTP runs a quantized BatchNormalization by refolding its parameters into a per-tensor quantized scale and
    bias of its own; measured (onnxruntime-qnn 2.7, HTP emulator) on the PP-OCRv4 detector's head and on a small
    ConvTranspose -> Add -> BatchNormalization model, the channel with the largest folded bias comes out with the
    wrong sign with int8 parameters or 16-bit activations, 17 quantization steps off at 8 bits where the QDQ
    model on ORT's CPU is exact. Folded, the QDQ model has no BatchNormalization, and both compute the same
    convolution. Each node involved must be the only reader of its input, every parameter a float initializer.
    """
    graph = model.graph
    g = _Graph(graph)
    inits = {t.name: t for t in graph.initializer}
    weight_users: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            weight_users[name] = weight_users.get(name, 0) + 1
    folded: list[str] = []
    dropped: set[int] = set()
    for bn in list(graph.node):
        fold = _batch_norm_fold(bn, g, inits, weight_users)
        if fold is None:
            continue
        _apply_fold(graph, inits, fold)
        dropped.update(id(n) for n in (bn, fold.add) if n is not None and n is not fold.conv)
        folded.append(bn.name or bn.output[0])
    if not folded:
        return None
    _set_nodes(graph, [n for n in graph.node if id(n) not in dropped])
    return RewriteResult(
        "fold-batch-norm", tuple(folded),
        f"folded {len(folded)} BatchNormalization node(s) after a Conv/ConvTranspose into its weights and bias "
        "(QNN HTP's own BatchNormalization computes some channels differently from the QDQ model): "
        + _shown(folded))


@dataclass(frozen=True)
class _BatchNormFold:
    """One BatchNormalization folded into the convolution before it: the nodes, and the convolution's new
    weight and bias (`add`: the per-channel Add between them, else the convolution itself, or None)."""

    bn: onnx.NodeProto
    conv: onnx.NodeProto
    add: onnx.NodeProto | None
    new_weight: np.ndarray
    new_bias: np.ndarray
    has_bias: bool


def _batch_norm_fold(bn: onnx.NodeProto, g: _Graph, inits: dict, weight_users: dict[str, int]) -> _BatchNormFold | None:
    """How `bn` folds into the convolution before it, or None when it does not (see `fold_batch_norm`)."""
    params = _inference_batch_norm(bn, inits)
    if params is None:
        return None
    scale, bias, mean, var, epsilon = params
    found = _convolution_before(bn, g, inits)
    if found is None:
        return None
    conv, add, shift_name = found
    weights = _convolution_weights(conv, inits, weight_users, scale.size)
    if weights is None:
        return None
    weight, conv_bias, groups, out_axis = weights
    channels = scale.size
    shift = _channel_shift(shift_name, inits, weight_users, weight, channels)
    if shift is None:
        return None
    factor = scale / np.sqrt(var + epsilon)
    if out_axis == 0:
        new_weight = weight * factor.reshape((-1,) + (1,) * (weight.ndim - 1))
    else:  # ConvTranspose: [in, out / group, ...]; output channel gi * (out / group) + j
        grouped = weight.reshape((groups, weight.shape[0] // groups) + weight.shape[1:])
        new_weight = (grouped * factor.reshape((groups, 1, -1) + (1,) * (weight.ndim - 2))).reshape(weight.shape)
    base = conv_bias if conv_bias is not None else np.zeros(channels)
    new_bias = (base + shift - mean) * factor + bias
    return _BatchNormFold(bn, conv, add, new_weight, new_bias, conv_bias is not None)


def _inference_batch_norm(bn: onnx.NodeProto, inits: dict) -> tuple | None:
    """(scale, bias, mean, var, epsilon) of an inference BatchNormalization with 1-D float initializer
    parameters; None for any other node."""
    if bn.op_type != "BatchNormalization" or bn.domain not in _STANDARD or len(bn.input) != 5 \
            or len(bn.output) != 1:
        return None
    attrs = {a.name: a for a in bn.attribute}
    if "training_mode" in attrs and attrs["training_mode"].i:
        return None
    params = [_float_initializer(inits, name) for name in bn.input[1:]]
    if any(p is None or p.ndim != 1 for p in params):
        return None
    scale, bias, mean, var = params
    epsilon = attrs["epsilon"].f if "epsilon" in attrs else 1e-5
    return scale, bias, mean, var, epsilon


def _convolution_before(bn: onnx.NodeProto, g: _Graph, inits: dict) -> tuple | None:
    """(conv, add, shift_name): the Conv or ConvTranspose whose output `bn` alone reads, directly (add is then
    the conv, shift_name None) or through an Add of a constant `shift_name` it alone reads; None otherwise."""
    add = g.producer.get(bn.input[0])
    shift_name = None
    conv = add
    if add is not None and add.op_type == "Add" and add.domain in _STANDARD and len(add.input) == 2:
        if g.only_consumer(add.output[0], "BatchNormalization") is not bn:
            return None
        shift_name = next((name for name in add.input if name in inits), None)
        other = _other(add, shift_name) if shift_name else None
        conv = g.producer.get(other) if other else None
        if conv is None or g.only_consumer(other, "Add") is not add:
            return None
    elif conv is None or g.only_consumer(bn.input[0], "BatchNormalization") is not bn:
        return None
    if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in _STANDARD or len(conv.output) != 1:
        return None
    return conv, add, shift_name


def _convolution_weights(conv: onnx.NodeProto, inits: dict, weight_users: dict[str, int],
                         channels: int) -> tuple | None:
    """(weight, bias or None, groups, output-channel axis) of a convolution whose float weight (and bias) only it
    reads, with `channels` output channels; None otherwise."""
    weight = _float_initializer(inits, conv.input[1]) if len(conv.input) > 1 else None
    conv_bias = _float_initializer(inits, conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if weight is None or weight_users.get(conv.input[1], 0) != 1 or (len(conv.input) > 2 and conv.input[2] and (
            conv_bias is None or weight_users.get(conv.input[2], 0) != 1)):
        return None
    groups = next((a.i for a in conv.attribute if a.name == "group"), 1)
    out_axis = 0 if conv.op_type == "Conv" else 1
    if weight.shape[out_axis] * (groups if out_axis == 1 else 1) != channels:
        return None
    return weight, conv_bias, groups, out_axis


def _channel_shift(shift_name: str | None, inits: dict, weight_users: dict[str, int], weight: np.ndarray,
                   channels: int) -> np.ndarray | None:
    """The per-channel shift the Add between convolution and BatchNormalization adds (zeros without an Add);
    None when its constant is not a scalar or per-channel float initializer only that Add reads."""
    if shift_name is None:
        return np.zeros(channels)
    constant = _float_initializer(inits, shift_name)
    # Per channel only: the output's channel axis is 1 of rank weight.ndim, i.e. weight.ndim - 1 from the right.
    per_channel = constant is not None and constant.ndim >= weight.ndim - 1 and \
        constant.shape[-(weight.ndim - 1)] == channels and constant.size == channels
    if constant is None or weight_users.get(shift_name, 0) != 1 or not (constant.size == 1 or per_channel):
        return None
    return np.broadcast_to(constant.reshape(-1), (channels,))


def _apply_fold(graph: onnx.GraphProto, inits: dict, fold: _BatchNormFold) -> None:
    """Write the folded weight and bias (a new bias initializer when the convolution had none) and make the
    convolution write the BatchNormalization's output."""
    conv = fold.conv
    inits[conv.input[1]].CopyFrom(numpy_helper.from_array(fold.new_weight.astype(np.float32), conv.input[1]))
    if fold.has_bias:
        inits[conv.input[2]].CopyFrom(numpy_helper.from_array(fold.new_bias.astype(np.float32), conv.input[2]))
    else:
        taken = set(inits) | {o for n in graph.node for o in n.output}
        name, i = f"{conv.name or conv.output[0]}/folded_bias", 1
        while name in taken:
            name, i = f"{conv.name or conv.output[0]}/folded_bias_{i}", i + 1
        tensor = numpy_helper.from_array(fold.new_bias.astype(np.float32), name)
        graph.initializer.append(tensor)
        inits[name] = tensor
        while len(conv.input) < 3:
            conv.input.append("")
        conv.input[2] = name
    conv.output[0] = fold.bn.output[0]


__all__ = ["RewriteResult", "rewrite_for_htp", "fuse_erf_gelu", "clamp_mask_constants", "where_to_arithmetic",
           "fold_batch_norm", "MASK_FLOOR"]
