"""The additive noise-power model behind output SNR: dB <-> noise power (relative to the outputs' power), the
noise a promotion removes or a demotion adds, and what is left after removals, floored.

Noise powers of independent quantization errors add, so a tensor's share of a plan's error is a difference of
noise powers, and the shares of several tensors are summed. The functions take floats, numpy arrays or pandas
Series alike (each is the same float operations, in the same order, whatever its caller).
"""

from __future__ import annotations

import math

from .metrics import OUTPUT_SNR


def is_output_snr(metric: str) -> bool:
    """Whether a metric (by its name, e.g. an `IsolationResult.metric`) is the output SNR against the float model
    (`metrics.OUTPUT_SNR`): the one metric whose values this model turns into noise powers."""
    return metric == OUTPUT_SNR


def noise_power(db):
    """The noise power (relative to the signal's) of an SNR of `db` dB."""
    return 10 ** (-db / 10)


def snr_db(noise: float) -> float:
    """The SNR in dB of a noise power (relative to the signal's)."""
    return -10 * math.log10(noise)


def removed_noise(base_db, promoted_db):
    """The noise power a promotion removes: from a plan at `base_db` to one at `promoted_db` (positive = helps)."""
    return noise_power(base_db) - noise_power(promoted_db)


def added_noise(demoted_db, base_db):
    """The noise power a demotion adds: from a plan at `base_db` to one at `demoted_db` (positive = hurts)."""
    return noise_power(demoted_db) - noise_power(base_db)


def remaining_noise(noise: float, removed: float, floor: float, *floors: float) -> float:
    """`noise` less `removed`, never below `floor` (e.g. the all-16-bit plan's noise) nor any further `floors`."""
    return max(noise - removed, floor, *floors)


__all__ = ["is_output_snr", "noise_power", "snr_db", "removed_noise", "added_noise", "remaining_noise"]
