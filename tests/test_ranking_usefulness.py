"""benchmarks/ranking_usefulness.py's (d) judgement: which plan pairs the CPU separates beyond its sampling noise,
and whether the HTP orders them the same way."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _separated_pairs():
    spec = importlib.util.spec_from_file_location("ranking_usefulness", ROOT / "benchmarks" / "ranking_usefulness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.separated_pairs


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
