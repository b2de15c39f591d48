"""PrecisionPlan: default quantization types plus per-tensor overrides, with JSON round trip and a stable hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from .errors import MpstudioError
from .folding import folded_activation
from .graph import BIAS, ModelGraph, unknown_name_message

PLAN_FORMAT = 1

# HTP takes unsigned 8/16-bit activations; signed int16 activations are rejected by the backend.
ACTIVATION_TYPES = ("uint8", "uint16")
# A plan's default weight type; a per-tensor override may also ask for int4 (WEIGHT_TYPES).
DEFAULT_WEIGHT_TYPES = ("uint8", "int8", "uint16", "int16")
WEIGHT_TYPES = ("int4",) + DEFAULT_WEIGHT_TYPES
_SIXTEEN_BIT = ("uint16", "int16")
FOUR_BIT = ("int4",)
# 16-bit weights need HTP v73 or newer.
MIN_ARCH_16BIT_WEIGHTS = 73
# int4 weights: symmetric, the weight of a matrix op. QNN's HTP (ORT's QNN EP 2.7, the HTP emulator) ran int4
# per-channel and per-tensor Conv, MatMul and Gemm weights with 8- and 16-bit activations on every arch
# mpstudio targets (v68 to v81), so no arch gate; per-block int4 is left out: ORT's quantizer applies one
# block size to every weight (rank-2 only) and the QNN EP took block-quantized MatMul weights with 16-bit
# activations only.
INT4_WEIGHT_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


@dataclass(frozen=True)
class TensorOverride:
    """What one tensor gets instead of the plan's defaults.

    `type` is the tensor's quantization type; `per_channel` and `symmetric` apply to weights only.
    """

    type: str | None = None
    per_channel: bool | None = None
    symmetric: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("type", self.type), ("per_channel", self.per_channel),
                                  ("symmetric", self.symmetric)) if v is not None}

    @classmethod
    def from_json(cls, tensor: str, data: Any) -> "TensorOverride":
        if isinstance(data, str):
            data = {"type": data}
        if not isinstance(data, Mapping):
            raise MpstudioError(f"override for {tensor!r} must be an object like {{\"type\": \"uint16\"}}, got {data!r}")
        extra = set(data) - {"type", "per_channel", "symmetric"}
        if extra:
            raise MpstudioError(
                f"override for {tensor!r} has unknown keys {sorted(extra)}; allowed: type, per_channel, symmetric"
            )
        for key in ("per_channel", "symmetric"):
            if key in data and not isinstance(data[key], bool):
                raise MpstudioError(f"override for {tensor!r}: {key} must be true or false, got {data[key]!r}")
        kind = data.get("type")
        if kind is not None and kind not in WEIGHT_TYPES:
            raise MpstudioError(
                f"override for {tensor!r}: unknown type {kind!r}; use one of {', '.join(WEIGHT_TYPES)}"
            )
        return cls(type=kind, per_channel=data.get("per_channel"), symmetric=data.get("symmetric"))


@dataclass(frozen=True)
class PrecisionPlan:
    """Default activation and weight quantization plus per-tensor overrides.

    Defaults follow ORT's `get_qnn_qdq_config`: uint8 activations, uint8 per-tensor weights
    (symmetric when the weight type is signed).
    """

    activation_type: str = "uint8"
    weight_type: str = "uint8"
    per_channel: bool = False
    weight_symmetric: bool | None = None  # None: symmetric exactly when the weight type is signed
    overrides: Mapping[str, TensorOverride] = field(default_factory=dict)
    name: str = ""
    # Imported encodings (their key in the study) whose scales and zero points the plan's model keeps;
    # "" for a plan calibrated by mpstudio. Part of the hash: the same types with other parameters differ.
    encodings: str = ""

    def __post_init__(self):
        if self.activation_type not in ACTIVATION_TYPES:
            raise MpstudioError(
                f"activation type {self.activation_type!r} is not supported on HTP; use one of {', '.join(ACTIVATION_TYPES)}"
            )
        if self.weight_type not in DEFAULT_WEIGHT_TYPES:
            hint = (" (int4 is set per weight, in the overrides, for the weights of Conv/MatMul/Gemm)"
                    if self.weight_type in FOUR_BIT else "")
            raise MpstudioError(f"default weight type {self.weight_type!r} is not supported; use one of "
                                f"{', '.join(DEFAULT_WEIGHT_TYPES)}{hint}")
        if self.weight_symmetric is None:
            object.__setattr__(self, "weight_symmetric", self.weight_type.startswith("int"))
        ordered = {k: self.overrides[k] for k in sorted(self.overrides)}
        object.__setattr__(self, "overrides", MappingProxyType(ordered))

    # ---- constructors --------------------------------------------------------------------------------
    @classmethod
    def a8w8(cls, **kw) -> "PrecisionPlan":
        """All-8-bit: uint8 activations and per-tensor uint8 weights (the study's `a8w8`)."""
        return cls._baseline("uint8", "a8w8", kw)

    @classmethod
    def a16w8(cls, **kw) -> "PrecisionPlan":
        """16-bit activations and per-tensor uint8 weights (the study's `a16w8`)."""
        return cls._baseline("uint16", "a16w8", kw)

    @classmethod
    def a8w8_pc(cls, **kw) -> "PrecisionPlan":
        """uint8 activations and per-channel symmetric int8 weights (the study's `a8w8-pc`)."""
        return cls._baseline("uint8", "a8w8-pc", kw, per_channel=True)

    @classmethod
    def a16w8_pc(cls, **kw) -> "PrecisionPlan":
        """16-bit activations and per-channel symmetric int8 weights (the study's `a16w8-pc`)."""
        return cls._baseline("uint16", "a16w8-pc", kw, per_channel=True)

    @classmethod
    def _baseline(cls, activations: str, name: str, kw: dict, per_channel: bool = False) -> "PrecisionPlan":
        if kw.get("per_channel") and not per_channel:
            raise MpstudioError(f"PrecisionPlan.{name.replace('-', '_')}() has per-tensor weights; per-channel "
                                f"int8 weights are PrecisionPlan.{name.replace('-', '_')}_pc()")
        kw = {"weight_type": "int8" if per_channel else "uint8", "per_channel": per_channel, **kw}
        return cls(activation_type=activations, name=kw.pop("name", name), **kw)

    def with_overrides(self, types: Mapping[str, str | TensorOverride], name: str | None = None) -> "PrecisionPlan":
        """A copy with more overrides (a type name, or a TensorOverride, per tensor).

        The copy is unnamed unless `name` is given: a baseline's name no longer describes it.
        """
        merged = dict(self.overrides)
        for tensor, value in types.items():
            merged[tensor] = value if isinstance(value, TensorOverride) else TensorOverride(type=value)
        return replace(self, overrides=merged, name=(self.name if not types else "") if name is None else name)

    def promote(self, tensors, to: str = "uint16", name: str | None = None) -> "PrecisionPlan":
        return self.with_overrides({t: to for t in tensors}, name=name)

    def without(self, tensors) -> "PrecisionPlan":
        drop = set(tensors)
        return replace(self, overrides={k: v for k, v in self.overrides.items() if k not in drop})

    # ---- identity --------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = {
            "format": PLAN_FORMAT,
            "name": self.name,
            "activation_type": self.activation_type,
            "weight_type": self.weight_type,
            "per_channel": self.per_channel,
            "weight_symmetric": self.weight_symmetric,
            "overrides": {k: v.to_json() for k, v in self.overrides.items() if v.to_json()},
        }
        if self.encodings:  # only then: plans without imported encodings keep their hashes
            out["encodings"] = self.encodings
        return out

    @property
    def hash(self) -> str:
        """A content hash: equal plans (whatever their names or key order) hash alike."""
        content = self.to_json()
        content.pop("name")
        text = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.dumps() + "\n")
        return path

    @classmethod
    def from_json(cls, data: Any) -> "PrecisionPlan":
        if not isinstance(data, Mapping):
            raise MpstudioError("a precision plan must be a JSON object")
        known = {"format", "name", "activation_type", "weight_type", "per_channel", "weight_symmetric", "overrides",
                 "encodings"}
        extra = set(data) - known
        if extra:
            raise MpstudioError(f"precision plan has unknown keys {sorted(extra)}; allowed: {', '.join(sorted(known))}")
        if data.get("format", PLAN_FORMAT) != PLAN_FORMAT:
            raise MpstudioError(f"precision plan format {data.get('format')!r} is not supported (this mpstudio reads {PLAN_FORMAT})")
        overrides = data.get("overrides")
        overrides = {} if overrides is None else overrides
        if not isinstance(overrides, Mapping):
            raise MpstudioError("precision plan 'overrides' must be an object of {tensor: {type: ...}}")
        if not isinstance(data.get("encodings", ""), str):
            raise MpstudioError(f"precision plan 'encodings' must be the key of imported encodings, got {data['encodings']!r}")
        if not isinstance(data.get("per_channel", False), bool):
            raise MpstudioError(f"precision plan 'per_channel' must be true or false, got {data['per_channel']!r}")
        return cls(
            activation_type=data.get("activation_type", "uint8"),
            weight_type=data.get("weight_type", "uint8"),
            per_channel=data.get("per_channel", False),
            weight_symmetric=data.get("weight_symmetric"),
            overrides={str(t): TensorOverride.from_json(t, v) for t, v in overrides.items()},
            name=str(data.get("name", "")),
            encodings=data.get("encodings", ""),
        )

    @classmethod
    def loads(cls, text: str, source: str = "plan") -> "PrecisionPlan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MpstudioError(f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from exc
        return cls.from_json(data)

    @classmethod
    def load(cls, path: str | Path) -> "PrecisionPlan":
        path = Path(path)
        if not path.is_file():
            raise MpstudioError(f"plan file not found: {path}")
        return cls.loads(path.read_text(), source=str(path))

    # ---- checks against a model ----------------------------------------------------------------------
    def validate(self, graph: ModelGraph, htp_arch: int | str | None = None) -> None:
        """Raise if an override names a tensor the model lacks or asks for a type the tensor cannot take."""
        arch = int(htp_arch) if htp_arch not in (None, "", "0") else None
        if arch is not None and arch < MIN_ARCH_16BIT_WEIGHTS and self.weight_type in _SIXTEEN_BIT:
            raise MpstudioError(f"16-bit weights need HTP v{MIN_ARCH_16BIT_WEIGHTS} or newer; the target is v{arch}")
        for tensor, override in self.overrides.items():
            if tensor not in graph.tensors:
                raise MpstudioError(unknown_name_message("tensor", tensor, graph.tensors) + " (in the plan's overrides)")
            info = graph.tensors[tensor]
            if info.kind == BIAS:
                raise MpstudioError(
                    f"tensor {tensor!r} is a bias: ORT quantizes it to int32 at its input's scale x its weight's "
                    "scale, which a plan does not choose; remove its override (promote the op's input or weight)"
                )
            if not info.quantizable:
                raise MpstudioError(
                    f"tensor {tensor!r} is a {info.kind} of type {info.dtype}, which is not quantized; remove its override"
                )
            if info.is_activation:
                if override.type is not None and override.type not in ACTIVATION_TYPES:
                    raise MpstudioError(
                        f"activation {tensor!r} cannot be {override.type}; HTP takes {', '.join(ACTIVATION_TYPES)} activations"
                    )
                if override.per_channel or override.symmetric is not None:
                    raise MpstudioError(f"{tensor!r} is an activation: per_channel and symmetric apply to weights only")
            elif override.type in _SIXTEEN_BIT and arch is not None and arch < MIN_ARCH_16BIT_WEIGHTS:
                raise MpstudioError(
                    f"weight {tensor!r} cannot be {override.type} on HTP v{arch}: 16-bit weights need v{MIN_ARCH_16BIT_WEIGHTS}+"
                )
            elif override.type in FOUR_BIT:
                _check_int4_weight(graph, tensor, override)
        self._check_sixteen_bit_weights(graph)

    def _check_sixteen_bit_weights(self, graph: ModelGraph) -> None:
        """HTP takes a 16-bit weight only on a matrix op that computes at 16 bits (measured with ORT's QNN EP
        2.7: Conv, MatMul and Gemm with int16 weights and 8-bit activations fall back to the CPU), so one of
        the op's activations must be 16-bit in the plan (ORT then converts the others)."""
        wide = None
        for node in graph.nodes.values():
            if node.op_type not in INT4_WEIGHT_OPS or len(node.inputs) < 2:
                continue
            weight = graph.tensors.get(node.inputs[1])
            if weight is None or weight.is_activation:
                continue
            override = self.overrides.get(weight.name)
            kind = override.type if override is not None and override.type else self.weight_type
            if kind not in _SIXTEEN_BIT:
                continue
            if wide is None:
                wide = set(self.sixteen_bit_activations(graph))
            near = _op_activations(graph, node)
            if not wide & set(near):
                raise MpstudioError(
                    f"weight {weight.name!r} is {kind}, but {node.op_type} {node.name!r} computes at 8 bits: HTP "
                    f"takes 16-bit weights only on ops that compute at 16 bits; promote its input or output to "
                    f"uint16 too ({', '.join(repr(t) for t in near[:2])})"
                )


    def sixteen_bit_activations(self, graph: ModelGraph) -> list[str]:
        """Activation tensors this plan quantizes to 16 bits (before the converts ORT adds)."""
        out = []
        for name in graph.activations():
            override = self.overrides.get(name)
            kind = override.type if override and override.type else self.activation_type
            if kind in _SIXTEEN_BIT:
                out.append(name)
        return out

    @property
    def base_name(self) -> str:
        """The default types in short: "a8w8", "a16w8", "a8w16" ..."""
        return f"a{self.activation_type[-2:].lstrip('t')}w{self.weight_type[-2:].lstrip('t')}"

    @property
    def short_name(self) -> str:
        """The plan's name, else a readable one from its types ("a8w8-pc+3x16", "a8w8+2x16+1x4"), as a study
        names the plans it stores: never its hash."""
        if self.name:
            return self.name
        n16 = sum(1 for o in self.overrides.values() if o.type in _SIXTEEN_BIT)
        n4 = sum(1 for o in self.overrides.values() if o.type in FOUR_BIT)
        rest = len(self.overrides) - n16 - n4
        base = self.base_name + ("-pc" if self.per_channel else "")
        return base + (f"+{n16}x16" if n16 else "") + (f"+{n4}x4" if n4 else "") + (f"+{rest}ov" if rest else "")

    def summary(self) -> str:
        n16 = sum(1 for o in self.overrides.values() if o.type in _SIXTEEN_BIT)
        n4 = sum(1 for o in self.overrides.values() if o.type in FOUR_BIT)
        base = self.base_name
        pc = " per-channel" if self.per_channel else ""
        four = f", {n4} int4" if n4 else ""
        more = f" + {len(self.overrides)} overrides ({n16} to 16-bit{four})" if self.overrides else ""
        return f"{self.short_name}: {base}{pc}{more}"


def _op_activations(graph: ModelGraph, node) -> list[str]:
    """The activations whose type decides what `node` computes in: its activation inputs, its outputs, and the
    output of a Relu/Clip that ORT folds into it."""
    names = [t for t in list(node.outputs) + list(node.inputs)
             if t in graph.tensors and graph.tensors[t].is_activation]
    for out in node.outputs:
        after = folded_activation(graph, out)
        if after is not None:
            names += [t for t in after.outputs if t in graph.tensors]
    return names


def _check_int4_weight(graph: ModelGraph, tensor: str, override: TensorOverride) -> None:
    """An int4 override must be the symmetric weight (input 1) of a Conv, ConvTranspose, MatMul or Gemm."""
    info = graph.tensors[tensor]
    ops = [graph.nodes[c] for c in info.consumers]
    if not ops or any(node.op_type not in INT4_WEIGHT_OPS or len(node.inputs) < 2 or node.inputs[1] != tensor
                      for node in ops):
        used = ", ".join(sorted({node.op_type for node in ops})) or "nothing"
        raise MpstudioError(
            f"weight {tensor!r} cannot be int4: int4 is for the weights of {', '.join(INT4_WEIGHT_OPS)} "
            f"(input 1), and {tensor!r} feeds {used}; use int8 or int16"
        )
    if override.symmetric is False:
        raise MpstudioError(f"weight {tensor!r}: int4 weights are symmetric on HTP; drop \"symmetric\": false")


# The baselines a study, a target and `mpstudio diverge` name, by name: each a constructor of its plan.
BASELINES = {"a8w8": PrecisionPlan.a8w8, "a16w8": PrecisionPlan.a16w8, "a8w8-pc": PrecisionPlan.a8w8_pc,
             "a16w8-pc": PrecisionPlan.a16w8_pc}
