"""Runs that skip the unchanged prefix: the switchable model cut at a few nodes, the values crossing each cut
(its frontier), and evaluation samples with their all-8-bit activations there."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
from onnx import helper

from ...data import Feed
from .edges import ALL_8, Setting


# The most cut points, and the weights their suffix sessions may hold together: each suffix session holds the
# weights after its cut (about half the model's on average), so a large model gets fewer cuts.
MOST_CUTS = 6
_SUFFIX_WEIGHT_BUDGET = 256 << 20


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of `model`'s initializers, at their element types."""
    return sum(int(np.prod(init.dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
               for init in model.graph.initializer)


def cut_count(model: onnx.ModelProto, most: int = MOST_CUTS, budget: int = _SUFFIX_WEIGHT_BUDGET) -> int:
    """How many cut points `model` gets: `most`, fewer when their suffix sessions would together hold more
    weights than the model itself or `budget` bytes, whichever is more (at least one)."""
    weights = weight_bytes(model)
    if weights == 0:
        return most
    return max(1, min(most, int(2 * max(weights, budget) // weights)))


def first_uses(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor (a switch input among them) -> index of the first node that reads it."""
    first: dict[str, int] = {}
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            first.setdefault(name, index)
    return first


def constant_nodes(model: onnx.ModelProto) -> list[bool]:
    """Per node: whether it computes from fixed initializers only (a Constant, a weight's DequantizeLinear)."""
    graph = model.graph
    known = {i.name for i in graph.initializer} - {i.name for i in graph.input}
    flags = []
    for node in graph.node:
        constant = node.op_type == "Constant" or all(name in known for name in node.input if name)
        if constant:
            known.update(o for o in node.output if o)
        flags.append(constant)
    return flags


def frontier_of(model: onnx.ModelProto, cut: int) -> list[str]:
    """Tensors computed before node `cut` and read from it on (graph inputs and switches excluded)."""
    graph = model.graph
    # Constant computations are carried into the suffix, so the frontier holds activations only: a weight
    # fed as an input would not be prepacked, and its node would run another kernel.
    constant = constant_nodes(model)
    produced = {o for n, c in zip(graph.node[:cut], constant) if not c for o in n.output if o}
    used = {i for n in graph.node[cut:] for i in n.input if i} | {o.name for o in graph.output}
    return sorted(produced & used)


def suffix_model(model: onnx.ModelProto, cut: int, frontier: list[str], types: Mapping[str, np.dtype]
                 ) -> onnx.ModelProto:
    """`model` from node `cut` on, reading the frontier's values (of dtypes `types`) as graph inputs."""
    graph = model.graph
    constant = constant_nodes(model)
    after = [n for n, c in zip(graph.node[:cut], constant) if c] + list(graph.node[cut:])
    used = {i for n in after for i in n.input if i} | {o.name for o in graph.output}
    inits = [i for i in graph.initializer if i.name in used]
    inputs = [i for i in graph.input if i.name in used]
    inputs += [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(types[name]), None)
               for name in frontier]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.CopyFrom(helper.make_graph(after, f"{graph.name}_from_{cut}", inputs, list(graph.output), inits))
    return out


class CachedSamples:
    """Evaluation samples bound to a switchable model, with the all-8-bit activations at its cut points."""

    def __init__(self, model, samples: list[Feed]):
        self.model, self.samples = model, samples
        frontier = sorted({name for names in model.frontier.values() for name in names})
        wanted = list(dict.fromkeys(model.output_names + frontier))
        self.values = model.frontier_values(samples, wanted)
        types = {name: value.dtype for name, value in self.values[0].items()} if self.values else {}
        self.sessions = {cut: model.suffix_session(cut, types) for cut in model.frontier} if samples else {}
        self.inputs = {cut: {i.name for i in s.get_inputs()} for cut, s in self.sessions.items()}
        self._unchanged = [[v[name] for name in model.output_names] for v in self.values]
        self.all_8 = self._unchanged if not model.has_own_baseline else [
            model.session_8.run(model.output_names, sample) for sample in samples]
        model.close_baseline()

    def head(self, n: int) -> "CachedSamples":
        """The first `n` samples, sharing this object's sessions and cached activations."""
        if n >= len(self.samples):
            return self
        part = object.__new__(CachedSamples)
        part.model, part.samples, part.values = self.model, self.samples[:n], self.values[:n]
        part.sessions, part.inputs = self.sessions, self.inputs
        part._unchanged, part.all_8 = self._unchanged[:n], self.all_8[:n]
        return part

    def outputs(self, setting: Setting) -> list[list[np.ndarray]]:
        """Every sample's model outputs under `setting`."""
        model = self.model
        feed = model.parameter_feed(setting)
        start = model.first_change(feed)
        if start >= len(model.model.graph.node):
            return self.all_8 if setting == ALL_8 else self._unchanged
        cut = max((c for c in self.sessions if c <= start), default=0)
        if cut == 0:
            return [model.session.run(model.output_names, {**s, **feed}) for s in self.samples]
        session, inputs, names = self.sessions[cut], self.inputs[cut], model.frontier[cut]
        results = []
        for sample, values in zip(self.samples, self.values):
            run_feed = {k: v for k, v in sample.items() if k in inputs}
            run_feed.update({n: values[n] for n in names})
            run_feed.update(feed)
            results.append(session.run(model.output_names, run_feed))
        return results
