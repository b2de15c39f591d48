"""A configuration resolved as ORT would quantize the real plan: the quantizations each edge passes, from the
plan's resolved types (`quantize.resolution`) and ORT's own parameters per tensor; and the two plans
isolation switches between."""

from __future__ import annotations

from typing import Mapping

from ...plan import PrecisionPlan
from ...qdq import Encoding
from ...quantize import CALIBRATION_METHODS, TensorParams, ort_tensor_params, qnn_config
from ...quantize.resolution import ResolvedTypes, activation_bits
from .edges import GRAPH_OUTPUT, EdgeQuant


class PlanQuant:
    """How one plan quantizes each edge of a switchable model (see the package docstring).

    `own`: (kind "written"/"convert", bits) -> tensor -> ORT's parameters from the tensor's own range;
    `shared` and `folded`: what the all-8-bit model shows of ORT's choices (`build.structure`); `overrides`:
    the plan's resolved TensorQuantOverrides, with `default` the plan's activation type.
    """

    def __init__(self, own: Mapping, shared: Mapping[str, tuple[str, str]], folded: Mapping[str, tuple[str, str]],
                 overrides: Mapping, default):
        self._own_tables, self._shared, self._folded = own, shared, folded
        self.types = ResolvedTypes(dict(overrides), default)
        self._written: dict[str, Encoding] = {}

    def own(self, tensor: str, quant_type, kind: str = "written") -> Encoding:
        return self._own_tables[kind, activation_bits(quant_type)][tensor]

    def written(self, tensor: str) -> Encoding:
        """The parameters `tensor`'s producer writes it with."""
        known = self._written.get(tensor)
        if known is None:
            shared = self._shared.get(tensor)
            if shared is not None:
                known = self.received(*shared)[-1]
            else:
                known = self.own(tensor, self.types.produced(tensor))
            self._written[tensor] = known
        return known

    def received(self, tensor: str, node: str) -> list[Encoding]:
        """The quantizations `tensor` passes on its way to `node`, in order."""
        steps = [self.written(tensor)]
        convert = self.types.converted(tensor, node) if node != GRAPH_OUTPUT else None
        if convert is not None:
            steps.append(self.own(tensor, convert, "convert"))
        return steps

    def edge(self, tensor: str, node: str) -> EdgeQuant:
        steps = self.received(tensor, node)
        folded = self._folded.get(tensor)
        # When the Relu/Clip ORT folded stays in the graph, the value also passes the input's quantization
        # before the activation.
        if folded is not None and self.types.keeps_folded_activation(folded[0], tensor):
            steps = self.received(*folded) + steps
        return EdgeQuant.of(steps)


def plan_ends(plan: PrecisionPlan | None = None) -> tuple[PrecisionPlan, PrecisionPlan]:
    """The all-8-bit and all-16-bit activation plans with `plan`'s weights (its default weight type,
    granularity and symmetry; its overrides left out): the two models isolation switches between. For None
    or any per-tensor uint8 plan, a8w8 and a16w8 themselves."""
    plan = plan or PrecisionPlan.a8w8()
    weights = dict(weight_type=plan.weight_type, per_channel=plan.per_channel, weight_symmetric=plan.weight_symmetric)
    return (PrecisionPlan(activation_type="uint8", name="a8w8", **weights),
            PrecisionPlan(activation_type="uint16", name="a16w8", **weights))


def own_params(quantizer, plan: PrecisionPlan | None = None) -> TensorParams:
    """The parameters ORT computes for every tensor of `quantizer`'s model from its own range, for the
    activations of `plan_ends(plan)` (the ranges are calibrated with that plan's weights)."""
    end_8, end_16 = plan_ends(plan)
    cache = quantizer.calibrate(plan=end_8)
    method = CALIBRATION_METHODS[quantizer.method]
    model, graph = quantizer.prepared.model, quantizer.graph
    config_8 = qnn_config(model, graph, end_8, method)
    config_16 = qnn_config(model, graph, end_16, method)

    def table(config, range_only):
        return ort_tensor_params(model, cache.path, config, range_only)

    return TensorParams(written_8=table(config_8, False), written_16=table(config_16, False),
                        convert_8=table(config_8, True), convert_16=table(config_16, True))
