"""Isolation scores: the output metric when one tensor (or region) alone is promoted to 16 bits from the
all-8-bit plan, and when it alone stays at 8 bits in the all-16-bit plan.

Regenerating a QDQ model and opening a session per candidate costs about a second each. Instead, the
all-8-bit QDQ model is turned once into a *switchable* model: every activation QuantizeLinear/
DequantizeLinear pair becomes, for each node that reads the tensor, Clip -> QuantizeLinear(uint16) ->
DequantizeLinear whose range, scale and zero point are overridable initializers (8-bit by default).
Feeding an edge's 16-bit parameters promotes what that node reads; element-wise constants are overridable
the same way. A promotion is resolved as the real plan would make it: ORT's `get_qnn_qdq_config` (through
`quantize.qnn_config`) lists what it converts with the tensor, and a node reads 16-bit values only where
the tensor is produced at 16 bits and not converted back to 8 for that node. Runs reuse the all-8-bit
activations up to the first node a promotion changes (suffix models cut at a few points). What the
switchable model leaves out: integer kernel rounding, and 16-bit constants are fed at float precision.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
from onnx import helper, numpy_helper

from ..data import Cancelled, DataSource, Feed, Progress, TaskMetric
from ..errors import MpstudioError
from ..evaluate import run_outputs
from ..graph import node_display_name
from ..plan import PrecisionPlan
from ..quantize import QUANT_TYPES, SIXTEEN_BIT, ResolvedTypes, qnn_config
from . import qdq
from .stats import ErrorAccumulator

_MS_DOMAIN = "com.microsoft"  # ORT's contrib QuantizeLinear takes uint16 at any opset
_GRAPH_OUTPUT = ""  # the receiver name of an edge into a graph output
_WEIGHT_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}  # their weights keep the plan's weight type
_DQ_SUFFIX = "_DequantizeLinear_Output"
OUTPUT_SNR = "output SNR (dB)"  # the default metric: SNR of all model outputs against the float model's


@dataclass(frozen=True)
class Setting:
    """What one configuration quantizes at 16 bits: activation edges (tensor, receiving node; "" for a graph
    output) and element-wise constants."""

    edges: frozenset[tuple[str, str]]
    constants: frozenset[str] = frozenset()


class SwitchableModel:
    """The all-8-bit QDQ model with every activation edge's bit width chosen at run time (see module docstring).

    `float_model` and `graph` (the prepared float model) let promotions be resolved as the real plan would
    make them; without them a promoted tensor is 16-bit for every node that reads it, and nothing else is.
    """

    def __init__(self, qdq_model_8, params_16: Mapping[str, qdq.QuantParams], threads: int | None = None,
                 float_model: onnx.ModelProto | None = None, graph=None, cuts: int = 6):
        model = qdq.load(qdq_model_8)
        self.float_model, self.graph = float_model, graph
        self.quantized = qdq.quantized_tensors(model)
        self.tensors: list[str] = list(self.quantized)
        self.params_8 = {t: q.params for t, q in self.quantized.items()}
        # A tensor the 16-bit model does not quantize keeps its 8-bit parameters in both settings.
        self.params_16 = {t: params_16.get(t, self.params_8[t]) for t in self.tensors}
        for t, params in self.params_8.items():
            if params.qmin != 0:
                raise MpstudioError(f"{t!r} is quantized to signed {params.dtype}; HTP activations are unsigned")
        self.receivers = self._receivers(model)
        self._constants_8: dict[str, np.ndarray] = {}
        self._constants_16: dict[str, np.ndarray] = {}
        self.model = self._rewrite(model)
        self.threads = threads or 1
        self.output_names = [o.name for o in self.model.graph.output]
        self._feeds_16 = {(t, r): self._edge_feed((t, r), self.params_16[t]) for t in self.tensors
                          for r in self.receivers[t]}
        self._first_use = self._first_uses()
        nodes = len(self.model.graph.node)
        cut_points = {nodes * k // (cuts + 1) for k in range(1, cuts + 1)}
        self._frontier = {cut: self._frontier_of(cut) for cut in sorted(cut_points - {0})}
        self._suffix_sessions: dict[int, ort.InferenceSession] | None = None
        self.session = self._open(self.model)
        # The same model with the frontier as outputs, so ORT's optimizer keeps those values fetchable.
        probe = onnx.ModelProto()
        probe.CopyFrom(self.model)
        frontier = sorted({name for names in self._frontier.values() for name in names} - set(self.output_names))
        probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in frontier)
        self._probe = self._open(probe) if frontier else self.session
        self._settings: dict[frozenset[str], Setting] = {}
        self._lock = threading.Lock()

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

    def _rewrite(self, model: onnx.ModelProto) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        graph = out.graph
        inits = {i.name: i for i in graph.initializer}
        by_q = {q.quantize_node: q for q in self.quantized.values()}
        posts = {q.post: t for t, q in self.quantized.items()}
        switchable_constants = self._switchable_constants(graph, inits)
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
                        helper.make_node("DequantizeLinear", [p["q"], p["scale"], p["zp"]], [value],
                                         name=f"{p['prefix']}Dequantize", domain=_MS_DOMAIN),
                    ]
                    switches.append(self._edge_feed((t.name, receiver), self.params_8[t.name]))
                continue
            if node.op_type == "DequantizeLinear" and (node.output[0] in posts or node.output[0] in switchable_constants):
                continue
            key = self._node_key(node, index)
            for i, name in enumerate(node.input):
                if name in posts:
                    node.input[i] = _input_names((posts[name], key))["value"]
            nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
        for name, value in self._constants_8.items():
            switches.append({_constant_input(name): value})
        for feed in switches:
            for name, value in feed.items():
                graph.initializer.append(numpy_helper.from_array(value, name))
                graph.input.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
        if not any(op.domain == _MS_DOMAIN for op in out.opset_import):
            out.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
        return out

    def _switchable_constants(self, graph: onnx.GraphProto, inits) -> set[str]:
        """DequantizeLinear outputs of per-tensor constants read by element-wise ops; each becomes an
        overridable float initializer (its 8-bit value), renamed for `_constant_input`."""
        if self.float_model is None:
            return set()
        floats = {i.name: i for i in self.float_model.graph.initializer}
        readers: dict[str, set[str]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, set()).add(node.op_type)
        chosen: dict[str, str] = {}  # DequantizeLinear output -> float constant name
        for node in graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in inits or len(node.input) < 3:
                continue
            out = node.output[0]
            name = out.removesuffix(_DQ_SUFFIX)
            if name == out or name not in floats or readers.get(out, set()) & _WEIGHT_OPS:
                continue
            if node.input[1] not in inits or node.input[2] not in inits:
                continue
            scale = numpy_helper.to_array(inits[node.input[1]])
            if scale.size != 1:
                continue
            q = numpy_helper.to_array(inits[node.input[0]]).astype(np.int64)
            zero = numpy_helper.to_array(inits[node.input[2]]).astype(np.int64).reshape(())
            value_8 = ((q - zero).astype(np.float32) * scale.astype(np.float32).reshape(())).astype(np.float32)
            value_f = numpy_helper.to_array(floats[name]).astype(np.float32)
            if value_f.shape != value_8.shape:
                continue
            self._constants_8[name] = value_8
            # 16-bit steps are 1/257 of the 8-bit ones: the float value stands in for them.
            self._constants_16[name] = value_f
            chosen[out] = name
        for node in graph.node:
            for i, input_name in enumerate(node.input):
                if input_name in chosen:
                    node.input[i] = _constant_input(chosen[input_name])
        return set(chosen)

    @staticmethod
    def _edge_feed(edge: tuple[str, str], params: qdq.QuantParams) -> dict[str, np.ndarray]:
        p = _input_names(edge)
        lo, hi = params.clip_range
        return {p["lo"]: np.array(lo, np.float32), p["hi"]: np.array(hi, np.float32),
                p["scale"]: np.array(params.scale, np.float32),
                p["zp"]: np.array(params.zero_point - params.qmin, np.uint16)}

    def _first_uses(self) -> dict[str, int]:
        """Switch input -> index of the first node that reads it."""
        first: dict[str, int] = {}
        for index, node in enumerate(self.model.graph.node):
            for name in node.input:
                first.setdefault(name, index)
        return first

    def _frontier_of(self, cut: int) -> list[str]:
        """Tensors computed before node `cut` and read from it on (graph inputs and switches excluded)."""
        graph = self.model.graph
        # Constant nodes are carried into the suffix, so the frontier holds computed values only.
        produced = {o for n in graph.node[:cut] if n.op_type != "Constant" for o in n.output if o}
        used = {i for n in graph.node[cut:] for i in n.input if i} | {o.name for o in graph.output}
        return sorted(produced & used)

    def _suffix(self, cut: int, types: Mapping[str, np.dtype]) -> onnx.ModelProto:
        """The switchable model from node `cut` on, reading the frontier's values as graph inputs."""
        graph = self.model.graph
        after = [n for n in graph.node[:cut] if n.op_type == "Constant"] + list(graph.node[cut:])
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
        types = ResolvedTypes(overrides, QUANT_TYPES[plan.activation_type])
        edges = set()
        for t in self.tensors:
            if types.produced(t) not in SIXTEEN_BIT:
                continue
            for receiver in self.receivers[t]:
                # A graph output reads the tensor as produced: converts go to nodes only.
                received = types.produced(t) if receiver == _GRAPH_OUTPUT else types.received(t, receiver)
                if received in SIXTEEN_BIT:
                    edges.add((t, receiver))
        constants = {name for name, entries in overrides.items()
                     if name in self._constants_16 and entries and entries[0].get("quant_type") in SIXTEEN_BIT}
        return Setting(frozenset(edges), frozenset(constants))

    def parameter_feed(self, setting: Setting) -> Feed:
        """The switch inputs `setting` changes from their 8-bit defaults."""
        feed: Feed = {}
        for edge in setting.edges:
            feed.update(self._feeds_16[edge])
        for name in setting.constants:
            feed[_constant_input(name)] = self._constants_16[name]
        return feed

    def first_change(self, feed: Feed) -> int:
        """The index of the first node whose inputs the parameter feed `feed` changes (the node count when none)."""
        end = len(self.model.graph.node)
        return min((self._first_use.get(n, end) for n in feed), default=end)

    def run(self, sample: Feed, sixteen: Collection[str] | Setting) -> list[np.ndarray]:
        """The model's outputs with `sixteen` (and what a QNN-valid plan converts with it) at 16 bits."""
        setting = sixteen if isinstance(sixteen, Setting) else self.setting(sixteen)
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
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # Configurations run concurrently, one thread each: better use of the cores than intra-op threads
        # on the small tensors of a mobile model.
        options.intra_op_num_threads = 1
        try:
            return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise MpstudioError(f"ONNX Runtime could not open the switchable model: {exc}") from exc


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
        self.all_8 = [[v[name] for name in model.output_names] for v in self.values]

    def outputs(self, setting: Setting) -> list[list[np.ndarray]]:
        """Every sample's model outputs under `setting`."""
        model = self.model
        feed = model.parameter_feed(setting)
        start = model.first_change(feed)
        if start >= len(model.model.graph.node):
            return self.all_8
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
            "value": prefix + "value"}


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
            return self.metric([dict(zip(self.output_names, o)) for o in outputs])
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
