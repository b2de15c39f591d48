"""A metric's value in text: four decimals, and more where four would hide how far the value lies from 0, 1 or -1
(the bounds of a cosine, a fraction and a difference of them). An output cosine of 0.99991 and one of 0.9999986
both read "1.0000" at four decimals (and a paired difference of 4e-5 reads "+0.0000"), so two plans that differ
would read the same and a target met would read as missed: such a value keeps three significant digits of its
distance from that bound (0.9999140, 0.99999864, +0.0000372). A metric's step (`step_text`) is a count's weight,
not a value near a bound: two significant digits where four decimals would read 0.0000."""

from __future__ import annotations

import math

DECIMALS = 4
MAX_DECIMALS = 12


def decimals(value: float) -> int:
    """The decimals `value_text` writes `value` with."""
    v = float(value)
    if not math.isfinite(v):
        return DECIMALS
    bound = round(v)
    distance = abs(v - bound)
    if abs(bound) > 1 or distance == 0 or distance >= 10.0 ** -(DECIMALS - 1):
        return DECIMALS
    return min(MAX_DECIMALS, max(DECIMALS, 2 - math.floor(math.log10(distance) + 1e-9)))


def value_text(value: float | None, *, sign: bool = False) -> str:
    """`value` with `decimals(value)` decimals (a leading + with `sign`); "-" for None."""
    if value is None:
        return "-"
    return f"{float(value):{'+' if sign else ''}.{decimals(value)}f}"


def step_text(step: float) -> str:
    """A metric's resolution in words: four decimals, or two significant digits when that would read 0.0000 (one
    pixel of 24 class maps of 224 x 224 weighs 8.3e-07)."""
    return f"{step:.4f}" if step >= 5e-4 else f"{step:.2g}"
