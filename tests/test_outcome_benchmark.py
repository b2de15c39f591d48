"""benchmarks/outcome.py's gates on a real small study: they pass a search's honest answer and catch a dominated
pick and a pointless evaluation."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import onnx
import pytest

from conftest import chain_feeds, make_chain_model
from mpstudio.data import FeedList
from mpstudio.plan import PrecisionPlan
from mpstudio.search import search
from mpstudio.study import Study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def outcome():
    """benchmarks/outcome.py, loaded from its file (an installed package may be called `outcome` too)."""
    spec = importlib.util.spec_from_file_location("outcome_benchmark", ROOT / "benchmarks" / "outcome.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture
def study(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=6, size=48), path)
    s = Study.create(tmp_path / "study", path, FeedList(chain_feeds(8, size=48)),
                     FeedList(chain_feeds(6, size=48, seed=5)))
    yield s
    s.close()


def _ms(e):
    return e.latency("estimate").ms


def test_the_gates_pass_a_search_that_picks_over_every_stored_plan(study, outcome):
    baselines = {"a8w8": study.evaluate(PrecisionPlan.a8w8()), "a16w8": study.evaluate(PrecisionPlan.a16w8())}
    before = outcome.stored(study, baselines["a8w8"].accuracy_source)
    result = search(study, "a16w8+5%", weights="per-tensor", max_evaluations=8, confirm=None, quiet=True)
    failures, mixed_only = outcome.judge(study, result, before, baselines)
    assert failures == [], failures
    assert result.reached and not mixed_only  # on this chain every partial promotion costs more than a16w8


def _dearer_partial(study) -> list[str]:
    """A partial promotion the cost model prices above all-16-bit: every tensor but the first convolution's output,
    whose 16-bit input and 16-bit readers each need a convert. (Every conv output and y, the input left at 8 bits,
    is priced within a tie under all-16-bit since the refit with `tiny_ops`.)"""
    return [t for t in study.graph.activations() if t.endswith("_conv")][1:] + ["y", "x"]


def test_the_gates_catch_a_dominated_pick_and_a_pointless_evaluation(study, outcome):
    a16 = study.evaluate(PrecisionPlan.a16w8())
    partial = study.evaluate(PrecisionPlan.a8w8().promote(_dearer_partial(study), name="partial"))
    assert _ms(partial) >= _ms(a16) and partial.value < a16.value  # the premise, as measured
    assert outcome.dominated_by(partial, [a16, partial], True) is a16
    assert outcome.dominated_by(a16, [a16, partial], True) is None
    found = outcome.pointless_evaluations(study, [a16], [partial], threshold=1000.0, higher=True)
    assert len(found) == 1 and "all-16-bit plan of its weights" in found[0]
    # A plan stored before that reaches the target makes any dearer evaluation pointless too.
    found = outcome.pointless_evaluations(study, [a16], [partial], threshold=a16.value, higher=True)
    assert len(found) == 1 and "reaches the target" in found[0]
    assert outcome.pointless_evaluations(study, [], [partial], threshold=1000.0, higher=True) == []


def test_targets_lie_between_the_best_all_8_bit_and_all_16_bit_values(outcome):
    class E:
        def __init__(self, value):
            self.value = value

    base = {"a8w8": E(0.80), "a8w8-pc": E(0.88), "a16w8": E(0.84), "a16w8-pc": E(0.92)}
    assert outcome.targets_of(base, True) == [pytest.approx(0.89), pytest.approx(0.91)]
    errors = {"a8w8": E(0.16), "a8w8-pc": E(0.12), "a16w8": E(0.15), "a16w8-pc": E(0.04)}
    assert outcome.targets_of(errors, False) == [pytest.approx(0.10), pytest.approx(0.06)]


def test_a_plan_within_noise_of_the_target_makes_no_dearer_evaluation_pointless(study, outcome):
    """The search keeps looking past a plan within noise of the target (it answers nothing), so the gate does not
    count the plans it evaluates next as wasted; a plan that clearly reaches the target still makes them so."""
    from dataclasses import replace

    a16 = study.evaluate(PrecisionPlan.a16w8())
    partial = study.evaluate(PrecisionPlan.a8w8().promote(_dearer_partial(study), name="partial"))
    assert _ms(a16) <= _ms(partial)  # the premise, as measured
    cheap = replace(a16, name="cheap", low=a16.value - 1.0, high=a16.value + 1.0)  # an interval of +-1 dB
    clearly = outcome.clearly_reaches(a16.value - 0.5, True)  # inside that interval: within noise
    assert not clearly(cheap)
    assert outcome.pointless_evaluations(study, [cheap], [partial], a16.value - 0.5, True, clearly) == []
    # Judged on its value alone (the gate's rule before), the same plan made the next evaluation look wasted.
    assert len(outcome.pointless_evaluations(study, [cheap], [partial], a16.value - 0.5, True)) == 1
    clearly = outcome.clearly_reaches(a16.value - 2.0, True)  # below the interval: clearly reached
    assert clearly(cheap)
    found = outcome.pointless_evaluations(study, [cheap], [partial], a16.value - 2.0, True, clearly)
    assert len(found) == 1 and "reaches the target" in found[0]
    # Unless the HTP confirmation read it short of the target: then the walk may go on past it.
    assert outcome.pointless_evaluations(study, [cheap], [partial], a16.value - 2.0, True, clearly,
                                         frozenset({cheap.plan_id})) == []


def test_a_partial_plan_named_from_all_16_bit_is_no_ceiling(study, outcome):
    """The top-down walk names its plans by what they demote from all-16-bit ("a16w8-pc-251x8"): such a partial
    plan, stored before, makes a dearer evaluation pointless only by reaching the target, never as "the
    all-16-bit plan of its weights" (the gate once went by the name)."""
    one = [t for t in study.graph.activations() if t.endswith("_conv")][:1]
    named = study.evaluate(PrecisionPlan.a8w8().promote(one, name="a16w8-9x8"))
    partial = study.evaluate(PrecisionPlan.a8w8().promote(_dearer_partial(study), name="partial"))
    assert _ms(named) < _ms(partial)  # the premise, as measured
    assert outcome.pointless_evaluations(study, [named], [partial], threshold=1000.0, higher=True) == []
    a16 = study.evaluate(PrecisionPlan.a16w8())
    found = outcome.pointless_evaluations(study, [named, a16], [partial], threshold=1000.0, higher=True)
    assert len(found) == 1 and "a16w8 " in found[0] and "all-16-bit plan of its weights" in found[0]


def test_a_pick_within_noise_is_printed_so_not_as_missed(study, outcome, capsys):
    """The benchmark's line for a search whose pick is within noise of the target says so (the search neither
    reached nor missed it); "NOT reached" is kept for a clear miss."""
    from dataclasses import replace

    baselines = {"a8w8": study.evaluate(PrecisionPlan.a8w8()), "a16w8": study.evaluate(PrecisionPlan.a16w8())}
    result = search(study, "a16w8+5%", weights="per-tensor", max_evaluations=4, confirm=None, quiet=True)
    for verdict, said in (("within noise", "within noise;"), ("misses", "NOT reached;"), ("reaches", ": reached;")):
        outcome.report(study, replace(result, reached=verdict == "reaches", verdict=verdict), outcome.PhaseClock(),
                       baselines, [], False)
        line = capsys.readouterr().out.splitlines()[0]
        assert said in line, line
