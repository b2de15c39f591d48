"""What each weight's precision costs at the model's outputs: the float model with one weight alone quantized
(per channel, int4 / int8 / int16), scored against the float model.

A weight's own quantization SNR (`weight_scores`) can mislead: a weight whose few large values meet inputs that
are almost always zero quantizes "well" by its own SNR while the values that matter round to zero. Measuring at
the outputs sees what the network does with the error. One ORT session serves every weight: the weights are
overridable initializers, fed quantized one at a time.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pandas as pd
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType

from ..data import Cancelled, DataSource, Progress
from ..errors import MpstudioError
from ..graph import ModelGraph
from ..metrics import ErrorAccumulator
from ..model import load_model
from ..plan import INT4_WEIGHT_OPS
from ..quantize import weight_axis
from ..runtime import create_session
from .scores import quantized_weight

# The per-channel symmetric types a matrix weight can take on HTP, by bit width.
WEIGHT_WIDTHS = {4: QuantType.QInt4, 8: QuantType.QInt8, 16: QuantType.QInt16}
WIDTH_TYPES = {4: "int4", 8: "int8", 16: "int16"}

# Columns of `weight_isolation` (one row per matrix weight, in graph order):
#   tensor, op, node (its consumer), axis (the per-channel axis), elements,
#   output_snr_4, output_snr_8, output_snr_16 (dB: the outputs of the float model with only this weight
#   quantized per channel at 4/8/16 bits, against the float model's, over all samples), samples.
WEIGHT_ISOLATION_COLUMNS = ["tensor", "op", "node", "axis", "elements", "output_snr_4", "output_snr_8",
                            "output_snr_16", "samples"]


def matrix_weights(graph: ModelGraph) -> list[str]:
    """Weights that are input 1 of every op that reads them, each a Conv, ConvTranspose, MatMul or Gemm: the
    weights whose precision a plan can choose from int4 to int16."""
    out = []
    for name in graph.weights():
        consumers = [graph.nodes[c] for c in graph.tensors[name].consumers]
        if consumers and all(n.op_type in INT4_WEIGHT_OPS and len(n.inputs) > 1 and n.inputs[1] == name
                             for n in consumers):
            out.append(name)
    return out


def weight_isolation(float_model, graph: ModelGraph, data: DataSource, weights: list[str] | None = None,
                     widths=(4, 8, 16), progress: Progress | None = None,
                     cancel: threading.Event | None = None) -> pd.DataFrame:
    """The output SNR of quantizing each weight alone (see WEIGHT_ISOLATION_COLUMNS)."""
    model = load_model(float_model)
    inits = {init.name: init for init in model.graph.initializer}
    names = [w for w in (matrix_weights(graph) if weights is None else weights) if w in inits]
    unknown = [w for w in (weights or []) if w not in inits]
    if unknown:
        raise MpstudioError(f"{unknown[0]!r} is not a weight (initializer) of the model")
    feeds = list(data.feeds())
    if not feeds:
        raise MpstudioError(f"{data.name} holds no samples to score weights with")
    session = create_session(_overridable(model, [inits[w] for w in names]))
    outputs = [o.name for o in session.get_outputs()]
    references = [session.run(outputs, feed) for feed in feeds]
    rows = []
    total = len(names) * len(widths)
    for i, name in enumerate(names):
        w = numpy_helper.to_array(inits[name]).astype(np.float32)
        axis = weight_axis(graph, name) if w.ndim > 1 else None
        consumer = graph.nodes[graph.tensors[name].consumers[0]]
        row = {"tensor": name, "op": consumer.op_type, "node": consumer.name, "axis": -1 if axis is None else axis,
               "elements": int(w.size), "samples": len(feeds)}
        for j, bits in enumerate(widths):
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"weight isolation cancelled after {i} of {len(names)} weights")
            quantized = quantized_weight(w, WEIGHT_WIDTHS[bits], True, axis).astype(w.dtype)
            acc = ErrorAccumulator()
            for feed, reference in zip(feeds, references):
                values = session.run(outputs, {**feed, name: quantized})
                for r, v in zip(reference, values):
                    acc.add(r, v)
            row[f"output_snr_{bits}"] = acc.snr_db
            if progress:
                progress(i * len(widths) + j + 1, total, f"weight precision: {name}")
        rows.append(row)
    return pd.DataFrame(rows, columns=WEIGHT_ISOLATION_COLUMNS)


def _overridable(model: onnx.ModelProto, weights: list) -> bytes:
    """`model` with `weights` also listed as graph inputs: initializers a run may replace by a feed."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    listed = {i.name for i in copy.graph.input}
    for init in weights:
        if init.name not in listed:
            copy.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return copy.SerializeToString()
