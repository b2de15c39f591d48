"""Placing the graph's node labels (no browser): no two placed labels overlap, none runs over another node or out
of the window, crowded projections are told apart by short forms, and the most important nodes win a crowded place."""

from __future__ import annotations

import itertools

import pytest

from mpstudio.widgets.graph_labels import (ELLIPSIS, LINE_PX, label_forms, place_labels, text_width)

PROJECTIONS = [f"/m/encoder/layer.0/attention/self/{part}/MatMul_output_0" for part in ("query", "key", "value")]


def full_labels(names, op="MatMul"):
    return [f"{op}  \u2026{name[-31:]}" for name in names]


def overlapping(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def assert_clear(placed, xs, ys, sizes, px_per_x, px_per_y):
    for a, b in itertools.combinations(placed.boxes, 2):
        assert not overlapping(a, b), (a, b)
    for node, box in zip(placed.nodes, placed.boxes):
        for i, (x, y, size) in enumerate(zip(xs, ys, sizes)):
            r = size / 2
            marker = (x * px_per_x - r, -y * px_per_y - r, x * px_per_x + r, -y * px_per_y + r)
            assert i == node or not overlapping(box, marker), (placed.texts[placed.nodes.index(node)], i)


def test_text_width_grows_with_the_text_and_bounds_wide_letters():
    assert text_width("") == 0
    assert text_width("iii") < text_width("mmm")
    assert text_width("query") < text_width("query/MatMul")
    assert text_width(ELLIPSIS) >= text_width("a")


def test_a_crowded_row_of_projections_is_told_apart_without_overlap():
    xs, ys, sizes = [0, 1, 2], [5, 5, 5], [13, 13, 13]
    forms = label_forms(full_labels(PROJECTIONS), ys, ["MatMul"] * 3, [[n] for n in PROJECTIONS])
    assert forms[0][-1] == "query" and forms[1][-1] == "key" and forms[2][-1] == "value"
    placed = place_labels(forms, xs, ys, sizes, [0, 1, 2], 40.0, 15.0, (-2.0, 5.5))
    assert_clear(placed, xs, ys, sizes, 40.0, 15.0)
    texts = dict(zip(placed.nodes, placed.texts))
    assert set(texts) == {0, 1, 2}
    assert "query" in texts[0] and "key" in texts[1] and "value" in texts[2]
    # The first of the row takes its left, where there is room for its name whole.
    assert placed.sides[placed.nodes.index(0)] == "left"
    # Far apart, every node keeps its full label on its right.
    wide = place_labels(forms, [0, 10, 20], ys, sizes, [0, 1, 2], 40.0, 15.0)
    assert wide.texts == full_labels(PROJECTIONS) and wide.sides == ["right"] * 3


def test_a_row_spanning_layers_names_what_tells_each_apart():
    names = ["/m/encoder/layer.0/attention/self/value/MatMul_output_0",
             "/m/encoder/layer.0/attention/self/key/MatMul_output_0",
             "/m/encoder/layer.0/attention/self/query/MatMul_output_0",
             "/m/encoder/layer.5/attention/self/Where/Cast_output_0"]
    forms = label_forms(["x" * 40] * 4, [5] * 4, ["MatMul"] * 3 + ["Cast"], [[n] for n in names])
    assert [f[-1] for f in forms[:3]] == ["value", "key", "query"]


def test_rows_closer_than_a_line_keep_the_most_important_label():
    # Zoomed out: rows 6 px apart, so neighbouring rows' labels would overlap; rank decides which are drawn.
    names = [f"/block{i}/Conv_output_0" for i in range(6)]
    xs, ys, sizes = [0] * 6, [-i for i in range(6)], [4] * 6
    forms = label_forms([f"Conv  {n}" for n in names], ys, ["Conv"] * 6, [[n] for n in names])
    order = [3, 0, 5, 1, 2, 4]
    placed = place_labels(forms, xs, ys, sizes, order, 40.0, 6.0)
    assert_clear(placed, xs, ys, sizes, 40.0, 6.0)
    assert 3 in placed.nodes and 2 not in placed.nodes and 4 not in placed.nodes
    assert len(placed.nodes) < 6
    # With a line's room between rows all of them are drawn.
    assert len(place_labels(forms, xs, ys, sizes, order, 40.0, LINE_PX + 2).nodes) == 6


def test_a_label_is_cut_to_the_window_or_left_out():
    name = "/a/very/long/namespace/path/that/goes/on/Conv_output_0"
    forms = label_forms([f"Conv  {name}"], [0], ["Conv"], [[name]])
    placed = place_labels(forms, [0], [0], [13], [0], 20.0, 15.0, (-0.5, 3.0))
    (box,) = placed.boxes
    assert box[2] <= 3.0 * 20.0 and box[0] >= -0.5 * 20.0
    assert placed.texts[0] in forms[0] or placed.texts[0].startswith(ELLIPSIS)
    # No room at all: no label.
    assert place_labels(forms, [0], [0], [13], [0], 20.0, 15.0, (-0.5, 0.8)).nodes == []


@pytest.mark.parametrize("px_per_x", [12.0, 25.0, 40.0, 80.0])
def test_a_dense_grid_never_overlaps(px_per_x):
    # A wide layer of many ops (a grouped block), rows one unit apart, at several zooms.
    names = [f"/stage/block{r}/branch{c}/Conv_output_0" for r in range(6) for c in range(8)]
    xs = [c for r in range(6) for c in range(8)]
    ys = [-r for r in range(6) for c in range(8)]
    sizes = [13] * len(xs)
    forms = label_forms([f"Conv  {n}" for n in names], ys, ["Conv"] * len(xs), [[n] for n in names])
    placed = place_labels(forms, xs, ys, sizes, list(range(len(xs))), px_per_x, 15.0)
    assert_clear(placed, xs, ys, sizes, px_per_x, 15.0)
    if px_per_x >= 80:
        assert len(placed.nodes) == len(xs)  # "branchN" fits between neighbours
    else:  # too tight between neighbours: each row's ends keep theirs (its first on its left)
        assert {r * 8 for r in range(6)} | {r * 8 + 7 for r in range(6)} <= set(placed.nodes)
