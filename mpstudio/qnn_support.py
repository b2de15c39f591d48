"""Static check of which nodes of an ONNX model the QNN execution provider can place on the HTP backend.

The operator table is transcribed from the ONNX Runtime QNN EP documentation, supported operators
(https://onnxruntime.ai/docs/execution-providers/QNN-ExecutionProvider.html#supported-onnx-operators);
the other rules come from that page's model requirements and from measurements of onnxruntime-qnn 2.7 on
the HTP backend. Nothing is run: the report is made before a session is created.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .graph import producers_and_consumers

FALLBACK = "fallback"  # the node would run on CPU, or session creation fails with CPU fallback disabled
WARNING = "warning"  # the node probably runs on HTP, but outside what the documentation promises
VERIFIED = "verified"  # outside what the documentation promises, but the HTP built it when probed (qnn_probe)

# Reason categories; a reason reads "<category>: <detail>" and `summarize` groups by category.
UNSUPPORTED_OP = "operator not supported by the QNN EP"
UNLISTED_OP = "operator missing from the documented list"
DYNAMIC_SHAPE = "dynamic shape"
UNSUPPORTED_TYPE = "data type QNN HTP lacks"
INT16_ACTIVATION = "signed int16 activation"
OP_CONSTRAINT = "operator constraint"


@dataclass(frozen=True)
class SupportedOp:
    """One row of the documented supported-operator list: domain, ONNX op type, the page's note."""

    domain: str  # "ai.onnx" or "com.microsoft", as the page writes it
    op_type: str
    notes: str = ""


SUPPORTED_OPERATORS: tuple[SupportedOp, ...] = (
    SupportedOp("ai.onnx", "Abs"),
    SupportedOp("ai.onnx", "Add"),
    SupportedOp("ai.onnx", "And"),
    SupportedOp("ai.onnx", "ArgMax"),
    SupportedOp("ai.onnx", "ArgMin"),
    SupportedOp("ai.onnx", "Asin"),
    SupportedOp("ai.onnx", "Atan"),
    SupportedOp("ai.onnx", "AveragePool"),
    SupportedOp("ai.onnx", "BatchNormalization", "fp16 supported since 1.18.0"),
    SupportedOp("ai.onnx", "Cast"),
    SupportedOp("ai.onnx", "Clip", "fp16 supported since 1.18.0"),
    SupportedOp("ai.onnx", "Concat"),
    SupportedOp("ai.onnx", "Conv", "3d supported since 1.18.0"),
    SupportedOp("ai.onnx", "ConvTranspose", "3d supported since 1.18.0"),
    SupportedOp("ai.onnx", "Cos"),
    SupportedOp("ai.onnx", "DepthToSpace"),
    SupportedOp("ai.onnx", "DequantizeLinear"),
    SupportedOp("ai.onnx", "Div"),
    SupportedOp("ai.onnx", "Elu"),
    SupportedOp("ai.onnx", "Equal"),
    SupportedOp("ai.onnx", "Exp"),
    SupportedOp("ai.onnx", "Expand"),
    SupportedOp("ai.onnx", "Flatten"),
    SupportedOp("ai.onnx", "Floor"),
    SupportedOp("ai.onnx", "Gather", "Only supports positive indices"),
    SupportedOp("ai.onnx", "Gelu"),
    SupportedOp("ai.onnx", "Gemm"),
    SupportedOp("ai.onnx", "GlobalAveragePool"),
    SupportedOp("ai.onnx", "Greater"),
    SupportedOp("ai.onnx", "GreaterOrEqual"),
    SupportedOp("ai.onnx", "GridSample"),
    SupportedOp("ai.onnx", "HardSwish"),
    SupportedOp("ai.onnx", "InstanceNormalization"),
    SupportedOp("ai.onnx", "LRN"),
    SupportedOp("ai.onnx", "LayerNormalization"),
    SupportedOp("ai.onnx", "LeakyRelu"),
    SupportedOp("ai.onnx", "Less"),
    SupportedOp("ai.onnx", "LessOrEqual"),
    SupportedOp("ai.onnx", "Log"),
    SupportedOp("ai.onnx", "LogSoftmax"),
    SupportedOp("ai.onnx", "LpNormalization", "p == 2"),
    SupportedOp(
        "ai.onnx", "MatMul",
        "Supported input data types on HTP backend: (uint8, uint8), (uint8, uint16), (uint16, uint8)",
    ),
    SupportedOp("ai.onnx", "Max"),
    SupportedOp("ai.onnx", "MaxPool"),
    SupportedOp("ai.onnx", "Min"),
    SupportedOp("ai.onnx", "Mul"),
    SupportedOp("ai.onnx", "Neg"),
    SupportedOp("ai.onnx", "Not"),
    SupportedOp("ai.onnx", "Or"),
    SupportedOp("ai.onnx", "PRelu", "fp16, int32 supported since 1.18.0"),  # the page spells it "Prelu"
    SupportedOp("ai.onnx", "Pad"),
    SupportedOp("ai.onnx", "Pow"),
    SupportedOp("ai.onnx", "QuantizeLinear"),
    SupportedOp("ai.onnx", "ReduceMax"),
    SupportedOp("ai.onnx", "ReduceMean"),
    SupportedOp("ai.onnx", "ReduceMin"),
    SupportedOp("ai.onnx", "ReduceProd"),
    SupportedOp("ai.onnx", "ReduceSum"),
    SupportedOp("ai.onnx", "Relu"),
    SupportedOp("ai.onnx", "Resize"),
    SupportedOp("ai.onnx", "Round"),
    SupportedOp("ai.onnx", "Sigmoid"),
    SupportedOp("ai.onnx", "Sign"),
    SupportedOp("ai.onnx", "Sin"),
    SupportedOp("ai.onnx", "Slice"),
    SupportedOp("ai.onnx", "Softmax"),
    SupportedOp("ai.onnx", "SpaceToDepth"),
    SupportedOp("ai.onnx", "Split"),
    SupportedOp("ai.onnx", "Sqrt"),
    SupportedOp("ai.onnx", "Squeeze"),
    SupportedOp("ai.onnx", "Sub"),
    SupportedOp("ai.onnx", "Tanh"),
    SupportedOp("ai.onnx", "Tile"),
    SupportedOp("ai.onnx", "TopK"),
    SupportedOp("ai.onnx", "Transpose"),
    SupportedOp("ai.onnx", "Unsqueeze"),
    SupportedOp("ai.onnx", "Where"),
    SupportedOp("com.microsoft", "DequantizeLinear", "Provides 16-bit integer dequantization support"),
    SupportedOp("com.microsoft", "Gelu"),
    SupportedOp("com.microsoft", "QuantizeLinear", "Provides 16-bit integer quantization support"),
)

# Standard-domain ops by bare op type; com.microsoft ops qualified as "com.microsoft:<op>".
SUPPORTED_OPS: frozenset[str] = frozenset(
    op.op_type if op.domain == "ai.onnx" else f"{op.domain}:{op.op_type}" for op in SUPPORTED_OPERATORS
)

# Standard ops absent from the documented list that onnxruntime-qnn 2.7 nevertheless assigned to QNN on
# HTP with CPU fallback disabled, for some types and shapes (GatherND on a bool tensor is rejected). The list
# is older than the EP, and calling these CPU fallbacks would make nearly every model (Reshape) look
# unsupported; they are warnings here, and `qnn_probe` settles each node on the HTP when it is available.
UNLISTED_ACCEPTED_OPS: frozenset[str] = frozenset({
    "Ceil", "CumSum", "GatherElements", "GatherND", "GlobalMaxPool", "HardSigmoid", "Identity", "IsNaN",
    "LSTM", "Mish", "Reciprocal", "ReduceL2", "Reshape", "ScatterND", "Selu", "Softplus", "ThresholdedRelu",
})

_STANDARD_DOMAINS = ("", "ai.onnx")
_MS_DOMAIN = "com.microsoft"
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")

# The documentation names Loop and If as unsupported; Scan is the same kind of control flow.
_CONTROL_FLOW = ("Loop", "If", "Scan")

# Element types with no QNN HTP tensor type: ORT leaves nodes touching them on CPU (float64 measured).
_UNSUPPORTED_ELEM_TYPES = {
    TensorProto.DOUBLE: "float64",
    TensorProto.STRING: "string",
}

# The MatMul note's quantized input pairs, by the element types the inputs were dequantized from.
_MATMUL_TYPE_PAIRS = {(TensorProto.UINT8, TensorProto.UINT8), (TensorProto.UINT8, TensorProto.UINT16),
                      (TensorProto.UINT16, TensorProto.UINT8)}

# Past this many nodes with the same reason, `summarize` names a few and counts the rest.
_NODES_SHOWN = 3

_TYPE_NAMES = {TensorProto.UINT8: "uint8", TensorProto.INT8: "int8", TensorProto.UINT16: "uint16",
               TensorProto.INT16: "int16", TensorProto.INT32: "int32", TensorProto.UINT32: "uint32"}


@dataclass(frozen=True)
class SupportIssue:
    """Why one node would not run (or might not run) on the QNN HTP backend."""

    node: str
    op_type: str
    reason: str  # "<category>: <detail>"
    severity: str  # "fallback" (would run on CPU / be rejected with fallback disabled) or "warning"


def is_supported(op_type: str, domain: str = "") -> bool:
    """True if the documented list has `op_type` in `domain` ("" and "ai.onnx" are the standard domain)."""
    if domain in _STANDARD_DOMAINS:
        return op_type in SUPPORTED_OPS
    return f"{domain}:{op_type}" in SUPPORTED_OPS


def operator_notes(op_type: str, domain: str = "") -> str:
    """The documentation's note for a supported operator ("" when it has none or is not listed)."""
    domain = "ai.onnx" if domain in _STANDARD_DOMAINS else domain
    for op in SUPPORTED_OPERATORS:
        if op.domain == domain and op.op_type == op_type:
            return op.notes
    return ""


class _GraphFacts:
    """Types, shapes, constants and producers of a graph's tensors, as shape inference left them."""

    def __init__(self, graph: onnx.GraphProto):
        self.types: dict[str, onnx.TypeProto] = {}
        for vi in (*graph.input, *graph.value_info, *graph.output):
            self.types[vi.name] = vi.type
        self.constants: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        self._shape_problems: dict[str, str | None] = {}
        self.producer, self.consumers = producers_and_consumers(graph)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in _STANDARD_DOMAINS:
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None and node.output:
                    self.constants[node.output[0]] = value
        # Graph order is topological: resolving outputs in it keeps shape_problem's recursion shallow.
        for node in graph.node:
            for name in node.output:
                if name:
                    self.shape_problem(name)

    def elem_type(self, name: str) -> int | None:
        if name in self.constants:
            return self.constants[name].data_type
        t = self.types.get(name)
        if t is not None and t.HasField("tensor_type"):
            return t.tensor_type.elem_type
        return None

    def non_tensor_kind(self, name: str) -> str | None:
        t = self.types.get(name)
        if t is None or name in self.constants:
            return None
        kind = t.WhichOneof("value")
        return None if kind in (None, "tensor_type") else kind

    def shape_problem(self, name: str) -> str | None:
        """Why `name` has no static shape, or None when every dimension is known."""
        if name not in self._shape_problems:
            self._shape_problems[name] = self._find_shape_problem(name)
        return self._shape_problems[name]

    def _find_shape_problem(self, name: str) -> str | None:
        if name in self.constants:
            return None
        t = self.types.get(name)
        if t is None:
            producer = self.producer.get(name)
            if producer is not None and producer.domain not in _STANDARD_DOMAINS:
                # ONNX's shape inference does not know contrib ops (com.microsoft Q/DQ, Gelu) but ORT does:
                # their outputs are static when their inputs are.
                return next((p for p in map(self.shape_problem, filter(None, producer.input)) if p), None)
            return f"shape of {name!r} is unknown after shape inference"
        if not t.HasField("tensor_type"):
            return None  # reported as a type problem
        if not t.tensor_type.HasField("shape"):
            return f"rank of {name!r} is unknown"
        for i, dim in enumerate(t.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            if dim.HasField("dim_param"):
                return f"{name!r} has the symbolic dimension {dim.dim_param!r} at axis {i}"
            return f"{name!r} has an unknown dimension at axis {i}"
        return None

    def rank(self, name: str) -> int | None:
        if name in self.constants:
            return len(self.constants[name].dims)
        t = self.types.get(name)
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return None
        return len(t.tensor_type.shape.dim)

    def constant_array(self, name: str) -> np.ndarray | None:
        tensor = self.constants.get(name)
        if tensor is None or tensor.data_location == TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(tensor)

    def dequantized_from(self, name: str) -> tuple[int | None, bool] | None:
        """For a DequantizeLinear output: (quantized element type, whether its input is a constant)."""
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or not node.input:
            return None
        source = node.input[0]
        return self.elem_type(source), source in self.constants


def describe_node(node: onnx.NodeProto) -> str:
    """The node's name, or its op type and first output tensor when it has none."""
    if node.name:
        return node.name
    output = next((o for o in node.output if o), "")
    return f"{node.op_type} -> {output}" if output else f"{node.op_type} (no output)"


def check_qnn_support(model: onnx.ModelProto) -> list[SupportIssue]:
    """Issues that would keep nodes of `model` off the QNN HTP backend, in graph order.

    `model` should have had ONNX shape inference run: tensors without an inferred shape are reported as
    dynamic. Subgraphs (Loop/If bodies) are not inspected; their parent node is already reported.
    """
    facts = _GraphFacts(model.graph)
    issues: list[SupportIssue] = []
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in _STANDARD_DOMAINS:
            continue  # folded into an initializer before partitioning
        found = _check_node(node, facts)
        name = describe_node(node)
        issues.extend(SupportIssue(name, node.op_type, reason, severity) for reason, severity in found)
    return issues


def _check_node(node: onnx.NodeProto, facts: _GraphFacts) -> list[tuple[str, str]]:
    domain = node.domain
    op = node.op_type
    if domain in _STANDARD_DOMAINS:
        if op in _CONTROL_FLOW:
            # The documentation: "Loops and Ifs are not supported".
            return [(f"{UNSUPPORTED_OP}: {op} is control flow, which QNN does not support", FALLBACK)]
        if op not in SUPPORTED_OPS and op not in UNLISTED_ACCEPTED_OPS:
            return [(f"{UNSUPPORTED_OP}: {op} is not in the supported-operator list", FALLBACK)]
    elif not is_supported(op, domain):
        return [(f"{UNSUPPORTED_OP}: {domain}:{op} is a custom-domain operator outside the supported list",
                 FALLBACK)]

    found: list[tuple[str, str]] = []
    if domain in _STANDARD_DOMAINS and op in UNLISTED_ACCEPTED_OPS:
        found.append((f"{UNLISTED_OP}: {op} is not in the documented list; the QNN EP has a builder for it, "
                      "but whether the HTP takes it depends on its types and shapes", WARNING))

    tensors = [t for t in (*node.input, *node.output) if t]

    # Data types: float64 and string tensors have no HTP representation; sequences/maps neither.
    for name in tensors:
        elem = facts.elem_type(name)
        if elem in _UNSUPPORTED_ELEM_TYPES:
            found.append((f"{UNSUPPORTED_TYPE}: {name!r} is {_UNSUPPORTED_ELEM_TYPES[elem]}", FALLBACK))
            break
        kind = facts.non_tensor_kind(name)
        if kind is not None:
            found.append((f"{UNSUPPORTED_TYPE}: {name!r} is a {kind.removesuffix('_type')}, not a tensor",
                          FALLBACK))
            break

    # The documentation: "QNN EP does not support models with dynamic shapes".
    for name in tensors:
        problem = facts.shape_problem(name)
        if problem is not None:
            found.append((f"{DYNAMIC_SHAPE}: {problem}; fix it to a static value", FALLBACK))
            break

    if op not in _QDQ_OPS:
        found.extend(_int16_activations(node, facts))
    found.extend(_op_constraints(node, facts))
    return found


def _int16_activations(node: onnx.NodeProto, facts: _GraphFacts) -> list[tuple[str, str]]:
    # Measured: the HTP backend rejects compute nodes on signed int16 activations (uint16 works).
    # Weights (constant DequantizeLinear inputs) are not activations and are left alone.
    for name in node.input:
        source = facts.dequantized_from(name) if name else None
        if source is not None and source[0] == TensorProto.INT16 and not source[1]:
            return [(f"{INT16_ACTIVATION}: input {name!r} is dequantized from int16; use uint16 activations",
                     FALLBACK)]
    for name in node.output:
        for consumer in facts.consumers.get(name, ()):
            if consumer.op_type == "QuantizeLinear" and consumer.output and \
                    facts.elem_type(consumer.output[0]) == TensorProto.INT16:
                return [(f"{INT16_ACTIVATION}: output {name!r} is quantized to int16; use uint16 activations",
                         FALLBACK)]
    return []


def _attribute(node: onnx.NodeProto, name: str, default):
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _op_constraints(node: onnx.NodeProto, facts: _GraphFacts) -> list[tuple[str, str]]:
    if node.domain not in _STANDARD_DOMAINS:
        return []
    op = node.op_type
    found: list[tuple[str, str]] = []
    if op == "LpNormalization":
        # Note "p == 2"; measured: p=1 is left to CPU.
        p = _attribute(node, "p", 2)
        if p != 2:
            found.append((f"{OP_CONSTRAINT}: LpNormalization supports only p == 2, this node has p={p}",
                          FALLBACK))
    elif op in ("Conv", "ConvTranspose") and node.input:
        # Note "3d supported": 1-D to 3-D convolutions, i.e. input rank 3 to 5.
        rank = facts.rank(node.input[0])
        if rank is not None and rank > 5:
            found.append((f"{OP_CONSTRAINT}: {op} on a rank-{rank} input ({rank - 2}-D); "
                          "QNN supports up to 3-D", FALLBACK))
    elif op == "Gather" and len(node.input) > 1:
        # Note "Only supports positive indices". Measured: constant negative indices still ran on HTP
        # (the EP can rewrite them), so this is a warning; runtime indices cannot be checked here.
        indices = facts.constant_array(node.input[1])
        if indices is not None and indices.size and int(indices.min()) < 0:
            found.append((f"{OP_CONSTRAINT}: Gather indices {node.input[1]!r} contain negative values; "
                          "the QNN EP documents only positive indices", WARNING))
    elif op == "MatMul" and len(node.input) == 2:
        # Note lists the HTP input pairs. Measured: other pairs such as (uint16, uint16) and
        # (uint8, int8) were still accepted (the EP converts), so this is a warning.
        sources = [facts.dequantized_from(name) for name in node.input]
        if all(s is not None and s[0] is not None for s in sources):
            pair = (sources[0][0], sources[1][0])
            if pair not in _MATMUL_TYPE_PAIRS:
                names = ", ".join(_TYPE_NAMES.get(t, str(t)) for t in pair)
                found.append((f"{OP_CONSTRAINT}: MatMul on quantized inputs ({names}); the documented HTP "
                              "pairs are (uint8, uint8), (uint8, uint16), (uint16, uint8)", WARNING))
    return found


def _category(reason: str) -> str:
    return reason.split(": ", 1)[0]


def summarize(issues: list[SupportIssue]) -> str:
    """A human-readable report of `issues`, fallbacks first, grouped by reason category."""
    if not issues:
        return "QNN HTP support: no issues found; every node is expected to run on the HTP backend."
    fallback_nodes = {i.node for i in issues if i.severity == FALLBACK}
    warning_nodes = {i.node for i in issues if i.severity == WARNING} - fallback_nodes
    verified_nodes = {i.node for i in issues if i.severity == VERIFIED} - fallback_nodes - warning_nodes
    lines = [
        f"QNN HTP support: {len(fallback_nodes)} node(s) would fall back to CPU, "
        f"{len(warning_nodes)} more with warnings"
        + (f", {len(verified_nodes)} outside the documented list but built by the HTP when probed." if verified_nodes
           else ".")
    ]
    groups: dict[tuple[str, str], list[SupportIssue]] = defaultdict(list)
    for issue in issues:
        groups[(issue.severity, _category(issue.reason))].append(issue)
    rank = {FALLBACK: 0, WARNING: 1, VERIFIED: 2}
    order = sorted(groups, key=lambda key: (rank.get(key[0], 1), -len(groups[key]), key[1]))
    for severity, category in order:
        members = groups[(severity, category)]
        lines.append(f"{severity} - {category} ({len(members)}):")
        by_detail: dict[tuple[str, str], list[str]] = defaultdict(list)
        for issue in members:
            detail = issue.reason.split(": ", 1)[1] if ": " in issue.reason else issue.reason
            by_detail[(issue.op_type, detail)].append(issue.node)
        for (op_type, detail), nodes in by_detail.items():
            if len(nodes) <= _NODES_SHOWN:
                lines.extend(f"  {node} [{op_type}]: {detail}" for node in nodes)
            else:
                shown = ", ".join(nodes[:_NODES_SHOWN])
                lines.append(f"  {len(nodes)} {op_type} nodes ({shown}, ...): {detail}")
    return "\n".join(lines)
