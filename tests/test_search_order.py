"""The bottom-up walk's order (`search.promotion_order`), on a real model and its real analysis: tensors whose
promotion helps on its own come first, by the noise that promotion removes per estimated ms; tensors whose 8 bits
only cost noise seen from the all-16-bit plan (the top-down walk's side) follow. The model is the top-down
walk's chains (`test_search_top_down`): promoting a spiked Add alone removes nothing, demoting it costs much."""

from __future__ import annotations

import onnx

from mpstudio.data import FeedList
from mpstudio.latency import promotion_costs
from mpstudio.noise import added_noise, removed_noise
from mpstudio.plan import PrecisionPlan
from mpstudio.search import promotion_order
from mpstudio.study import Study
from test_search_top_down import SAMPLES, _chains, _feeds


def test_promotions_that_help_alone_come_before_those_seen_only_from_the_top(tmp_path):
    onnx.save(_chains(), tmp_path / "chains.onnx")
    with Study.create(tmp_path / "study", tmp_path / "chains.onnx", FeedList(_feeds(SAMPLES, 0)),
                      FeedList(_feeds(SAMPLES, 1))) as study:
        report = study.sensitivity(samples=SAMPLES, isolation_samples=2)
        iso = report.isolation
        per = iso.per_tensor()
        removed = removed_noise(iso.all_8, per["promoted"].astype(float))
        added = added_noise(per["demoted"].astype(float), iso.all_16)
        helpers = set(removed[removed > 0].index)
        # The premise: some promotions help alone, and a tensor that does not is dearer seen from the top than
        # one that does (an order by the larger side would put it first).
        assert helpers and len(helpers) < len(per)
        assert max(added[t] for t in per.index if t not in helpers) > min(added[t] for t in helpers)
        order, predicted = promotion_order(study, report, PrecisionPlan.a8w8())
        assert set(order) == set(per.index) and len(predicted) == len(order)
        assert set(order[:len(helpers)]) == helpers
        costs = promotion_costs(study.quantizer.generate(PrecisionPlan.a8w8()), order, study.htp_arch,
                                graph=study.graph)
        per_ms = [removed[t] / costs[t] for t in order[:len(helpers)]]
        assert per_ms == sorted(per_ms, reverse=True)
        rest = [added[t] / costs[t] for t in order[len(helpers):]]
        assert rest == sorted(rest, reverse=True)
        assert predicted == sorted(predicted)  # each prefix removes more noise
