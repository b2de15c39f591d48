"""Isolation scores: the output metric when one tensor (or region) alone is promoted to 16 bits from the
all-8-bit plan, and when it alone stays at 8 bits in the all-16-bit plan.

Regenerating a QDQ model and opening a session per candidate costs about a second each. Instead, the
all-8-bit QDQ model is turned once into a *switchable* model: every activation QuantizeLinear/
DequantizeLinear pair becomes, for each node that reads the tensor, a Clip and two QuantizeLinear(uint16) ->
DequantizeLinear pairs (a convert rounds twice) whose range, scales and zero points are overridable inputs
(the all-8-bit values by default); element-wise constants and Conv/Gemm biases are overridable the same way.
A configuration is resolved into those inputs as ORT would quantize the real plan: `get_qnn_qdq_config`
(through `quantize.qnn_config`) gives each tensor's produced type and its converts; a tensor written with
its input's parameters (Reshape, Transpose, Slice, AveragePool ...) takes them as its input arrives at its
producer; a convert uses the parameters ORT computes from the tensor's own range (`quantize.ort_tensor_params`);
a Relu/Clip that ORT folds into the op before it in the all-8-bit model stays in the graph when a convert
touches it, so the value also passes its input's quantization; a bias is requantized to the scale its
node's input arrives with; 16-bit constants take the all-16-bit model's values. Runs reuse the all-8-bit
activations up to the first node a configuration changes (suffix models cut at a few points).

The switchable model computes as `float_qdq_session` runs a QDQ model on ONNX Runtime's CPU EP:
quantization simulated in float as the graph writes it, at the opset ORT gives plans with 16-bit types, with
fixed kernels; it matches that run of the regenerated model to within a 16-bit step. It leaves out integer
kernel rounding: its numerics are neither the CPU EP's fused integer kernels nor HTP's.
A value that meets more than two quantizations on its way (only where a folded activation stays in the
graph) is rounded on the first coarsest grid and the finest before it; the others move it by less than a
16-bit step.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

import numpy as np
import onnx
import onnx.version_converter
import onnxruntime as ort
import pandas as pd
from onnx import helper, numpy_helper

from ..data import Cancelled, DataSource, Feed, Progress, TaskMetric
from ..errors import MpstudioError
from ..runtime import create_session
from ..evaluate import run_outputs
from ..graph import node_display_name
from ..plan import PrecisionPlan
from .. import qdq
from ..qdq import Encoding
from ..quantize import (CALIBRATION_METHODS, QUANT_TYPES, SIXTEEN_BIT, ResolvedTypes, TensorParams, ort_tensor_params,
                        qnn_config)
from ..metrics import OUTPUT_SNR, ErrorAccumulator

_MS_DOMAIN = "com.microsoft"  # ORT's contrib QuantizeLinear takes uint16 at any opset
_GRAPH_OUTPUT = ""  # the receiver name of an edge into a graph output
_WEIGHT_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}  # their weights keep the plan's weight type
_BIAS_OPS = {"Conv", "ConvTranspose", "Gemm"}  # ORT quantizes their bias to int32 at input scale x weight scale
_FOLDABLE = {"Relu", "Clip"}  # ORT's QDQ quantizer folds these into the op before them
_INT32 = np.iinfo(np.int32)

Edge = tuple[str, str]  # (tensor, receiving node; "" for a graph output)


@dataclass(frozen=True)
class EdgeQuant:
    """How a value is quantized between its producer and one receiver: clipped to [lo, hi], rounded on the
    grid of `first`, then on that of `second` if given (a 16-bit value converted to 8 bits is rounded
    twice). `scale` is the last quantizer's step, the one the receiver's DequantizeLinear carries (and so the
    one a Conv bias is quantized with)."""

    first: Encoding
    lo: float
    hi: float
    scale: float
    second: Encoding | None = None

    @classmethod
    def of(cls, steps: Sequence[Encoding]) -> "EdgeQuant":
        """The value quantized by each of `steps` in turn. Two roundings are kept exactly; of a longer chain
        (a folded activation kept in the graph), the first coarsest one and the finest before it."""
        distinct = [p for i, p in enumerate(steps) if i == 0 or p != steps[i - 1]]
        lo = max(p.clip_range[0] for p in distinct)
        hi = min(p.clip_range[1] for p in distinct)
        if len(distinct) > 2:
            index = max(range(len(distinct)), key=lambda i: (distinct[i].step, -i))
            finer = [p for p in distinct[:index] if p.step < distinct[index].step]
            distinct = ([min(finer, key=lambda p: p.step)] if finer else []) + [distinct[index]]
        return cls(distinct[0], lo, hi, steps[-1].step, distinct[1] if len(distinct) > 1 else None)

    @property
    def params(self) -> Encoding:
        """The coarsest quantization on the way: the precision the receiver gets."""
        return self.first if self.second is None or self.first.step >= self.second.step else self.second

    @property
    def bits(self) -> int:
        return self.params.bits


@dataclass(frozen=True)
class Setting:
    """What one configuration changes from the all-8-bit model: the activation edges (tensor, receiving
    node; "" for a graph output) quantized at 16 bits, the element-wise constants at 16 bits, and every edge
    whose quantization differs from the all-8-bit one (`quant`; when empty, the 16-bit edges take the
    all-16-bit model's parameters)."""

    edges: frozenset[Edge]
    constants: frozenset[str] = frozenset()
    quant: tuple[tuple[Edge, EdgeQuant], ...] = ()


_ALL_8 = Setting(frozenset())


@dataclass(frozen=True, eq=False)
class _Bias:
    """A Conv/Gemm bias the switchable model can requantize: ORT stores round(bias / (input scale x weight
    scale)) as int32."""

    input: str  # the switch input that replaces its DequantizeLinear
    edge: Edge  # the node's data input
    value: np.ndarray  # float64
    weight_scale: np.ndarray  # float32, per channel or a scalar
    beta: float


class SwitchableModel:
    """The all-8-bit QDQ model with every activation edge's quantization chosen at run time (see module docstring).

    `float_model` and `graph` (the prepared float model) let promotions be resolved as the real plan would
    make them; without them a promoted tensor is 16-bit for every node that reads it, and nothing else is.
    `own_params` (ORT's parameters from each tensor's own range, `own_params(quantizer)`) let converts and
    shared parameters follow ORT; `qdq_model_16` (the all-16-bit model) gives 16-bit constants their exact
    values. `from_quantizer` supplies all of them.
    """

    def __init__(self, qdq_model_8, params_16: Mapping[str, Encoding], threads: int | None = None,
                 float_model: onnx.ModelProto | None = None, graph=None, cuts: int = 6, *,
                 own_params: TensorParams | None = None,
                 qdq_model_16=None):
        model_16 = qdq.load(qdq_model_16) if qdq_model_16 is not None else None
        original = qdq.load(qdq_model_8)
        model = _at_opset_of(original, model_16)
        self.float_model, self.graph = float_model, graph
        self.quantized = qdq.read(model).activations()
        self.tensors: list[str] = list(self.quantized)
        self.params_8 = {t: q.encoding for t, q in self.quantized.items()}
        # A tensor the 16-bit model does not quantize keeps its 8-bit parameters in both settings.
        self.params_16 = {t: params_16.get(t, self.params_8[t]) for t in self.tensors}
        for t, params in self.params_8.items():
            if params.qmin != 0:
                raise MpstudioError(f"{t!r} is quantized to signed {params.dtype}; HTP activations are unsigned")
        self.receivers = self._receivers(model)
        self._default = {(t, r): EdgeQuant.of([self.params_8[t]]) for t in self.tensors for r in self.receivers[t]}
        self._shared, self._folded = self._structure(model)
        # Without ORT's own parameters: a folded activation's input has the activation's range, and the
        # all-8/16-bit models' parameters stand in for the rest.
        inputs_of_folded = {source: t for t, (source, _) in self._folded.items()}
        own = own_params or TensorParams({}, {}, {}, {})
        self._own = {
            (kind, bits): {**{source: base[t] for source, t in inputs_of_folded.items()}, **base, **table}
            for kind, bits, base, table in (
                ("written", 8, self.params_8, own.written_8), ("written", 16, self.params_16, own.written_16),
                ("convert", 8, self.params_8, own.convert_8), ("convert", 16, self.params_16, own.convert_16))}
        self._constants_8: dict[str, np.ndarray] = {}
        self._constants_16: dict[str, np.ndarray] = {}
        self._biases: list[_Bias] = []
        self._bias_values: dict[tuple[str, float], np.ndarray] = {}
        self._feeds: dict[tuple[Edge, EdgeQuant], dict[str, np.ndarray]] = {}
        self.model = self._rewrite(model, model_16)
        self.threads = threads or 1
        self.output_names = [o.name for o in self.model.graph.output]
        self._first_use = self._first_uses()
        nodes = len(self.model.graph.node)
        cut_points = {nodes * k // (cuts + 1) for k in range(1, cuts + 1)}
        self._frontier = {cut: self._frontier_of(cut) for cut in sorted(cut_points - {0})}
        self._suffix_sessions: dict[int, ort.InferenceSession] | None = None
        self.session = self._open(self.model)
        # The all-8-bit plan itself stays at its own opset: its baseline comes from the model as it is.
        self._session_8 = self._open(original) if model is not original else None
        # The same model with the frontier as outputs, so ORT's optimizer keeps those values fetchable.
        probe = onnx.ModelProto()
        probe.CopyFrom(self.model)
        frontier = sorted({name for names in self._frontier.values() for name in names} - set(self.output_names))
        probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in frontier)
        self._probe = self._open(probe) if frontier else self.session
        self._settings: dict[frozenset[str], Setting] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_quantizer(cls, quantizer, threads: int | None = None, cuts: int = 6,
                       plan: PrecisionPlan | None = None) -> "SwitchableModel":
        """The switchable model of `quantizer`'s all-8-bit plan (with `plan`'s weights: `plan_ends`), resolving
        configurations as its real plans."""
        end_8, end_16 = plan_ends(plan)
        model_8 = qdq.load(quantizer.generate(end_8))
        model_16 = quantizer.generate(end_16)
        params_16 = {t: q.encoding for t, q in qdq.read(model_16).activations().items()}
        return cls(model_8, params_16, threads, quantizer.prepared.model, quantizer.graph, cuts,
                   own_params=own_params(quantizer, plan), qdq_model_16=model_16)

    # ---- building ---------------------------------------------------------------------------------------
    @staticmethod
    def _node_key(node: onnx.NodeProto, index: int) -> str:
        return node.name or f"#{index}"

    def _receivers(self, model: onnx.ModelProto) -> dict[str, list[str]]:
        """Tensor -> the nodes (and "" for a graph output) that read its quantized value."""
        by_post = {q.post: t for t, q in self.quantized.items()}
        receivers: dict[str, list[str]] = {t: [] for t in self.tensors}
        for index, node in enumerate(model.graph.node):
            key = self._node_key(node, index)
            for name in node.input:
                t = by_post.get(name)
                if t is not None and key not in receivers[t]:
                    receivers[t].append(key)
        for output in model.graph.output:
            if output.name in by_post:
                receivers[by_post[output.name]].append(_GRAPH_OUTPUT)
        return receivers

    def _structure(self, model: onnx.ModelProto) -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
        """What the all-8-bit model shows of ORT's choices that hold in every plan:
        shared: tensor -> (input, producer) when ORT writes the tensor with its producer's input's parameters
        (the two Quantize nodes read the same scale initializer);
        folded: tensor -> (input, Relu/Clip node) when ORT folded the Relu/Clip producing it into the op before."""
        if self.graph is None:
            return {}, {}
        scales = {node_display_name(n, i): n.input[1] for i, n in enumerate(model.graph.node)
                  if n.op_type == "QuantizeLinear"}
        scale_of = {t: scales.get(q.quantize_node) for t, q in self.quantized.items()}
        present = {n.name for n in model.graph.node if n.name}
        shared, folded = {}, {}
        for t in self.tensors:
            info = self.graph.tensors.get(t)
            node = self.graph.nodes.get(info.producer) if info is not None and info.producer else None
            if node is None or not node.inputs or not node.inputs[0]:
                continue
            source = node.inputs[0]
            if node.op_type in _FOLDABLE and node.name not in present:
                folded[t] = (source, node.name)
            elif source in scale_of and scale_of[source] is not None and scale_of[source] == scale_of[t]:
                shared[t] = (source, node.name)
        return shared, folded

    def _rewrite(self, model: onnx.ModelProto, model_16: onnx.ModelProto | None) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        graph = out.graph
        inits = {i.name: i for i in graph.initializer}
        by_q = {q.quantize_node: q for q in self.quantized.values()}
        posts = {q.post: t for t, q in self.quantized.items()}
        switchable_constants = self._switchable_constants(graph, inits, model_16)
        switchable_biases = self._switchable_biases(graph, inits, posts)
        nodes, switches = [], []
        for index, node in enumerate(graph.node):
            t = by_q.get(node_display_name(node, index)) if node.op_type == "QuantizeLinear" else None
            if t is not None:
                for receiver in self.receivers[t.name]:
                    p = _input_names((t.name, receiver))
                    value = t.post if receiver == _GRAPH_OUTPUT else p["value"]
                    nodes += [
                        helper.make_node("Clip", [t.pre, p["lo"], p["hi"]], [p["clipped"]], name=f"{p['prefix']}Clip"),
                        helper.make_node("QuantizeLinear", [p["clipped"], p["scale"], p["zp"]], [p["q"]],
                                         name=f"{p['prefix']}Quantize", domain=_MS_DOMAIN),
                        helper.make_node("DequantizeLinear", [p["q"], p["scale"], p["zp"]], [p["first"]],
                                         name=f"{p['prefix']}Dequantize", domain=_MS_DOMAIN),
                        helper.make_node("QuantizeLinear", [p["first"], p["scale_2"], p["zp_2"]], [p["q_2"]],
                                         name=f"{p['prefix']}Quantize2", domain=_MS_DOMAIN),
                        helper.make_node("DequantizeLinear", [p["q_2"], p["scale_2"], p["zp_2"]], [value],
                                         name=f"{p['prefix']}Dequantize2", domain=_MS_DOMAIN),
                    ]
                    edge = (t.name, receiver)
                    switches.append(self._edge_feed(edge, self._default[edge]))
                continue
            if node.op_type == "DequantizeLinear" and (node.output[0] in posts or node.output[0] in switchable_constants
                                                       or node.output[0] in switchable_biases):
                continue
            key = self._node_key(node, index)
            for i, name in enumerate(node.input):
                if name in posts:
                    node.input[i] = _input_names((posts[name], key))["value"]
                elif name in switchable_biases:
                    node.input[i] = switchable_biases[name]
            nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
        for name, value in self._constants_8.items():
            switches.append({_constant_input(name): value})
        for bias in self._biases:
            switches.append({bias.input: self._bias_value(bias, self._default[bias.edge].scale)})
        for feed in switches:
            for name, value in feed.items():
                graph.initializer.append(numpy_helper.from_array(value, name))
                graph.input.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
        if not any(op.domain == _MS_DOMAIN for op in out.opset_import):
            out.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
        return out

    def _switchable_constants(self, graph: onnx.GraphProto, inits, model_16: onnx.ModelProto | None) -> set[str]:
        """DequantizeLinear outputs of per-tensor constants read by element-wise ops; each becomes an
        overridable float initializer (its 8-bit value), renamed for `_constant_input`."""
        if self.float_model is None:
            return set()
        floats = {i.name: i for i in self.float_model.graph.initializer}
        values_16 = _dequantized_constants(model_16) if model_16 is not None else {}
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
            q = numpy_helper.to_array(inits[node.input[0]]).astype(np.int64)
            zero = numpy_helper.to_array(inits[node.input[2]]).astype(np.int64).reshape(())
            value_8 = np.asarray((q - zero).astype(np.float32) * scale.astype(np.float32).reshape(()), np.float32)
            value_f = numpy_helper.to_array(floats[name]).astype(np.float32)
            if value_f.shape != value_8.shape:
                continue
            self._constants_8[name] = value_8
            value_16 = values_16.get(name)
            # Without the all-16-bit model the float value stands in (16-bit steps are 1/257 of the 8-bit ones).
            self._constants_16[name] = value_16 if value_16 is not None and value_16.shape == value_8.shape else value_f
            chosen[out] = name
        for node in graph.node:
            for i, input_name in enumerate(node.input):
                if input_name in chosen:
                    node.input[i] = _constant_input(chosen[input_name])
        return set(chosen)

    def _switchable_biases(self, graph: onnx.GraphProto, inits, posts: Mapping[str, str]) -> dict[str, str]:
        """int32 biases of Conv/Gemm nodes that read a quantized activation: DequantizeLinear output -> the
        switch input that replaces it (the bias at the node's input scale)."""
        if self.float_model is None:
            return {}
        floats = {i.name: i for i in self.float_model.graph.initializer}
        producers = {o: n for n in graph.node for o in n.output}
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
            bias = _Bias(input=f"mpstudio_switch/bias/{node.input[2]}",
                         edge=(posts[node.input[0]], self._node_key(node, index)),
                         value=numpy_helper.to_array(floats[node.input[2]]).astype(np.float64),
                         weight_scale=numpy_helper.to_array(inits[weight_dq.input[1]]).astype(np.float32), beta=beta)
            self._biases.append(bias)
            chosen[node.input[2]] = bias.input
        return chosen

    def _bias_value(self, bias: _Bias, input_scale: float) -> np.ndarray:
        """The dequantized bias as ORT quantizes it for `input_scale`."""
        key = (bias.input, input_scale)
        value = self._bias_values.get(key)
        if value is None:
            scale = np.float32(input_scale) * bias.weight_scale * np.float32(bias.beta)
            q = np.clip(np.round(bias.value / scale.astype(np.float64)), _INT32.min, _INT32.max)
            value = self._bias_values[key] = (q.astype(np.float32) * scale).astype(np.float32)
        return value

    @staticmethod
    def _edge_feed(edge: Edge, quant: EdgeQuant) -> dict[str, np.ndarray]:
        p = _input_names(edge)
        first, second = quant.first, quant.second or quant.first  # rounding twice on one grid is rounding once
        return {p["lo"]: np.array(quant.lo, np.float32), p["hi"]: np.array(quant.hi, np.float32),
                p["scale"]: np.array(first.step, np.float32),
                p["zp"]: np.array(first.zero - first.qmin, np.uint16),
                p["scale_2"]: np.array(second.step, np.float32),
                p["zp_2"]: np.array(second.zero - second.qmin, np.uint16)}

    def _first_uses(self) -> dict[str, int]:
        """Switch input -> index of the first node that reads it."""
        first: dict[str, int] = {}
        for index, node in enumerate(self.model.graph.node):
            for name in node.input:
                first.setdefault(name, index)
        return first

    def _constant_nodes(self) -> list[bool]:
        """Per node: whether it computes from fixed initializers only (a Constant, a weight's DequantizeLinear)."""
        graph = self.model.graph
        known = {i.name for i in graph.initializer} - {i.name for i in graph.input}
        flags = []
        for node in graph.node:
            constant = node.op_type == "Constant" or all(name in known for name in node.input if name)
            if constant:
                known.update(o for o in node.output if o)
            flags.append(constant)
        return flags

    def _frontier_of(self, cut: int) -> list[str]:
        """Tensors computed before node `cut` and read from it on (graph inputs and switches excluded)."""
        graph = self.model.graph
        # Constant computations are carried into the suffix, so the frontier holds activations only: a weight
        # fed as an input would not be prepacked, and its node would run another kernel.
        constant = self._constant_nodes()
        produced = {o for n, c in zip(graph.node[:cut], constant) if not c for o in n.output if o}
        used = {i for n in graph.node[cut:] for i in n.input if i} | {o.name for o in graph.output}
        return sorted(produced & used)

    def _suffix(self, cut: int, types: Mapping[str, np.dtype]) -> onnx.ModelProto:
        """The switchable model from node `cut` on, reading the frontier's values as graph inputs."""
        graph = self.model.graph
        constant = self._constant_nodes()
        after = [n for n, c in zip(graph.node[:cut], constant) if c] + list(graph.node[cut:])
        used = {i for n in after for i in n.input if i} | {o.name for o in graph.output}
        inits = [i for i in graph.initializer if i.name in used]
        inputs = [i for i in graph.input if i.name in used]
        inputs += [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(types[name]), None)
                   for name in self._frontier[cut]]
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        model.graph.CopyFrom(helper.make_graph(after, f"{graph.name}_from_{cut}", inputs, list(graph.output), inits))
        return model

    # ---- configurations ---------------------------------------------------------------------------------
    def setting(self, sixteen: Collection[str]) -> Setting:
        """What a QNN-valid plan with `sixteen` (and only those tensors) at 16 bits quantizes at 16 bits."""
        key = frozenset(sixteen)
        with self._lock:
            known = self._settings.get(key)
        if known is not None:
            return known
        if self.graph is None or self.float_model is None:
            setting = Setting(frozenset((t, r) for t in key if t in self.receivers for r in self.receivers[t]))
        else:
            setting = self._resolve(key)
        with self._lock:
            self._settings[key] = setting
        return setting

    def _resolve(self, sixteen: frozenset[str]) -> Setting:
        everything = set(self.tensors)
        promoted = [t for t in sixteen if t in self.graph.tensors]
        if len(promoted) * 2 <= len(everything):
            plan = PrecisionPlan.a8w8().promote(promoted)
        else:
            demoted = [t for t in everything - sixteen if t in self.graph.tensors]
            plan = PrecisionPlan.a16w8().promote(demoted, to="uint8")
        overrides = qnn_config(self.float_model, self.graph, plan).extra_options.get("TensorQuantOverrides", {})
        plan_quant = _PlanQuant(self, overrides, QUANT_TYPES[plan.activation_type])
        quant, edges = [], set()
        for t in self.tensors:
            for receiver in self.receivers[t]:
                edge = (t, receiver)
                value = plan_quant.edge(t, receiver)
                if value.bits == 16:
                    edges.add(edge)
                if value != self._default[edge]:
                    quant.append((edge, value))
        constants = {name for name in self._constants_16 if plan_quant.types.produced(name) in SIXTEEN_BIT}
        return Setting(frozenset(edges), frozenset(constants), tuple(sorted(quant, key=lambda item: item[0])))

    def parameter_feed(self, setting: Setting) -> Feed:
        """The switch inputs `setting` changes from their all-8-bit defaults."""
        if setting.quant:
            quant = dict(setting.quant)
        else:
            quant = {edge: EdgeQuant.of([self.params_16[edge[0]]]) for edge in setting.edges if edge in self._default}
        feed: Feed = {}
        for edge, value in quant.items():
            key = (edge, value)
            cached = self._feeds.get(key)
            if cached is None:
                cached = self._feeds[key] = self._edge_feed(edge, value)
            feed.update(cached)
        for name in setting.constants:
            feed[_constant_input(name)] = self._constants_16[name]
        for bias in self._biases:
            value = quant.get(bias.edge)
            if value is not None and value.scale != self._default[bias.edge].scale:
                feed[bias.input] = self._bias_value(bias, value.scale)
        return feed

    def first_change(self, feed: Feed) -> int:
        """The index of the first node whose inputs the parameter feed `feed` changes (the node count when none)."""
        end = len(self.model.graph.node)
        return min((self._first_use.get(n, end) for n in feed), default=end)

    def run(self, sample: Feed, sixteen: Collection[str] | Setting) -> list[np.ndarray]:
        """The model's outputs with `sixteen` (and what a QNN-valid plan converts with it) at 16 bits."""
        setting = sixteen if isinstance(sixteen, Setting) else self.setting(sixteen)
        if self._session_8 is not None and setting == _ALL_8:
            return self._session_8.run(self.output_names, sample)
        return self.session.run(self.output_names, {**sample, **self.parameter_feed(setting)})

    def cached(self, samples: Sequence[Feed]) -> "CachedSamples":
        """`samples` with their all-8-bit activations at the cut points, for runs that skip the unchanged prefix."""
        return CachedSamples(self, list(samples))

    def _suffix_session(self, cut: int, types: Mapping[str, np.dtype]) -> ort.InferenceSession:
        with self._lock:
            if self._suffix_sessions is None:
                self._suffix_sessions = {c: self._open(self._suffix(c, types)) for c in self._frontier}
            return self._suffix_sessions[cut]

    @staticmethod
    def _open(model: onnx.ModelProto) -> ort.InferenceSession:
        # Configurations run concurrently, one thread each: better use of the cores than intra-op threads
        # on the small tensors of a mobile model.
        try:
            return float_qdq_session(model.SerializeToString(), threads=1)
        except Exception as exc:
            raise MpstudioError(f"ONNX Runtime could not open the switchable model: {exc}") from exc


def float_qdq_session(model, threads: int = 0) -> ort.InferenceSession:
    """An ONNX Runtime CPU session that runs a QDQ model (path or serialized bytes) with the switchable model's
    numerics: quantization simulated in float as the graph writes it (ORT's QDQ transformations, which fuse
    node groups into integer kernels or move and drop Q/DQ pairs, are off), and without ORT's NCHWc layout
    kernels, which sum in another order and are used or not depending on the graph around each Conv or Pool:
    a one-ulp difference flips an 8-bit rounding now and then, and one flip can move a model's output."""
    return create_session(model, numerics="fake-quant", intra_op_threads=threads)


def _at_opset_of(model: onnx.ModelProto, reference: onnx.ModelProto | None) -> onnx.ModelProto:
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


class _PlanQuant:
    """How one plan quantizes each edge of a switchable model (see the module docstring)."""

    def __init__(self, model: SwitchableModel, overrides: Mapping, default):
        self.model, self.overrides = model, overrides
        self.types = ResolvedTypes(dict(overrides), default)
        self._written: dict[str, Encoding] = {}

    def own(self, tensor: str, quant_type, kind: str = "written") -> Encoding:
        return self.model._own[kind, 16 if quant_type in SIXTEEN_BIT else 8][tensor]

    def written(self, tensor: str) -> Encoding:
        """The parameters `tensor`'s producer writes it with."""
        known = self._written.get(tensor)
        if known is None:
            shared = self.model._shared.get(tensor)
            if shared is not None:
                known = self.received(*shared)[-1]
            else:
                known = self.own(tensor, self.types.produced(tensor))
            self._written[tensor] = known
        return known

    def received(self, tensor: str, node: str) -> list[Encoding]:
        """The quantizations `tensor` passes on its way to `node`, in order."""
        steps = [self.written(tensor)]
        convert = self.types.converted(tensor, node) if node != _GRAPH_OUTPUT else None
        if convert is not None:
            steps.append(self.own(tensor, convert, "convert"))
        return steps

    def edge(self, tensor: str, node: str) -> EdgeQuant:
        steps = self.received(tensor, node)
        folded = self.model._folded.get(tensor)
        # ORT folds the Relu/Clip again unless a convert touches its input or output; then the value also
        # passes the input's quantization before the activation.
        if folded is not None and (self.types.has_convert(folded[0]) or self.types.has_convert(tensor)):
            steps = self.received(*folded) + steps
        return EdgeQuant.of(steps)


def plan_ends(plan: PrecisionPlan | None = None) -> tuple[PrecisionPlan, PrecisionPlan]:
    """The all-8-bit and all-16-bit activation plans with `plan`'s weights (its default weight type,
    granularity and symmetry; its overrides left out): the two models isolation switches between. For None
    or any per-tensor uint8 plan, a8w8 and a16w8 themselves."""
    plan = plan or PrecisionPlan.a8w8()
    weights = dict(weight_type=plan.weight_type, per_channel=plan.per_channel, weight_symmetric=plan.weight_symmetric)
    return (PrecisionPlan(activation_type="uint8", name="a8w8", **weights),
            PrecisionPlan(activation_type="uint16", name="a16w8", **weights))


def own_params(quantizer, plan: PrecisionPlan | None = None) -> TensorParams:
    """The parameters ORT computes for every tensor of `quantizer`'s model from its own range, for the
    activations of `plan_ends(plan)` (the ranges are calibrated with that plan's weights)."""
    end_8, end_16 = plan_ends(plan)
    cache = quantizer.calibrate(plan=end_8)
    method = CALIBRATION_METHODS[quantizer.method]
    model, graph = quantizer.prepared.model, quantizer.graph
    config_8 = qnn_config(model, graph, end_8, method)
    config_16 = qnn_config(model, graph, end_16, method)
    def table(config, range_only):
        return ort_tensor_params(model, cache.path, config, range_only)

    return TensorParams(written_8=table(config_8, False), written_16=table(config_16, False),
                            convert_8=table(config_8, True), convert_16=table(config_16, True))


def _dequantized_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Float constant name -> its dequantized value in `model`, for per-tensor quantized initializers."""
    read = qdq.read(model)
    values = {name: read.dequantized_constant(name) for name in read.params()}
    return {name: value for name, value in values.items() if value is not None}


class CachedSamples:
    """Evaluation samples bound to a switchable model, with the all-8-bit activations at its cut points."""

    def __init__(self, model: SwitchableModel, samples: list[Feed]):
        self.model, self.samples = model, samples
        frontier = sorted({name for names in model._frontier.values() for name in names})
        wanted = list(dict.fromkeys(model.output_names + frontier))
        self.values = [dict(zip(wanted, model._probe.run(wanted, sample))) for sample in samples]
        types = {name: value.dtype for name, value in self.values[0].items()} if self.values else {}
        self.sessions = {cut: model._suffix_session(cut, types) for cut in model._frontier} if samples else {}
        self.inputs = {cut: {i.name for i in s.get_inputs()} for cut, s in self.sessions.items()}
        self._unchanged = [[v[name] for name in model.output_names] for v in self.values]
        self.all_8 = self._unchanged if model._session_8 is None else [
            model._session_8.run(model.output_names, sample) for sample in samples]

    def head(self, n: int) -> "CachedSamples":
        """The first `n` samples, sharing this object's sessions and cached activations."""
        if n >= len(self.samples):
            return self
        part = object.__new__(CachedSamples)
        part.model, part.samples, part.values = self.model, self.samples[:n], self.values[:n]
        part.sessions, part.inputs = self.sessions, self.inputs
        part._unchanged, part.all_8 = self._unchanged[:n], self.all_8[:n]
        return part

    def outputs(self, setting: Setting) -> list[list[np.ndarray]]:
        """Every sample's model outputs under `setting`."""
        model = self.model
        feed = model.parameter_feed(setting)
        start = model.first_change(feed)
        if start >= len(model.model.graph.node):
            return self.all_8 if setting == _ALL_8 else self._unchanged
        cut = max((c for c in self.sessions if c <= start), default=0)
        if cut == 0:
            return [model.session.run(model.output_names, {**s, **feed}) for s in self.samples]
        session, inputs, names = self.sessions[cut], self.inputs[cut], model._frontier[cut]
        results = []
        for sample, values in zip(self.samples, self.values):
            run_feed = {k: v for k, v in sample.items() if k in inputs}
            run_feed.update({n: values[n] for n in names})
            run_feed.update(feed)
            results.append(session.run(model.output_names, run_feed))
        return results


def _input_names(edge: tuple[str, str]) -> dict[str, str]:
    tensor, receiver = edge
    prefix = f"mpstudio_switch/{tensor}/{receiver or 'output'}/"
    return {"prefix": prefix, "lo": prefix + "lo", "hi": prefix + "hi", "scale": prefix + "scale",
            "zp": prefix + "zero_point", "clipped": prefix + "clipped", "q": prefix + "quantized",
            "value": prefix + "value", "first": prefix + "first", "scale_2": prefix + "scale_2",
            "zp_2": prefix + "zero_point_2", "q_2": prefix + "quantized_2"}


def _constant_input(name: str) -> str:
    return f"mpstudio_switch/constant/{name}"


class OutputScorer:
    """Scores a configuration's outputs over the evaluation samples: output SNR, or a task metric."""

    def __init__(self, references: Sequence[list[np.ndarray]], output_names: Sequence[str],
                 metric: TaskMetric | None = None):
        self.references, self.output_names, self.metric = list(references), list(output_names), metric

    @property
    def higher_is_better(self) -> bool:
        return self.metric.higher_is_better if self.metric else True

    @property
    def name(self) -> str:
        return self.metric.name if self.metric else OUTPUT_SNR

    def score(self, outputs: Sequence[list[np.ndarray]]) -> float:
        if self.metric is not None:
            reference = ([dict(zip(self.output_names, r)) for r in self.references]
                         if self.metric.needs_reference else None)
            return self.metric([dict(zip(self.output_names, o)) for o in outputs], reference)
        acc = ErrorAccumulator()
        for reference, values in zip(self.references, outputs):
            for r, v in zip(reference, values):
                acc.add(r, v)
        return acc.snr_db

    def gain(self, value: float, baseline: float) -> float:
        """How much better `value` is than `baseline`, positive when better, in the metric's units."""
        return (value - baseline) if self.higher_is_better else (baseline - value)


def float_references(float_model, data: DataSource, output_names: Sequence[str]) -> list[list[np.ndarray]]:
    """The float model's outputs for every sample (small: the model outputs only)."""
    return [[outputs[name] for name in output_names] for outputs in run_outputs(float_model, data)]


# Columns of `isolation_scores` (one row per candidate: a tensor or a region):
#   region, source (tensor/namespace/qnn/selection/...), tensors (how many activation tensors), members
#   (their names, joined by ";"), promoted (metric with only this region at 16 bits in the all-8-bit plan),
#   promoted_gain (its improvement over all-8-bit, positive = better), demoted (metric with only this region
#   at 8 bits in the all-16-bit plan), demoted_loss (its loss against all-16-bit, positive = worse).
ISOLATION_COLUMNS = ["region", "source", "tensors", "members", "promoted", "promoted_gain", "demoted", "demoted_loss"]


@dataclass(frozen=True)
class Region:
    """A named group of activation tensors that is promoted or demoted together."""

    name: str
    tensors: tuple[str, ...]
    source: str = "tensor"


@dataclass(frozen=True)
class IsolationResult:
    """Isolation scores with the two baselines they are measured from."""

    scores: pd.DataFrame  # ISOLATION_COLUMNS
    metric: str
    higher_is_better: bool
    all_8: float
    all_16: float
    samples: int

    def per_tensor(self) -> pd.DataFrame:
        """The rows of single tensors, indexed by tensor name."""
        return self.scores[self.scores["source"] == "tensor"].set_index("region")


def isolation_scores(
    switchable: SwitchableModel,
    data: DataSource,
    regions: Sequence[Region],
    scorer: OutputScorer,
    both_directions: bool = True,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> IsolationResult:
    """Evaluate each region promoted alone (and, if `both_directions`, demoted alone) on `data`."""
    samples = switchable.cached(list(data.feeds()))  # the evaluation subset is small; every configuration reuses it
    everything = frozenset(switchable.tensors)
    members = [frozenset(region.tensors) & everything for region in regions]
    configs: list[frozenset[str]] = [frozenset(), everything]
    for m in members:
        configs += [m, everything - m] if both_directions else [m]
    total = len(configs)
    done = [0]
    lock = threading.Lock()

    def evaluate(config: frozenset[str]) -> float:
        if cancel is not None and cancel.is_set():
            raise Cancelled("isolation scoring cancelled")
        value = scorer.score(samples.outputs(switchable.setting(config)))
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], total, "isolation scores")
        return value

    with ThreadPoolExecutor(max_workers=switchable.threads) as pool:
        values = iter(list(pool.map(evaluate, configs)))
    all_8, all_16 = next(values), next(values)
    rows = []
    for region, m in zip(regions, members):
        promoted = next(values)
        demoted = next(values) if both_directions else np.nan
        rows.append({
            "region": region.name, "source": region.source, "tensors": len(m),
            "members": ";".join(region.tensors), "promoted": promoted,
            "promoted_gain": scorer.gain(promoted, all_8),
            "demoted": demoted, "demoted_loss": scorer.gain(all_16, demoted),
        })
    return IsolationResult(pd.DataFrame(rows, columns=ISOLATION_COLUMNS), scorer.name, scorer.higher_is_better,
                           all_8, all_16, len(samples.samples))


def tensor_regions(tensors: Sequence[str]) -> list[Region]:
    return [Region(t, (t,), "tensor") for t in tensors]
