"""The studio's search result card on a real search (real ORT sessions, a real SQLite store): every plan the
recommendation chose among is listed with its value, interval, estimated latency and why it was not picked."""

from __future__ import annotations

import html
import re

import pytest

from gui_support import make_small_study
from mpstudio.plan import PrecisionPlan
from mpstudio.search import search
from mpstudio.widgets.search_card import search_card_html


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    study = make_small_study(tmp_path_factory.mktemp("search-card") / "study")
    try:
        # Stored plans beside the baselines, which the recommendation chooses among too.
        top = study.sensitivity().top(6)["tensor"].tolist()
        for plan in (PrecisionPlan.a8w8().promote(top[:2]), PrecisionPlan.a8w8().promote(top),
                     PrecisionPlan(activation_type="uint8", weight_type="int8", per_channel=True, name="a8w8-pc")):
            study.evaluate(plan)
        yield search(study, "a16w8+1%", weights="per-tensor", max_evaluations=6, confirm=None, quiet=True)
    finally:
        study.close()


def _considered_rows(card: str) -> list[list[str]]:
    table = re.search(r"<table class='mpstudio-considered'.*?</table>", card, re.S)
    assert table, "the card has no table of the plans considered"
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(0), re.S)[1:]  # after the header
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row,
                                                                                        re.S)]
            for row in rows]


def test_the_card_lists_every_plan_considered_with_value_interval_latency_and_why(result):
    assert len(result.considered) >= 5  # the baselines, the stored plans and the walk's
    rows = _considered_rows(search_card_html(result))
    assert [int(r[0]) for r in rows] == [c.plan_id for c in result.considered]
    for row, c in zip(rows, result.considered):
        plan_id, name, value, interval, estimate, why = row
        assert name.startswith(c.name) and value == f"{c.value:.4f}"
        assert interval == f"{c.low:.4f}\u2013{c.high:.4f}"  # every plan here has per-sample terms
        assert estimate == f"{c.estimate_ms:.3f}"  # under the header "est. ms"
        assert why == ("picked" if c.plan_id == result.recommended.plan_id else c.verdict)
    assert sum(r[-1] == "picked" for r in rows) == 1
    assert {r[-1] for r in rows if r[-1] != "picked"} <= {"reaches (dearer)", "within noise", "misses",
                                                          "over the latency budget"} | {
        r[-1] for r in rows if r[-1].startswith("dominated by plan ")}


def test_the_cards_figures_stay_on_one_line(result):
    """The card breaks long words anywhere (paths, plan names); a figure broken over two lines ("0.16" over "37")
    reads as two numbers, so its cells and the headers do not wrap."""
    card = search_card_html(result)
    table = re.search(r"<table class='mpstudio-considered'.*?</table>", card, re.S).group(0)
    cells = re.findall(r"<t([dh]) style='([^']*)'>(.*?)</t[dh]>", table, re.S)
    figures = [style for kind, style, text in cells if kind == "h" or re.fullmatch(r"[-0-9.\u2013 ms]+", text)]
    assert len(figures) >= 6 + 4 * len(result.considered)
    assert all("white-space:nowrap" in style for style in figures)
