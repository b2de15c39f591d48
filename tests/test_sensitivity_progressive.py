"""The progressive sensitivity analysis: partial reports first, the exhaustive analysis's numbers where it
isolates, the same numbers in worker processes as in this one, cancel, and cached values reused."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pandas as pd
import pytest

from conftest import chain_feeds, make_chain_model
from gui_models import make_residual_model
from gui_support import small_feeds
from mpstudio.data import Cancelled, FeedList
from mpstudio.model import prepare_model
from mpstudio.quantize import Quantizer
from mpstudio.sensitivity import analyze, analyze_progressive


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    """A 60-node residual net (about 30 activation tensors, two namespaces) and its exhaustive analysis."""
    prepared = prepare_model(make_residual_model(60, size=8))
    quantizer = Quantizer(prepared, small_feeds(12), tmp_path_factory.mktemp("residual-cache"))
    data = small_feeds(8, seed=3)
    reference = analyze(quantizer, data, isolation_samples=4)
    return quantizer, data, reference


def _isolation(report) -> pd.DataFrame:
    return report.isolation.scores.set_index("region").sort_index()


def _terms(report) -> pd.DataFrame:
    """The per-sample noise terms, by (region, side)."""
    return report.isolation.terms.set_index(["region", "side"]).sort_index()


def test_partial_reports_come_before_the_final_one(residual):
    quantizer, data, _ = residual
    partials = []
    final = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, chunk=2, keep=3,
                                on_partial=partials.append)
    assert len(partials) >= 4
    assert all(p.partial for p in partials) and not final.partial
    stages = [p.meta["stage"] for p in partials]
    # Cheap scores first, on more samples each time, with no isolation yet; then screening, then isolation.
    assert stages[0] == "scores" and partials[0].isolation is None
    assert partials[0].meta["scored_samples"] == 2 and partials[0].status() == f"cheap scores, 2/{len(data)} samples"
    assert partials[0].ranking["snr_db"].notna().any()
    assert stages.index("screening") < stages.index("isolation")
    assert [s for s in stages if s == "scores"] == stages[:stages.count("scores")]
    isolated = [len(p.isolation.per_tensor()) for p in partials if p.meta["stage"] == "isolation"]
    assert isolated == sorted(isolated) and isolated[-1] <= len(final.isolation.per_tensor())
    assert partials[-1].meta["seconds"] <= final.meta["seconds"]
    assert list(final.ranking.columns) == list(residual[2].ranking.columns)


def test_final_ranking_matches_the_exhaustive_reference(residual):
    quantizer, data, reference = residual
    keep = 3
    report = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=keep, budget=100)
    ref, new = _isolation(reference), _isolation(report)
    # Every configuration it isolated has exactly the exhaustive analysis's value, regions included.
    assert {"namespace"} <= set(new["source"])
    pd.testing.assert_frame_equal(new[["promoted", "demoted"]], ref.loc[new.index, ["promoted", "demoted"]])
    assert report.isolation.all_8 == reference.isolation.all_8
    assert report.isolation.all_16 == reference.isolation.all_16
    # So are the per-sample noise terms of the tensors it isolated, and of the baselines.
    terms = _terms(report)
    assert len(terms) == 2 + 2 * len(report.isolation.per_tensor())
    pd.testing.assert_frame_equal(terms, _terms(reference).loc[terms.index])
    # The cheap scores are the reference's (merged from chunks: equal to the last float64 bits or nearly).
    np.testing.assert_allclose(report.tensors["snr_db"], reference.tensors["snr_db"], rtol=1e-9)
    np.testing.assert_allclose(report.tensors["local_snr_8"], reference.tensors["local_snr_8"], rtol=1e-9)
    # Its top `keep` is the reference's (on this model screening tells little, so it isolates most tensors).
    assert report.ranking["tensor"].head(keep).tolist() == reference.ranking["tensor"].head(keep).tolist()
    # Exhaustive: every tensor, the reference's ranking.
    full = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, exhaustive=True)
    pd.testing.assert_frame_equal(_isolation(full)[["promoted", "demoted"]], ref[["promoted", "demoted"]])
    assert full.ranking["tensor"].tolist() == reference.ranking["tensor"].tolist()
    assert full.status() == ""


def test_it_isolates_only_what_can_change_a_decision(tmp_path):
    """A chain where one tensor decides the output: the other tensors' screened values cannot reach it."""
    prepared = prepare_model(make_chain_model(blocks=24, size=8))
    quantizer = Quantizer(prepared, FeedList(chain_feeds(12, size=8)), tmp_path)
    data = FeedList(chain_feeds(8, size=8, seed=5))
    reference = analyze(quantizer, data, isolation_samples=4)
    report = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=3, budget=100)
    isolated, tensors = report.isolation.per_tensor(), reference.isolation.per_tensor()
    assert 2 * 3 <= len(isolated) < len(tensors) / 2
    assert "cannot enter the top 3" in report.meta["stopped"]
    assert report.status().startswith(f"isolation of {len(isolated)}/{len(tensors)} tensors")
    nonzero = reference.ranking[reference.ranking["isolation_gain"] > 0]  # the rest gain nothing or lose
    assert len(nonzero) >= 1
    assert report.ranking["tensor"].head(len(nonzero)).tolist() == nonzero["tensor"].tolist()
    pd.testing.assert_frame_equal(isolated[["promoted", "demoted"]], tensors.loc[isolated.index, ["promoted", "demoted"]])
    # With a budget it stops there, whatever is left undecided.
    ticks = []
    capped = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=3, budget=7,
                                 progress=lambda done, total, message: ticks.append((done, total, message)))
    assert len(capped.isolation.per_tensor()) == 7 and "budget of 7" in capped.meta["stopped"]
    # Its bar has the most it will isolate as its total from the start (the total once grew with every tensor),
    # and ends full when it stops before it.
    isolating = [(done, total) for done, total, message in ticks if message.startswith("isolat")]
    assert isolating and {total for _, total in isolating[:-1]} == {7} and isolating[-1] == (7, 7), isolating
    assert "isolating up to 7 tensors" in {message for _, _, message in ticks}
    ticks.clear()
    analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=3, budget=100,
                        progress=lambda done, total, message: ticks.append((done, total, message)))
    isolating = [(done, total) for done, total, message in ticks if message.startswith("isolat")]
    assert len({total for _, total in isolating[:-1]}) == 1 and isolating[-1][0] == isolating[-1][1] < isolating[0][1]


def test_worker_processes_give_the_numbers_of_this_process(residual):
    quantizer, data, _ = residual
    here = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=3)
    there = analyze_progressive(quantizer, data, isolation_samples=4, workers=2, keep=3)
    assert there.meta["workers"] == 2 and here.meta["workers"] == 0
    pd.testing.assert_frame_equal(here.tensors, there.tensors)
    pd.testing.assert_frame_equal(here.weights, there.weights)
    pd.testing.assert_frame_equal(_isolation(here), _isolation(there))
    pd.testing.assert_frame_equal(_terms(here), _terms(there))
    pd.testing.assert_frame_equal(here.ranking, there.ranking)


def test_cancel_stops_the_workers(residual):
    quantizer, data, _ = residual
    cancel = threading.Event()
    workers = {}

    def analysis_workers():  # not other pools of the process (the HTP evaluation workers)
        return [w for w in multiprocessing.active_children() if w.name.startswith("mpstudio-sensitivity")]

    def partial(report):
        workers.update({w.pid: w for w in analysis_workers()})
        cancel.set()

    with pytest.raises(Cancelled):
        analyze_progressive(quantizer, data, isolation_samples=4, workers=2, chunk=2, on_partial=partial,
                            cancel=cancel)
    assert len(workers) == 2
    assert not any(w.is_alive() for w in workers.values())
    assert not analysis_workers()


def test_isolation_values_are_reused(residual, tmp_path):
    quantizer, data, reference = residual
    first = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=3, cache_dir=tmp_path)
    assert first.meta["evaluated"] > 0 and first.meta["cached"] == 0
    again = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, keep=3, cache_dir=tmp_path)
    assert again.meta["evaluated"] == 0 and again.meta["cached"] == first.meta["evaluated"]
    pd.testing.assert_frame_equal(_isolation(first), _isolation(again))
    pd.testing.assert_frame_equal(_terms(first), _terms(again))  # the terms come back from the cache exactly
    # An exhaustive run on the same cache isolates only the tensors the first one did not.
    full = analyze_progressive(quantizer, data, isolation_samples=4, workers=0, exhaustive=True, cache_dir=tmp_path)
    left = len(reference.isolation.per_tensor()) - len(first.isolation.per_tensor())
    assert full.meta["evaluated"] == 2 * left
    pd.testing.assert_frame_equal(_isolation(full)[["promoted", "demoted"]],
                                  _isolation(reference)[["promoted", "demoted"]])


def test_the_studio_table_shows_partial_rankings_as_they_come(tmp_path):
    from gui_support import make_small_study
    from mpstudio.widgets.state import StudioState
    from mpstudio.widgets.table import SensitivityTable

    study = make_small_study(tmp_path / "study", analyzed=False, baselines=False)
    state = StudioState(study, auto_analyze=False)
    table = SensitivityTable(state=state)
    captions, reports = [], []
    table.status.param.watch(lambda event: captions.append(event.new), "object")
    state.param.watch(lambda event: reports.append(event.new), "report")
    job = state.analyze()
    assert job.wait(600) and job.status == "done", job.error
    partial = [r for r in reports if r is not None and r.partial]
    assert partial and partial[0].meta["stage"] == "scores"
    assert any("partial: cheap scores" in c for c in captions)
    assert reports[-1] is state.report and not state.report.partial
    assert "partial" not in captions[-1]
    assert table.table.value["snr_db"].notna().any() and table.table.value["isolation_gain"].notna().any()
