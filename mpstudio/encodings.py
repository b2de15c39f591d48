"""AIMET/QNN encodings files in both forms AIMET writes: 1.0.0 (the list form of aimet-onnx 2.x) and 0.6.1 (the
older dict form): written from and read into `qdq.Encoding`s, with every schema problem named by tensor and field.

Both forms say `x = (u + offset) * scale` with `u` the code read as an *unsigned* integer of `bw` bits, so
`offset = qmin - zero_point` in ONNX terms. In 1.0.0 `is_sym` is the signedness of the type (AIMET reads a true
`is_sym` as a signed type whose zero point is `-(offset + 2^(bw-1))`); in 0.6.1 `is_symmetric` is the string
"True" exactly when zero sits at the middle code.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import MpstudioError
from .qdq import ACTIVATION, INTEGER_TYPES, PARAM, Encoding

VERSIONS = ("1.0.0", "0.6.1")
# aimet-onnx 2.x writes and reads 1.0.0 by default and calls 0.6.1 deprecated; tools that predate 1.0.0
# read the dict form.
DEFAULT_VERSION = "1.0.0"
SECTIONS = {ACTIVATION: "activation_encodings", PARAM: "param_encodings"}
BITWIDTHS = (4, 8, 16, 32)
_DTYPES = {name for name, _, _ in INTEGER_TYPES.values()}
# Top-level keys AIMET writes beside the two sections; read and ignored.
_OPTIONAL_TOP = {"version", "excluded_layers", "quantizer_args", "producer"}
_LEGACY_KEYS = ("bitwidth", "dtype", "is_symmetric", "max", "min", "offset", "scale")
_V1_REQUIRED = ("name", "dtype", "bw", "enc_type")
_V1_INT_REQUIRED = ("is_sym", "scale", "offset")
_V1_KEYS = set(_V1_REQUIRED) | set(_V1_INT_REQUIRED) | {"block_size", "compressed_bw", "per_block_int_scale",
                                                        "zero_point_shift"}
_ENC_TYPES = ("PER_TENSOR", "PER_CHANNEL", "PER_BLOCK", "LPBQ")


@dataclass(frozen=True)
class FileEncoding:
    """One tensor's entry of an encodings file.

    `encoding` is None for a float entry (dtype "float"/"FLOAT": the tensor is left unquantized). Its `axis` is
    None: the files do not say along which axis a per-channel tensor is split (the model does), so `per_channel`
    says whether the entry is one encoding per channel.
    """

    name: str
    kind: str  # ACTIVATION or PARAM
    encoding: Encoding | None
    per_channel: bool = False
    float_bitwidth: int | None = None  # the bit width of a float entry

    @property
    def channels(self) -> int:
        return len(self.encoding.scale) if self.encoding is not None else 1


@dataclass(frozen=True)
class EncodingsFile:
    """An encodings file read and checked: its version and every entry by tensor name."""

    version: str
    entries: Mapping[str, FileEncoding]

    def of_kind(self, kind: str) -> dict[str, FileEncoding]:
        return {name: e for name, e in self.entries.items() if e.kind == kind}


# ---- writing ----------------------------------------------------------------------------------------------
def entry_0_6_1(encoding: Encoding) -> list[dict[str, Any]]:
    """The 0.6.1 (dict form) list of one tensor: one dict per tensor, or one per channel."""
    return encoding.to_qnn()


def entry_1_0_0(name: str, encoding: Encoding) -> dict[str, Any]:
    """The 1.0.0 entry of one tensor: `{name, dtype, enc_type, bw, is_sym, scale[], offset[]}`."""
    per_channel = encoding.per_channel or len(encoding.scale) > 1  # read from a file, the axis is the model's
    return {"name": name, "dtype": "INT", "enc_type": "PER_CHANNEL" if per_channel else "PER_TENSOR",
            "bw": encoding.bits, "is_sym": encoding.dtype.startswith("int"), "scale": list(encoding.scale),
            "offset": list(encoding.offsets)}


def write(tensors: Iterable[tuple[str, str, Encoding]], version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """The encodings JSON of `(name, kind, encoding)` triples in `version`, sections sorted by name."""
    check_version(version)
    ordered = sorted(tensors, key=lambda t: t[0])
    out: dict[str, Any] = {"version": version}
    for kind, section in SECTIONS.items():
        chosen = [(name, encoding) for name, k, encoding in ordered if k == kind]
        if version == "0.6.1":
            out[section] = {name: entry_0_6_1(encoding) for name, encoding in chosen}
        else:
            out[section] = [entry_1_0_0(name, encoding) for name, encoding in chosen]
    return out


def check_version(version: str) -> None:
    if version not in VERSIONS:
        raise MpstudioError(f"encodings version {version!r} is not one mpstudio writes; use {' or '.join(VERSIONS)}")


# ---- reading ----------------------------------------------------------------------------------------------
def read_json(source: str | os.PathLike | Mapping, what: str, parsed_name: str) -> tuple[Any, str]:
    """(the JSON of `source`, a path or JSON already parsed; the name errors give it). A missing file, invalid
    JSON or a binary file is an MpstudioError that says which and where."""
    if isinstance(source, Mapping):
        return source, parsed_name
    path = Path(source)
    if not path.is_file():
        raise MpstudioError(f"{what} file not found: {path}")
    try:
        return json.loads(path.read_text()), str(path)
    except json.JSONDecodeError as exc:
        raise MpstudioError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from exc
    except UnicodeDecodeError as exc:
        raise MpstudioError(f"{path} is not a text file: {exc.reason}") from exc


def load(source: str | os.PathLike | Mapping) -> EncodingsFile:
    """An encodings file (a path, or JSON already parsed) read in either version; MpstudioError lists every
    problem of the schema, naming the tensor and the field."""
    data, origin = read_json(source, "encodings", "the encodings")
    parsed, problems = parse(data)
    raise_if(problems, f"{origin} is not a valid AIMET/QNN encodings file")
    return parsed


def parse(data: Any) -> tuple[EncodingsFile, list[str]]:
    """`data` read as far as it goes: the entries that are valid, and a problem for each that is not (an entry
    with problems is left out; its name is still reported by `names`)."""
    if not isinstance(data, Mapping):
        return EncodingsFile("", {}), ["encodings must be a JSON object with 'activation_encodings' and "
                                      "'param_encodings'"]
    problems: list[str] = []
    version = _version(data, problems)
    missing = [s for s in SECTIONS.values() if s not in data]
    if missing:
        problems.append(f"missing section(s) {missing}: both must be present, even if empty")
    extra = sorted(set(data) - set(SECTIONS.values()) - _OPTIONAL_TOP)
    if extra:
        problems.append(f"unknown top-level key(s) {extra}; allowed: "
                        f"{', '.join(sorted(set(SECTIONS.values()) | _OPTIONAL_TOP))}")
    entries: dict[str, FileEncoding] = {}
    if version is None:
        return EncodingsFile("", entries), problems
    for kind, section in SECTIONS.items():
        if section not in data:
            continue
        for name, where, raw in _section_items(data[section], section, version, problems):
            if name in entries:
                problems.append(f"{where}: {name!r} appears twice (also in {SECTIONS[entries[name].kind]})")
                continue
            checked = _legacy_problems(where, raw) if version == "0.6.1" else _v1_problems(where, raw)
            if checked:
                problems += checked
                continue
            entries[name] = (_from_legacy if version == "0.6.1" else _from_v1)(name, kind, raw)
    return EncodingsFile(version, entries), problems


def names(data: Any) -> dict[str, list[str]]:
    """Section -> every tensor name it lists, valid entries or not (for coverage messages)."""
    out: dict[str, list[str]] = {section: [] for section in SECTIONS.values()}
    if not isinstance(data, Mapping):
        return out
    for section in SECTIONS.values():
        value = data.get(section)
        if isinstance(value, Mapping):
            out[section] = [str(name) for name in value]
        elif isinstance(value, list):
            out[section] = [str(e["name"]) for e in value if isinstance(e, Mapping) and isinstance(e.get("name"), str)]
    return out


def _version(data: Mapping, problems: list[str]) -> str | None:
    given = data.get("version")
    sections = [data.get(s) for s in SECTIONS.values() if s in data]
    lists = any(isinstance(s, list) for s in sections)
    dicts = any(isinstance(s, Mapping) for s in sections)
    if given is None:  # AIMET's files before 0.5 carry no version: the dict form
        if lists and not dicts:
            problems.append("the file has no 'version' but lists its encodings (the 1.0.0 form); "
                            "add \"version\": \"1.0.0\"")
            return None
        return "0.6.1"
    if not isinstance(given, str):
        problems.append(f"version must be a string like \"1.0.0\", got {given!r}")
        return None
    if given == "1.0.0":
        return given
    if given.split(".")[0] == "0":  # 0.4.0, 0.5.0, 0.6.1: the dict form, later versions adding keys
        return "0.6.1"
    problems.append(f"encodings version {given!r} is not read by mpstudio; it reads 1.0.0 and the older dict "
                    "form (0.6.1 and before). With AIMET, export with encoding_version=\"1.0.0\"")
    return None


def _section_items(value: Any, section: str, version: str, problems: list[str]):
    if version == "0.6.1":
        if not isinstance(value, Mapping):
            problems.append(f"{section} must be an object of {{tensor: [encoding, ...]}} in the dict form (0.6.1)")
            return
        for name, raw in value.items():
            yield str(name), f"{section}[{name!r}]", raw
        return
    if not isinstance(value, list):
        problems.append(f"{section} must be a list of {{\"name\": ..., \"bw\": ...}} objects in version 1.0.0")
        return
    for index, raw in enumerate(value):
        name = raw.get("name") if isinstance(raw, Mapping) else None
        if not isinstance(name, str) or not name:
            problems.append(f"{section}[{index}] must be an object with a tensor 'name' (a string)")
            continue
        yield name, f"{section}[{index}] ({name!r})", raw


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_integral(value: Any) -> bool:
    return _is_number(value) and float(value).is_integer()


def _v1_problems(where: str, item: Mapping) -> list[str]:
    problems = []
    missing = [k for k in _V1_REQUIRED if k not in item]
    if missing:
        return [f"{where}: missing key(s) {missing}"]
    unknown = sorted(set(item) - _V1_KEYS)
    if unknown:
        problems.append(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(sorted(_V1_KEYS))}")
    dtype, bw, enc_type = item["dtype"], item["bw"], item["enc_type"]
    if dtype not in ("INT", "FLOAT"):
        problems.append(f"{where}: dtype must be \"INT\" or \"FLOAT\", got {dtype!r}")
    if isinstance(bw, bool) or not isinstance(bw, int) or bw not in BITWIDTHS:
        problems.append(f"{where}: bw must be one of {', '.join(map(str, BITWIDTHS))}, got {bw!r}")
    if enc_type not in _ENC_TYPES:
        problems.append(f"{where}: enc_type must be one of {', '.join(_ENC_TYPES)}, got {enc_type!r}")
    elif enc_type in ("PER_BLOCK", "LPBQ"):
        problems.append(f"{where}: enc_type {enc_type} (block quantization) is not read by mpstudio; quantize this "
                        "tensor per tensor or per channel")
    if problems:
        return problems
    if dtype == "FLOAT":
        return [] if bw in (16, 32) else [f"{where}: a FLOAT encoding has bw 16 or 32, got {bw}"]
    missing = [k for k in _V1_INT_REQUIRED if k not in item]
    if missing:
        return [f"{where}: missing key(s) {missing} (an INT encoding needs them)"]
    if not isinstance(item["is_sym"], bool):
        problems.append(f"{where}: is_sym must be true or false, got {item['is_sym']!r}")
    scale, offset = item["scale"], item["offset"]
    if not isinstance(scale, list) or not scale or not all(_is_number(s) and s > 0 for s in scale):
        problems.append(f"{where}: scale must be a non-empty list of positive numbers, got {_short(scale)}")
    if not isinstance(offset, list) or not all(_is_integral(o) for o in offset):
        problems.append(f"{where}: offset must be a list of integers, got {_short(offset)}")
    elif not all(-(2 ** bw) < o <= 0 for o in offset):
        problems.append(f"{where}: offset must hold integers in (-2^bw, 0] (offset = -zero point of the "
                        f"unsigned code), got {_short(offset)}")
    if "zero_point_shift" in item and any(v != 0 for v in _as_list(item["zero_point_shift"])):
        problems.append(f"{where}: a fractional zero point (zero_point_shift) is not read by mpstudio")
    if problems:
        return problems
    if len(scale) != len(offset):
        return [f"{where}: scale has {len(scale)} value(s) but offset {len(offset)}"]
    if enc_type == "PER_TENSOR" and len(scale) != 1:
        return [f"{where}: a PER_TENSOR encoding has one scale and one offset, got {len(scale)}"]
    if f"{'' if item['is_sym'] else 'u'}int{bw}" not in _DTYPES:
        return [f"{where}: an unsigned {bw}-bit type is not one mpstudio reads (is_sym false with bw {bw})"]
    return []


def _legacy_problems(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        return [f"{where} must be a non-empty list of encodings (one per tensor, or one per channel)"]
    problems: list[str] = []
    for index, item in enumerate(value):
        problems += _legacy_item_problems(f"{where}[{index}]", item)
    if problems:
        return problems
    if len({(e.get("dtype", "int"), e.get("bitwidth"), e.get("is_symmetric")) for e in value}) > 1:
        problems.append(f"{where}: the channels of one tensor differ in dtype, bitwidth or is_symmetric")
    if value[0].get("dtype", "int") == "int":
        bits, signed = value[0]["bitwidth"], value[0]["is_symmetric"] == "True"
        if f"{'' if signed else 'u'}int{bits}" not in _DTYPES:
            problems.append(f"{where}: an asymmetric {bits}-bit encoding is not one mpstudio reads")
    return problems


def _legacy_item_problems(where: str, item: Any) -> list[str]:
    if not isinstance(item, Mapping):
        return [f"{where} must be an object"]
    dtype = item.get("dtype", "int")
    bitwidth = item.get("bitwidth")
    problems = []
    if dtype not in ("int", "float"):
        problems.append(f"{where}: dtype must be \"int\" or \"float\", got {dtype!r}")
    if not isinstance(bitwidth, int) or isinstance(bitwidth, bool) or bitwidth not in BITWIDTHS:
        problems.append(f"{where}: bitwidth must be one of {', '.join(map(str, BITWIDTHS))}, got {bitwidth!r}")
    unknown = sorted(set(item) - set(_LEGACY_KEYS))
    if unknown:
        problems.append(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(_LEGACY_KEYS)}")
    if dtype != "int" or problems:
        if dtype == "float" and bitwidth not in (16, 32):
            problems.append(f"{where}: a float encoding has bitwidth 16 or 32")
        return problems
    missing = [k for k in _LEGACY_KEYS if k not in item]
    if missing:
        return [f"{where}: missing key(s) {missing}"]
    bad = [k for k in ("max", "min", "offset", "scale") if not _is_number(item[k])]
    if bad:
        return [f"{where}: {', '.join(bad)} must be finite numbers"]
    if item["is_symmetric"] not in ("True", "False"):
        problems.append(f"{where}: is_symmetric must be the string \"True\" or \"False\", got {item['is_symmetric']!r}")
    scale, offset, low, high = item["scale"], item["offset"], item["min"], item["max"]
    if scale <= 0:
        problems.append(f"{where}: scale must be > 0, got {scale!r}")
    if low > high:
        problems.append(f"{where}: min {low!r} is above max {high!r}")
    if offset != int(offset) or not -(2 ** bitwidth) < offset <= 0:
        problems.append(f"{where}: offset must be an integer in (-2^bitwidth, 0], got {offset!r}")
    if problems:
        return problems
    tolerance = 1e-6 * max(abs(low), abs(high), scale)
    if abs(low - offset * scale) > tolerance or abs(high - (low + (2 ** bitwidth - 1) * scale)) > tolerance:
        problems.append(f"{where}: min/max disagree with scale and offset (expected min = offset * scale = "
                        f"{offset * scale!r}, max = min + (2^bitwidth - 1) * scale)")
    if item["is_symmetric"] == "True" and offset != -(2 ** (bitwidth - 1)):
        problems.append(f"{where}: a symmetric encoding has offset -2^(bitwidth-1) = {-(2 ** (bitwidth - 1))}, "
                        f"got {offset!r}")
    return problems


def _encoding(signed: bool, bits: int, scales: list, offsets: list) -> Encoding:
    dtype = f"{'' if signed else 'u'}int{bits}"
    qmin = -(2 ** (bits - 1)) if signed else 0
    return Encoding(dtype, tuple(float(s) for s in scales), tuple(qmin - int(o) for o in offsets))


def _from_v1(name: str, kind: str, item: Mapping) -> FileEncoding:
    if item["dtype"] == "FLOAT":
        return FileEncoding(name, kind, None, float_bitwidth=item["bw"])
    encoding = _encoding(item["is_sym"], item["bw"], item["scale"], item["offset"])
    return FileEncoding(name, kind, encoding, per_channel=item["enc_type"] == "PER_CHANNEL")


def _from_legacy(name: str, kind: str, items: list) -> FileEncoding:
    first = items[0]
    if first.get("dtype", "int") == "float":
        return FileEncoding(name, kind, None, float_bitwidth=first["bitwidth"])
    # AIMET reads "True" as a signed type with zero point 0: the same values as the unsigned reading.
    encoding = _encoding(first["is_symmetric"] == "True", first["bitwidth"], [e["scale"] for e in items],
                         [e["offset"] for e in items])
    return FileEncoding(name, kind, encoding, per_channel=len(items) > 1)


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...]"


def raise_if(problems: list[str], headline: str, limit: int = 20) -> None:
    """Raise one MpstudioError listing `problems` (the first `limit` of them) under `headline`."""
    if not problems:
        return
    shown = "\n  - ".join(problems[:limit])
    more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
    raise MpstudioError(f"{headline} ({len(problems)} problem{'s' if len(problems) > 1 else ''}):\n  - {shown}{more}")


__all__ = ["VERSIONS", "DEFAULT_VERSION", "SECTIONS", "FileEncoding", "EncodingsFile", "write", "load", "parse",
           "names", "entry_0_6_1", "entry_1_0_0", "check_version", "raise_if"]
