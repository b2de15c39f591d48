"""Plans from elsewhere: an AIMET (or any) QDQ model, or an AIMET/QNN encodings file (1.0.0 or the dict form) of
the study's float model, imported as a plan of a study.

The plan's types (per tensor, per channel) come from the imported quantization; its scales and zero points are
kept in the study and pinned when the plan's model is generated (ORT's TensorQuantOverrides), so evaluating the
imported plan evaluates the imported quantization. Tensors the import does not mention are calibrated by the
study, biases are derived by ORT from the input and weight scales, and ORT adds its own converts where
consumers of a tensor differ in width.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

import onnx

from . import encodings as encodings_format
from . import qdq
from .errors import MpstudioError
from .import_check import float_biases, quantized_before_activation, unapplied_encodings, weight_code_differences
from .graph import BIAS, WEIGHT, ModelGraph
from .plan import ACTIVATION_TYPES, WEIGHT_TYPES, PrecisionPlan, TensorOverride
from .qdq import ACTIVATION, PARAM, Encoding
from .quantize import default_per_channel as _default_per_channel, weight_axis

ORIGIN = "import"
_SHOWN = 8  # names listed in one message


@dataclass(frozen=True)
class ImportedTensor:
    """One tensor of an imported quantization, under the float model's name: what the plan pins."""

    name: str
    kind: str  # qdq.ACTIVATION or qdq.PARAM
    encoding: Encoding  # per-channel encodings carry the model's axis


@dataclass(frozen=True)
class ImportedPlan:
    """A plan imported into a study.

    `pinned` are the tensors whose scale and zero point the plan's model applies; `skipped` the imported entries
    it does not pin, as (name, why) pairs (biases: ORT derives them); `unapplied` the pinned encodings the plan's
    model does not apply (not quantized there, e.g. an op fused with its Clip, or written with other parameters),
    with why; `calibrated` the quantizable tensors of the model the import does not mention (calibrated by the
    study wherever ORT quantizes them).
    """

    plan: PrecisionPlan
    plan_id: int
    source: str  # "QDQ model" / "encodings 1.0.0" / "encodings 0.6.1"
    pinned: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    calibrated: tuple[str, ...]
    unapplied: tuple[tuple[str, str], ...] = ()
    before_activation: tuple[str, ...] = ()  # pinned op outputs quantized ahead of their Relu/Clip, as the source
    # Biases a QDQ source computes in float (an encodings file: the biases it does not list); the plan's model
    # has ORT's int32 biases.
    float_biases: tuple[str, ...] = ()
    weight_codes: tuple[tuple[str, int, int], ...] = ()  # (weight, codes differing from the source's, codes)
    source_codes: tuple[tuple[str, int, int], ...] = ()  # (weight, codes taken from the source, codes)
    # A QDQ source's node groups ORT's QNN EP does not quantize (the HTP computes them in float:
    # mpstudio.latency.units), and the cost model's ms of the source as written and of the plan's model.
    source_float_ops: tuple[str, ...] = ()
    source_ms: float | None = None
    plan_ms: float | None = None

    def describe(self) -> str:
        lines = [f"imported {self.source} as plan {self.plan_id} ({self.plan.summary()})",
                 f"  {len(self.pinned)} tensor(s) keep the imported scale and zero point in the plan's model"]
        if self.before_activation:
            lines.append(f"  {len(self.before_activation)} of them are an op's output before its Relu/Clip, which ORT "
                         "fuses: the plan's model quantizes them with the imported encoding, as the source does: "
                         f"{_few(self.before_activation)}")
        if self.unapplied:
            lines.append(f"  {len(self.unapplied)} imported encoding(s) the plan's model does not apply (its numbers "
                         "can differ from the source's there):")
            lines += [f"    {name}: {why}" for name, why in self.unapplied]
        if self.float_biases:
            where = ("the source computes in float" if self.source == "QDQ model" else
                     "not in the file (a source that computed them in float, as AIMET's sim does, differs there)")
            lines.append(f"  {len(self.float_biases)} bias(es) {where}; the plan's model quantizes them to int32 at "
                         f"input scale x weight scale, as the HTP computes them: {_few(self.float_biases)}")
        if self.source_codes:
            lines.append(f"  {len(self.source_codes)} weight(s) take the source's integer codes where ORT's quantizer "
                         f"rounds otherwise at the same scale: {_counts(self.source_codes)}")
        if self.weight_codes:
            lines.append(f"  {len(self.weight_codes)} weight(s) whose integer codes still differ from the source's "
                         f"(not stored quantized in the plan's model): {_counts(self.weight_codes)}")
        if self.skipped:
            reasons = Counter(why for _, why in self.skipped)
            for why, count in reasons.items():
                names = [name for name, reason in self.skipped if reason == why]
                lines.append(f"  {count} entr{'y' if count == 1 else 'ies'} not pinned ({why}): {_few(names)}")
        if self.source_float_ops:
            ms = (f"; estimated {self.source_ms:.3f} ms as written against {self.plan_ms:.3f} ms for the plan's "
                  "model, which writes a convert at each precision boundary instead"
                  if self.source_ms is not None and self.plan_ms is not None else "")
            lines.append(f"  as written, {len(self.source_float_ops)} op(s) of the source would compute in float "
                         "on the HTP (ORT's QNN EP does not quantize a group whose input and output types differ, "
                         f"or a LayerNormalization with a float bias){ms}: {_few(self.source_float_ops)}")
        if self.calibrated:
            lines.append(f"  {len(self.calibrated)} quantizable tensor(s) not in the import, calibrated by the study "
                         "where ORT quantizes them (a plan quantizes every tensor ORT does; where the source left one "
                         f"in float, the numbers can differ): {_few(self.calibrated)}")
        return "\n".join(lines)


def import_plan(study, source: str | os.PathLike | Mapping | onnx.ModelProto, *, name: str | None = None) -> ImportedPlan:
    """Import `source` (a QDQ model path or ModelProto, or an encodings file path or parsed JSON) into `study`
    as a plan, and return it with its id. Every problem (names the float model lacks, types HTP plans cannot
    take, channel counts) is reported at once before anything is stored."""
    graph = study.graph
    kind, tensors, skipped = read_import(source, graph)
    model = qdq.read(source) if kind == "QDQ model" else None
    names = _float_names(model, graph) if model is not None else {}
    converted = _converted(model, names) if model is not None else frozenset()
    plan = derive_plan(graph, tensors, converted)
    plan.validate(graph, study.htp_arch)
    encodings = {t.name: t.encoding for t in tensors}
    stem = Path(source).stem if isinstance(source, (str, os.PathLike)) else "plan"
    plan = replace(plan, encodings=study.quantizer.save_pinned(encodings), name=name or f"imported {stem}")
    generated = study.quantizer.generate(plan)
    if converted:
        plan, generated = _closer_default(study, model, names, tensors, converted, plan, generated)
    taken, remaining = (), []
    if model is not None:
        codes = weight_code_differences(model, names, generated)
        if codes:  # the source rounded some weights another way: the plan's model takes its codes
            pinned_codes = {weight: (indices, values) for weight, indices, values, _ in codes}
            plan = replace(plan, encodings=study.quantizer.save_pinned(encodings, pinned_codes))
            generated = study.quantizer.generate(plan)
            taken = tuple((weight, len(indices), total) for weight, indices, _, total in codes)
        remaining = [(w, len(i), total) for w, i, _, total in weight_code_differences(model, names, generated)]
    plan_id = study.add_plan(plan, origin=ORIGIN)
    unapplied = unapplied_encodings(generated, graph, tensors)
    left_out = {name for name, _ in unapplied}
    kept = tuple(t.name for t in tensors if t.name not in left_out)
    mentioned = {t.name for t in tensors} | {name for name, _ in skipped}
    quantized = qdq.read(generated).tensors  # ORT fuses some outputs into their Relu/Clip and keeps Clip bounds float
    calibrated = tuple(n for n in graph.activations() + graph.weights()
                       if n not in mentioned and graph.tensors[n].quantizable and n in quantized)
    floats, source_ms, plan_ms = _source_layout(study, model, generated)
    return ImportedPlan(plan, plan_id, kind, kept, tuple(skipped), calibrated, tuple(unapplied),
                        tuple(quantized_before_activation(generated, graph, kept)),
                        tuple(float_biases(graph, model, mentioned)), tuple(remaining), taken, floats, source_ms,
                        plan_ms)


def _source_layout(study, model, generated) -> tuple[tuple[str, ...], float | None, float | None]:
    """A QDQ source's ops the HTP would compute in float as written, with the cost model's ms of the source and of
    the plan's model when there are any (else nothing is estimated)."""
    if model is None:
        return (), None, None
    from .constant_codes import quantized_constants
    from .latency import estimate_latency
    from .latency.units import float_units

    floats = tuple(sorted(float_units(qdq.read(quantized_constants(model.model))).float_ops))
    if not floats:
        return (), None, None
    try:
        return (floats, estimate_latency(model.model, study.cost_model.arch).ms,
                estimate_latency(generated, study.cost_model.arch).ms)
    except MpstudioError:
        return floats, None, None


def read_import(source, graph: ModelGraph) -> tuple[str, list[ImportedTensor], list[tuple[str, str]]]:
    """(what the source is, the tensors to pin, the entries not pinned with why) of a QDQ model or an
    encodings file, checked against the float model's `graph`; MpstudioError lists every problem."""
    if isinstance(source, onnx.ModelProto) or (isinstance(source, (str, os.PathLike)) and
                                               Path(source).suffix.lower() == ".onnx"):
        return ("QDQ model",) + _from_qdq_model(source, graph)
    parsed = encodings_format.load(source)
    entries = [(name, e.kind, e.encoding, e.per_channel, e.float_bitwidth) for name, e in parsed.entries.items()]
    return (f"encodings {parsed.version}",) + _checked(entries, graph, "the encodings")


def _from_qdq_model(source, graph: ModelGraph) -> tuple[list[ImportedTensor], list[tuple[str, str]]]:
    model = qdq.read(source)
    if not model.quantized:
        raise MpstudioError("the model quantizes no activation: give a QDQ model (QuantizeLinear/DequantizeLinear "
                            "pairs), not a float model")
    names = _float_names(model, graph)
    entries = []
    unknown = []
    for tensor in model.tensors.values():
        name = names.get(tensor.name)
        if name is None:
            unknown.append(tensor.name)
            continue
        entries.append((name, tensor.kind, tensor.encoding, tensor.encoding.per_channel, None))
    if unknown:
        raise MpstudioError(f"{len(unknown)} quantized tensor(s) of the QDQ model have no counterpart in the study's "
                            f"float model: {_few(unknown)}. Import a QDQ model made from this float model (the "
                            "study's model.onnx: the same tensor and node names)")
    return _checked(entries, graph, "the QDQ model")


def _float_names(model: qdq.QdqModel, graph: ModelGraph) -> dict[str, str]:
    """QDQ tensor name -> the float model's name. ORT keeps the float names; other tools (AIMET writes
    `W_q`, `T_updated`) are matched through the float op that reads or writes the tensor, by node name."""
    out: dict[str, str] = {}
    nodes = model.model.graph.node
    for tensor in model.tensors.values():
        if tensor.name in graph.tensors:
            out[tensor.name] = tensor.name
            continue
        found = None
        if tensor.kind == ACTIVATION:
            if tensor.post in graph.tensors and tensor.post in model.graph_outputs:
                found = tensor.post  # a graph output: the last DequantizeLinear writes the float name
            else:
                found = _through_node(model.producer.get(tensor.pre), tensor.pre, graph, outputs=True)
        else:
            stored = {tensor.name, tensor.name + qdq.QUANTIZED_INITIALIZER_SUFFIX}
            for dq in (n for n in nodes if n.op_type == "DequantizeLinear" and n.input[0] in stored):
                for consumer in model.consumers.get(dq.output[0], ()):
                    found = found or _through_node(consumer, dq.output[0], graph, outputs=False)
        if found is None:
            for suffix in (qdq.QUANTIZED_INITIALIZER_SUFFIX, "_q"):
                if tensor.name.endswith(suffix) and tensor.name.removesuffix(suffix) in graph.tensors:
                    found = tensor.name.removesuffix(suffix)
        if found is not None:
            out[tensor.name] = found
    return out


def _through_node(node, value: str, graph: ModelGraph, outputs: bool) -> str | None:
    if node is None or node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.name not in graph.nodes:
        return None
    mine = list(node.output if outputs else node.input)
    theirs = graph.nodes[node.name].outputs if outputs else graph.nodes[node.name].inputs
    index = mine.index(value)
    return theirs[index] if index < len(theirs) and theirs[index] else None


def _checked(entries, graph: ModelGraph, origin: str) -> tuple[list[ImportedTensor], list[tuple[str, str]]]:
    """Entries `(name, kind, encoding or None, per_channel, float bit width)` checked against `graph`."""
    problems: list[str] = []
    unknown = [name for name, *_ in entries if name not in graph.tensors]
    if unknown:
        problems.append(f"{len(unknown)} name(s) the float model lacks: {_few(unknown)}"
                        + _close_hint(unknown[0], graph))
    tensors: list[ImportedTensor] = []
    skipped: list[tuple[str, str]] = []
    for name, kind, encoding, per_channel, float_bits in entries:
        info = graph.tensors.get(name)
        if info is None:
            continue
        if info.kind == BIAS:
            skipped.append((name, "a bias: ORT derives its int32 encoding from the input and weight scales"))
            continue
        where = f"{name!r}"
        if not info.quantizable:
            problems.append(f"{where} is a {info.kind} of type {info.dtype}, which mpstudio does not quantize")
            continue
        actual = PARAM if info.kind == WEIGHT else ACTIVATION
        if kind == ACTIVATION and actual == PARAM and _constant_operand(graph, name):
            kind = PARAM  # AIMET lists an element-wise op's or a Clip's constant operand as an activation
        if kind != actual:
            problems.append(f"{where} is listed as a{'n' if kind == ACTIVATION else ''} {kind}, but the model has it as "
                            f"a {info.kind}; it belongs in {encodings_format.SECTIONS[actual]}")
            continue
        if encoding is None:
            problems.append(f"{where} is float{float_bits} in {origin}: mpstudio's plans quantize every tensor ORT "
                            "quantizes; quantize it or leave it out")
            continue
        if actual == ACTIVATION:
            encoding = _unsigned(encoding)
            if encoding.dtype not in ACTIVATION_TYPES or per_channel:
                problems.append(f"{where} is an activation quantized {'per channel ' if per_channel else ''}to "
                                f"{encoding.dtype}; HTP takes per-tensor {' or '.join(ACTIVATION_TYPES)} activations")
                continue
        else:
            if encoding.dtype not in WEIGHT_TYPES:
                problems.append(f"{where} is a weight quantized to {encoding.dtype}; plans take "
                                f"{', '.join(WEIGHT_TYPES)} weights")
                continue
            if per_channel:
                try:
                    axis = weight_axis(graph, name)
                except MpstudioError as exc:
                    problems.append(f"{where} is quantized per channel, but {exc}")
                    continue
                if encoding.axis is not None and encoding.axis % max(len(info.shape or ()), 1) != axis:
                    problems.append(f"{where} is quantized per channel along axis {encoding.axis}; ORT quantizes this "
                                    f"weight along axis {axis}")
                    continue
                channels = info.shape[axis]
                if len(encoding.scale) != channels:
                    problems.append(f"{where} has {len(encoding.scale)} per-channel encoding(s); the weight has "
                                    f"{channels} channels along axis {axis}")
                    continue
                encoding = Encoding(encoding.dtype, encoding.scale, encoding.zero_point, axis)
            elif len(encoding.scale) != 1:
                problems.append(f"{where} has {len(encoding.scale)} encodings but is not marked per channel")
                continue
        tensors.append(ImportedTensor(name, actual, encoding))
    if not tensors and not problems:
        problems.append(f"{origin} holds no tensor to import")
    encodings_format.raise_if(problems, f"{origin} cannot be imported as a plan of this study")
    return tensors, skipped


_WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _constant_operand(graph: ModelGraph, name: str) -> bool:
    """A constant read by element-wise ops or Clip only, not the weight of a Conv, Gemm or MatMul."""
    consumers = [graph.nodes[c] for c in graph.tensors[name].consumers if c in graph.nodes]
    return bool(consumers) and all(node.op_type not in _WEIGHT_OPS for node in consumers)


def _unsigned(encoding: Encoding) -> Encoding:
    """A signed activation encoding as the unsigned one with the same values (HTP activations are unsigned)."""
    if not encoding.dtype.startswith("int") or encoding.dtype == "int32":
        return encoding
    shift = 2 ** (encoding.bits - 1)
    return Encoding("u" + encoding.dtype, encoding.scale, tuple(z + shift for z in encoding.zero_point), encoding.axis)


def _converted(model: qdq.QdqModel, names: Mapping[str, str]) -> frozenset[str]:
    """The activations a QDQ source writes at one width and converts to another for some of their consumers
    (under the float model's names: `names`, `_float_names`)."""
    return frozenset(names[t.name] for t in model.tensors.values()
                     if t.kind == ACTIVATION and t.converts and t.name in names)


def _activation_types(model: qdq.QdqModel, names: Mapping[str, str] | None = None) -> dict[str, tuple]:
    return {(names or {}).get(t.name, t.name): (t.encoding.dtype, tuple(c.dtype for c in t.converts))
            for t in model.tensors.values() if t.kind == ACTIVATION}


def _closer_default(study, model: qdq.QdqModel, names: Mapping[str, str], tensors, converted, plan, generated):
    """`plan` and its model, or the plan derived with the other default activation type when its model writes
    the source's activation types and converts where `plan`'s does not. ORT's fixer grows a region of the
    non-default width from each override, so the same types written per tensor come from one default only, and
    the source does not say which."""
    graph = study.graph
    wanted = _activation_types(model, names)

    def differences(path) -> int:
        got = _activation_types(qdq.read(path))
        return sum(got.get(name) != types for name, types in wanted.items())

    first = differences(generated)
    if first == 0:
        return plan, generated
    other = "uint16" if plan.activation_type == "uint8" else "uint8"
    alternative = replace(derive_plan(graph, tensors, converted, activation_type=other), encodings=plan.encodings,
                          name=plan.name)
    alternative.validate(graph, study.htp_arch)
    alternative_model = study.quantizer.generate(alternative)
    return (alternative, alternative_model) if differences(alternative_model) < first else (plan, generated)


def derive_plan(graph: ModelGraph, tensors: list[ImportedTensor], converted: frozenset[str] = frozenset(),
                activation_type: str | None = None) -> PrecisionPlan:
    """The PrecisionPlan whose types are the imported ones: the most common activation and weight types (and
    per-channel Conv weights) as defaults (or `activation_type`), an override for every tensor that differs.
    The `converted` activations (a QDQ source writes them at one width and converts them for some consumers)
    take the default: ORT's QNN fixer writes a tensor so when its producer computes at the width of a
    neighbouring override, never when the plan names the tensor itself, and an override on it would widen
    that region by its consumers."""
    activations = [t for t in tensors if t.kind == ACTIVATION]
    weights = [t for t in tensors if t.kind == PARAM]
    activation_type = activation_type or _most_common(
        [t.encoding.dtype for t in activations if t.name not in converted], "uint8")
    # The weights of Conv/Gemm/MatMul decide the default: AIMET also lists every Clip bound and element-wise
    # constant (uint8, like activations), which outnumber them in a CNN with one Clip per layer.
    op_weights = [t for t in weights if not _constant_operand(graph, t.name)] or weights
    weight_type = _most_common([t.encoding.dtype for t in op_weights], "uint8")
    convs = [t for t in weights if _default_per_channel(graph, t.name)]
    per_channel = sum(t.encoding.per_channel for t in convs) * 2 > len(convs)
    overrides: dict[str, TensorOverride] = {}
    for t in activations:
        if t.encoding.dtype != activation_type and t.name not in converted:
            overrides[t.name] = TensorOverride(type=t.encoding.dtype)
    for t in weights:
        default_pc = per_channel and _default_per_channel(graph, t.name)
        kind = t.encoding.dtype if t.encoding.dtype != weight_type else None
        pc = t.encoding.per_channel if t.encoding.per_channel != default_pc else None
        if kind is not None or pc is not None:
            overrides[t.name] = TensorOverride(type=kind, per_channel=pc)
    return PrecisionPlan(activation_type=activation_type, weight_type=weight_type, per_channel=per_channel,
                         overrides=overrides)


def _most_common(values: list[str], default: str) -> str:
    if not values:
        return default
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v == default))


def _few(names, limit: int = _SHOWN) -> str:
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _counts(rows) -> str:
    shown = ", ".join(f"{name!r} ({count} of {total})" for name, count, total in rows[:_SHOWN])
    return shown + (f" and {len(rows) - _SHOWN} more" if len(rows) > _SHOWN else "")


def _close_hint(name: str, graph: ModelGraph) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(graph.tensors), n=3, cutoff=0.6)
    return f" (for {name!r}, did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


__all__ = ["ImportedPlan", "ImportedTensor", "import_plan", "read_import", "derive_plan"]
