"""The model as a graph: tensor kinds, producers and consumers, namespaces, topological order."""

import pytest
from onnx import helper

from conftest import make_conv_model
from mpstudio import MpstudioError
from mpstudio.graph import ACTIVATION, BIAS, INPUT, OUTPUT, WEIGHT, ModelGraph, namespace_of
from mpstudio.model import prepare_model


def test_namespace_of():
    assert namespace_of("/encoder/layer.0/attn/MatMul") == "encoder/layer.0/attn"
    assert namespace_of("MatMul_3") == ""
    assert namespace_of("/Conv") == ""


def test_kinds_producers_consumers():
    graph = prepare_model(make_conv_model()).graph
    t = graph.tensors
    assert t["x"].kind == INPUT and t["y"].kind == OUTPUT
    assert t["conv1_out"].kind == ACTIVATION and t["conv1_out"].producer == "/backbone/conv1/Conv"
    assert t["conv1_out"].consumers == ("/backbone/conv1/Relu",)
    assert t["conv1.weight"].kind == WEIGHT and t["conv1.bias"].kind == BIAS
    assert graph.activations()[0] == "x" and graph.activations()[-1] == "y"
    assert set(graph.weights()) >= {"conv1.weight", "conv2.weight"}


def test_namespaces_include_ancestors():
    graph = prepare_model(make_conv_model()).graph
    groups = graph.namespaces()
    assert set(groups["backbone/conv1"]) == {"/backbone/conv1/Conv", "/backbone/conv1/Relu"}
    assert set(groups["backbone"]) >= set(groups["backbone/conv1"]) | set(groups["backbone/conv2"])
    assert len(groups[""]) == len(graph.nodes)


def test_topological_order_from_a_shuffled_file():
    model = make_conv_model(with_constant=False)
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    graph = ModelGraph(model)
    order = {name: n.order for name, n in graph.nodes.items()}
    assert order["/backbone/conv1/Conv"] < order["/backbone/conv1/Relu"] < order["/backbone/conv2/Conv"] < order["/head/Add"]


def test_unknown_tensor_suggests_close_names():
    graph = prepare_model(make_conv_model()).graph
    with pytest.raises(MpstudioError, match="did you mean 'conv1_out'"):
        graph.tensor("conv1_ou")


def test_cycle_is_refused():
    model = make_conv_model(with_constant=False)
    model.graph.node[0].input[0] = "relu1_out"  # conv1 now reads its own successor
    with pytest.raises(MpstudioError, match="cycle"):
        ModelGraph(model)
