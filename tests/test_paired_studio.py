"""A promotion's first measured values in the studio, as a paired difference from the plan it was made from (the
same samples, with the difference's interval), and the Pareto plot's whiskers kept inside the plot: on a real
study (real ORT sessions, a real SQLite store), through the state and in headless Chromium."""

from __future__ import annotations

import html
import math
import threading

import pandas as pd
import pytest

from gui_support import chromium_path, make_small_study, open_studio, studio_server, wait_until
from mpstudio.plan import PrecisionPlan

pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    s = make_small_study(tmp_path_factory.mktemp("paired-studio") / "study")
    yield s
    s.close()


def test_a_promotions_partial_values_are_paired_with_the_plan_it_came_from(study):
    from mpstudio.widgets import StudioState

    state = StudioState(study, first_samples=4)
    try:
        assert all(job.wait(120) for job in state.jobs)
        base = state.plan
        assert study.plan_id(base) is not None  # the opening plan is evaluated (the baselines)
        seen = []
        state.param.watch(lambda event: seen.extend(event.new[["kind", "paired", "verdict", "samples", "value", "low", "high",
                                                                  "detail"]]
                                                    .itertuples(index=False)), "provisional")
        tensors = state.tensors["tensor"].tolist()
        state.select(tensors[10:14])
        plan = state.promote_selected()
        job = wait_until(lambda: next((j for j in state.jobs if j.kind == "evaluate"), None), 30)
        assert job.wait(120) and job.status == "done", job.status
        partial = [row for row in seen if row.kind == "partial"]
        assert [row.samples for row in partial] == [4, 8]
        for row in partial:
            assert f"vs {base.name}" in row.paired and f"{row.samples} of 12 samples" in row.paired
            assert row.verdict in ("better", "worse", "within noise")
            # Drawn at the base's value on every sample plus the difference, with the difference's interval.
            assert "plus the paired difference" in row.detail and row.low <= row.value <= row.high
        # The final message carries the difference on every sample, as Study.compare computes it.
        final = study.compare(plan, base)
        assert final.describe() in state.message and "12 samples" in state.message
        assert state.message.startswith(f"{study.store.plan_row(study.plan_id(plan))[1]}: {final.describe()}; ")
    finally:
        state.close()


def test_whiskers_are_clipped_to_the_plotted_span():
    from mpstudio.widgets.pareto import _clip_limits, _provisional

    rows = pd.DataFrame([{"plan_hash": "h", "name": "p", "kind": "partial", "value": 0.15, "low": -0.2, "high": 0.9,
                          "latency_ms": 1.0, "samples": 16, "total": 100, "accuracy_source": "cpu", "detail": "",
                          "paired": "", "verdict": ""}])
    values = [0.15, 0.16, 0.17]  # measured plans 0.02 apart
    floor, ceiling = _clip_limits(values)
    data = _provisional(rows, "partial", values)
    assert data["low_shown"] == [pytest.approx(floor)] and data["high_shown"] == [pytest.approx(ceiling)]
    assert ceiling - floor == pytest.approx(3 * 0.02)  # the range widens by at most the values' span each side
    # A narrow interval is drawn whole; its real ends stay in the hover.
    rows.loc[0, ["low", "high"]] = [0.155, 0.165]
    data = _provisional(rows, "partial", values)
    assert data["low_shown"] == [0.155] and data["high_shown"] == [0.165] and "0.1550-0.1650" in data["interval"][0]
    assert _clip_limits([]) == (-math.inf, math.inf)


CHANGES = """
() => {
  window.__paired = [];
  Bokeh.documents[0].on_change((event) => {
    const value = event.value === undefined ? "" : String(event.value);
    if (value.includes("paired, so far:")) window.__paired.push(value);
  });
}
"""


@pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser")
def test_the_studio_shows_a_promotions_paired_first_value(page, study, monkeypatch):
    # A loaded server sends what its event loop has gathered as one batch: on a small study the whole evaluation may
    # end within one batch, and its first value would never be sent on its own. The evaluation (real, in this
    # process) waits after its first value until the page has shown it.
    seen = threading.Event()
    evaluate = study.evaluate

    def evaluate_seen(*args, partial=None, **kwargs):
        def held(point):
            partial(point)
            seen.wait(120)
        return evaluate(*args, partial=held if partial is not None else None, **kwargs)
    monkeypatch.setattr(study, "evaluate", evaluate_seen)
    with studio_server(study) as studio:
        state = open_studio(page, studio)
        state.first_samples = 4
        base = state.plan.name
        page.evaluate(CHANGES)
        row = page.locator(".tabulator-row").nth(3).locator(".tabulator-cell[tabulator-field='tensor']")
        tensor = row.text_content().strip()
        row.click()
        wait_until(lambda: state.selection == [tensor], 30)
        page.get_by_role("button", name="Promote to 16-bit").click()
        # The browser received the note above the plot with the paired difference of the first value.
        shown = wait_until(lambda: page.evaluate("() => window.__paired"), 120,
                           message="no paired first value reached the page")
        seen.set()
        assert any(f"vs {base}, 4 of 12 samples" in html.unescape(s) for s in shown), shown
        # Then the full result; the message bar says the difference on every sample, with its interval.
        page.get_by_text(f"vs {base}, 12 samples").first.wait_for(state="visible", timeout=120000)
        assert state.plan_id is not None and study.plan_id(PrecisionPlan.a8w8()) is not None


def test_a_partial_value_that_cannot_be_paired_says_why(tmp_path):
    """A study whose current plan was stored without per-sample terms (by an older mpstudio): a promotion's first
    values are the plan's own, and the note above the plot says why they are not paired (not silently)."""
    import sqlite3

    from mpstudio.widgets import StudioState
    from mpstudio.widgets.pareto import _paired_note

    study = make_small_study(tmp_path / "study")
    state = StudioState(study, first_samples=4)
    try:
        assert all(job.wait(120) for job in state.jobs)
        base_id = study.plan_id(state.plan)
        with sqlite3.connect(study.folder / "study.sqlite") as db:  # as an older mpstudio stored it
            db.execute("DELETE FROM sample_terms WHERE plan_id = ?", (base_id,))
        seen = []
        state.param.watch(lambda event: seen.extend(event.new[["kind", "paired", "verdict", "samples"]]
                                                    .itertuples(index=False)), "provisional")
        state.select(state.tensors["tensor"].tolist()[10:13])
        state.promote_selected()
        job = wait_until(lambda: next((j for j in state.jobs if j.kind == "evaluate"), None), 30)
        assert job.wait(120) and job.status == "done", job.status
        partial = [row for row in seen if row.kind == "partial"]
        assert partial and all(row.verdict == "unpaired" for row in partial)
        name = study.store.plan_row(base_id)[1]
        for row in partial:
            assert row.paired.startswith(f"not paired with {name}: its stored result has no per-sample terms")
            assert f"own value on {row.samples} of 12 samples" in row.paired
        note = _paired_note(pd.DataFrame([partial[0]._asdict()]))
        assert "so far, not paired with" in html.unescape(note) and "paired, so far" not in note
    finally:
        state.close()
        study.close()
