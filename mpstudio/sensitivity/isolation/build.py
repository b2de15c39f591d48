"""Building the switchable model from the all-8-bit QDQ model: which nodes read each quantized tensor, what
the model shows of ORT's choices (shared parameters, folded activations), and the rewrite that makes every
activation edge, element-wise constant and Conv/Gemm bias an overridable input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
import onnx.version_converter
from onnx import helper, numpy_helper

from ... import qdq
from ...errors import MpstudioError
from ...graph import node_display_name, producers_and_consumers
from ...folding import FOLDED_ACTIVATIONS
from ... import runtime
from ...runtime import switchable_input_rounding
from .edges import GRAPH_OUTPUT, Bias, Edge, EdgeQuant, bias_value, constant_input, edge_feed, switch_names
from .requantize import RequantizeSwitches, follow

MS_DOMAIN = "com.microsoft"  # ORT's contrib QuantizeLinear takes uint16 at any opset
_WEIGHT_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}  # their weights keep the plan's weight type
_BIAS_OPS = {"Conv", "ConvTranspose", "Gemm"}  # ORT quantizes their bias to int32 at input scale x weight scale


def node_key(node: onnx.NodeProto, index: int) -> str:
    """A node's name as a receiver of an edge (`#index` for an unnamed node)."""
    return node.name or f"#{index}"


def receivers(model: onnx.ModelProto, quantized: Mapping[str, qdq.QuantizedTensor]) -> dict[str, list[str]]:
    """Tensor -> the nodes (and "" for a graph output) that read its quantized value."""
    by_post = {q.post: t for t, q in quantized.items()}
    out: dict[str, list[str]] = {t: [] for t in quantized}
    for index, node in enumerate(model.graph.node):
        key = node_key(node, index)
        for name in node.input:
            t = by_post.get(name)
            if t is not None and key not in out[t]:
                out[t].append(key)
    for output in model.graph.output:
        if output.name in by_post:
            out[by_post[output.name]].append(GRAPH_OUTPUT)
    return out


def structure(model: onnx.ModelProto, quantized: Mapping[str, qdq.QuantizedTensor], graph
              ) -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
    """What the all-8-bit model shows of ORT's choices that hold in every plan:
    shared: tensor -> (input, producer) when ORT writes the tensor with its producer's input's parameters
    (the two Quantize nodes read the same scale initializer);
    folded: tensor -> (input, Relu/Clip node) when ORT folded the Relu/Clip producing it into the op before."""
    if graph is None:
        return {}, {}
    scales = {node_display_name(n, i): n.input[1] for i, n in enumerate(model.graph.node)
              if n.op_type == "QuantizeLinear"}
    scale_of = {t: scales.get(q.quantize_node) for t, q in quantized.items()}
    present = {n.name for n in model.graph.node if n.name}
    shared, folded = {}, {}
    for t in quantized:
        info = graph.tensors.get(t)
        node = graph.nodes.get(info.producer) if info is not None and info.producer else None
        if node is None or not node.inputs or not node.inputs[0]:
            continue
        source = node.inputs[0]
        if node.op_type in FOLDED_ACTIVATIONS and node.name not in present:
            folded[t] = (source, node.name)
        elif source in scale_of and scale_of[source] is not None and scale_of[source] == scale_of[t]:
            shared[t] = (source, node.name)
    return shared, folded


@dataclass(frozen=True)
class Switches:
    """The rewritten model and what its constant and bias switches hold."""

    model: onnx.ModelProto
    constants_8: dict[str, np.ndarray]  # float constant -> its all-8-bit value
    constants_16: dict[str, np.ndarray]  # float constant -> its 16-bit value
    biases: list[Bias]
    requantize: RequantizeSwitches  # the HTP's requantization where the plans' CPU numerics follow it


def rewrite(model: onnx.ModelProto, model_16: onnx.ModelProto | None, quantized: Mapping[str, qdq.QuantizedTensor],
            edge_receivers: Mapping[str, list[str]], default: Mapping[Edge, EdgeQuant],
            float_model: onnx.ModelProto | None) -> Switches:
    """`model` with each activation's Q/DQ pair replaced, per receiving node, by a Clip and two Q -> DQ pairs
    whose parameters are switch inputs (the all-8-bit values by default), and the constants and biases that
    depend on a plan made switch inputs too; each Conv/Gemm and Add the plans' CPU numerics requantize as the HTP
    does computes that too where a configuration leaves it so (`requantize`)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    posts = {q.post: t for t, q in quantized.items()}
    constants, constants_8, constants_16, encodings_16 = _switchable_constants(graph, inits, float_model, model_16)
    biases, bias_inputs = _switchable_biases(graph, inits, posts, float_model)
    by_q = {q.quantize_node: q for q in quantized.values()}
    graph_inputs = {i.name for i in graph.input} - set(inits)
    nodes, switches = [], []
    for index, node in enumerate(graph.node):
        t = by_q.get(node_display_name(node, index)) if node.op_type == "QuantizeLinear" else None
        if t is not None:
            for receiver in edge_receivers[t.name]:
                nodes += _edge_nodes(t, receiver, t.pre in graph_inputs)
                switches.append(edge_feed((t.name, receiver), default[(t.name, receiver)]))
            continue
        if node.op_type == "DequantizeLinear" and (node.output[0] in posts or node.output[0] in constants
                                                   or node.output[0] in bias_inputs):
            continue
        key = node_key(node, index)
        for i, name in enumerate(node.input):
            if name in posts:
                node.input[i] = switch_names((posts[name], key))["value"]
            elif name in bias_inputs:
                node.input[i] = bias_inputs[name]
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    requantize = (follow(graph, model, quantized, edge_receivers, biases, default, encodings_16)
                  if runtime.FOLLOW_HTP_REQUANTIZATION else RequantizeSwitches([], default))
    switches.append(requantize.defaults)
    switches += [{constant_input(name): value} for name, value in constants_8.items()]
    switches += [{bias.input: bias_value(bias, default[bias.edge].scale)} for bias in biases]
    for feed in switches:
        for name, value in feed.items():
            graph.initializer.append(numpy_helper.from_array(value, name))
            graph.input.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
    if not any(op.domain == MS_DOMAIN for op in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return Switches(out, constants_8, constants_16, biases, requantize)


def _edge_nodes(t: qdq.QuantizedTensor, receiver: str, graph_input: bool) -> list[onnx.NodeProto]:
    """Clip, then Q -> DQ twice, on the way from `t`'s producer to `receiver`; a float graph input is first
    rounded onto the first grid as the HTP rounds it (`runtime.htp_input_rounding`), as the regenerated plans' CPU numerics do."""
    p = switch_names((t.name, receiver))
    value = t.post if receiver == GRAPH_OUTPUT else p["value"]
    source, rounding = t.pre, []
    if graph_input:
        source = p["prefix"] + "htp_rounded"
        rounding = switchable_input_rounding(t.pre, p["scale"], p["lo"], p["hi"], source)
    return rounding + [
        helper.make_node("Clip", [source, p["lo"], p["hi"]], [p["clipped"]], name=f"{p['prefix']}Clip"),
        helper.make_node("QuantizeLinear", [p["clipped"], p["scale"], p["zp"]], [p["q"]],
                         name=f"{p['prefix']}Quantize", domain=MS_DOMAIN),
        helper.make_node("DequantizeLinear", [p["q"], p["scale"], p["zp"]], [p["first"]],
                         name=f"{p['prefix']}Dequantize", domain=MS_DOMAIN),
        helper.make_node("QuantizeLinear", [p["first"], p["scale_2"], p["zp_2"]], [p["q_2"]],
                         name=f"{p['prefix']}Quantize2", domain=MS_DOMAIN),
        helper.make_node("DequantizeLinear", [p["q_2"], p["scale_2"], p["zp_2"]], [value],
                         name=f"{p['prefix']}Dequantize2", domain=MS_DOMAIN),
    ]


def _switchable_constants(graph: onnx.GraphProto, inits, float_model: onnx.ModelProto | None,
                          model_16: onnx.ModelProto | None):
    """DequantizeLinear outputs of per-tensor constants read by element-wise ops; each becomes an overridable
    float initializer (its 8-bit value), renamed for `constant_input`. Returns those outputs, each constant's
    8-bit and 16-bit values, and the 16-bit encoding of those whose 16-bit value the all-16-bit model gives."""
    constants_8: dict[str, np.ndarray] = {}
    constants_16: dict[str, np.ndarray] = {}
    encodings_16: dict[str, qdq.Encoding] = {}
    if float_model is None:
        return set(), constants_8, constants_16, encodings_16
    floats = {i.name: i for i in float_model.graph.initializer}
    read_16 = qdq.read(model_16) if model_16 is not None else None
    params_16 = read_16.params() if read_16 is not None else {}
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    chosen: dict[str, str] = {}  # DequantizeLinear output -> float constant name
    for node in graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits or len(node.input) < 3:
            continue
        out = node.output[0]
        name = out.removesuffix(qdq.DEQUANTIZED_SUFFIX)
        if name == out or name not in floats or readers.get(out, set()) & _WEIGHT_OPS:
            continue
        if node.input[1] not in inits or node.input[2] not in inits:
            continue
        scale = numpy_helper.to_array(inits[node.input[1]])
        if scale.size != 1:
            continue
        value_8 = qdq.dequantize(numpy_helper.to_array(inits[node.input[0]]), scale,
                                 numpy_helper.to_array(inits[node.input[2]]))
        value_f = numpy_helper.to_array(floats[name]).astype(np.float32)
        if value_f.shape != value_8.shape:
            continue
        constants_8[name] = value_8
        value_16 = read_16.dequantized_constant(name) if name in params_16 else None
        if value_16 is not None and value_16.shape == value_8.shape:
            constants_16[name], encodings_16[name] = value_16, params_16[name].encoding
        else:
            # Without the all-16-bit model the float value stands in (16-bit steps are 1/257 of the 8-bit ones).
            constants_16[name] = value_f
        chosen[out] = name
    for node in graph.node:
        for i, input_name in enumerate(node.input):
            if input_name in chosen:
                node.input[i] = constant_input(chosen[input_name])
    return set(chosen), constants_8, constants_16, encodings_16


def _switchable_biases(graph: onnx.GraphProto, inits, posts: Mapping[str, str],
                       float_model: onnx.ModelProto | None) -> tuple[list[Bias], dict[str, str]]:
    """int32 biases of Conv/Gemm nodes that read a quantized activation, and for each its DequantizeLinear
    output -> the switch input that replaces it (the bias at the node's input scale)."""
    biases: list[Bias] = []
    if float_model is None:
        return biases, {}
    floats = {i.name: i for i in float_model.graph.initializer}
    producers, _ = producers_and_consumers(graph)
    chosen: dict[str, str] = {}
    for index, node in enumerate(graph.node):
        if node.op_type not in _BIAS_OPS or len(node.input) < 3 or node.input[0] not in posts:
            continue
        bias_dq, weight_dq = producers.get(node.input[2]), producers.get(node.input[1])
        if (bias_dq is None or weight_dq is None or bias_dq.op_type != "DequantizeLinear"
                or weight_dq.op_type != "DequantizeLinear" or bias_dq.input[0] not in inits
                or weight_dq.input[1] not in inits or node.input[2] not in floats):
            continue
        if inits[bias_dq.input[0]].data_type != onnx.TensorProto.INT32:
            continue
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0) if node.op_type == "Gemm" else 1.0
        bias = Bias(input=f"mpstudio_switch/bias/{node.input[2]}",
                    edge=(posts[node.input[0]], node_key(node, index)),
                    value=numpy_helper.to_array(floats[node.input[2]]).astype(np.float64),
                    weight_scale=numpy_helper.to_array(inits[weight_dq.input[1]]).astype(np.float32), beta=beta)
        biases.append(bias)
        chosen[node.input[2]] = bias.input
    return biases, chosen


def at_opset_of(model: onnx.ModelProto, reference: onnx.ModelProto | None) -> onnx.ModelProto:
    """`model` converted to `reference`'s default-domain opset when that is newer. ORT moves a model with any
    16-bit type to opset 21 before quantizing it, and newer op versions run other kernels (the same values to
    within an ulp, which is not always the same rounding)."""
    def opset(m):
        return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)

    if reference is None or opset(reference) <= opset(model):
        return model
    try:
        return onnx.version_converter.convert_version(model, opset(reference))
    except Exception as exc:
        raise MpstudioError(f"could not move the all-8-bit model to opset {opset(reference)}: {exc}") from exc
