"""Which ops of a QDQ model the HTP runs as quantized node units, and which it computes in float.

ONNX Runtime's QNN EP hands QNN a DequantizeLinear -> op -> QuantizeLinear group as one quantized op only when the
group's activation types agree: the op's (first) activation input and its output have the same quantized type,
and an elementwise or joining op's activation inputs all share it (its node-group selectors); and, for a
normalization, when its bias too comes from a DequantizeLinear. A group that fails
is not quantized: the op computes in float on the HTP, and its DequantizeLinear and QuantizeLinear nodes run as
ops of their own. ORT's quantizer never writes such a group (it inserts a convert at each precision boundary); a
model written with one quantizer per tensor (AIMET's export) has one wherever an 8-bit op reads a 16-bit tensor.

`float_units` applies that rule to the model. Where the HTP's own answer is at hand (mpstudio.htp_build, which
reads the graph the HTP prepared), `built_units` takes it instead: it also sees groups the EP refuses for
reasons the rule does not cover (a LayerNormalization with a float bias, say).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Units:
    """ONNX node names: ops the HTP computes in float although the model quantizes them, and Q/DQ nodes it runs as
    ops of their own (priced as vector ops beside the float op)."""

    float_ops: frozenset[str] = frozenset()
    standalone: frozenset[str] = frozenset()
    source: str = "rule"  # "rule" (ORT's node-group selectors) or "htp" (the graph the HTP prepared)
    notes: tuple[str, ...] = field(default=(), compare=False)


# Normalizations whose node group wants every input from a DequantizeLinear: a float bias leaves it float. (Other
# ops the selectors treat alike are first rewritten by ORT's fusions, e.g. MatMul + float-bias Add into a Gemm
# that QNN quantizes, so the rule keeps to these; the HTP's own answer, `built_units`, sees the rest.)
_ALL_INPUTS_DQ = frozenset({"LayerNormalization", "InstanceNormalization"})


def _quantized(dtype: str) -> bool:
    return bool(dtype) and not dtype.startswith("float")


def _ungrouped(op) -> bool:
    """Whether ORT's QNN EP leaves this op of a quantized model ungrouped (so the HTP computes it in float)."""
    types = {o.dtype for o in op.activations + op.outputs if _quantized(o.dtype)}
    if len(types) > 1:
        return True
    return bool(types) and op.op_type in _ALL_INPUTS_DQ and any(
        o.role == "weight" and not _quantized(o.dtype) for o in op.inputs)


def float_units(qdq) -> Units:
    """The node units of `qdq` (an mpstudio.qdq.QdqModel) ORT's QNN EP does not group, because their quantized
    activation types differ or a float constant feeds an op whose group needs all its inputs dequantized: each
    op computes in float, its activations' DQ and its outputs' Q run on their own."""
    floats, standalone = set(), set()
    for op in qdq.ops:
        if not _ungrouped(op):
            continue
        floats.add(op.node.name)
        for operand in op.activations:
            producer = qdq.producer.get(operand.value)
            if producer is not None and producer.op_type == "DequantizeLinear" and _quantized(operand.dtype):
                standalone.add(producer.name or producer.output[0])
        for operand in op.outputs:
            standalone.update(c.name or c.output[0] for c in qdq.consumers.get(operand.value, ())
                              if c.op_type == "QuantizeLinear")
    return Units(frozenset(floats), frozenset(standalone))


def built_units(qdq, build) -> Units:
    """`build` (an mpstudio.htp_build.HtpBuild of the same model) as Units of `qdq`'s node names. ORT's graph
    optimizations rename some nodes they fuse ("<node>/MatMulAddFusion"): such a name counts for the node it
    starts with. An op the rule leaves float that the HTP's graph does not name (the EP left it to ORT's CPU EP)
    keeps the rule's answer."""
    nodes = {n.name: n for n in qdq.model.graph.node if n.name}
    io = {io.name for io in qdq.graph_io}

    def known(name: str) -> str | None:
        while name and name not in nodes:
            name = name.rpartition("/")[0]
        return name or None

    listed = {n for n in (known(b) for b in build.nodes) if n}
    rule = float_units(qdq)
    unlisted = rule.float_ops - listed
    floats = {n for n in (known(b) for b in build.float_nodes) if n} | unlisted
    standalone = {n for n in build.standalone if n in nodes and n not in io}
    standalone |= {n for n in rule.standalone if n not in listed and _beside(qdq, nodes.get(n), unlisted)}
    notes = (f"{len(unlisted)} op(s) the rule computes in float are not in the HTP's graph (left to ORT's CPU EP): "
             "priced by the rule",) if unlisted else ()
    return Units(frozenset(floats), frozenset(standalone), "htp", notes)


def _beside(qdq, node, ops: set[str]) -> bool:
    """Whether the Q/DQ `node` reads from or writes to one of `ops`."""
    if node is None:
        return False
    around = [qdq.producer.get(node.input[0])] + list(qdq.consumers.get(node.output[0], ()))
    return any(n is not None and n.name in ops for n in around)
