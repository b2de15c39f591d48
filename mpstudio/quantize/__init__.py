"""Calibrate once per weight form, then regenerate a QNN-valid QDQ model for any precision plan from the cached ranges.

Activation ranges are calibrated with the weights already quantized, as the HTP runs them: ORT's calibrator runs
the float model, ORT quantizes the weights in the plan's weight form (type, per-channel, symmetry) from those
ranges, and the calibrator runs again on the float model carrying those weights. They are kept on disk per weight
form; each plan is then quantized by ORT's `get_qnn_qdq_config` (converts at 8/16-bit boundaries) and
`quantize_static` reading them, and `fuse_activations` leaves no Q/DQ between an op and the Relu/Clip HTP fuses
into it. Generated models are cached by plan hash.

Rooms: `calibrate` (ranges), `concat_ranges` (Concats whose joined scale squeezes an input), `overrides` and
`config` (the plan as ORT's configuration), `resolution` (which type each node reads a tensor in, as ORT resolves
it), `tensor_params` (ORT's own parameters per tensor), `fusion` (the post-pass), `ort_patch` (ORT's quantizer
one run at a time, sped up), `versions` (cache keys' tool versions), `quantizer` (the Quantizer) and `plain` (ORT's
own path, the baseline).
"""

from .calibrate import CALIBRATION_METHODS, CalibrationCache, weight_form, with_quantized_weights
from .config import qnn_config, quantize_kwargs
from .fusion import fuse_activations
from .ort_patch import PATCHED_ORT_VERSIONS, fast_ort_quantizer, ort_patch_applies, ort_quantizer_turn
from .overrides import default_per_channel, init_overrides, pin_overrides, weight_axis
from .plain import quantize_plain
from .quantizer import Quantizer
from ..folding import FOLDED_ACTIVATIONS, folded_activation_input
from .resolution import ELEMENTWISE, QUANT_TYPES, SIXTEEN_BIT, ResolvedTypes
from .tensor_params import TensorParams, ort_tensor_params
from .versions import GENERATOR_VERSION, toolchain, toolchain_key

__all__ = [
    "CALIBRATION_METHODS", "CalibrationCache", "weight_form", "with_quantized_weights", "qnn_config",
    "quantize_kwargs", "fuse_activations", "PATCHED_ORT_VERSIONS", "fast_ort_quantizer", "ort_patch_applies",
    "ort_quantizer_turn", "default_per_channel", "init_overrides", "pin_overrides", "weight_axis",
    "quantize_plain", "Quantizer", "ELEMENTWISE", "FOLDED_ACTIVATIONS", "QUANT_TYPES", "SIXTEEN_BIT",
    "ResolvedTypes", "folded_activation_input", "TensorParams", "ort_tensor_params", "GENERATOR_VERSION",
    "toolchain", "toolchain_key",
]
