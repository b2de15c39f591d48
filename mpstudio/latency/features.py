"""The cost formulas: what they read of each op, as arrays (`OpFeatures`), and the roofline that prices those
on one HTP generation (`OpFeatures.costs`)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .arch import HtpArch
from .ops import MECHANISMS, TYPE_BITS, HtpOp, type_bytes
from .branches import parallel_widths
from .reading import float_io_ops, parsed_model

# HVX instructions per 128-byte vector of the cost classes whose count is not a fitted constant.
_FIXED_INSTR = {"simple": 1.0, "arith": 2.0, "resize": 4.0, "reduce": 1.0, "pool": 1.0}
# Mechanism `tiny_ops` (assumptions): an op whose operands fit one 64 KB tile runs whole on one thread (no split
# across the HTP's threads, no join), for a quarter of the fixed per-op cost.
TINY_BYTES, TINY_SHARE = 64 * 1024, 0.25


def _act_type(types: Iterable[str]) -> str:
    """The type an op computes in: fp16 if any activation is float, else the widest quantized type."""
    types = [t for t in types if t]
    if not types or any(t.startswith("float") for t in types):
        return "float16"
    return "uint16" if max(TYPE_BITS.get(t, 8) for t in types) > 8 else "uint8"


_PRECISION = {"uint8": 0, "uint16": 1, "float16": 2}
_KINDS = ("compute", "convert", "io", "graph")


@dataclass(frozen=True)
class OpFeatures:
    """What the cost formulas read of each op, as arrays (one entry per op); `costs(arch)` prices them.

    Separate from the constants so that a fit (benchmarks/latency_fit.py) or a calibration can price the same
    model under many constants quickly.
    """

    kind: np.ndarray  # index into ("compute", "convert", "io", "graph")
    engine: np.ndarray  # "hmx", "hvx", "dma", "none", "fused", "cpu", "graph"
    cls: np.ndarray  # cost class (OP_CLASSES), "" for io / graph / fused
    act_type: np.ndarray  # "uint8", "uint16", "float16" (what the op computes in)
    wide_weights: np.ndarray  # bool: the matrix op's weight (or second operand) is 16-bit
    hmx_macs: np.ndarray
    work: np.ndarray  # HVX elements of work
    act_bytes: np.ndarray
    weight_bytes: np.ndarray
    hidden_by: np.ndarray  # index of the matrix op that can hide this op's HVX time, -1 if none
    parallel: np.ndarray | None = None  # running ops sharing its depth (mechanism `branch_overlap`; None: 1 each)

    @functools.cached_property
    def _static(self) -> dict[str, np.ndarray]:
        """The masks and per-op numbers the pricing reads that no constant changes (computed once: a fit prices
        the same features thousands of times)."""
        prec = np.array([_PRECISION.get(t, 0) for t in self.act_type], dtype=int)
        cls = self.cls.astype(str) if len(self.cls) else np.array([], dtype=str)
        engine = self.engine.astype(str) if len(self.engine) else np.array([], dtype=str)
        runs = np.isin(engine, ("hmx", "hvx", "dma", "none"))
        return {"prec": prec, "is_hmx": engine == "hmx", "is_hvx": engine == "hvx",
                "transcendental": cls == "transcendental", "normalize": cls == "normalize", "convert": cls == "convert",
                "layernorm": cls == "layernorm",
                "depthwise": cls == "depthwise",
                "fixed_instr": np.array([_FIXED_INSTR.get(k, 2.0) for k in self.cls], dtype=float),
                "runs": runs, "moves": runs & (engine != "none"), "io": self.kind == _KINDS.index("io"),
                "graph": self.kind == _KINDS.index("graph"), "partial_spill": MECHANISMS["vtcm_partial_spill"],
                "overhead_overlaps": MECHANISMS["overhead_overlaps"],
                "fixed_share": np.where(runs & (self.act_bytes + self.weight_bytes <= TINY_BYTES)
                                        & MECHANISMS["tiny_ops"], TINY_SHARE, 1.0)
                / (self.parallel if self.parallel is not None else 1.0)
                # Mechanism `metadata_ops_free`: an op that moves no data (a reshape, a float Concat its producers
                # write in place) is folded into its tensors' descriptions when the graph is prepared: never run.
                * np.where((engine == "none") & MECHANISMS["metadata_ops_free"], 0.0, 1.0)}

    def costs(self, arch: HtpArch) -> dict[str, np.ndarray]:
        """compute_ms, memory_ms, overhead_ms, hidden_ms and ms of every op on `arch`."""
        c, st = arch.costs, self._static
        prec = st["prec"]
        is_hmx, is_hvx = st["is_hmx"], st["is_hvx"]
        rate_16x16 = c.rate_16x8 * c.rate_16x16_factor
        rate = np.select([prec == 2, prec == 1],
                         [c.rate_fp16 * arch.fp16_factor, np.where(self.wide_weights, rate_16x16, c.rate_16x8)], 1.0)
        rate = np.where((prec == 0) & self.wide_weights, c.rate_16x8, rate)
        hmx_s = np.where(is_hmx, self.hmx_macs * rate / (arch.hmx_gmacs * 1e9), 0.0)
        wide = np.select([prec == 2, prec == 1], [c.transcendental_fp16, c.transcendental_16], 1.0)
        instr = np.select([st["transcendental"], st["normalize"], st["layernorm"], st["convert"], st["depthwise"]],
                          [c.transcendental * wide, c.normalize * wide, c.normalize, c.convert_instr, c.depthwise],
                          st["fixed_instr"])
        width = np.select([prec == 2, prec == 1], [c.hvx_fp16 * arch.fp16_factor, c.hvx_16bit], 1.0)
        hvx_s = np.where(is_hvx, self.work / 128 * instr * width / (c.hvx_vectors_per_cycle * arch.clock_ghz * 1e9),
                         0.0)
        ddr = arch.ddr_gbs * c.memory_efficiency * 1e9
        usable = arch.vtcm_mb * 2**20 / 2
        if st["partial_spill"]:  # what of the working set the usable VTCM holds moves at its rate, the rest at DDR's
            resident = np.minimum(self.act_bytes, np.maximum(usable - self.weight_bytes, 0.0))
            memory_s = resident / (c.vtcm_factor * ddr) + (self.act_bytes - resident + self.weight_bytes) / ddr
        else:
            fits = self.act_bytes + self.weight_bytes <= usable
            memory_s = self.act_bytes / np.where(fits, c.vtcm_factor * ddr, ddr) + self.weight_bytes / ddr
        memory_s = np.where(st["moves"], memory_s, 0.0)
        overhead_s = np.where(st["runs"], c.op_cycles * st["fixed_share"] / (arch.clock_ghz * 1e9), 0.0)
        memory_s = np.where(st["io"], self.act_bytes / (c.cpu_io_gbs * 1e9), memory_s)
        overhead_s = np.where(st["graph"], c.graph_overhead_us * 1e-6, overhead_s)
        compute_s = hmx_s + hvx_s
        busy = np.maximum(compute_s, memory_s)
        if st["overhead_overlaps"]:  # the next op is set up while this one works: only the longer of the two counts
            overhead_s = np.where(st["runs"], np.maximum(overhead_s - busy, 0.0), overhead_s)
        hidden_s = np.zeros_like(busy)
        has = self.hidden_by >= 0
        if has.any():
            partner = busy[self.hidden_by[has]]
            hidden_s[has] = c.overlap * np.minimum(busy[has], partner)
        scale = np.array([arch.scales.get(k, 1.0) for k in self._scale_keys()]) if arch.scales else np.ones_like(busy)
        ms = (busy + overhead_s - hidden_s) * 1e3 * scale
        return {"compute_ms": compute_s * 1e3, "memory_ms": memory_s * 1e3, "overhead_ms": overhead_s * 1e3,
                "hidden_ms": hidden_s * 1e3, "ms": ms, "busy_ms": busy * 1e3, "scale": scale}

    def htp_ms(self, arch: HtpArch) -> float:
        """Total ms of the ops the HTP runs (the graph-input quantize and output dequantize left out)."""
        return float(self.costs(arch)["ms"][self.kind != _KINDS.index("io")].sum())

    def _scale_keys(self) -> list[str]:
        return [k if k else e for k, e in zip(self.cls, self.engine)]


def _op_types(op: HtpOp, in_types=None, out_types=None) -> tuple[list, list]:
    ins = [(n, t if in_types is None else in_types) for _, t, n in op.inputs]
    outs = [(n, t if out_types is None else out_types) for _, t, n in op.outputs]
    return ins, outs


def features_of(ops: list[HtpOp], in_types=None, out_types=None) -> OpFeatures:
    """OpFeatures of `ops`; `in_types`/`out_types` override every op's activation types (e.g. "uint16")."""
    rows = []
    for op in ops:
        ins, outs = _op_types(op, in_types, out_types)
        act = _act_type([t for _, t in ins] + [t for _, t in outs]) if op.kind != "io" else (
            outs[0][1] if op.op_type == "QuantizeLinear" else ins[0][1])
        moved = 0.0 if op.kind == "graph" else sum(n * type_bytes(t) for n, t in ins + outs)
        wide_weights = False
        if op.engine == "hmx" and act != "float16":
            if op.op_type == "MatMul" and len(op.inputs) > 1:  # two activations: the second plays the weight
                wide_weights = TYPE_BITS.get(ins[1][1], 8) > 8
            else:
                wide_weights = TYPE_BITS.get(op.weight_type or "uint8", 8) > 8
        engine = op.engine
        if op.op_type == "Concat" and engine == "dma" and act == "float16" and MECHANISMS["concat_in_place"]:
            engine = "none"  # its producers write into the joined buffer: no scale to unify, no data moved
        rows.append((_KINDS.index(op.kind), engine, op.cls if op.engine != "fused" else "", act, wide_weights,
                     float(op.hmx_macs), float(op.work), float(moved), float(op.weight_bytes), op.hidden_by))
    cols = list(zip(*rows)) if rows else [()] * 10
    return OpFeatures(
        kind=np.array(cols[0], dtype=int), engine=np.array(cols[1], dtype=object), cls=np.array(cols[2], dtype=object),
        act_type=np.array(cols[3], dtype=object), wide_weights=np.array(cols[4], dtype=bool),
        hmx_macs=np.array(cols[5], dtype=float), work=np.array(cols[6], dtype=float),
        act_bytes=np.array(cols[7], dtype=float), weight_bytes=np.array(cols[8], dtype=float),
        hidden_by=np.array(cols[9], dtype=int), parallel=parallel_widths(ops))


def op_ms(op: HtpOp, arch: HtpArch, in_types=None, out_types=None) -> float:
    """The time of one op alone (no overlap), with its types optionally overridden."""
    single = dataclasses.replace(op, hidden_by=-1)
    return float(features_of([single], in_types, out_types).costs(arch)["ms"][0])


def op_features(model) -> OpFeatures:
    """The ops of `model` as OpFeatures: `op_features(m).htp_ms(arch)` is `estimate_latency(m, arch).htp_ms`.
    For fitting constants without re-reading the model."""
    parsed = parsed_model(model)
    ops_list = list(parsed.ops)
    if not parsed.quantized:
        ops_list += float_io_ops(parsed)
    return features_of(ops_list)
