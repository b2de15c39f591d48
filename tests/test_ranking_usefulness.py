"""benchmarks/ranking_usefulness.py's judgements: which plan pairs the CPU separates beyond its sampling noise, and
whether the HTP orders them the same way; top-k against random k, with the paired interval of the gap."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("ranking_usefulness", ROOT / "benchmarks" / "ranking_usefulness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _separated_pairs():
    return _module().separated_pairs


def _terms(noise_scale: float, samples: int, seed: int) -> np.ndarray:
    """Per-sample (signal, noise) powers of a plan whose noise is about `noise_scale` of the signal."""
    rng = np.random.default_rng(seed)
    signal = rng.uniform(0.8, 1.2, samples)
    return np.stack([signal, signal * noise_scale * rng.uniform(0.5, 1.5, samples)], axis=1)


def test_only_pairs_the_cpu_separates_are_judged_and_a_reversal_among_them_counts():
    separated_pairs = _separated_pairs()
    good, bad = _terms(0.01, 16, 1), _terms(0.1, 16, 2)  # about 20 dB against 10 dB: separated
    tie = _terms(0.05, 16, 3)
    # The same level, its per-sample noise shuffled: the CPU cannot order the two.
    shuffled = np.stack([tie[:, 0], tie[::-1, 1]], axis=1)
    names = ["good", "bad", "tie", "shuffled"]
    terms = {("good", "cpu"): good, ("bad", "cpu"): bad, ("tie", "cpu"): tie, ("shuffled", "cpu"): shuffled,
             ("good", "htp"): good, ("bad", "htp"): bad, ("tie", "htp"): shuffled, ("shuffled", "htp"): tie}
    pairs = {(a, b): agree for a, b, _, _, agree in separated_pairs(terms, names)}
    assert pairs[("good", "bad")] is True
    assert ("tie", "shuffled") not in pairs  # their order on the HTP is not held against the CPU
    terms[("good", "htp")], terms[("bad", "htp")] = bad, good  # a separated pair the HTP reverses
    pairs = {(a, b): agree for a, b, _, _, agree in separated_pairs(terms, names)}
    assert pairs[("good", "bad")] is False


def test_the_resampling_is_seeded():
    separated_pairs = _separated_pairs()
    terms = {(name, backend): _terms(scale, 12, i)
             for i, (name, scale) in enumerate([("x", 0.02), ("y", 0.03), ("z", 0.05)]) for backend in ("cpu", "htp")}
    first = separated_pairs(terms, ["x", "y", "z"])
    assert first and first == separated_pairs(terms, ["x", "y", "z"])


def _cer(errors: list[int], chars: int = 10):
    from mpstudio.metric_terms import MetricTerms

    return MetricTerms("ratio", ("edits", "chars"), np.array([[e, chars] for e in errors], float))


def test_top_k_against_random_k_is_better_worse_or_within_noise_by_the_paired_interval():
    gap_to_random = _module().gap_to_random
    rng = np.random.default_rng(5)
    randoms = [_cer(list(rng.integers(1, 4, 60))) for _ in range(3)]
    # Top-k makes no errors on any line: better than every draw, beyond doubt.
    point, low, high, verdict = gap_to_random([[_cer([0] * 60), *randoms]], higher_is_better=False)
    assert verdict == "better" and point < 0 and high < 0
    # Top-k makes the draws' errors plus one on every line: worse beyond noise.
    worse = _cer(list(np.mean([r.columns[:, 0] for r in randoms], axis=0) + 1))
    assert gap_to_random([[worse, *randoms]], higher_is_better=False)[3] == "worse"
    # Top-k is one of the draws: its gap to their mean is noise.
    assert gap_to_random([[randoms[0], *randoms]], higher_is_better=False)[3] == "within noise"
    # Less than one character apart on the whole set is within noise however tight the interval.
    tiny = [_cer([2] * 60), _cer([2] * 59 + [3])]
    assert gap_to_random([tiny], higher_is_better=False)[3] == "within noise"


def test_the_gap_over_every_k_pools_what_each_k_cannot_show_alone():
    gap_to_random = _module().gap_to_random
    rng = np.random.default_rng(7)
    groups = []
    for k in range(3):
        draws = [_cer(list(rng.integers(0, 3, 40))) for _ in range(3)]
        lines = np.arange(40)
        # One error fewer than the draws' mean on every third line, one more on every fifth: a small gain in
        # line-to-line noise, on other lines for each k.
        change = -1.0 * ((lines + k) % 3 == 0) + 1.0 * ((lines + k) % 5 == 0)
        groups.append([_cer(list(np.mean([d.columns[:, 0] for d in draws], axis=0) + change)), *draws])
    alone = [gap_to_random([group], higher_is_better=False) for group in groups]
    assert all(point < 0 and verdict == "within noise" for point, _, _, verdict in alone)
    assert gap_to_random(groups, higher_is_better=False)[3] == "better"
