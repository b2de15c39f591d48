"""The graph layout: layered top-to-bottom positions, namespace collapse, routing, determinism, disk cache."""

import subprocess
import sys

import pytest

from conftest import make_conv_model
from gui_models import make_residual_model
from mpstudio import MpstudioError
from mpstudio.graph import ModelGraph
from mpstudio.layout import (INPUT_PREFIX, NAMESPACE_PREFIX, GraphLayout, collapsible_namespaces, dot_available,
                             layout_graph)

engines = ["layered", pytest.param("dot", marks=pytest.mark.skipif(not dot_available(), reason="no Graphviz dot"))]


@pytest.fixture(scope="module")
def big_graph():
    return ModelGraph(make_residual_model(2000))


def check_drawable(layout: GraphLayout):
    """Every edge points down; nodes in one layer are at least one unit apart."""
    nodes = layout.nodes.set_index("id")
    for source, target in zip(layout.edges["source"], layout.edges["target"]):
        assert nodes.at[source, "layer"] < nodes.at[target, "layer"], (source, target)
    for _, row in layout.nodes.groupby("layer")["x"]:
        xs = sorted(row)
        assert all(b - a >= 0.99 for a, b in zip(xs, xs[1:]))
    assert (layout.nodes["y"] == -layout.nodes["layer"]).all() or layout.engine == "dot"


@pytest.mark.parametrize("engine", engines)
def test_small_model_is_a_straight_chain(engine, tmp_path):
    graph = ModelGraph(make_conv_model(with_constant=False))
    layout = layout_graph(graph, engine=engine, cache_dir=tmp_path)
    assert layout.engine == engine
    assert list(layout.nodes["id"][:2]) == [INPUT_PREFIX + "x", "/backbone/conv1/Conv"]
    assert set(layout.nodes["id"]) == {INPUT_PREFIX + "x", *graph.nodes}
    assert layout.members[INPUT_PREFIX + "x"] == ("x",)
    check_drawable(layout)
    chain = layout.nodes.set_index("id").loc[[INPUT_PREFIX + "x", "/backbone/conv1/Conv", "/backbone/conv1/Relu",
                                              "/backbone/conv2/Conv", "/head/Add"]]
    assert list(chain["layer"]) == [0, 1, 2, 3, 4]
    assert chain["x"][:3].max() - chain["x"][:3].min() < 0.05  # a chain is drawn straight
    # The Identity feeding the Add has no activation input: it sits right above the Add, not at the top, and
    # the Add sits between its two inputs.
    identity = layout.nodes.set_index("id").loc["/head/Identity"]
    assert identity["layer"] == 3
    assert min(identity["x"], chain["x"].iloc[3]) < chain["x"].iloc[4] < max(identity["x"], chain["x"].iloc[3])


def test_long_edges_are_routed_through_each_layer(big_graph, tmp_path):
    layout = layout_graph(big_graph, engine="layered", cache_dir=tmp_path)
    nodes = layout.nodes.set_index("id")
    skip = layout.edges[(layout.edges["source"] == "/stage0/block0/Relu") &
                        (layout.edges["target"] == "/stage0/block1/Add")].iloc[0]
    span = nodes.at["/stage0/block1/Add", "layer"] - nodes.at["/stage0/block0/Relu", "layer"]
    assert span == 4 and len(skip["xs"]) == span + 1
    assert skip["ys"] == sorted(skip["ys"], reverse=True)


@pytest.mark.parametrize("engine", engines)
def test_two_thousand_nodes_lay_out_narrow_and_deterministic(big_graph, engine, tmp_path):
    first = layout_graph(big_graph, engine=engine, cache_dir=tmp_path / "a")
    second = layout_graph(big_graph, engine=engine, cache_dir=tmp_path / "b")
    assert len(first) == len(big_graph.nodes) + 1
    check_drawable(first)
    assert first.nodes.equals(second.nodes) and first.edges.equals(second.edges)
    # Residual blocks stack up instead of drifting sideways: the drawing stays a narrow column.
    assert first.width < (12 if engine == "layered" else 100)
    assert first.depth > 1000


def test_collapsed_namespaces_become_one_node(big_graph, tmp_path):
    namespaces = collapsible_namespaces(big_graph)
    assert namespaces[0] == "head" or namespaces[0].count("/") == 0
    assert "stage0/block2" in namespaces and "stage0" in namespaces
    layout = layout_graph(big_graph, ["stage0", "stage1/block3", "stage0/block1"], engine="layered",
                          cache_dir=tmp_path)
    stage0 = NAMESPACE_PREFIX + "stage0"
    assert layout.collapsed == ("stage0", "stage0/block1", "stage1/block3")
    assert len(layout.members[stage0]) == len(big_graph.namespaces()["stage0"])
    assert NAMESPACE_PREFIX + "stage0/block1" not in layout.members  # the outer namespace wins
    assert layout.node_of["/stage0/block1/Add"] == stage0 and layout.node_of["/stage1/block0/Add"] == "/stage1/block0/Add"
    row = layout.nodes.set_index("id").loc[stage0]
    assert row["kind"] == "namespace" and row["label"] == "stage0" and row["size"] == len(layout.members[stage0])
    assert len(layout) == len(big_graph.nodes) + 1 - sum(len(m) - 1 for m in layout.members.values())
    # stage0 is fed by the stem and feeds stage1's first block (both its conv and its skip connection).
    assert set(layout.edges.loc[layout.edges["target"] == stage0, "source"]) == {"/stem/Conv"}
    assert set(layout.edges.loc[layout.edges["source"] == stage0, "target"]) == {
        "/stage1/block0/conv1/Conv", "/stage1/block0/Add"}
    check_drawable(layout)


def test_unknown_namespace_or_engine_is_an_error(big_graph):
    with pytest.raises(MpstudioError, match="no namespace"):
        layout_graph(big_graph, ["stage999"], use_cache=False)
    with pytest.raises(MpstudioError, match="layout engine"):
        layout_graph(big_graph, engine="neato", use_cache=False)


def test_layouts_are_cached_on_disk_by_model_and_collapse_state(big_graph, tmp_path):
    fresh = layout_graph(big_graph, ["stage0"], engine="layered", model_sha256="abc", cache_dir=tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and fresh.seconds > 0
    cached = layout_graph(big_graph, ["stage0"], engine="layered", model_sha256="abc", cache_dir=tmp_path)
    assert cached.seconds == 0.0  # read back, not laid out again
    assert cached.nodes.equals(fresh.nodes) and cached.edges.equals(fresh.edges) and cached.members == fresh.members
    layout_graph(big_graph, [], engine="layered", model_sha256="abc", cache_dir=tmp_path)
    layout_graph(big_graph, ["stage0"], engine="layered", model_sha256="other", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 3
    files[0].write_text("{torn")  # a damaged file is laid out again and replaced
    again = layout_graph(big_graph, ["stage0"], engine="layered", model_sha256="abc", cache_dir=tmp_path)
    assert again.seconds > 0 and again.nodes.equals(fresh.nodes)


def test_layout_is_core_code():
    code = ("import sys, mpstudio.layout\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('panel', 'bokeh', 'param'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
