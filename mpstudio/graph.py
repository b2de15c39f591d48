"""The model as a DAG of nodes and tensors: kinds, producers and consumers, namespaces, topological order."""

from __future__ import annotations

import difflib
import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping

import onnx
from onnx import TensorProto

from .errors import MpstudioError

# Tensor kinds. A "weight" or "bias" is an initializer that ORT's QDQ quantizer quantizes; "constant" is an
# initializer it leaves alone (shapes, indices, axes).
INPUT, ACTIVATION, OUTPUT, WEIGHT, BIAS, CONSTANT = "input", "activation", "output", "weight", "bias", "constant"

# Input positions that hold a bias (quantized to int32 from the weight and input scales). ORT's QDQ quantizer
# treats a normalization's bias so too (onnxruntime.quantization.operators.norm.QDQNormalization).
_BIAS_INPUTS = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2,
                "LayerNormalization": 2, "InstanceNormalization": 2, "BatchNormalization": 2}
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the graph."""

    name: str
    kind: str
    shape: tuple[int | str | None, ...] | None
    dtype: str
    producer: str | None
    consumers: tuple[str, ...]

    @property
    def quantizable(self) -> bool:
        """Whether a precision plan may say something about this tensor."""
        return self.kind in (INPUT, ACTIVATION, OUTPUT, WEIGHT) and self.dtype in ("float32", "float16")

    @property
    def is_activation(self) -> bool:
        return self.kind in (INPUT, ACTIVATION, OUTPUT)


@dataclass(frozen=True)
class NodeInfo:
    """One node of the graph; `order` is its position in topological order."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    namespace: str
    order: int
    attributes: Mapping[str, object] = field(default_factory=dict, compare=False)


def namespace_of(node_name: str) -> str:
    """`/encoder/layer.0/attn/MatMul` belongs to `encoder/layer.0/attn`; a name without `/` to the root ``""``."""
    parts = [p for p in node_name.split("/") if p]
    return "/".join(parts[:-1])


def node_display_name(node: onnx.NodeProto, index: int) -> str:
    """A node's name, or a stable stand-in for an unnamed node."""
    return node.name or f"{node.op_type}_{index}"


def producers_and_consumers(graph: onnx.GraphProto) -> tuple[dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]]:
    """Tensor name -> the node that writes it, and -> the nodes that read it (in graph order)."""
    producer: dict[str, onnx.NodeProto] = {}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.output:
            if name:
                producer[name] = node
        for name in node.input:
            if name:
                consumers[name].append(node)
    return producer, consumers


class ModelGraph:
    """Nodes and tensors of an ONNX model (after shape inference), in topological order."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        initializers = {init.name: init for init in graph.initializer}
        value_info = {vi.name: vi for vi in (*graph.input, *graph.value_info, *graph.output)}
        graph_inputs = [i.name for i in graph.input if i.name not in initializers]
        graph_outputs = [o.name for o in graph.output]

        producers: dict[str, str] = {}
        consumers: dict[str, list[str]] = defaultdict(list)
        raw_nodes = []
        for index, node in enumerate(graph.node):
            name = node_display_name(node, index)
            raw_nodes.append((name, node))
            for out in node.output:
                if out:
                    producers[out] = name
            for inp in node.input:
                if inp:
                    consumers[inp].append(name)

        self.nodes: dict[str, NodeInfo] = {}
        for order, (name, node) in enumerate(_topological(raw_nodes, producers)):
            self.nodes[name] = NodeInfo(
                name=name,
                op_type=node.op_type,
                inputs=tuple(node.input),
                outputs=tuple(node.output),
                namespace=namespace_of(name),
                order=order,
                attributes=_simple_attributes(node),
            )

        self.inputs = tuple(graph_inputs)
        self.outputs = tuple(graph_outputs)
        self.tensors: dict[str, TensorInfo] = {}
        names = list(graph_inputs) + [o for n in self.nodes.values() for o in n.outputs if o]
        names += [name for name in initializers if name in consumers]
        for name in dict.fromkeys(names):
            if name in initializers:
                init = initializers[name]
                shape: tuple | None = tuple(init.dims)
                dtype = _dtype_name(init.data_type)
                kind = self._initializer_kind(name, init.data_type, consumers.get(name, []))
            else:
                shape, dtype = _shape_and_type(value_info.get(name))
                kind = INPUT if name in graph_inputs else OUTPUT if name in graph_outputs else ACTIVATION
            self.tensors[name] = TensorInfo(
                name=name,
                kind=kind,
                shape=shape,
                dtype=dtype,
                producer=producers.get(name),
                consumers=tuple(consumers.get(name, ())),
            )

    def _initializer_kind(self, name, data_type, consumer_names) -> str:
        if data_type not in _FLOAT_TYPES:
            return CONSTANT
        for consumer in consumer_names:
            node = self.nodes[consumer]
            position = _BIAS_INPUTS.get(node.op_type)
            if position is not None and len(node.inputs) > position and node.inputs[position] == name:
                return BIAS
        return WEIGHT

    # ---- queries -------------------------------------------------------------------------------------
    def activations(self) -> list[str]:
        """Float activation tensors (graph inputs, intermediates, outputs) in topological order."""
        return [t.name for t in self.tensors.values() if t.is_activation and t.quantizable]

    def weights(self) -> list[str]:
        return [t.name for t in self.tensors.values() if t.kind == WEIGHT]

    def namespaces(self) -> dict[str, list[str]]:
        """Namespace -> node names, for every namespace and each of its ancestors."""
        groups: dict[str, list[str]] = defaultdict(list)
        for node in self.nodes.values():
            parts = node.namespace.split("/") if node.namespace else []
            for depth in range(len(parts) + 1):
                groups["/".join(parts[:depth])].append(node.name)
        return dict(groups)

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called `name`; an unknown name is an error that suggests close matches."""
        try:
            return self.tensors[name]
        except KeyError:
            raise MpstudioError(unknown_name_message("tensor", name, self.tensors)) from None

    def node(self, name: str) -> NodeInfo:
        try:
            return self.nodes[name]
        except KeyError:
            raise MpstudioError(unknown_name_message("node", name, self.nodes)) from None

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return f"ModelGraph({len(self.nodes)} nodes, {len(self.tensors)} tensors)"


def unknown_name_message(what: str, name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown {what} {name!r}: the model has no {what} of that name{hint}"


def _topological(raw_nodes, producers):
    """Kahn's algorithm, stable with respect to file order (ONNX files are usually sorted already)."""
    index_of = {name: i for i, (name, _) in enumerate(raw_nodes)}
    deps: list[set[int]] = []
    users: dict[int, list[int]] = defaultdict(list)
    for i, (_, node) in enumerate(raw_nodes):
        d = {index_of[producers[x]] for x in node.input if x in producers} - {i}
        deps.append(d)
        for j in d:
            users[j].append(i)
    remaining = [len(d) for d in deps]
    ready = [i for i, r in enumerate(remaining) if r == 0]
    order = []
    heapq.heapify(ready)
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            remaining[u] -= 1
            if remaining[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(raw_nodes):
        raise MpstudioError("the model graph has a cycle; an ONNX graph must be acyclic")
    return [raw_nodes[i] for i in order]


def _simple_attributes(node: onnx.NodeProto) -> dict[str, object]:
    """Scalar and list attributes (graphs and tensors are left out)."""
    out: dict[str, object] = {}
    for attr in node.attribute:
        if attr.type in (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.STRING,
                         onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
            value = onnx.helper.get_attribute_value(attr)
            out[attr.name] = value.decode() if isinstance(value, bytes) else value
    return out


def _dtype_name(data_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(data_type).name
    except Exception:
        return TensorProto.DataType.Name(data_type).lower()


def _shape_and_type(vi):
    if vi is None or not vi.type.HasField("tensor_type"):
        return None, "unknown"
    tt = vi.type.tensor_type
    dtype = _dtype_name(tt.elem_type) if tt.elem_type else "unknown"
    if not tt.HasField("shape"):
        return None, dtype
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return dims, dtype
