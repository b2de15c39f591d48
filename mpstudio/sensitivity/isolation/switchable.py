"""The switchable model: the all-8-bit QDQ model with every activation edge's quantization chosen at run time,
its configurations resolved as the real plans, and the ORT sessions that run it."""

from __future__ import annotations

import threading
from typing import Collection, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from ... import qdq
from ...data import Feed
from ...errors import MpstudioError
from ...plan import PrecisionPlan
from ...qdq import Encoding
from ...quantize import QUANT_TYPES, SIXTEEN_BIT, TensorParams, qnn_config
from ...runtime import create_session
from . import build
from .cuts import CachedSamples, cut_count, first_uses, frontier_of, suffix_model
from .edges import ALL_8, Bias, Edge, EdgeQuant, Setting, bias_value, constant_input, edge_feed
from .plan_quant import PlanQuant, own_params, plan_ends


class SwitchableModel:
    """The all-8-bit QDQ model with every activation edge's quantization chosen at run time (see the package
    docstring).

    `float_model` and `graph` (the prepared float model) let promotions be resolved as the real plan would
    make them; without them a promoted tensor is 16-bit for every node that reads it, and nothing else is.
    `own_params` (ORT's parameters from each tensor's own range, `own_params(quantizer)`) let converts and
    shared parameters follow ORT; `qdq_model_16` (the all-16-bit model) gives 16-bit constants their exact
    values. `from_quantizer` supplies all of them.
    """

    def __init__(self, qdq_model_8, params_16: Mapping[str, Encoding], threads: int | None = None,
                 float_model: onnx.ModelProto | None = None, graph=None, cuts: int | None = None, *,
                 own_params: TensorParams | None = None,
                 qdq_model_16=None):
        model_16 = qdq.load(qdq_model_16) if qdq_model_16 is not None else None
        original = qdq.load(qdq_model_8)
        model = build.at_opset_of(original, model_16)
        self.float_model, self.graph = float_model, graph
        self.quantized = qdq.read(model).activations()
        self.tensors: list[str] = list(self.quantized)
        self.params_8 = {t: q.encoding for t, q in self.quantized.items()}
        # A tensor the 16-bit model does not quantize keeps its 8-bit parameters in both settings.
        self.params_16 = {t: params_16.get(t, self.params_8[t]) for t in self.tensors}
        for t, params in self.params_8.items():
            if params.qmin != 0:
                raise MpstudioError(f"{t!r} is quantized to signed {params.dtype}; HTP activations are unsigned")
        self.receivers = build.receivers(model, self.quantized)
        self._default = {(t, r): EdgeQuant.of([self.params_8[t]]) for t in self.tensors for r in self.receivers[t]}
        self._shared, self._folded = build.structure(model, self.quantized, graph)
        self._own = self._own_tables(own_params or TensorParams({}, {}, {}, {}))
        switches = build.rewrite(model, model_16, self.quantized, self.receivers, self._default, float_model)
        self.model = switches.model
        self._constants_8, self._constants_16 = switches.constants_8, switches.constants_16
        self._biases: list[Bias] = switches.biases
        self._requantize = switches.requantize
        self._bias_values: dict[tuple[str, float], np.ndarray] = {}
        self._feeds: dict[tuple[Edge, EdgeQuant], dict[str, np.ndarray]] = {}
        self.threads = threads or 1
        self.output_names = [o.name for o in self.model.graph.output]
        self._first_use = first_uses(self.model)
        nodes = len(self.model.graph.node)
        cuts = cut_count(self.model) if cuts is None else cuts
        cut_points = {nodes * k // (cuts + 1) for k in range(1, cuts + 1)}
        self.frontier = {cut: frontier_of(self.model, cut) for cut in sorted(cut_points - {0})}
        self._suffix_sessions: dict[int, ort.InferenceSession] | None = None
        self._open_sessions(original, model)
        self._settings: dict[frozenset[str], Setting] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_quantizer(cls, quantizer, threads: int | None = None, cuts: int | None = None,
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
    def _own_tables(self, own: TensorParams) -> dict[tuple[str, int], dict[str, Encoding]]:
        """(kind, bits) -> tensor -> ORT's parameters from its own range. Without ORT's own parameters: a folded
        activation's input has the activation's range, and the all-8/16-bit models' parameters stand in for
        the rest."""
        inputs_of_folded = {source: t for t, (source, _) in self._folded.items()}
        return {
            (kind, bits): {**{source: base[t] for source, t in inputs_of_folded.items()}, **base, **table}
            for kind, bits, base, table in (
                ("written", 8, self.params_8, own.written_8), ("written", 16, self.params_16, own.written_16),
                ("convert", 8, self.params_8, own.convert_8), ("convert", 16, self.params_16, own.convert_16))}

    def _open_sessions(self, original: onnx.ModelProto, model: onnx.ModelProto) -> None:
        self.session = self._open(self.model)
        # The all-8-bit plan itself stays at its own opset: its baseline comes from the model as it is. Its
        # session, and the frontier's, open when used and close after (each holds the model's weights).
        self._original = original.SerializeToString() if model is not original else None
        self._session_8: ort.InferenceSession | None = None

    @property
    def has_own_baseline(self) -> bool:
        """Whether the all-8-bit plan runs as its own model (at its own opset), not as this model's setting."""
        return self._original is not None

    @property
    def session_8(self) -> ort.InferenceSession | None:
        """The all-8-bit plan's own session (None when it is this model's ALL_8 setting), opened on first use."""
        if self._original is not None and self._session_8 is None:
            self._session_8 = self._open(self._original)
        return self._session_8

    def close_baseline(self) -> None:
        """Let the all-8-bit plan's own session go (it opens again when used)."""
        self._session_8 = None

    def frontier_values(self, samples: Sequence[Feed], wanted: list[str]) -> list[dict[str, np.ndarray]]:
        """`wanted` (outputs and frontier tensors) of each sample under ALL_8: the model with the frontier as outputs
        (so ORT's optimizer keeps those values fetchable), opened for this and let go after."""
        frontier = sorted(set(wanted) - set(self.output_names))
        if frontier:
            probe = onnx.ModelProto()
            probe.CopyFrom(self.model)
            probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in frontier)
            session = self._open(probe)
            del probe
        else:
            session = self.session
        return [dict(zip(wanted, session.run(wanted, sample))) for sample in samples]

    @staticmethod
    def _open(model: onnx.ModelProto | bytes) -> ort.InferenceSession:
        # Configurations run concurrently, one thread each: better use of the cores than intra-op threads
        # on the small tensors of a mobile model.
        try:
            return float_qdq_session(model if isinstance(model, bytes) else model.SerializeToString(), threads=1)
        except Exception as exc:
            raise MpstudioError(f"ONNX Runtime could not open the switchable model: {exc}") from exc

    def suffix_session(self, cut: int, types: Mapping[str, np.dtype]) -> ort.InferenceSession:
        """The session of the model from node `cut` on (all cut points' sessions are opened on first use)."""
        with self._lock:
            if self._suffix_sessions is None:
                self._suffix_sessions = {c: self._open(suffix_model(self.model, c, self.frontier[c], types))
                                         for c in self.frontier}
            return self._suffix_sessions[cut]

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
        plan_quant = PlanQuant(self._own, self._shared, self._folded, overrides, QUANT_TYPES[plan.activation_type])
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
                cached = self._feeds[key] = edge_feed(edge, value)
            feed.update(cached)
        for name in setting.constants:
            feed[constant_input(name)] = self._constants_16[name]
        feed.update(self._requantize.feed(lambda edge: quant.get(edge, self._default[edge]), setting.constants))
        for bias in self._biases:
            value = quant.get(bias.edge)
            if value is not None and value.scale != self._default[bias.edge].scale:
                feed[bias.input] = self._bias_value(bias, value.scale)
        return feed

    def _bias_value(self, bias: Bias, input_scale: float) -> np.ndarray:
        key = (bias.input, input_scale)
        value = self._bias_values.get(key)
        if value is None:
            value = self._bias_values[key] = bias_value(bias, input_scale)
        return value

    def first_change(self, feed: Feed) -> int:
        """The index of the first node whose inputs the parameter feed `feed` changes (the node count when none)."""
        end = len(self.model.graph.node)
        return min((self._first_use.get(n, end) for n in feed), default=end)

    # ---- runs -------------------------------------------------------------------------------------------
    def run(self, sample: Feed, sixteen: Collection[str] | Setting) -> list[np.ndarray]:
        """The model's outputs with `sixteen` (and what a QNN-valid plan converts with it) at 16 bits."""
        setting = sixteen if isinstance(sixteen, Setting) else self.setting(sixteen)
        if self.has_own_baseline and setting == ALL_8:
            return self.session_8.run(self.output_names, sample)
        return self.session.run(self.output_names, {**sample, **self.parameter_feed(setting)})

    def cached(self, samples: Sequence[Feed]) -> CachedSamples:
        """`samples` with their all-8-bit activations at the cut points, for runs that skip the unchanged prefix."""
        return CachedSamples(self, list(samples))


def float_qdq_session(model, threads: int = 0) -> ort.InferenceSession:
    """An ONNX Runtime CPU session that runs a QDQ model (path or serialized bytes) with the switchable model's
    numerics: quantization simulated in float as the graph writes it (ORT's QDQ transformations, which fuse
    node groups into integer kernels or move and drop Q/DQ pairs, are off), and without ORT's NCHWc layout
    kernels, which sum in another order and are used or not depending on the graph around each Conv or Pool:
    a one-ulp difference flips an 8-bit rounding now and then, and one flip can move a model's output."""
    return create_session(model, numerics="fake-quant", intra_op_threads=threads)
