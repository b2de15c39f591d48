"""The base plan a study opens on (mpstudio.search.opening): measured when the study holds both all-8-bit weight
forms, scored otherwise; and the stored bases that beat a plan. A real small study, real ORT evaluations."""

from __future__ import annotations

import pytest

from gui_support import make_small_study
from mpstudio.plan import PrecisionPlan
from mpstudio.search.opening import beating_bases, opening_base
from mpstudio.search.targets import named_baselines


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_small_study(tmp_path_factory.mktemp("opening") / "study", analyzed=False)


def test_before_any_per_channel_measurement_the_weights_scores_decide(study):
    choice = opening_base(study, study.accuracy_source("cpu"))
    assert "median gain" in choice.reason and choice.measure == (choice.plan.hash != PrecisionPlan.a8w8().hash
                                                                 or "until" in choice.reason)


def test_measured_weight_forms_decide_as_the_search_does(study):
    named = named_baselines()
    a8 = study.evaluate(PrecisionPlan.a8w8(), "cpu")
    pc = study.evaluate(named["a8w8-pc"], "cpu")
    choice = opening_base(study, a8.accuracy_source)
    better = pc.value > a8.value if study.higher_is_better else pc.value < a8.value
    assert choice.plan.name == ("a8w8-pc" if better else "a8w8") and "measured" in choice.reason
    assert not choice.measure
    # The loser is beaten by the winner when it costs no less latency; the winner by nothing of the two.
    front = study.front("estimate")
    loser, winner = (a8, pc) if better else (pc, a8)
    wins = beating_bases(front, loser.plan_hash, study.higher_is_better)
    row = front[front["plan_hash"] == winner.plan_hash].iloc[0]
    lost = front[front["plan_hash"] == loser.plan_hash].iloc[0]
    assert (winner.plan_hash in set(wins["plan_hash"])) == (row["latency_ms"] <= lost["latency_ms"] * 1.02)
    assert loser.plan_hash not in set(beating_bases(front, winner.plan_hash, study.higher_is_better).get(
        "plan_hash", []))


def test_an_unevaluated_plan_is_beaten_by_nothing(study):
    plan = PrecisionPlan.a8w8().promote(study.graph.activations()[2:4])
    assert beating_bases(study.front("estimate"), plan.hash, study.higher_is_better).empty


def test_the_base_hint_never_shows_the_same_number_twice():
    from mpstudio.widgets.opening_base import distinct_values

    left, right = distinct_values(0.99874, 0.99866)
    assert left != right and (left, right) == ("0.99874", "0.99866")
    assert distinct_values(0.9, 0.1) == ("0.9", "0.1")
    assert distinct_values(0.25, 0.25) == ("0.25", "0.25")  # equal values stay equal
