"""How finely the cost model tells two plans of one model apart: estimated latencies closer than its resolution
are a tie (`tied`); the search gives a tie to the better value (docs/latency.md, "Resolution")."""

from __future__ import annotations

import math

from .arch import htp_arch

# Why a share of the dearer estimate with a floor, and not the estimate's interval. The interval (`Spread`, +-27 %
# for an all-8-bit model, +-80 % for an all-16-bit one) is the error of one model's figure on an architecture the
# fit never saw; plans of one model share nearly all of it (the same ops, constants and device), so it says
# little about the difference between two of them, and as a tie it would join a8w8 and a16w8 (1.53 and 2.43 ms
# on the demo recognizer). What two plans of one model do not share are the ops they price differently: converts
# (priced by an assumption, `convert_instr`, not fitted), fusions a convert breaks, ops computing at 16 bits
# (fitted only through published w8a16/w8a8 ratios, cross-validated spread +-60 %). When a plan saves 16-bit work
# and adds converts against another (a near-all-16-bit promotion against all-16-bit), its estimated difference is
# a balance of such items, each uncertain by tens of percent: a balance of a few thousandths of a ms out of 2.4
# (0.12 %) says nothing about which plan a device runs faster. A tie of 1 % of the dearer estimate joins such
# balances and keeps apart the savings the search offers on benchmarks/outcome.py's models (its encoder's +5
# against +8 promoted tensors: 0.641 against 0.657 ms, 2.4 %).
TIE_SHARE = 0.01
# Below any share: one op's fixed cost on the HTP (scheduling, synchronisation; `op_cycles` at the default v75's
# clock, 2.5 us; 3.9 us on v73), the smallest item the cost model prices. A smaller difference is whether one op
# runs at all, which the model cannot resolve.
_DEFAULT = htp_arch("75")
TIE_FLOOR_MS = _DEFAULT.costs.op_cycles / (_DEFAULT.clock_ghz * 1e6)


def resolution_ms(a_ms: float, b_ms: float) -> float:
    """The smallest difference between two estimated latencies (ms) of plans of one model that the cost model
    resolves: `TIE_SHARE` of the dearer one, at least `TIE_FLOOR_MS`."""
    return max(TIE_SHARE * max(a_ms, b_ms), TIE_FLOOR_MS)


def tied(a_ms: float, b_ms: float) -> bool:
    """Whether two estimated latencies are a tie: both known and closer than `resolution_ms`."""
    if not (math.isfinite(a_ms) and math.isfinite(b_ms)):
        return False
    return abs(a_ms - b_ms) <= resolution_ms(a_ms, b_ms)


def no_dearer(a_ms: float, b_ms: float) -> bool:
    """Whether `a_ms` is no dearer than `b_ms` as far as the cost model resolves (cheaper, equal, or a tie)."""
    return a_ms <= b_ms or tied(a_ms, b_ms)


def clearly_cheaper(a_ms: float, b_ms: float) -> bool:
    """Whether `a_ms` is cheaper than `b_ms` by more than the cost model's resolution."""
    return a_ms < b_ms and not tied(a_ms, b_ms)


__all__ = ["TIE_SHARE", "TIE_FLOOR_MS", "resolution_ms", "tied", "no_dearer", "clearly_cheaper"]
