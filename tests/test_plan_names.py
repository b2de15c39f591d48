"""A study names the plans it stores: two different plans with the same precisions counted are told apart."""

from __future__ import annotations

from gui_support import make_small_study
from mpstudio.plan import PrecisionPlan


def test_two_different_plans_promoting_as_many_tensors_get_different_names(tmp_path):
    with make_small_study(tmp_path / "study", analyzed=False, baselines=False) as study:
        tensors = [t for t in study.graph.activations() if study.graph.tensors[t].quantizable]
        first = study.add_plan(PrecisionPlan.a8w8().promote(tensors[:3]))
        second = study.add_plan(PrecisionPlan.a8w8().promote(tensors[3:6]))
        third = study.add_plan(PrecisionPlan.a8w8().promote(tensors[6:9]))
        names = [study.store.plan_row(i)[1] for i in (first, second, third)]
        assert names == ["a8w8+3x16", "a8w8+3x16#2", "a8w8+3x16#3"]
        assert study.add_plan(PrecisionPlan.a8w8().promote(tensors[3:6])) == second  # the same plan, its name kept
        named = study.add_plan(PrecisionPlan.a8w8().promote(tensors[9:12], name="mine"))
        assert study.store.plan_row(named)[1] == "mine"  # a name given is kept as given
