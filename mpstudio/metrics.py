"""How close a quantized model's outputs are to the float model's, and the task metrics a study can rebuild.

One definition of SNR and cosine serves the sensitivity engine (per tensor, streamed) and the study (model
outputs); `MetricSpec` is how a study stores its task metric so that a reopened study evaluates it again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .data import Feed, TaskMetric
from .errors import MpstudioError

OUTPUT_SNR = "output SNR (dB)"  # the default metric: SNR of all model outputs against the float model's
SNR_CAP_DB = 200.0  # an exact match has no finite SNR; stored and plotted values stop here
_EPS = float(np.finfo(np.float64).eps)


# ---- agreement with the float model --------------------------------------------------------------------------
def snr_db(signal_power: float, noise_power: float) -> float:
    """10·log10(signal / noise), with ORT's epsilon floor on both (so an exact match is finite)."""
    return 10.0 * math.log10(max(signal_power, _EPS ** 2) / max(noise_power, _EPS ** 2))


class ErrorAccumulator:
    """Accumulates signal, noise and cross terms of (reference, test) pairs over any number of samples.

    Sums are kept in float64, so memory stays constant whatever the number of samples; SNR and cosine are
    computed over all samples at once (the same definition as ORT's `qdq_loss_debug` SQNR). Values are
    compared in `dtype`: float32 for the per-tensor streams of the sensitivity engine, float64 where a score
    is computed once per plan and exactness wins.
    """

    __slots__ = ("signal", "test", "noise", "dot", "max_abs", "count", "dtype")

    def __init__(self, dtype=np.float32):
        self.signal = self.test = self.noise = self.dot = 0.0
        self.max_abs = 0.0
        self.count = 0
        self.dtype = dtype

    def add(self, reference: np.ndarray, test: np.ndarray) -> None:
        x = np.ravel(np.asarray(reference, dtype=self.dtype))
        y = np.ravel(np.asarray(test, dtype=self.dtype))
        if x.shape != y.shape:
            raise ValueError(f"shapes differ: {x.shape} vs {y.shape}")
        self._accumulate(x, y, x - y)

    def add_noise(self, reference: np.ndarray, diff: np.ndarray) -> None:
        """Add a pair given as the reference and its exact error (the local-error path computes it directly)."""
        self._accumulate(reference, reference + diff, diff)

    def _accumulate(self, reference: np.ndarray, test: np.ndarray, diff: np.ndarray) -> None:
        # np.dot on float32 goes through BLAS with float64-safe pairwise blocks; cast the result only.
        self.signal += float(np.dot(reference, reference))
        self.test += float(np.dot(test, test))
        self.noise += float(np.dot(diff, diff))
        self.dot += float(np.dot(reference, test))
        if diff.size:
            self.max_abs = max(self.max_abs, float(np.max(np.abs(diff))))
        self.count += reference.size

    def add_powers(self, signal: float, noise: float, count: int) -> None:
        """Add a pair known only by its signal and noise powers (enough for `snr_db` and `mse`, not `cosine`)."""
        self.signal += signal
        self.noise += noise
        self.count += count

    def merge(self, other: "ErrorAccumulator") -> None:
        """Fold in `other`'s sums (samples scored elsewhere, e.g. in another process)."""
        self.signal += other.signal
        self.test += other.test
        self.noise += other.noise
        self.dot += other.dot
        self.max_abs = max(self.max_abs, other.max_abs)
        self.count += other.count

    @property
    def snr_db(self) -> float:
        return snr_db(self.signal, self.noise)

    @property
    def cosine(self) -> float:
        denominator = math.sqrt(max(self.signal, 0.0) * max(self.test, 0.0))
        if denominator == 0.0:
            return 1.0 if self.noise == 0.0 else 0.0
        return self.dot / denominator

    @property
    def mse(self) -> float:
        return self.noise / self.count if self.count else float("nan")


def output_agreement(references: Sequence[Feed], outputs: Sequence[Feed]) -> tuple[float, float]:
    """SNR (dB, capped at SNR_CAP_DB) and cosine of every output against the float model's, over all samples."""
    acc = ErrorAccumulator(np.float64)
    for ref, out in zip(references, outputs):
        for name, value in ref.items():
            acc.add(value, out[name])
    return float(min(acc.snr_db, SNR_CAP_DB)), float(acc.cosine)


# ---- text recognition (CTC) ----------------------------------------------------------------------------------
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
    blank, then the model's `character` metadata, then a space."""
    from .model import metadata

    chars = metadata(getattr(model, "model", model)).get("character")
    if not chars:
        raise MpstudioError("the model has no 'character' metadata, so its CTC classes are unknown")
    return ["<blank>"] + chars.split("\n") + [" "]


# ---- metrics a study stores ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSpec:
    """How a study rebuilds its task metric when reopened: a kind and its arguments (JSON).

    Kinds: "output" (output SNR against the float model, the default), "ctc_cer" (character error rate of
    a CTC text recognizer: `references` and the model's `character` metadata), "python" (a metric given in
    Python; pass it again to `Study.open(metric=...)` to evaluate more plans).
    """

    kind: str = "output"
    name: str = OUTPUT_SNR
    higher_is_better: bool = True
    args: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "higher_is_better": self.higher_is_better, "args": self.args}

    @classmethod
    def from_json(cls, data: dict) -> "MetricSpec":
        return cls(data.get("kind", "output"), data.get("name", OUTPUT_SNR), bool(data.get("higher_is_better", True)),
                   dict(data.get("args") or {}))

    def build(self, model) -> TaskMetric | None:
        """The task metric this spec describes for `model` (None: output SNR, computed by the study itself)."""
        if self.kind == "output":
            return None
        if self.kind == "ctc_cer":
            return cer_metric(tuple(self.args["references"]), ctc_charset(model))
        raise MpstudioError(
            f"this study's metric {self.name!r} was given in Python; open it with Study.open(folder, metric=...) "
            "to evaluate more plans (stored results can be read without it)"
        )


__all__ = ["OUTPUT_SNR", "ErrorAccumulator", "snr_db", "output_agreement", "MetricSpec", "cer_metric",
           "ctc_charset", "ctc_greedy_decode", "character_error_rate", "edit_distance"]
