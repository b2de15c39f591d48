"""Streaming error statistics between a reference tensor and its quantized counterpart.

Sums are kept in float64 per tensor, so memory stays constant whatever the number of samples; SNR and cosine
are computed over all samples at once (the same definition as ORT's `qdq_loss_debug` SQNR).
"""

from __future__ import annotations

import math

import numpy as np

# Seed 004's acceptance thresholds for a quantized tensor.
COSINE_THRESHOLD = 0.995
SNR_THRESHOLD_DB = 30.0
_EPS = float(np.finfo(np.float64).eps)


class ErrorAccumulator:
    """Accumulates signal, noise and cross terms of (reference, test) pairs over any number of samples."""

    __slots__ = ("signal", "test", "noise", "dot", "max_abs", "count")

    def __init__(self):
        self.signal = self.test = self.noise = self.dot = 0.0
        self.max_abs = 0.0
        self.count = 0

    def add(self, reference: np.ndarray, test: np.ndarray) -> None:
        x = np.ravel(np.asarray(reference, dtype=np.float32))
        y = np.ravel(np.asarray(test, dtype=np.float32))
        if x.shape != y.shape:
            raise ValueError(f"shapes differ: {x.shape} vs {y.shape}")
        self._accumulate(x, y, x - y)

    def add_noise(self, reference: np.ndarray, diff: np.ndarray) -> None:
        """Add a pair given as the reference and its exact error (the local-error path computes it directly)."""
        self._accumulate(reference, reference + diff, diff)

    def _accumulate(self, reference: np.ndarray, test: np.ndarray, diff: np.ndarray) -> None:
        # np.dot on float32 goes through BLAS with float64-safe pairwise blocks; cast the result only.
        self.signal += float(np.dot(reference, reference))
        self.test += float(np.dot(test, test))
        self.noise += float(np.dot(diff, diff))
        self.dot += float(np.dot(reference, test))
        if diff.size:
            self.max_abs = max(self.max_abs, float(np.max(np.abs(diff))))
        self.count += reference.size

    @property
    def snr_db(self) -> float:
        return snr_db(self.signal, self.noise)

    @property
    def cosine(self) -> float:
        denominator = math.sqrt(max(self.signal, 0.0) * max(self.test, 0.0))
        if denominator == 0.0:
            return 1.0 if self.noise == 0.0 else 0.0
        return self.dot / denominator

    @property
    def mse(self) -> float:
        return self.noise / self.count if self.count else float("nan")


def snr_db(signal_power: float, noise_power: float) -> float:
    """10·log10(signal / noise), with ORT's epsilon floor on both (so an exact match is finite)."""
    return 10.0 * math.log10(max(signal_power, _EPS ** 2) / max(noise_power, _EPS ** 2))


def quantize_dequantize(x: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int) -> np.ndarray:
    """ORT's QuantizeLinear then DequantizeLinear: round half to even, saturate, back to float."""
    q = np.rint(x / np.float32(scale))
    q += zero_point
    np.clip(q, qmin, qmax, out=q)
    q -= zero_point
    q *= np.float32(scale)
    return q


def local_error(x: np.ndarray, encoding) -> np.ndarray:
    """The error of quantizing `x` alone with a per-tensor `encoding` (quantized minus float)."""
    return quantize_dequantize(x, encoding.step, encoding.zero, encoding.qmin, encoding.qmax) - x
