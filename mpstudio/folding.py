"""The Relu/Clip that ORT's QDQ quantizer folds into the op before it: one rule, read from either side (the
activation that a tensor's producer absorbs, or the tensor an activation's output is folded onto)."""

from __future__ import annotations

from .graph import ACTIVATION, ModelGraph

FOLDED_ACTIVATIONS = ("Relu", "Clip")
# Ops HTP fuses a following Relu/Clip into (AIMET's supergroups): no quantizer belongs between them, and the
# generated models drop the activation there (quantize.fusion).
FUSING_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"})


def folded_activation(graph: ModelGraph, tensor: str):
    """The Relu/Clip node that reads `tensor` as its only consumer (ORT folds it into `tensor`'s producer when
    they share their quantization), or None."""
    info = graph.tensors.get(tensor)
    if info is None or len(info.consumers) != 1:
        return None
    node = graph.nodes[info.consumers[0]]
    return node if node.op_type in FOLDED_ACTIVATIONS else None


def folded_activation_input(graph: ModelGraph, tensor: str) -> str | None:
    """The input of the Relu/Clip that produces `tensor`, when ORT folds that activation into its producer.

    ORT removes such an activation only when its input and output share their quantization, so an override
    on the output alone would leave the producer's output at the default type behind a convert: the
    promotion would change almost nothing. The override has to cover both.
    """
    producer = graph.tensors[tensor].producer
    node = graph.nodes.get(producer) if producer else None
    if node is None or node.op_type not in FOLDED_ACTIVATIONS or not node.inputs:
        return None
    upstream = graph.tensors.get(node.inputs[0])
    if upstream is None or upstream.kind != ACTIVATION or len(upstream.consumers) != 1:
        return None
    return upstream.name
