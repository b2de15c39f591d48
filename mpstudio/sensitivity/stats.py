"""Quantization arithmetic of the sensitivity engine: ORT's quantize-dequantize, a tensor's local error, and
the acceptance thresholds (the SNR and cosine themselves are `mpstudio.metrics`)."""

from __future__ import annotations

import numpy as np

# Seed 004's acceptance thresholds for a quantized tensor.
COSINE_THRESHOLD = 0.995
SNR_THRESHOLD_DB = 30.0


def quantize_dequantize(x: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int) -> np.ndarray:
    """ORT's QuantizeLinear then DequantizeLinear: round half to even, saturate, back to float."""
    q = np.rint(x / np.float32(scale))
    # Clipping rint(x/scale) to [qmin - zp, qmax - zp] is clipping it + zp to [qmin, qmax] (integers, exact).
    np.clip(q, qmin - zero_point, qmax - zero_point, out=q)
    q *= np.float32(scale)
    return q


def local_error(x: np.ndarray, encoding) -> np.ndarray:
    """The error of quantizing `x` alone with a per-tensor `encoding` (quantized minus float)."""
    return quantize_dequantize(x, encoding.step, encoding.zero, encoding.qmin, encoding.qmax) - x
