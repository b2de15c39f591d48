"""The HTP latency cost model: estimates of a model's latency on a Hexagon tensor processor, recalibration on a
device, and the cost of promoting single tensors.

`estimate_latency` reads a QDQ model (or a float model, estimated as fp16) and prices every op the Hexagon
tensor processor runs, after the fusions QNN makes (Conv+activation, SiLU, GELU, LayerNorm and Softmax as
single ops), with per-op-type costs for 8-bit, 16-bit and fp16 whose free constants are fitted to Qualcomm
AI Hub's published device latencies (benchmarks/latency_fit.py). Every estimate carries an interval from the
fit's residuals and says what it includes (HTP only, or with the CPU's graph-input quantize and output
dequantize). `calibrate` refits the per-op-type costs to a device's per-op profile; `promotion_costs`
prices promoting single activation tensors to 16 bits from the same formulas. Constants, sources and known
errors: docs/latency.md. An estimate is never a measurement: everything it returns says `estimate`.

Rooms: `arch` (constants per HTP generation), `ops` (the HTP's op vocabulary and cost classes), `reading`
(a model as the ops the HTP runs), `work` (an op's MACs and vector work), `fusion` (QNN's fusions),
`features` (the cost formulas), `estimate` (the estimate and its per-op breakdown), `calibration`
(recalibration on a device), `promotion` (the cost of changing one tensor's precision), `resolution` (how finely
it tells two plans of one model apart: closer estimates are a tie).
"""

from __future__ import annotations

# Latency's home is sources.py; re-exported here for callers of the cost model.
from ..sources import (
    HTP_ONLY,
    LATENCY_SCOPES,
    LATENCY_SOURCES,
    SESSION_RUN,
    WITH_CPU_IO,
    Latency,
    milliseconds,
)
from .arch import COSTS, FIT_SOURCE, HTP_ARCHS, SPREAD, CostConstants, HtpArch, Spread, htp_arch, make_archs
from .calibration import Calibration, calibrate
from .estimate import OP_COLUMNS, LatencyEstimate, estimate_latency
from .features import OpFeatures, op_features
from .ops import OP_CLASSES
from .promotion import promotion_costs, weight_costs
from .resolution import TIE_FLOOR_MS, TIE_SHARE, clearly_cheaper, no_dearer, resolution_ms, tied

__all__ = [
    "COSTS", "FIT_SOURCE", "HTP_ARCHS", "HTP_ONLY", "LATENCY_SCOPES", "LATENCY_SOURCES", "OP_CLASSES", "OP_COLUMNS",
    "SESSION_RUN", "SPREAD", "WITH_CPU_IO", "Calibration", "CostConstants", "HtpArch", "Latency",
    "LatencyEstimate", "OpFeatures", "Spread", "calibrate", "estimate_latency", "htp_arch", "make_archs",
    "milliseconds", "op_features", "promotion_costs", "weight_costs", "TIE_FLOOR_MS", "TIE_SHARE", "clearly_cheaper",
    "no_dearer", "resolution_ms", "tied",
]
