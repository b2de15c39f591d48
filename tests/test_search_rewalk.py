"""The walk goes on when the HTP reads its pick short (`search.rewalk`).

As in test_search_confirmation.py, a CPU/HTP disagreement large enough to turn a clear CPU reach into an HTP miss
cannot be built with a small onnx.helper model, so the accuracies are written into a real study (its SQLite
store; every plan real, estimated by the real cost model, ordered by a real sensitivity analysis) and the real
search runs over them. Each plan's value depends only on how many activations it keeps at 16 bits: the CPU reads
10 + 20 m / n dB for m of n, the HTP 0.6 dB less. A plan's values are written when the search first submits it
(written up front, every plan would be a stored plan the walk chooses from without evaluating), so the store
answers every evaluation the search asks for.
"""

from __future__ import annotations

import onnx
import pytest

from conftest import chain_feeds, make_chain_model, requires_qnn
from mpstudio.data import FeedList
from mpstudio.plan import PrecisionPlan
from mpstudio.latency.resolution import clearly_cheaper
from mpstudio.search import estimate_ms, search
from mpstudio.search.rewalk import short_gap, tightened
from mpstudio.store import AccuracyRecord
from mpstudio.study import Study

HTP_SHORT = 0.6  # dB the HTP reads below the CPU


def _value(m: int, n: int, backend: str) -> float:
    return 10.0 + 20.0 * m / n - (HTP_SHORT if backend == "htp" else 0.0)


def _written_study(tmp_path) -> tuple[Study, int]:
    """A long Sigmoid chain (24 blocks, 64x64, 16 channels), whose plans get both backends' values when first
    submitted; returns it and its number of activations. Its first few promotions are priced clearly under
    all-16-bit (each adds converts, so a dozen are not: the room the walk has between its pick and all-16-bit)."""
    model = make_chain_model(blocks=24, channels=16, size=64)
    for node in model.graph.node:
        if node.op_type == "Relu":
            node.op_type = "Sigmoid"
    onnx.save(model, tmp_path / "chain.onnx")
    study = Study.create(tmp_path / "study", tmp_path / "chain.onnx", FeedList(chain_feeds(8, size=64)),
                         FeedList(chain_feeds(6, size=64, seed=5)))
    n = len(study.graph.activations())
    sources = {backend: study.accuracy_source(backend) for backend in ("cpu", "htp")}
    submit = study.submit

    def written_then_submitted(plan: PrecisionPlan, backend: str = "cpu", **kwargs) -> int:
        plan_id = study.add_plan(plan, "search")
        if study.store.evaluation(plan_id, sources[backend]) is None:
            m = n if plan.activation_type == "uint16" else len(plan.overrides)
            value = _value(m, n, backend)
            study.estimate(plan)
            study.store.record(plan_id, AccuracyRecord(backend, sources[backend], study.metric_name, value, True,
                                                       value, None, 6, 0.1))
        return submit(plan, backend, **kwargs)

    study.submit = written_then_submitted
    return study, n


@pytest.mark.htp
@requires_qnn
def test_the_walk_goes_on_past_a_pick_the_htp_reads_short(tmp_path):
    study, n = _written_study(tmp_path)
    with study:
        target = _value(1, n, "cpu") - 0.1  # the CPU reaches it with 1 or 2 promoted; the HTP needs 2 more
        result = search(study, target, weights="per-tensor", max_evaluations=20, confirm_plans=6, quiet=True)
        first = result.confirmations[0]  # the walk's pick: the cheapest that reaches the target on the CPU
        assert study.plan(first.walk.plan_id).overrides
        assert (first.walk_verdict, first.verdict) == ("reaches", "misses")  # read short on the HTP
        # The walk went on against the target with room for the gap the HTP showed, and the HTP confirmed what it
        # found: a partial promotion clearly cheaper than all-16-bit, which the confirmation alone settled on
        # (the plans the first walk evaluated above its pick are dearer than all-16-bit, by the cost model).
        assert f"so the walk went on to output SNR (dB) >= {target + HTP_SHORT:.4f}" in result.stop_reason
        assert result.reached and result.verdict == "reaches"
        assert result.threshold == target  # judged against the search's own target, not the tightened one
        assert result.recommended.accuracy_source == study.accuracy_source("htp")
        promoted = len(study.plan(result.recommended.plan_id).overrides)
        assert promoted > len(study.plan(first.walk.plan_id).overrides)
        assert result.recommended.value == pytest.approx(_value(promoted, n, "htp"))
        a16 = result.baselines["a16w8"]
        assert clearly_cheaper(estimate_ms(result.recommended), estimate_ms(a16))
        # Every confirmation listed once, the first round's first, the pick among them.
        ids = [c.walk.plan_id for c in result.confirmations]
        assert len(ids) == len(set(ids)) <= 6 and ids[0] == first.walk.plan_id
        assert result.recommended.plan_id in ids
        assert a16.plan_id in ids  # the first round went up to all-16-bit: the walk looked between the two


def test_the_gap_is_the_walk_picks_and_tightens_the_threshold_its_way():
    from mpstudio.search.result import Confirmation, SearchResult
    from mpstudio.sources import Latency
    from mpstudio.store import Evaluation

    def ev(plan_id, value, source):
        return Evaluation(plan_id, f"h{plan_id}", f"p{plan_id}", source, source, "CER", value, False, None, None, 96,
                          1.0, (Latency(1.0 + plan_id, "estimate", "HTP v75 (cost model)"),))

    pick = ev(1, 0.065, "cpu")
    result = SearchResult(1, "0.08", 0.08, "CER", False, False, "", ev(1, 0.085, "htp"), {}, (), 0,
                          confirmations=(Confirmation(pick, ev(1, 0.085, "htp"), "reaches", "within noise"),
                                         Confirmation(ev(2, 0.05, "cpu"), ev(2, 0.09, "htp"), "reaches", "misses")))
    assert short_gap(result) == pytest.approx(0.02)  # the pick's own gap, not the larger one of plan 2
    assert tightened(0.08, 0.02, higher_is_better=False) == pytest.approx(0.06)
    assert tightened(12.0, 1.5, higher_is_better=True) == pytest.approx(13.5)
    agreeing = SearchResult(1, "0.08", 0.08, "CER", False, True, "", ev(1, 0.07, "htp"), {}, (), 0,
                            confirmations=(Confirmation(pick, ev(1, 0.07, "htp"), "reaches", "reaches"),))
    assert short_gap(agreeing) == 0.0
