"""The exported encodings in AIMET's hands: a QuantizationSimModel set up to agree with the file, so that
`load_encodings_to_sim(sim, path, strict=True)` (AIMET's default) loads it, and what the format cannot carry.

aimet-onnx is never imported here: `configure_aimet_sim` works on the sim the caller built (the optional extra
`mpstudio[aimet]` installs aimet-onnx). AIMET's strict check compares each quantizer's settings (enabled,
bit width, symmetry, per-channel) with the file's; a sim built with one `param_type`/`activation_type` and a
hardware config (e.g. "htp_v75") has per-channel symmetric weights, one activation width and no bias
quantizers, so a plan with 16-bit tensors or uint8 per-tensor weights needs those quantizers set as the plan has
them before loading, as AIMET's own mixed-precision flow does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from . import encodings as encodings_format
from . import qdq


def configure_aimet_sim(sim: Any, encodings: str | os.PathLike | Mapping) -> list[str]:
    """Set the quantizers of `sim` (an aimet_onnx QuantizationSimModel of the exported float model) to the
    bit width, per-tensor or per-channel granularity and symmetry of each entry of `encodings` (either version);
    returns the names the sim has no quantizer for (AIMET's strict loading refuses those).

    Quantizers the file does not mention are disabled: the tensors the exported model leaves unquantized, which
    a sim built from a hardware config quantizes anyway (an op's output before the Relu/Clip ORT and HTP fuse
    into it, AIMET's copies of a Clip's constant bounds). Loading disables them too, and its strict check
    refuses a quantizer it has to disable; disabled first, the sim computes what the exported model does."""
    parsed = encodings_format.load(encodings)
    for name, quantizer in sim.qc_quantize_op_dict.items():
        if name not in parsed.entries and quantizer.enabled:
            quantizer.enabled = False
    missing = []
    for name, entry in parsed.entries.items():
        quantizer = sim.qc_quantize_op_dict.get(name)
        if quantizer is None or entry.encoding is None:
            missing.append(name)
            continue
        if not quantizer.enabled:
            quantizer.enabled = True  # e.g. a Flatten's output: AIMET leaves data movement alone, ORT quantizes it
        if quantizer.bitwidth != entry.encoding.bits:
            quantizer.set_bitwidth(entry.encoding.bits)
        if entry.kind == qdq.PARAM and bool(quantizer.quant_info.usePerChannelMode) != entry.per_channel:
            quantizer.enable_per_channel_quantization(entry.per_channel)
        # Signed types are symmetric. Activations too: AIMET makes an activation that a MatMul reads as its
        # second operand symmetric, as it makes weights; the plan's model quantizes it like any activation.
        signed = entry.encoding.dtype.startswith("int")
        if quantizer.use_symmetric_encodings != signed:
            quantizer.use_symmetric_encodings = signed
    return missing


def encodings_for_sim(encodings: str | os.PathLike | Mapping, sim: Any) -> tuple[dict, list[str]]:
    """(the file's JSON without the entries `sim` has no quantizer for, their names). Strict loading refuses
    such names. AIMET gives a data movement op's output (Flatten, Reshape, ...) no quantizer of its own (it
    carries its input's encoding, where ORT's model quantizes it again with the same values); on larger graphs
    its sim leaves other tensors unquantized too (on the demo, the insides of a decomposed LayerNorm and of
    attention), and there its numbers differ from the plan's model: report the names to the user."""
    if isinstance(encodings, Mapping):
        raw = json.loads(json.dumps(encodings))
    else:
        raw = json.loads(Path(encodings).read_text())
    quantizers = sim.qc_quantize_op_dict
    left_out: list[str] = []
    for section in ("activation_encodings", "param_encodings"):
        entries = raw.get(section)
        if isinstance(entries, list):  # 1.0.0: a list of entries, each with its name
            left_out += [e["name"] for e in entries if e.get("name") not in quantizers]
            raw[section] = [e for e in entries if e.get("name") in quantizers]
        elif isinstance(entries, dict):  # the dict form: name -> entry
            left_out += [name for name in entries if name not in quantizers]
            raw[section] = {name: e for name, e in entries.items() if name in quantizers}
    return raw, left_out


_SHOWN_CONVERTS = 3


def encodings_cannot_carry(qdq_model, *, biases: bool) -> list[str]:
    """What the encodings of `qdq_model` leave out, one line each: converts (one encoding per tensor) and, when
    left out, the int32 biases."""
    tensors = qdq.quantized_tensors(qdq_model).values()
    lines = []
    converted = [(tensor, convert) for tensor in tensors for convert in tensor.converts]
    if converted:  # a mixed encoder has dozens: the count and a few, not a paragraph of them
        shown = ", ".join(f"{tensor.name} ({tensor.encoding.dtype} to {convert.dtype}: scale {convert.scale[0]:.6g}, "
                          f"zero point {convert.zero_point[0]})" for tensor, convert in converted[:_SHOWN_CONVERTS])
        more = f" and {len(converted) - _SHOWN_CONVERTS} more" if len(converted) > _SHOWN_CONVERTS else ""
        lines.append(f"{len(converted)} tensor(s) written at one width and converted to the other for some "
                     f"consumers, {shown}{more}: the file has each producer's encoding, QNN inserts its own "
                     "converts")
    if not biases:
        count = sum(1 for t in tensors if t.encoding.dtype == "int32")
        if count:
            lines.append(f"{count} int32 bias(es): left out, as AIMET's HTP configurations write them; QNN derives "
                         "each from its input and weight scales, as ORT did")
    return lines
