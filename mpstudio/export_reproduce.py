"""What an export needs so that the plan comes out the same in the user's own tools.

Two things keep an exported plan from reproducing the study's numbers unless the user is told: ORT's quantizer
calibrates activations on its own unless their parameters are pinned in the overrides, and the HTP requantizes
the uint8 per-tensor weights it cannot multiply by as they are (`runtime.htp_weight_grid`), which the study's CPU
numerics take into account and ORT's CPU run of the plain QDQ model does not (nor the HTP's rounding of float
graph inputs, `runtime.htp_input_rounding`, nor how it rounds a Conv's or Gemm's accumulator,
`runtime.htp_accumulator_rounding`). This module writes the model with the HTP's weights (and roundings) beside the
plain one and the notes (`<name>.README.md`) saying which file holds what and what to pass for each to reproduce
the study.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx

from . import qdq
from .errors import MpstudioError

from .plan import PrecisionPlan
from .quantize import QUANT_TYPES
from . import runtime
from .runtime import htp_accumulator_rounding, htp_input_rounding, htp_weight_grid

# The CPU session settings of the study's numerics (runtime.DEFAULT_CPU_NUMERICS, "fake-quant"): quantization
# simulated in float as the graph writes it, without ORT's QDQ fusions or the NCHWc kernels.
CPU_SESSION_CONFIG = {"session.disable_quant_qdq": "1"}
CPU_DISABLED_OPTIMIZERS = ("NchwcTransformer",)
_GRID_MARK = "_htp_grid_"


@dataclass(frozen=True)
class HtpWeights:
    """The QDQ model with the weights the HTP computes with, and the float names of the weights it requantizes."""

    model: bytes
    weights: tuple[str, ...]


def htp_weights(qdq_path: str | os.PathLike) -> HtpWeights | None:
    """`qdq_path` with each uint8 per-tensor weight the HTP requantizes on its grid, and its float graph inputs
    rounded as the HTP rounds them (`runtime.htp_input_rounding`) and its Convs' and Gemms' accumulators rounded
    and 8-bit ones (and Adds) requantized as the HTP does (`runtime.htp_accumulator_rounding`), as the study's CPU
    numerics run it; None when the
    HTP takes every weight as the model stores it."""
    grid = htp_weight_grid(str(qdq_path))
    if not isinstance(grid, bytes):
        return None
    proto = onnx.load_from_string(grid)  # read once: for the names, then rounded in place
    names = sorted({init.name.split(_GRID_MARK)[0].removesuffix("_quantized") for init in proto.graph.initializer
                    if _GRID_MARK in init.name and not init.name.endswith(("_scale", "_zero_point"))})
    rounded = htp_input_rounding(proto)
    accumulated = htp_accumulator_rounding(proto, requantize=runtime.FOLLOW_HTP_REQUANTIZATION)
    return HtpWeights(grid if rounded is None and accumulated is None else proto.SerializeToString(), tuple(names))


def reproduction_notes(plan: PrecisionPlan, stem: str, files: dict[str, Path], *, pinned: bool,
                       weights: HtpWeights | None, encodings_gaps: list[str] = ()) -> list[str]:
    """What each written file reproduces and what the user must pass for it, one paragraph per note."""
    notes = []
    if "overrides" in files:
        arguments = (f"activation_type=QuantType.{_quant_type(plan.activation_type)}, "
                     f"weight_type=QuantType.{_quant_type(plan.weight_type)}, per_channel={plan.per_channel}, "
                     f"weight_symmetric={plan.weight_symmetric}")
        if pinned:
            notes.append(
                f"{stem}.overrides.json pins every activation's scale and zero point: ORT's get_qnn_qdq_config("
                f"{stem}.float.onnx, reader, {arguments}, init_overrides=<the file, loaded as docs/export.md shows>) "
                f"and quantize() give the QDQ model the study evaluated, whatever calibration data the reader "
                f"yields.")
        else:
            notes.append(
                f"{stem}.overrides.json does NOT pin activation parameters: get_qnn_qdq_config + quantize calibrate "
                f"every activation on your data, and the result differs from the study's model. To reproduce it, "
                f"export with pinned parameters (the default), or call quantize_static with "
                f"calibration_cache_path=<mpstudio's range file, Quantizer.calibrate(plan=plan).path> and {arguments}.")
    if "encodings" in files:
        notes.append(f"{stem}.encodings.json has every quantized tensor's encoding with the QDQ model's values. "
                     f"AIMET loads it with load_encodings_to_sim(sim, path, strict=True) into a QuantizationSimModel "
                     f"of {stem}.float.onnx once the sim's quantizers have the plan's widths and weight settings: "
                     f"mpstudio.export_aimet.configure_aimet_sim(sim, path) sets them. What the format cannot carry: "
                     + ("; ".join(encodings_gaps) if encodings_gaps else "nothing in this plan") + ".")
    if "model" in files:
        if weights is None:
            notes.append(f"{stem}.qdq.onnx is the model the study scored; the HTP takes its weights as stored. The "
                         f"study's CPU numerics round its float inputs as the HTP does "
                         f"(mpstudio.runtime.htp_input_rounding) and round Convs' and Gemms' accumulators and "
                         f"requantize 8-bit Convs, Gemms and Adds as the HTP does "
                         f"(mpstudio.runtime.htp_accumulator_rounding, requantize=True), which ORT's CPU EP does not "
                         f"by itself.")
        else:
            shown = ", ".join(weights.weights[:5]) + (", ..." if len(weights.weights) > 5 else "")
            notes.append(
                f"{stem}.qdq.onnx is ORT's quantizer output (what the overrides reproduce and the encodings "
                f"describe): give it to the HTP, which requantizes {len(weights.weights)} of its uint8 per-tensor "
                f"weights ({shown}) per channel itself. {stem}.htp.qdq.onnx holds the weights the HTP computes "
                f"with (int8 per channel) and rounds its float inputs and accumulators as the HTP does: ONNX "
                f"Runtime's CPU EP on "
                f"it, with session config "
                f"{CPU_SESSION_CONFIG} and disabled_optimizers={list(CPU_DISABLED_OPTIMIZERS)}, gives the study's "
                f"numbers; on {stem}.qdq.onnx it does not. mpstudio.runtime.htp_weight_grid, "
                f"mpstudio.runtime.htp_input_rounding and mpstudio.runtime.htp_accumulator_rounding (requantize=True) "
                f"make one from "
                f"the other.")
    return notes


def readme_text(plan: PrecisionPlan, notes: list[str]) -> str:
    """The `<name>.README.md` of an export: the plan and the notes."""
    lines = [f"# {plan.name or plan.hash}", "", plan.summary(), ""]
    for note in notes:
        lines += [f"- {note}", ""]
    return "\n".join(lines)


def _quant_type(dtype: str) -> str:
    return QUANT_TYPES[dtype].name


# ---- writing files whole or not at all -------------------------------------------------------------------------
def temporary_beside(path: Path) -> Path:
    # A fresh name, not a mkstemp file: the final file gets the usual permissions (mkstemp's are 0600).
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def write_bytes(path: Path, data: bytes) -> None:
    tmp = temporary_beside(path)
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def copy_atomic(source: Path, destination: Path) -> None:
    tmp = temporary_beside(destination)
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, destination)
    finally:
        tmp.unlink(missing_ok=True)


# ---- the context binary ----------------------------------------------------------------------------------------
def build_context(agent, model: Path, destination: Path, provider_options) -> None:
    """Compile `model` on `agent` and write the EPContext model it sends back to `destination`, checked."""
    context = agent.build_context(model, provider_options)
    tmp = temporary_beside(destination)
    try:
        agent.download(context.model_id, tmp)
        check_context_model(tmp)
        os.replace(tmp, destination)
    finally:
        tmp.unlink(missing_ok=True)


def check_context_model(path: str | os.PathLike) -> None:
    """Raise unless `path` is an ONNX model made of EPContext nodes with an embedded QNN context binary."""
    model = qdq.load(path)
    nodes = list(model.graph.node)
    contexts = [n for n in nodes if n.op_type == "EPContext"]
    if not contexts:
        raise MpstudioError(f"{path} has no EPContext node: it is not a context-binary model")
    for node in contexts:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("embed_mode", 1) != 1 or not attrs.get("ep_cache_context"):
            raise MpstudioError(f"EPContext node {node.name!r} of {path} does not embed its context binary")
