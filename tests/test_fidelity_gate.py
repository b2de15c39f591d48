"""benchmarks/fidelity.py's gate: which plan pairs the HTP tells apart on its samples, and what share of them each
CPU numerics orders the same way."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def _fidelity():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("fidelity", ROOT / "benchmarks" / "fidelity.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _levels(fidelity, levels: dict[str, float], samples: int, seed: int, spread: float = 0.01):
    """Per-sample terms of plans whose task metric sits at `levels`, each sample's value scattered by `spread`
    around it (the same scatter for every plan: paired samples)."""
    scatter = np.random.default_rng(seed).normal(0, spread, samples)
    own = np.random.default_rng(seed + 1)
    return {name: fidelity.per_sample(level + scatter + own.normal(0, spread / 10, samples))
            for name, level in levels.items()}


def _study(fidelity, htp_levels, cpu_levels):
    terms, rows = {}, []
    htp = _levels(fidelity, htp_levels, 24, 0)
    cpu = _levels(fidelity, cpu_levels, 24, 5)
    for name in htp_levels:
        row = {"model": "m", "plan": name, "sixteen_bit": 0}
        for numerics in fidelity.NUMERICS:
            terms[(name, numerics)] = htp[name] if numerics == "htp" else cpu[name]
            row[f"{numerics}:metric"] = terms[(name, numerics)].value()
            row[f"{numerics}:snr_db"] = row[f"{numerics}:metric"]
        rows.append(row)
    return pd.DataFrame(rows), {"m": terms}


def test_only_pairs_the_htp_separates_are_judged():
    fidelity = _fidelity()
    # a, b and c are well apart on the HTP; d sits on c within the HTP's sampling noise.
    htp = {"a": 0.90, "b": 0.80, "c": 0.70, "d": 0.7001}
    frame, terms = _study(fidelity, htp, {"a": 0.91, "b": 0.81, "c": 0.6999, "d": 0.71})
    pairs = {(a, b) for a, b, _ in fidelity.separated_pairs(terms["m"], list(htp), True)}
    assert {("a", "b"), ("a", "c"), ("b", "c")} <= pairs
    assert ("c", "d") not in pairs  # the CPU's order of c and d is not held against it
    assert fidelity.ordered_alike(fidelity.separated_pairs(terms["m"], list(htp), True), frame, "cpu/basic") == len(pairs)


def test_a_reversal_of_a_separated_pair_counts_and_few_pairs_are_not_rankable(monkeypatch):
    fidelity = _fidelity()
    levels = {f"p{i}": 0.5 + 0.05 * i for i in range(6)}  # 15 separated pairs
    reversed_top = dict(levels, p5=0.5 + 0.05 * 3.5)  # p5 now under p4: one pair reversed
    frame, terms = _study(fidelity, levels, reversed_top)
    summary = fidelity.summarise(frame, terms, {"m": True})
    row = summary[summary["numerics"] == "cpu/fake-quant"].iloc[0]
    assert row["separated"] == 15 and row["alike"] == 14 and row["rankable"]
    gate = fidelity.gate_table(summary, "cpu/fake-quant").iloc[0]
    assert gate["verdict"] == "holds" and gate["ordered alike"] == "14 of 15"

    monkeypatch.setattr(fidelity, "MIN_SEPARATED_PAIRS", 16)
    summary = fidelity.summarise(frame, terms, {"m": True})
    assert fidelity.gate_table(summary, "cpu/fake-quant").iloc[0]["verdict"] == "not rankable"


def test_a_lower_is_better_metric_is_ordered_by_its_own_sense():
    fidelity = _fidelity()
    levels = {"x": 0.02, "y": 0.05, "z": 0.10}
    frame, terms = _study(fidelity, levels, {"x": 0.10, "y": 0.05, "z": 0.02})  # the CPU has it backwards
    summary = fidelity.summarise(frame, terms, {"m": False})
    row = summary[summary["numerics"] == "cpu/fused"].iloc[0]
    assert row["separated"] == 3 and row["alike"] == 0
