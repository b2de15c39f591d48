"""What changing one tensor's precision costs, from the same per-op formulas as the estimate and without
regenerating the model: an activation promoted to 16 bits (`promotion_costs`, with the converts ORT's QNN
mixed-precision rule adds) and a weight given another type (`weight_costs`)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Iterable, Mapping

import pandas as pd

from ..folding import FUSING_OPS, folded_activation
from ..qdq import GRAPH_OUTPUT_SUFFIX
from .arch import HtpArch
from .arch import htp_arch as resolve_arch  # the functions below take a parameter named htp_arch
from .features import features_of, op_ms
from .ops import MECHANISMS, TYPE_BITS, HtpOp, type_bytes
from .reading import ParsedModel, parsed_model
from .shallow import widened


def promotion_costs(qdq_model_8bit, tensors: Iterable[str], htp_arch: str | int | HtpArch = "75",
                    graph=None) -> pd.Series:
    """Estimated ms added by promoting each tensor in `tensors`, alone, to 16 bits in `qdq_model_8bit`'s plan.

    `tensors` are float-model activation names. Promotion follows ORT's QNN mixed-precision rule: the tensor's
    producer and all its consumers compute at 16 bits (16x8 instead of 8x8 on the matrix unit, wider vectors,
    twice the bytes for their activations), and converts appear where a 16-bit op meets an 8-bit one. Computed
    from the same per-op formulas as `estimate_latency`, without regenerating the model.

    ORT folds a Relu or Clip into the quantization of the op before it, so that op's own output has no
    counterpart in the QDQ model. With `graph` (the float model's `ModelGraph`, e.g. `Quantizer.graph`) such a
    tensor is priced as its producer at 16 bits plus the activation, which then runs as an op of its own;
    without it, and for names the model does not have at all, the cost is NaN.
    Returns a Series indexed by tensor name (in the order given), named "promotion_ms".
    """
    arch = resolve_arch(htp_arch)
    analysis = _PromotionAnalysis(parsed_model(qdq_model_8bit), arch)
    names = list(dict.fromkeys(tensors))
    values = [analysis.cost(name, graph) for name in names]
    return pd.Series(values, index=pd.Index(names, name="tensor"), name="promotion_ms", dtype=float)


def weight_costs(qdq_model, types: Mapping[str, str], htp_arch: str | int | HtpArch = "75",
                 activation_type: str | None = None) -> pd.Series:
    """Estimated ms added by giving each weight in `types` (float-model name -> "int4", "int8", "int16" ...),
    alone, that type in `qdq_model`: the op that reads it moves more or fewer weight bytes (int4 half of int8,
    int16 twice), and a 16-bit weight runs the matrix unit at the 16-bit rate. Negative when cheaper.

    The op keeps its activation types, or computes in `activation_type` ("uint16") when given: HTP takes a
    16-bit weight only on an op that computes at 16 bits, whose own promotion (and its converts) is
    `promotion_costs`' part. int4 is priced by its bytes only (assumption: the matrix unit expands 4-bit
    weights to 8 bits; no int4 model is in the fit data). A name no op reads as a weight costs NaN.
    Returns a Series indexed by weight name (in the order given), named "weight_ms".
    """
    arch = resolve_arch(htp_arch)
    parsed = parsed_model(qdq_model)
    readers: dict[str, HtpOp] = {}
    for op in parsed.ops:
        if op.kind == "compute":
            for name, _, _ in op.weights:
                readers.setdefault(name, op)
    values = []
    for name, new_type in types.items():
        op = readers.get(name)
        if op is None or new_type not in TYPE_BITS:
            values.append(float("nan"))
            continue
        changed = [(w, new_type if w == name else t, n) for w, t, n in op.weights]
        weight_bytes = float(sum(n * type_bytes(t) for _, t, n in changed))
        after = dataclasses.replace(op, weights=changed, weight_bytes=weight_bytes,
                                    weight_type=next((t for _, t, _ in changed if t != "int32"), ""))
        values.append(op_ms(after, arch, activation_type, activation_type)
                      - op_ms(op, arch, activation_type, activation_type))
    return pd.Series(values, index=pd.Index(list(types), name="tensor"), name="weight_ms", dtype=float)


class _PromotionAnalysis:
    """The 8/16-bit state of a QDQ model's ops, and the cost deltas of promoting one tensor."""

    def __init__(self, parsed: ParsedModel, arch: HtpArch):
        self.arch = arch
        compute_ops = [i for i, op in enumerate(parsed.ops) if op.kind == "compute"]
        self.ops = parsed.ops
        features = features_of(parsed.ops)
        actual = features.act_type
        # Per op at 8 and 16 bits: the busy time and the fixed overhead. An op hidden behind a partner (a fused
        # activation overlapping the op before it) hides min(own, partner's) busy time, so its cost depends on
        # its partner's width as well as its own: both are read from the plan being priced.
        self._hidden_by = features.hidden_by
        self._overlap = arch.costs.overlap
        self._busy_actual = features.costs(arch)["busy_ms"]
        # A fused activation (a Relu, a bias Add after its matrix op) costs nothing while it and the op it fused
        # into compute in one type; a promotion that puts a convert between them makes it an HVX op of its own.
        unfused = [dataclasses.replace(op, engine="hvx") if op.fused_into >= 0 else op for op in parsed.ops]
        self._busy, self._fixed, self._scale = {}, {}, {}
        for bits, dtype in ((8, "uint8"), (16, "uint16")):
            c = features_of(unfused, dtype, dtype).costs(arch)
            self._busy[bits], self._fixed[bits], self._scale[bits] = c["busy_ms"], c["overhead_ms"], c["scale"]
        for i, op in enumerate(parsed.ops):  # a shallow image's convolution at 16 bits: converted, unpacked
            if op.shallow and MECHANISMS["shallow_input"]:
                c = features_of(widened(op), "uint16", "uint16").costs(arch)
                self._busy[16][i], self._fixed[16][i] = c["busy_ms"].sum(), c["overhead_ms"].sum()
        self._partners: dict[int, list[int]] = defaultdict(list)  # op -> the ops fused into or hidden behind it
        self._chain: dict[int, tuple[int, list[int]]] = {}  # such an op -> (that op, the ops from it to this one)
        producers = {name: i for i, op in enumerate(parsed.ops) if op.kind == "compute" for name, _, _ in op.outputs}
        for i, op in enumerate(parsed.ops):
            root = op.fused_into if op.fused_into >= 0 else int(self._hidden_by[i])
            if root >= 0:
                path = _path_from(parsed.ops, producers, root, i)
                self._chain[i] = (root, path)
                for member in {root, *path}:
                    self._partners[member].append(i)
        self.bits: dict[int, int] = {}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, set[int]] = defaultdict(set)
        self.elements: dict[str, int] = {}
        self.by_node = {parsed.ops[i].node: i for i in compute_ops}
        for i in compute_ops:
            op = parsed.ops[i]
            if actual[i] == "float16":
                continue  # a float op is already wide; promotion does not concern it
            self.bits[i] = TYPE_BITS[actual[i]]
            for name, _, n in op.inputs:
                self.consumers[name].add(i)
                self.elements[name] = n
            for name in op.absorbed:  # a fused pattern still reads its inner tensors in the QDQ model
                self.consumers[name].add(i)
            for name, _, n in op.outputs:
                self.producer[name] = i
                self.elements[name] = n
        # Graph inputs: their quantize (on the CPU) is the producer; the type is the model's.
        self.input_bits: dict[str, int] = {}
        self.io: dict[str, HtpOp] = {}
        for op in parsed.ops:
            if op.kind == "io" and op.op_type == "QuantizeLinear":
                name, dtype, n = op.outputs[0]
                self.input_bits[name] = TYPE_BITS.get(dtype, 8)
                self.io[name] = op
                self.elements[name] = n
            elif op.kind == "io":
                self.io[op.inputs[0][0]] = op

    def _producer_bits(self, tensor: str, state) -> int | None:
        op_bits, input_bits, produced = state
        if tensor in produced:
            return produced[tensor]
        if tensor in self.producer:
            return op_bits.get(self.producer[tensor])
        return input_bits.get(tensor)

    def _converts(self, tensor: str, state) -> int:
        """Converts ORT inserts for `tensor`: one per consumer type that differs from the produced type."""
        produced = self._producer_bits(tensor, state)
        if produced is None:
            return 0
        op_bits = state[0]
        received = {op_bits[c] for c in self.consumers.get(tensor, ()) if c in op_bits}
        return len(received - {produced})

    def _busy_of(self, i: int, op_bits) -> float:
        if i not in self.bits:
            return float(self._busy_actual[i])
        return float(self._busy[16 if op_bits[i] > 8 else 8][i])

    def _attached(self, i: int, op_bits) -> bool:
        """Whether op `i` still fuses into (or overlaps with) its partner: QNN joins them only when no convert
        stands between, i.e. when every op from the partner to `i` computes in the partner's type."""
        root, path = self._chain[i]
        want = op_bits.get(root)
        return all(op_bits.get(k, want) == want for k in path)

    def _op_cost(self, i: int, op_bits) -> float:
        """Op `i`'s ms with every op at its width in `op_bits` (a compute op at 8 or 16 bits)."""
        bits = 16 if op_bits[i] > 8 else 8
        attached = i in self._chain and self._attached(i, op_bits)
        if self.ops[i].fused_into >= 0 and attached:
            return 0.0
        busy = float(self._busy[bits][i])
        partner = int(self._hidden_by[i])
        hidden = self._overlap * min(busy, self._busy_of(partner, op_bits)) if partner >= 0 and attached else 0.0
        return (busy + float(self._fixed[bits][i]) - hidden) * float(self._scale[bits][i])

    def _convert_cost(self, tensor: str) -> float:
        n = self.elements.get(tensor, 1)
        convert = HtpOp("", "Convert", "hvx", [(tensor, "uint8", n)], [(tensor, "uint16", n)], work=n,
                        cls="convert", kind="convert")
        return op_ms(convert, self.arch)

    def _io_cost(self, tensor: str, bits: int) -> float:
        op = self.io[tensor]
        dtype = "uint16" if bits > 8 else "uint8"
        if op.op_type == "QuantizeLinear":
            return op_ms(op, self.arch, out_types=dtype)
        return op_ms(op, self.arch, in_types=dtype)

    def resolve(self, name: str) -> str | None:
        for candidate in (name, name + GRAPH_OUTPUT_SUFFIX):
            if candidate in self.producer or candidate in self.input_bits:
                return candidate
        return None

    def cost(self, name: str, graph=None) -> float:
        tensor = self.resolve(name)
        extra = 0.0
        if tensor is not None:
            group = set(self.consumers.get(tensor, ()))
            if tensor in self.producer:
                group.add(self.producer[tensor])
        else:
            folded = self._folded(name, graph)
            if folded is None:
                return float("nan")
            index, activation = folded
            tensor = self.ops[index].outputs[0][0]
            group = {index}
            extra = activation
        group = {i for i in group if i in self.bits}
        # An 8-bit Relu/Clip that ORT had folded into a now 16-bit op comes back as an op of its own, behind a
        # convert, and the op's visible output stays 8-bit.
        produced: dict[str, int] = {}
        for i in group:
            if (self.bits[i] <= 8 and not extra and self.ops[i].outputs[0][0] != tensor
                    and self._has_folded_activation(i, graph)):
                out = self.ops[i].outputs[0][0]
                produced[out] = 8
                extra += self._convert_cost(out) + self._activation_cost(out, "uint8")
        old = (self.bits, self.input_bits, {})
        new = (_Overlay(self.bits, {i: 16 for i in group}),
               _Overlay(self.input_bits, {tensor: 16} if tensor in self.input_bits else {}), produced)
        affected = group | {k for i in group for k in self._partners.get(i, ())}
        delta = sum(self._op_cost(k, new[0]) - self._op_cost(k, old[0]) for k in affected if k in self.bits)
        touched = {tensor}
        for i in group:
            touched.update(name for name, _, _ in self.ops[i].inputs)
            touched.update(name for name, _, _ in self.ops[i].outputs)
            touched.update(self.ops[i].absorbed)  # a fused pattern's inner tensors (a SiLU's gate) convert too
        for t in touched:
            change = self._converts(t, new) - self._converts(t, old)
            if change:
                delta += change * self._convert_cost(t)
            if t in self.io:
                delta += (self._io_cost(t, self._producer_bits(t, new) or 8)
                          - self._io_cost(t, self._producer_bits(t, old) or 8))
        return float(delta + extra)

    def _folded(self, name: str, graph) -> tuple[int, float] | None:
        """(op index, ms of the re-appearing activation) for a float tensor whose activation ORT folded."""
        if graph is None or name not in getattr(graph, "tensors", {}):
            return None
        info = graph.tensors[name]
        index = self.by_node.get(info.producer or "")
        if index is None or index not in self.bits:
            return None
        if self.ops[index].op_type in FUSING_OPS:
            # The activation fuses into the op (same type, no convert between): the generated model drops it.
            return index, 0.0
        return index, self._activation_cost(self.ops[index].outputs[0][0], "uint16")

    def _activation_cost(self, tensor: str, dtype: str) -> float:
        n = self.elements.get(tensor, 1)
        activation = HtpOp("", "Clip", "hvx", [(tensor, dtype, n)], [(tensor, dtype, n)], work=n, cls="simple")
        return op_ms(activation, self.arch)

    def _has_folded_activation(self, index: int, graph) -> bool:
        """Whether the float op behind op `index` wrote a tensor that only a folded Relu/Clip read."""
        if graph is None:
            return False
        node = getattr(graph, "nodes", {}).get(self.ops[index].node)
        if node is None or not node.outputs:
            return False
        out = graph.tensors.get(node.outputs[0])
        if out is None or self.resolve(out.name) is not None:
            return False
        return folded_activation(graph, out.name) is not None


def _path_from(ops: list[HtpOp], producers: dict[str, int], root: int, op: int) -> list[int]:
    """`op` and the ops between `root` and it (a fused bias Add, a metadata-only reshape), following first
    inputs back to `root`; just `op` when the way back does not reach `root` within a few ops."""
    path, current = [op], op
    for _ in range(8):
        inputs = ops[current].inputs
        current = producers.get(inputs[0][0], -1) if inputs else -1
        if current == root:
            return path
        if current < 0:
            break
        path.append(current)
    return [op]


class _Overlay(Mapping):
    """`base` with `changes` on top, without copying `base`."""

    def __init__(self, base: Mapping, changes: Mapping):
        self.base, self.changes = base, changes

    def __getitem__(self, key):
        return self.changes[key] if key in self.changes else self.base[key]

    def __contains__(self, key):
        return key in self.changes or key in self.base

    def __iter__(self):
        return iter(set(self.base) | set(self.changes))

    def __len__(self):
        return len(set(self.base) | set(self.changes))

    def get(self, key, default=None):
        return self[key] if key in self else default
