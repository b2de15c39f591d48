"""Per-tensor scores in one streamed pass: accumulated error (float vs QDQ), local error at 8 and 16 bits,
and weight quantization scores (per-tensor vs per-channel, 8 vs 16 bits).

One run of the float model and one of the QDQ model per sample, each with its intermediate tensors exposed;
every sample's tensors are folded into running sums and dropped, so memory does not grow with the samples.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import onnx
import pandas as pd
from onnx import numpy_helper
from onnxruntime.quantization import QuantType
from onnxruntime.quantization.quant_utils import quantize_data

from ..data import Cancelled, DataSource, Feed, Progress
from ..errors import MpstudioError
from ..graph import ModelGraph
from ..quantize import weight_axis
from ..runtime import create_session
from .. import qdq
from ..qdq import Encoding, dequantize
from ..metrics import ErrorAccumulator
from .stats import COSINE_THRESHOLD, SNR_THRESHOLD_DB, local_error

# Columns of `tensor_scores` (one row per float activation tensor, in topological order):
#   tensor, kind (input/activation/output), op (producer op type, "" for a graph input), node (producer),
#   namespace, matched (has a QDQ counterpart), qdq_tensor (its DequantizeLinear output), bits (in the plan),
#   snr_db, cosine, mse, max_abs (float model vs QDQ model, accumulated over all samples),
#   local_snr_8, local_snr_16 (this tensor alone quantized with its calibrated 8/16-bit parameters, read in the
#   model the parameters were calibrated on: `local_model` when given, the float model otherwise),
#   passes_snr, passes_cosine (seed 004's thresholds), samples.
TENSOR_COLUMNS = ["tensor", "kind", "op", "node", "namespace", "matched", "qdq_tensor", "bits", "snr_db", "cosine",
                  "mse", "max_abs", "local_snr_8", "local_snr_16", "passes_snr", "passes_cosine", "samples"]


def tensor_scores(
    float_model,
    qdq_model,
    graph: ModelGraph,
    data: DataSource,
    params_8: Mapping[str, Encoding],
    params_16: Mapping[str, Encoding],
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    local_model=None,
) -> pd.DataFrame:
    """Accumulated and local error of every activation tensor of `graph` over `data` (see TENSOR_COLUMNS).

    `local_model`: the model the parameters' ranges were calibrated on (`Quantizer.calibration_model`: the float
    model carrying quantized weights); local errors quantize its tensors, accumulated errors stay against the
    float model."""
    scorer = TensorScorer(float_model, qdq_model, graph, params_8, params_16, local_model=local_model)
    return scorer.frame(scorer.score(data.feeds(), len(data), progress, cancel))


@dataclass
class ScoreSums:
    """The running sums behind `tensor_scores` over some samples. Sums of disjoint sample sets merge into the
    sums of their union, so samples can be scored in several processes (or in chunks, to show early scores)."""

    accumulated: dict[str, ErrorAccumulator]  # matched tensor -> float vs QDQ model
    local: dict[str, dict[int, ErrorAccumulator]]  # tensor -> bits -> its local error at that width
    samples: int = 0

    def merge(self, other: "ScoreSums") -> None:
        for t, acc in other.accumulated.items():
            self.accumulated[t].merge(acc)
        for t, widths in other.local.items():
            for bits, acc in widths.items():
                self.local[t][bits].merge(acc)
        self.samples += other.samples

    @classmethod
    def merged(cls, parts: list["ScoreSums"]) -> "ScoreSums":
        """The sums of `parts` (disjoint samples, at least one) merged in their order, into new accumulators."""
        merged = cls({t: type(a)() for t, a in parts[0].accumulated.items()},
                     {t: {b: type(a)() for b, a in w.items()} for t, w in parts[0].local.items()})
        for part in parts:
            merged.merge(part)
        return merged


class TensorScorer:
    """The two sessions (float and QDQ model, every intermediate tensor exposed) that `tensor_scores` streams
    samples through, and how its sums become the TENSOR_COLUMNS frame."""

    def __init__(self, float_model, qdq_model, graph: ModelGraph, params_8: Mapping[str, Encoding],
                 params_16: Mapping[str, Encoding], threads: int = 0, local_model=None):
        qdq_model = qdq.load(qdq_model)
        self.graph = graph
        self.counterparts = qdq.read(qdq_model).activations()
        self.activations = graph.activations()
        self.inputs = set(graph.inputs)
        exposed_float = [t for t in self.activations if t not in self.inputs]
        self.matched = [t for t in self.activations if t in self.counterparts]
        self.float_session = create_session(qdq.with_outputs(float_model, exposed_float), intra_op_threads=threads)
        self.qdq_session = create_session(qdq.with_outputs(qdq_model, [self.counterparts[t].post for t in self.matched]),
                                          intra_op_threads=threads)
        self.float_names = [o.name for o in self.float_session.get_outputs()]
        # Quantizing the float model's values with ranges calibrated under quantized weights would count as
        # clipping what the QDQ model never reaches: local errors read the calibration's own model.
        self.local_session = (create_session(qdq.with_outputs(local_model, exposed_float), intra_op_threads=threads)
                              if local_model is not None else None)
        self.qdq_names = [o.name for o in self.qdq_session.get_outputs()]
        # Tensor -> bits -> its calibrated parameters at that width.
        self.params = {t: {bits: table[t] for bits, table in ((8, params_8), (16, params_16)) if t in table}
                       for t in self.activations}

    def empty(self) -> ScoreSums:
        return ScoreSums({t: ErrorAccumulator() for t in self.matched},
                         {t: {bits: ErrorAccumulator() for bits in widths} for t, widths in self.params.items()})

    def score(self, feeds: Iterable[Feed], total: int, progress: Progress | None = None,
              cancel: threading.Event | None = None) -> ScoreSums:
        """The sums over `feeds` (`total` of them, for progress)."""
        sums = self.empty()
        for i, feed in enumerate(feeds):
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"tensor scoring cancelled after {i} of {total} samples")
            float_values = dict(zip(self.float_names, self.float_session.run(self.float_names, feed)))
            float_values.update({name: feed[name] for name in self.inputs if name in feed})
            qdq_values = dict(zip(self.qdq_names, self.qdq_session.run(self.qdq_names, feed)))
            for t in self.matched:
                sums.accumulated[t].add(float_values[t], qdq_values.pop(self.counterparts[t].post))
            local_values = float_values
            if self.local_session is not None:
                local_values = dict(zip(self.float_names, self.local_session.run(self.float_names, feed)))
                local_values.update({name: feed[name] for name in self.inputs if name in feed})
            for t, widths in self.params.items():
                if not widths:
                    continue
                x = np.ravel(np.asarray(local_values[t], dtype=np.float32))
                # Only the local SNR is reported: signal (once for both widths) and noise powers suffice.
                signal = float(np.dot(x, x))
                for bits, params in widths.items():
                    diff = local_error(x, params)
                    sums.local[t][bits].add_powers(signal, float(np.dot(diff, diff)), x.size)
            del float_values, qdq_values, local_values
            sums.samples += 1
            if progress:
                progress(i + 1, total, "scoring tensors")
        return sums

    def frame(self, sums: ScoreSums) -> pd.DataFrame:
        return score_frame(self.graph, self.counterparts, sums)


def score_frame(graph: ModelGraph, counterparts: Mapping, sums: ScoreSums) -> pd.DataFrame:
    """The TENSOR_COLUMNS frame of `sums` (`counterparts`: `qdq.read(qdq_model).activations()`)."""
    rows = []
    for t in graph.activations():
        info = graph.tensors[t]
        node = graph.nodes.get(info.producer) if info.producer else None
        acc = sums.accumulated.get(t)
        local_snr = {bits: local_acc.snr_db for bits, local_acc in sums.local.get(t, {}).items()}
        rows.append({
            "tensor": t,
            "kind": info.kind,
            "op": node.op_type if node else "",
            "node": node.name if node else "",
            "namespace": node.namespace if node else "",
            "matched": acc is not None,
            "qdq_tensor": counterparts[t].post if t in counterparts else "",
            "bits": counterparts[t].encoding.bits if t in counterparts else np.nan,
            "snr_db": acc.snr_db if acc else np.nan,
            "cosine": acc.cosine if acc else np.nan,
            "mse": acc.mse if acc else np.nan,
            "max_abs": acc.max_abs if acc else np.nan,
            "local_snr_8": local_snr.get(8, np.nan),
            "local_snr_16": local_snr.get(16, np.nan),
            "samples": sums.samples,
        })
    frame = pd.DataFrame(rows, columns=[c for c in TENSOR_COLUMNS if c not in ("passes_snr", "passes_cosine")])
    frame["passes_snr"] = frame["snr_db"] > SNR_THRESHOLD_DB
    frame["passes_cosine"] = frame["cosine"] > COSINE_THRESHOLD
    return frame[TENSOR_COLUMNS]


# Columns of `weight_scores` (one row per weight tensor):
#   tensor, op, node, namespace, shape, axis (output-channel axis, -1 when it has none),
#   snr_pt_8 (uint8 asymmetric per tensor: ORT's QNN default), snr_pc_8 (int8 symmetric per channel),
#   snr_pt_16 (uint16 per tensor), snr_pc_16 (int16 symmetric per channel), per_channel_gain_8 (dB).
WEIGHT_COLUMNS = ["tensor", "op", "node", "namespace", "shape", "axis", "snr_pt_8", "snr_pc_8", "snr_pt_16",
                  "snr_pc_16", "per_channel_gain_8"]


def weight_scores(model: onnx.ModelProto, graph: ModelGraph, progress: Progress | None = None,
                  cancel: threading.Event | None = None) -> pd.DataFrame:
    """The SNR of quantizing each weight per tensor and per channel at 8 and 16 bits (ORT's arithmetic)."""
    inits = {init.name: init for init in model.graph.initializer}
    names = [w for w in graph.weights() if w in inits]
    rows = []
    for i, name in enumerate(names):
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"weight scoring cancelled after {i} of {len(names)} weights")
        w = numpy_helper.to_array(inits[name]).astype(np.float32)
        info = graph.tensors[name]
        node = graph.nodes[info.consumers[0]] if info.consumers else None
        try:
            axis = weight_axis(graph, name) if w.ndim > 1 else -1
        except MpstudioError:
            axis = -1
        row = {"tensor": name, "op": node.op_type if node else "", "node": node.name if node else "",
               "namespace": node.namespace if node else "", "shape": "x".join(map(str, w.shape)), "axis": axis}
        row["snr_pt_8"] = _weight_snr(w, QuantType.QUInt8, False, None)
        row["snr_pt_16"] = _weight_snr(w, QuantType.QUInt16, False, None)
        row["snr_pc_8"] = _weight_snr(w, QuantType.QInt8, True, axis) if axis >= 0 else np.nan
        row["snr_pc_16"] = _weight_snr(w, QuantType.QInt16, True, axis) if axis >= 0 else np.nan
        row["per_channel_gain_8"] = row["snr_pc_8"] - row["snr_pt_8"] if axis >= 0 else np.nan
        rows.append(row)
        if progress:
            progress(i + 1, len(names), "scoring weights")
    return pd.DataFrame(rows, columns=WEIGHT_COLUMNS)


def quantized_weight(w: np.ndarray, qtype, symmetric: bool, axis: int | None) -> np.ndarray:
    """`w` quantized and dequantized as ORT's quantizer does (per channel along `axis` when given)."""
    if axis is None:
        return _qdq(w, qtype, symmetric)
    moved = np.moveaxis(w, axis, 0)
    out = np.stack([_qdq(channel, qtype, symmetric) for channel in moved])
    return np.moveaxis(out, 0, axis)


def _qdq(w: np.ndarray, qtype, symmetric: bool) -> np.ndarray:
    zero_point, scale, quantized = quantize_data(w.ravel(), qtype.tensor_type, symmetric)
    return dequantize(quantized, scale, zero_point).reshape(w.shape)


def _weight_snr(w: np.ndarray, qtype, symmetric: bool, axis: int | None) -> float:
    acc = ErrorAccumulator()
    acc.add(w, quantized_weight(w, qtype, symmetric, axis))
    return acc.snr_db
