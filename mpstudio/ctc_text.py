"""Text recognition with CTC: greedy decoding, edit distance and character error rate, and a recognizer's charset
(from the model's metadata or a file) and reference texts. The built-in `cer` metric (`metrics.ctc_cer`) and its
per-sample terms (`metric_terms.cer_terms`) are made of these."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .data import TaskMetric
from .errors import MpstudioError

def ctc_greedy_decode(probabilities: np.ndarray, charset: list[str]) -> str:
    """Argmax per timestep, drop repeats, drop blanks (class 0)."""
    best = np.asarray(probabilities).reshape(-1, probabilities.shape[-1]).argmax(axis=-1)
    chars, previous = [], -1
    for index in best:
        if index != previous and index != 0:
            chars.append(charset[index] if index < len(charset) else "")
        previous = index
    return "".join(chars)


def edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def character_error_rate(predictions: list[str], references: list[str]) -> float:
    """Total edit distance over total reference length."""
    errors = sum(edit_distance(p, r) for p, r in zip(predictions, references))
    return errors / max(1, sum(len(r) for r in references))


def cer_metric(references: tuple[str, ...], charset: list[str]) -> TaskMetric:
    """Character error rate of a CTC text recognizer's first output against `references`, one per sample."""
    def cer(outputs: list[dict[str, np.ndarray]]) -> float:
        if len(outputs) != len(references):
            raise MpstudioError(f"CER needs {len(references)} outputs (one per evaluation line), got {len(outputs)}")
        # Lines are cropped with margins, where the model may read a space: compare the stripped text.
        predictions = [ctc_greedy_decode(next(iter(o.values()))[0], charset).strip() for o in outputs]
        return character_error_rate(predictions, list(references))

    return TaskMetric(name="CER", fn=cer, higher_is_better=False)


def ctc_charset(model) -> list[str]:
    """Class index -> character of a PaddleOCR-style recognizer (a ModelProto or PreparedModel): 0 is the CTC
    blank, then the model's `character` metadata, then a space.

    The metadata is checked before it is trusted (one published recognizer carries an HTML page there): it
    must be one character per line, and their number must fit the model's output classes.
    """
    from .model import metadata

    proto = getattr(model, "model", model)
    chars = metadata(proto).get("character")
    if not chars:
        raise MpstudioError("the model has no 'character' metadata, so its CTC classes are unknown; give the "
                            "character list as a file: --metric cer --charset FILE (one character per line)")
    classes = _output_classes(proto)
    return charset_classes(chars.split("\n"), classes, "the model's 'character' metadata",
                           "give the right character list as a file: --metric cer --charset FILE (one character "
                           "per line)")


def charset_classes(lines: list[str], classes: int | None, where: str, fix: str) -> list[str]:
    """The CTC classes of a character list (blank, the characters, then a space when the model has one more
    class), checked: one character per line, no markup, and as many classes as the model outputs."""
    chars = [line[:-1] if line.endswith("\r") else line for line in lines]
    if chars and chars[-1] == "":
        chars = chars[:-1]  # a final newline
    bad = [(i, c) for i, c in enumerate(chars) if len(c) != 1]
    if bad and re.search(r"<(!doctype|html|head|body|meta|script|div|title)\b", "\n".join(chars[:200]).lower()):
        raise MpstudioError(f"{where} is an HTML page, not a character list; {fix}")
    if bad:
        i, c = bad[0]
        raise MpstudioError(f"{where} is not one character per line: {len(bad)} of its {len(chars)} lines are not "
                            f"(line {i + 1} is {c[:40]!r}); {fix}")
    if classes is not None and classes not in (len(chars) + 1, len(chars) + 2):
        raise MpstudioError(f"{where} lists {len(chars)} characters, but the model outputs {classes} classes (a CTC "
                            f"recognizer has one per character, plus the blank and maybe a space); {fix}")
    space = [" "] if classes is None or classes == len(chars) + 2 else []
    return ["<blank>"] + chars + space


def _output_classes(proto) -> int | None:
    """The last axis of the model's first output when it is static (the CTC classes of a recognizer)."""
    try:
        dims = proto.graph.output[0].type.tensor_type.shape.dim
        return int(dims[-1].dim_value) or None if dims else None
    except (AttributeError, IndexError):
        return None


def read_charset(path: str | Path) -> list[str]:
    """The lines of a charset file (one character per line, UTF-8), for `ctc_cer(charset=...)`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MpstudioError(f"charset file not found: {path}") from None
    except UnicodeDecodeError:
        raise MpstudioError(f"charset file {path} is not UTF-8 text") from None
    lines = text.split("\n")
    charset_classes(lines, None, f"charset file {path}", "write one character per line")
    return lines[:-1] if lines and lines[-1] == "" else lines


def read_labels(path: str | Path) -> list[str]:
    """One reference text per evaluation sample (UTF-8, one per line), for `ctc_cer(labels=...)`."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise MpstudioError(f"labels file not found: {path}") from None
    except UnicodeDecodeError:
        raise MpstudioError(f"labels file {path} is not UTF-8 text") from None
