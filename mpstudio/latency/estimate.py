"""The estimate: a model's latency on one HTP generation from the cost model (`estimate_latency`), with its
interval, what it includes, and its per-op breakdown (`LatencyEstimate`). An estimate is never a measurement:
everything it returns says `estimate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..sources import HTP_ONLY, WITH_CPU_IO, Latency
from .arch import FIT_SOURCE, HtpArch
from .arch import htp_arch as resolve_arch  # the functions below take a parameter named htp_arch
from .features import features_of
from .ops import TYPE_BITS, HtpOp
from .reading import float_io_ops, parsed_model

OP_COLUMNS = ("node", "op_type", "kind", "engine", "op_class", "tensor", "macs", "elements", "act_type",
              "act_bits", "weight_type", "weight_bits", "act_bytes", "weight_bytes", "compute_ms", "memory_ms",
              "overhead_ms", "hidden_ms", "ms", "bound", "share")


@dataclass(frozen=True, eq=False)
class LatencyEstimate:
    """The cost model's latency of one model on one HTP architecture, with its per-op breakdown.

    `latency` includes the CPU's graph-input quantize and output dequantize (what an application running the
    QDQ model through ORT's QNN EP waits for); `htp` is the HTP's graph alone (how AI Hub publishes its figures).
    Both carry the interval from the fit's cross-validated errors (or the calibration's residuals).

    `ops` has one row per op the HTP (or, for graph I/O, the CPU) runs, columns:
      node: the ONNX node (a convert is named by its quantize node; "graph execute" is the per-call cost)
      op_type: ONNX op type; "Convert" for an 8<->16-bit convert, "Graph" for the per-call cost, and the fused
               op for a pattern QNN runs as one (SiLU, HardSwish, Gelu)
      kind: "compute", "convert" (at a precision boundary), "io" (graph-input quantize / output dequantize,
            on the CPU) or "graph"
      engine: "hmx" (matrix unit), "hvx" (vector unit), "dma" (data mover), "none" (metadata-only reshape),
              "fused" (part of the op before it, or of a fused pattern), "cpu", "graph"
      op_class: cost class (OP_CLASSES; "" for fused, io and graph rows)
      tensor: the op's (first) output, as named in the model
      macs: logical multiply-accumulates (0 for element-wise ops)
      elements: elements of the (first) output
      act_type / act_bits: the type the op computes in (uint8, uint16 or float16)
      weight_type / weight_bits: the type of its weight or constant operand ("" / 0 if none)
      act_bytes / weight_bytes: bytes read and written
      compute_ms, memory_ms, overhead_ms: the roofline terms; hidden_ms: time hidden behind the matrix op
        before it; ms = (max(compute, memory) + overhead - hidden) x the calibration scale of its class
      bound: "compute", "memory" or "overhead" (the largest term)
      share: ms / total
    """

    latency: Latency
    htp: Latency
    ops: pd.DataFrame
    arch: HtpArch

    @property
    def ms(self) -> float:
        return self.latency.ms

    @property
    def htp_ms(self) -> float:
        return self.htp.ms

    @property
    def compute_ms(self) -> float:
        return float(self.ops["compute_ms"].sum())

    @property
    def memory_ms(self) -> float:
        return float(self.ops["memory_ms"].sum())

    @property
    def overhead_ms(self) -> float:
        return float(self.ops["overhead_ms"].sum())

    @property
    def convert_ms(self) -> float:
        return float(self.ops.loc[self.ops["kind"] == "convert", "ms"].sum())

    @property
    def converts(self) -> int:
        return int((self.ops["kind"] == "convert").sum())

    @property
    def io_ms(self) -> float:
        return float(self.ops.loc[self.ops["kind"] == "io", "ms"].sum())

    @property
    def macs(self) -> int:
        return int(self.ops["macs"].sum())

    def by_op_type(self) -> pd.DataFrame:
        """Time per op type: count, ms, share, sorted by ms."""
        grouped = self.ops.groupby("op_type").agg(count=("ms", "size"), macs=("macs", "sum"), ms=("ms", "sum"))
        grouped["share"] = grouped["ms"] / max(self.ms, 1e-12)
        return grouped.sort_values("ms", ascending=False)

    def summary(self) -> str:
        ran = self.ops[(self.ops["kind"] != "graph") & (self.ops["engine"] != "fused")]
        return (f"{self.latency} and {self.htp.ms:.3f} ms [{self.htp.interval}] {HTP_ONLY}: {len(ran)} ops, "
                f"{self.macs / 1e9:.3f} GMAC, compute {self.compute_ms:.3f} / memory {self.memory_ms:.3f} / "
                f"overhead {self.overhead_ms:.3f} ms, {self.converts} converts {self.convert_ms:.3f} ms, "
                f"graph I/O {self.io_ms:.3f} ms")

    def to_dict(self) -> dict[str, Any]:
        return {"latency": self.latency.to_dict(), "htp": self.htp.to_dict(), "arch": self.arch.name,
                "ops": self.ops.to_dict(orient="records")}


def estimate_latency(qdq_model, htp_arch: str | int | HtpArch = "75", build=None) -> LatencyEstimate:
    """Estimate the latency of `qdq_model` (a path or ModelProto) on HTP `htp_arch` with the cost model.

    A QDQ model (QuantizeLinear/DequantizeLinear around float ops, as ORT's quantize_static makes for QNN) is
    priced with the types its Q/DQ nodes give each op; a float model (no QDQ) as fp16 on the HTP. `htp_arch`
    may be a calibrated HtpArch (`calibrate`). The result's latencies have source "estimate"; they are not
    measurements. A node unit the QNN EP does not group (its quantized activation types differ) is priced as the
    HTP runs it: the op in fp16 with its own Q/DQ ops; `build` (mpstudio.htp_build.htp_build of the model) takes
    the HTP's own answer of which ops compute in float instead.
    """
    arch = resolve_arch(htp_arch)
    parsed = parsed_model(qdq_model, build)
    ops_list = list(parsed.ops)
    if not parsed.quantized:
        ops_list += float_io_ops(parsed)  # the HTP casts fp32 graph inputs to fp16 and outputs back
    ops = _op_frame(ops_list, arch)
    detail = (f"{'QDQ' if parsed.quantized else 'float model as fp16'}; {arch.reference_soc} constants; "
              f"{int((ops['engine'] != 'fused').sum()) - 1} ops; {FIT_SOURCE}")
    if parsed.unknown_shapes:
        detail += f"; {parsed.unknown_shapes} tensors of unknown shape counted as 1 element"
    if arch.spread.coverage and not arch.calibrated_on:
        detail += (f"; the interval covers {arch.spread.coverage:.0%} of the published figures predicted by "
                   "leave-one-architecture-out cross-validation")
    on_htp = ops["kind"] != "io"
    htp_ms = float(ops.loc[on_htp, "ms"].sum())
    factor = _interval_factor(ops[on_htp], arch)
    io_ms = float(ops.loc[~on_htp, "ms"].sum())
    total = htp_ms + io_ms
    htp = Latency(htp_ms, "estimate", arch.where, detail, HTP_ONLY, htp_ms / factor, htp_ms * factor)
    # The CPU's part is priced by an assumption, not fitted: the interval covers the HTP's part.
    latency = Latency(total, "estimate", arch.where, detail, WITH_CPU_IO, htp_ms / factor + io_ms,
                      htp_ms * factor + io_ms)
    return LatencyEstimate(latency=latency, htp=htp, ops=ops, arch=arch)


def _op_frame(ops_list: list[HtpOp], arch: HtpArch) -> pd.DataFrame:
    features = features_of(ops_list)
    costs = features.costs(arch)
    first = [(op.outputs or op.inputs or [("", "", 0)])[0] for op in ops_list]
    ops = pd.DataFrame({
        "node": [op.node for op in ops_list], "op_type": [op.op_type for op in ops_list],
        "kind": [op.kind for op in ops_list], "engine": features.engine, "op_class": features.cls,
        "tensor": [f[0] for f in first], "macs": [int(op.macs) for op in ops_list],
        "elements": [int(f[2]) for f in first], "act_type": features.act_type,
        "act_bits": [TYPE_BITS.get(t, 0) for t in features.act_type],
        "weight_type": [op.weight_type for op in ops_list],
        "weight_bits": [TYPE_BITS.get(op.weight_type, 0) for op in ops_list],
        "act_bytes": features.act_bytes, "weight_bytes": features.weight_bytes, **costs,
        "bound": _bound(costs["compute_ms"], costs["memory_ms"], costs["overhead_ms"]),
    })
    ops.loc[ops["kind"].isin(["graph"]), "act_type"] = ""
    ops.loc[ops["kind"].isin(["graph"]), "act_bits"] = 0
    total = float(ops["ms"].sum())
    ops["share"] = ops["ms"] / total if total > 0 else 0.0
    return ops[list(OP_COLUMNS)]


def _interval_factor(htp_ops: pd.DataFrame, arch: HtpArch) -> float:
    """The multiplicative half-width of the interval: the fit's spread, by the share of 16-bit and fp16 time."""
    total = float(htp_ops["ms"].sum())
    if total <= 0:
        return 1.0
    share16 = float(htp_ops.loc[htp_ops["act_type"] == "uint16", "ms"].sum()) / total
    share_fp16 = float(htp_ops.loc[htp_ops["act_type"] == "float16", "ms"].sum()) / total
    return arch.spread.factor(share16, share_fp16)


def _bound(compute: np.ndarray, memory: np.ndarray, overhead: np.ndarray) -> list[str]:
    """Which roofline term is the largest, per op."""
    return ["overhead" if o >= max(c, m) else "compute" if c >= m else "memory"
            for c, m, o in zip(compute, memory, overhead)]
