"""Isolation scores: the output metric when one tensor (or region) alone is promoted to 16 bits from the
all-8-bit plan, and when it alone stays at 8 bits in the all-16-bit plan.

Regenerating a QDQ model and opening a session per candidate costs about a second each. Instead, the
all-8-bit QDQ model is turned once into a *switchable* model (`build`): every activation QuantizeLinear/
DequantizeLinear pair becomes, for each node that reads the tensor, a Clip and two QuantizeLinear(uint16) ->
DequantizeLinear pairs (a convert rounds twice) whose range, scales and zero points are overridable inputs
(the all-8-bit values by default, `edges`); element-wise constants and Conv/Gemm biases are overridable the
same way. A configuration is resolved into those inputs as ORT would quantize the real plan (`plan_quant`):
`get_qnn_qdq_config` (through `quantize.qnn_config`) gives each tensor's produced type and its converts
(`quantize.resolution`); a tensor written with its input's parameters (Reshape, Transpose, Slice,
AveragePool ...) takes them as its input arrives at its producer; a convert uses the parameters ORT computes
from the tensor's own range (`quantize.ort_tensor_params`); a Relu/Clip that ORT folds into the op before it
in the all-8-bit model stays in the graph when a convert touches it, so the value also passes its input's
quantization; a bias is requantized to the scale its node's input arrives with; 16-bit constants take the
all-16-bit model's values. Runs reuse the all-8-bit activations up to the first node a configuration changes
(suffix models cut at a few points, `cuts`). `scoring` scores the configurations.

The switchable model computes as `float_qdq_session` runs a QDQ model on ONNX Runtime's CPU EP:
quantization simulated in float as the graph writes it, at the opset ORT gives plans with 16-bit types, with
fixed kernels; it matches that run of the regenerated model to within a 16-bit step. Of the HTP's arithmetic
those numerics follow, it takes the weight grid and the graph-input rounding as they do, the HTP's 8-bit
requantization of Conv/Gemm wherever a configuration leaves the node at 8 bits and its integer Add wherever the
operands and output share a width (`requantize`, as `runtime.FOLLOW_HTP_REQUANTIZATION` says); not the 16-bit
accumulator rounding.
A value that meets more than two quantizations on its way (only where a folded activation stays in the
graph) is rounded on the first coarsest grid and the finest before it; the others move it by less than a
16-bit step.
"""

from .cuts import CachedSamples
from .edges import ALL_8, Edge, EdgeQuant, Setting
from .plan_quant import PlanQuant, own_params, plan_ends
from .scoring import (ISOLATION_COLUMNS, TERM_SIDES, IsolationResult, OutputScorer, Region, float_references,
                      isolation_scores, tensor_regions, terms_frame)
from .switchable import SwitchableModel, float_qdq_session

__all__ = ["CachedSamples", "ALL_8", "Edge", "EdgeQuant", "Setting", "PlanQuant", "own_params", "plan_ends",
           "ISOLATION_COLUMNS", "TERM_SIDES", "IsolationResult", "OutputScorer", "Region", "float_references",
           "isolation_scores", "tensor_regions", "terms_frame", "SwitchableModel", "float_qdq_session"]
