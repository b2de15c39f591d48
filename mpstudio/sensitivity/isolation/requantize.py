"""The HTP's requantization (`htp_requantize`) in the switchable model.

The regenerated plans' CPU numerics compute each 8-bit Conv/Gemm with the HTP's shifted accumulator and 12-bit
multiplier wherever a plan leaves the node's input and output at 8 bits, and each Add with the HTP's integer
multipliers wherever its operands and output share a width (8 or 16 bits). In the switchable model each such node
computes both its plain value and the rule's, and a switch input selects one. The rule's per-node constants (the
accumulator's shift step and multiplier, the bias requantized to the input's scale, the Add's multipliers and
constant, a constant operand's step, the output scale) are switch inputs too, computed in Python per
configuration from the scales and zero points its edges carry (`RequantizeSwitches.feed`), the all-8-bit values
by default. The input codes are recovered in the graph from each edge's dequantized value (value / its last step,
rounded: exact, the value is a code times that step).

Which nodes the rule covers is read from the all-8-bit model on the HTP's weight grid (`runtime.htp_weight_grid`,
as the plans' numerics take it where input and output share a width), through `htp_requantize`'s own operand
checks. A node whose bias or constant operand the switchable model cannot requantize (a model prepared without
its float model; a 16-bit constant without the all-16-bit model's encoding) is left plain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ... import qdq
from ...htp_accumulator import graph_links, initializer_array, quantizers_after
from ...htp_requantize import (accumulator_bias, add_constants, add_operands, added_value_nodes, conv_operands,
                              one_element_constant, requantize_constants, requantized_value_nodes)
from ...qdq import Encoding
from ...runtime import htp_weight_grid
from .edges import Bias, Edge, EdgeQuant, bias_codes, constant_input, switch_names

Feed = dict[str, np.ndarray]
QuantOf = Callable[[Edge], EdgeQuant]


@dataclass(frozen=True, eq=False)
class ConvRule:
    """A Conv or Gemm the rule covers: its data input's edge, the edges of the tensor it writes, the HTP's weight
    codes and scale per output channel (float64) and its bias."""

    prefix: str
    input: Edge
    outputs: tuple[Edge, ...]
    codes: np.ndarray  # the weight codes the HTP multiplies by (minus a uint8 weight's zero point)
    w_scale: np.ndarray
    bias: Bias
    shape: tuple[int, ...]  # of its per-channel constants

    @property
    def edges(self) -> tuple[Edge, ...]:
        return (self.input,) + self.outputs


@dataclass(frozen=True)
class Operand:
    """One input of an Add: an activation edge, or a constant (a switchable one named by `constant`, 16-bit in
    some plans, or a fixed one) with its 8-bit encoding and its 16-bit one where known."""

    edge: Edge | None = None
    constant: str | None = None
    encoding: Encoding | None = None
    encoding_16: Encoding | None = None


@dataclass(frozen=True, eq=False)
class AddRule:
    """An Add the rule covers: its two operands and the edges of the tensor it writes; `exact_at_8` when the HTP
    adds it exactly at 8 bits (a one-element constant)."""

    prefix: str
    operands: tuple[Operand, Operand]
    outputs: tuple[Edge, ...]
    exact_at_8: bool = False

    @property
    def edges(self) -> tuple[Edge, ...]:
        return tuple(o.edge for o in self.operands if o.edge is not None) + self.outputs


def received(quant: EdgeQuant) -> Encoding:
    """The encoding of the DequantizeLinear the receiving node reads (its last quantization)."""
    return quant.second or quant.first


def _width(encoding: Encoding | None) -> int | None:
    """8 or 16 for a per-tensor unsigned activation encoding of that width, else None."""
    if encoding is None or encoding.qmin != 0 or encoding.per_channel or encoding.bits not in (8, 16):
        return None
    return encoding.bits


def _output(outputs: tuple[Edge, ...], quant: QuantOf) -> Encoding | None:
    """The one 8-bit or 16-bit encoding the node's output is written with, or None."""
    written = {quant(edge).first for edge in outputs}
    encoding = written.pop() if len(written) == 1 else None
    return encoding if _width(encoding) else None


def conv_feed(rule: ConvRule, quant: QuantOf) -> Feed:
    """The switch inputs of `rule` for a configuration whose edges quantize as `quant`."""
    off = {rule.prefix + "on": np.array(False)}
    arriving = quant(rule.input)
    output = _output(rule.outputs, quant)
    if output is None or _width(output) != 8 or _width(received(arriving)) != 8:
        return off
    codes, b_scale = bias_codes(rule.bias, arriving.scale)
    bias = accumulator_bias(codes, b_scale, arriving.scale, rule.w_scale)
    if bias is None:
        return off
    step, multiplier = requantize_constants(arriving.scale, rule.w_scale, output.step)
    return {rule.prefix + "on": np.array(True), rule.prefix + "step": step.reshape(rule.shape),
            rule.prefix + "multiplier": multiplier.reshape(rule.shape),
            rule.prefix + "bias": bias.astype(np.float32), rule.prefix + "y_scale": np.array(output.step)}


def add_feed(rule: AddRule, quant: QuantOf, sixteen_constants: Collection[str]) -> Feed:
    """The switch inputs of `rule` for a configuration whose edges quantize as `quant` and whose constants
    `sixteen_constants` are 16-bit."""
    off = {rule.prefix + "on": np.array(False)}
    encodings = []
    for operand in rule.operands:
        if operand.edge is not None:
            encodings.append(received(quant(operand.edge)))
        else:
            encodings.append(operand.encoding_16 if operand.constant in sixteen_constants else operand.encoding)
    output = _output(rule.outputs, quant)
    bits = _width(output)
    if bits is None or any(_width(e) != bits for e in encodings) or (bits == 8 and rule.exact_at_8):
        return off
    a, b = encodings
    m_a, m_b, constant, shift = add_constants(a.step, a.zero, b.step, b.zero, output.step, output.zero, bits)
    # the graph multiplies codes minus their zero points: their terms move into the constant, with + 1/2 output
    # step and - the output zero point (in 2^-s steps), as `htp_requantize` writes it
    constant += a.zero * m_a + b.zero * m_b + 0.5 * shift - output.zero * shift
    feed = {rule.prefix + "on": np.array(True), rule.prefix + "constant": np.array(constant),
            rule.prefix + "shift": np.array(shift), rule.prefix + "y_scale": np.array(output.step)}
    feed[rule.prefix + "m_a"], feed[rule.prefix + "m_b"] = np.array(m_a), np.array(m_b)
    for name, operand, encoding in zip("ab", rule.operands, encodings):
        if operand.edge is None:
            feed[rule.prefix + name + "_step"] = np.array(encoding.step, np.float32)
    return feed


class RequantizeSwitches:
    """The rules of one switchable model and the switch inputs a configuration gives them (see the module
    docstring)."""

    def __init__(self, rules: list[ConvRule | AddRule], default: Mapping[Edge, EdgeQuant]):
        self.rules = rules
        self.defaults: Feed = {}
        for rule in rules:
            self.defaults.update(_placeholders(rule))  # (for a rule off at all 8 bits)
            self.defaults.update(self._feed(rule, default.__getitem__, ()))
        self._cache: dict[tuple, Feed] = {}

    @staticmethod
    def _feed(rule, quant: QuantOf, sixteen_constants: Collection[str]) -> Feed:
        return conv_feed(rule, quant) if isinstance(rule, ConvRule) else add_feed(rule, quant, sixteen_constants)

    def feed(self, quant: QuantOf, sixteen_constants: Collection[str]) -> Feed:
        """The switch inputs whose values a configuration (its edges quantized as `quant`, its constants
        `sixteen_constants` at 16 bits) changes from the all-8-bit defaults."""
        out: Feed = {}
        for rule in self.rules:
            constants = tuple(o.constant in sixteen_constants for o in getattr(rule, "operands", ()))
            key = (rule.prefix, tuple(quant(edge) for edge in rule.edges), constants)
            cached = self._cache.get(key)
            if cached is None:
                full = self._feed(rule, quant, sixteen_constants)
                cached = self._cache[key] = {name: value for name, value in full.items()
                                             if not np.array_equal(value, self.defaults[name])}
            out.update(cached)
        return out


def _placeholders(rule: ConvRule | AddRule) -> Feed:
    """A value of the right type and shape for every switch input of `rule`, the rule off."""
    p = rule.prefix
    feed = {p + "on": np.array(False), p + "y_scale": np.array(1.0)}
    if isinstance(rule, ConvRule):
        ones = np.ones(rule.shape)
        return feed | {p + "step": ones, p + "multiplier": ones, p + "bias": np.zeros(rule.w_scale.size, np.float32)}
    feed |= {p + n: np.array(v) for n, v in [("constant", 0.0), ("shift", 1.0), ("m_a", 0.0), ("m_b", 0.0)]}
    return feed | {p + n + "_step": np.array(1.0, np.float32) for n, o in zip("ab", rule.operands) if o.edge is None}


def follow(graph: onnx.GraphProto, model_8: onnx.ModelProto, quantized: Mapping[str, qdq.QuantizedTensor],
           receivers: Mapping[str, list[str]], biases: list[Bias], default: Mapping[Edge, EdgeQuant],
           constants_16: Mapping[str, Encoding] = {}) -> RequantizeSwitches:
    """Rewrite, in place, each node of the switchable `graph` the rule covers in the all-8-bit `model_8` into
    its plain and its rule's value and a selection between them; the rules and their default switch inputs.
    `constants_16`: the 16-bit encoding of each switchable constant, where the all-16-bit model gives it."""
    grid = onnx.ModelProto()
    grid.CopyFrom(model_8)
    htp_weight_grid(grid)
    inits, producers, consumers = graph_links(grid.graph)
    by_output = {n.output[0]: n for n in grid.graph.node if n.output}
    edges = {switch_names((t, r))["value"]: (t, r) for t in receivers for r in receivers[t]}
    by_bias = {b.input: b for b in biases}
    written: dict[str, list[Edge]] = {}
    for t, q in quantized.items():
        written.setdefault(q.pre, []).extend((t, r) for r in receivers[t])
    rules: list[ConvRule | AddRule] = []
    nodes = []
    for node in graph.node:
        original = by_output.get(node.output[0]) if node.output else None
        rule = None
        if original is not None and node.op_type in ("Conv", "Gemm"):
            rule = _conv_rule(node, original, (inits, producers, consumers), edges, by_bias, written)
        elif original is not None and node.op_type == "Add":
            rule = _add_rule(node, original, (inits, producers, consumers), edges, written, constants_16)
        if rule is None:
            nodes.append(node)
            continue
        rules.append(rule)
        nodes += _rule_nodes(node, rule)
    del graph.node[:]
    graph.node.extend(nodes)
    return RequantizeSwitches(rules, default)


def _written_edges(node, links, written: Mapping[str, list[Edge]]) -> tuple[Edge, ...]:
    """The edges of the tensors the all-8-bit model's QuantizeLinears after `node` (through a fused Relu/Clip)
    write."""
    users = quantizers_after(node, links[2])
    return tuple(edge for u in users for edge in written.get(u.input[0], []))


def _conv_rule(node, original, links, edges, by_bias, written) -> ConvRule | None:
    found = conv_operands(original, *links)
    if found is None or len(node.input) < 3 or node.input[0] not in edges or node.input[2] not in by_bias:
        return None
    _, _, _, codes, w_scale, bias, _ = found
    outputs = _written_edges(original, links, written)
    if not outputs:
        return None
    channels = bias.size
    shape = (1, channels) + (1,) * (codes.ndim - 2) if node.op_type == "Conv" else (channels,)
    return ConvRule(_prefix(node), edges[node.input[0]], outputs, codes, w_scale, by_bias[node.input[2]], shape)


def _add_rule(node, original, links, edges, written, constants_16) -> AddRule | None:
    inits, producers, consumers = links
    found = add_operands(original, inits, producers, consumers, exact_constants=False)
    if found is None or found[2] != 8 or len(node.input) != 2:
        return None
    operands = []
    for name, source in zip(node.input, original.input):
        dq = producers[source]
        encoding = Encoding.per_tensor(float(initializer_array(inits, dq.input[1]).reshape(-1)[0]),
                                       int(initializer_array(inits, dq.input[2]).reshape(-1)[0]), "uint8")
        if name in edges:
            operands.append(Operand(edge=edges[name]))
        elif dq.input[0] in inits and name.startswith(constant_input("")):
            constant = name.removeprefix(constant_input(""))
            operands.append(Operand(constant=constant, encoding=encoding, encoding_16=constants_16.get(constant)))
        elif dq.input[0] in inits and name == source:
            operands.append(Operand(encoding=encoding))  # a constant the switchable model leaves as it is
        else:
            return None
    outputs = _written_edges(original, links, written)
    if not outputs:
        return None
    exact_at_8 = any(one_element_constant(codes, inits) for codes, _, _ in found[0])
    return AddRule(_prefix(node), tuple(operands), outputs, exact_at_8)


def _prefix(node) -> str:
    return f"mpstudio_switch/requantize/{node.output[0]}/"


def _rule_nodes(node, rule: ConvRule | AddRule) -> list[onnx.NodeProto]:
    """`node` writing its plain value aside, the rule's value, and the selection of one into its output."""
    p, output = rule.prefix, node.output[0]
    node.output[0] = p + "plain"
    if isinstance(rule, ConvRule):
        value = _conv_value(node, rule)
    else:
        value = _add_value(node, rule)
    return [node, *value, helper.make_node("Where", [p + "on", p + "value", p + "plain"], [output],
                                           name=p + "Select")]


def _codes(value: str, step: str, out: str) -> list[onnx.NodeProto]:
    """A dequantized value's codes minus their zero point: value / step, rounded."""
    return [helper.make_node("Div", [value, step], [out + "_ratio"], name=out + "_Ratio"),
            helper.make_node("Round", [out + "_ratio"], [out], name=out + "_Round")]


def _conv_value(node, rule: ConvRule) -> list[onnx.NodeProto]:
    """The rule's output value of a Conv/Gemm (`htp_requantize`'s nodes, from codes recovered in the graph)."""
    p = rule.prefix
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return _codes(node.input[0], switch_names(rule.input)["scale_2"], p + "centred") + [
        helper.make_node("Constant", [], [p + "w_codes"], name=p + "WeightCodes",
                         value=numpy_helper.from_array(rule.codes.astype(np.float32), "")),
        helper.make_node("Constant", [], [p + "half"], name=p + "Half",
                         value=numpy_helper.from_array(np.float64(0.5), "")),
        helper.make_node(node.op_type, [p + "centred", p + "w_codes", p + "bias"], [p + "sum"], name=p + "Sum",
                         **attributes),
        *requantized_value_nodes(p, p + "value"),
    ]


def _add_value(node, rule: AddRule) -> list[onnx.NodeProto]:
    """The rule's output value of an Add (`htp_requantize`'s nodes, from codes recovered in the graph)."""
    p = rule.prefix
    nodes = []
    for name, source, operand in zip("ab", node.input, rule.operands):
        # a constant operand's step is a switch input (its 8-bit or 16-bit encoding's)
        step = switch_names(operand.edge)["scale_2"] if operand.edge is not None else p + name + "_step"
        nodes += _codes(source, step, p + "r" + name)
        nodes += [helper.make_node("Cast", [p + "r" + name], [p + "q" + name], name=p + "Codes" + name.upper(),
                                   to=TensorProto.DOUBLE),
                  helper.make_node("Mul", [p + "q" + name, p + "m_" + name], [p + "t" + name],
                                   name=p + "Term" + name.upper())]
    return nodes + added_value_nodes(p, p + "value")
