"""A metric's value as sums of per-sample terms, where the metric decomposes: CER (edit errors and reference
characters per line), top-1 agreement (agreeing and compared positions per sample), recall@k (a hit per query),
output SNR (signal and noise energy per sample) and output cosine (dot product and both energies per sample).

Terms are what makes a result's uncertainty computable: resampling the samples gives an interval, and two plans
evaluated on the same samples are compared sample by sample (`loop.uncertainty`). A metric given by import path
has terms when its function carries a `sample_terms` function (`metrics`); a metric of the whole set only (a
function given in Python, or by import path without `sample_terms`) has none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .data import Feed
from .errors import MpstudioError
from .ctc_text import charset_classes, ctc_charset, ctc_greedy_decode, edit_distance
from .metrics import (SNR_CAP_DB, ErrorAccumulator, MetricSpec, _pick, ctc_cer, load_metric_function, output_cosine,
                      output_snr, recall_at_k, top1_agreement, top1_labels)

# How per-sample sums become the metric's value:
#   "ratio": the first column's sum over the second's (CER, top-1 agreement, recall@k);
#   "snr": 10·log10(signal / noise), capped at SNR_CAP_DB; "cosine": dot / sqrt(signal · test).
FORMS = ("ratio", "snr", "cosine")
_EPS2 = float(np.finfo(np.float64).eps) ** 2


@dataclass(frozen=True)
class MetricTerms:
    """One plan's per-unit terms of its metric: `columns[i]` holds unit i's terms (named by `names`), a unit being
    an evaluation sample (a query for recall@k); `form` says how their sums combine into the value."""

    form: str
    names: tuple[str, ...]
    columns: np.ndarray  # float64, (units, len(names))
    unit: str = "sample"

    def __post_init__(self):
        if self.form not in FORMS:
            raise MpstudioError(f"unknown metric terms form {self.form!r}")
        object.__setattr__(self, "columns", np.asarray(self.columns, np.float64).reshape(-1, len(self.names)))

    @property
    def units(self) -> int:
        return len(self.columns)

    def combine(self, sums: np.ndarray) -> np.ndarray:
        """The metric's value of term sums (`sums[..., j]` the sum of column j), vectorised over leading axes."""
        sums = np.asarray(sums, np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.form == "ratio":
                return sums[..., 0] / np.maximum(sums[..., 1], 1e-300)
            if self.form == "snr":
                return np.minimum(10.0 * np.log10(np.maximum(sums[..., 0], _EPS2) / np.maximum(sums[..., 1], _EPS2)),
                                  SNR_CAP_DB)
            denominator = np.sqrt(np.maximum(sums[..., 1], 0.0) * np.maximum(sums[..., 2], 0.0))
            return np.where(denominator > 0, sums[..., 0] / np.where(denominator > 0, denominator, 1.0),
                            np.where(sums[..., 3] == 0.0, 1.0, 0.0))

    def value(self, indices: Sequence[int] | None = None) -> float:
        """The metric on all units, or on `indices`."""
        rows = self.columns if indices is None else self.columns[np.asarray(indices, int)]
        return float(self.combine(rows.sum(axis=0)))

    @property
    def resolution(self) -> float | None:
        """The smallest step of the metric's value: one count of a counted metric (a character of CER, a position
        of top-1, a query of recall@k) over all of them; None for a continuous metric (SNR, cosine)."""
        if self.form != "ratio" or not np.all(self.columns == np.round(self.columns)):
            return None  # a ratio of non-integer sums (a user's mean of per-sample values) is continuous
        total = float(self.columns[:, 1].sum())
        return 1.0 / total if total > 0 else None

    # ---- as the store keeps them ----
    def header(self) -> str:
        return json.dumps({"form": self.form, "names": list(self.names), "unit": self.unit})

    def blob(self) -> bytes:
        return np.ascontiguousarray(self.columns, "<f8").tobytes()

    @classmethod
    def read(cls, header: str, blob: bytes) -> "MetricTerms":
        head = json.loads(header)
        names = tuple(head["names"])
        return cls(head["form"], names, np.frombuffer(blob, "<f8").reshape(-1, len(names)), head.get("unit", "sample"))


def _agreement_rows(outputs: Sequence[Feed], references: Sequence[Feed]) -> list[ErrorAccumulator]:
    rows = []
    for out, ref in zip(outputs, references):
        acc = ErrorAccumulator(np.float64)
        for name, value in ref.items():
            acc.add(value, out[name])
        rows.append(acc)
    return rows


def snr_terms(outputs: Sequence[Feed], references: Sequence[Feed]) -> MetricTerms:
    rows = _agreement_rows(outputs, references)
    return MetricTerms("snr", ("signal", "noise"), [[a.signal, a.noise] for a in rows])


def cosine_terms(outputs: Sequence[Feed], references: Sequence[Feed]) -> MetricTerms:
    rows = _agreement_rows(outputs, references)
    return MetricTerms("cosine", ("dot", "signal", "test", "noise"), [[a.dot, a.signal, a.test, a.noise] for a in rows])


def cer_terms(outputs: Sequence[Feed], truth: Sequence[str], charset: list[str], output: str | None = None
              ) -> MetricTerms:
    """Per line: edit errors of the greedy CTC text against `truth`, and the reference's length."""
    rows = []
    for out, reference in zip(outputs, truth):
        text = ctc_greedy_decode(_pick(out, output, "CER")[0], charset).strip()
        rows.append([edit_distance(text, reference), len(reference)])
    return MetricTerms("ratio", ("errors", "characters"), rows)


def top1_terms(outputs: Sequence[Feed], references: Sequence[Feed], output: str | None = None,
               axis: int | None = None) -> MetricTerms:
    rows = []
    for out, ref in zip(outputs, references):
        a, b = top1_labels(out, output, axis), top1_labels(ref, output, axis)
        rows.append([int(np.sum(a == b)), a.size])
    return MetricTerms("ratio", ("agree", "positions"), rows)


def recall_terms(outputs: Sequence[Feed], k: int = 1, pair: list[str] | None = None, output: str | None = None
                 ) -> MetricTerms:
    """A hit (its document among the first k) per query, as `metrics.recall_at_k` ranks them."""
    if pair is not None:
        queries = [_pick(o, pair[0], "recall@k") for o in outputs]
        documents = [_pick(o, pair[1], "recall@k") for o in outputs]
    else:
        vectors = [_pick(o, output, "recall@k") for o in outputs]
        queries, documents = vectors[0::2], vectors[1::2]

    def embed(items):
        m = np.stack([np.asarray(v, np.float64).reshape(-1, np.shape(v)[-1]).mean(axis=0) for v in items])
        return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), float(np.finfo(np.float64).eps))

    similarity = embed(queries) @ embed(documents).T
    rank = (similarity > np.diag(similarity)[:, None]).sum(axis=1)
    hits = (rank < int(k)).astype(np.float64)
    return MetricTerms("ratio", ("hit", "queries"), np.stack([hits, np.ones_like(hits)], axis=1), unit="query")


_BUILTIN = {f"{fn.__module__}:{fn.__name__}": fn for fn in (ctc_cer, top1_agreement, recall_at_k, output_snr,
                                                             output_cosine)}


def decomposes(spec: MetricSpec) -> bool:
    """Whether `spec`'s metric has per-sample terms (`metric_terms` gives them)."""
    if spec.kind in ("output", "ctc_cer"):
        return True
    return spec.kind == "reference" and (spec.args.get("function") in _BUILTIN or user_terms_function(spec) is not None)


def user_terms_function(spec: MetricSpec):
    """The `sample_terms` function of a metric given by import path (`metrics`, "A metric a study stores by
    reference"), or None when it has none (or cannot be imported here: its own error comes when it is built)."""
    if spec.kind != "reference" or spec.args.get("function") in _BUILTIN:
        return None
    try:
        fn = load_metric_function(spec.args["function"], dict(spec.args.get("args") or {}), spec.args.get("file"))
    except MpstudioError:
        return None
    terms = getattr(fn, "sample_terms", None)
    return terms if callable(terms) else None


def user_terms(spec: MetricSpec, fn, outputs: Sequence[Feed], references: Sequence[Feed]) -> MetricTerms:
    """The terms `fn` (a metric's `sample_terms`) gives: one (numerator, denominator) row per sample, the metric
    being the sum of the numerators over the sum of the denominators."""
    ref = spec.args["function"]
    try:
        rows = fn(outputs, references, **dict(spec.args.get("args") or {}))
    except MpstudioError:
        raise
    except Exception as exc:
        raise MpstudioError(f"{ref}.sample_terms raised {type(exc).__name__}: {exc}") from exc
    try:
        columns = np.asarray(rows, np.float64)
    except (TypeError, ValueError):
        columns = np.empty((0,))
    if columns.shape != (len(outputs), 2) or not np.all(np.isfinite(columns)) or np.any(columns[:, 1] < 0):
        got = f"shape {columns.shape}" if columns.ndim else type(rows).__name__
        raise MpstudioError(
            f"{ref}.sample_terms returned {got} for {len(outputs)} samples: it must return one (numerator, "
            f"denominator) pair of finite numbers per sample, denominators >= 0, such that the metric is the sum of "
            f"the numerators over the sum of the denominators (a mean of per-sample values: (value, 1) each)")
    return MetricTerms("ratio", ("numerator", "denominator"), columns)


def check_user_terms(spec: MetricSpec, references: Sequence[Feed], value: float) -> None:
    """Refuse a metric whose `sample_terms` do not give its `value` on the float model's own outputs: intervals and
    paired comparisons of such terms would be of another metric."""
    fn = user_terms_function(spec)
    if fn is None:
        return
    terms = user_terms(spec, fn, references, references)
    combined = terms.value()
    if not abs(combined - value) <= 1e-6 * max(1.0, abs(value)):
        raise MpstudioError(
            f"{spec.args['function']}.sample_terms does not give the metric: on the float model the sum of its "
            f"numerators over the sum of its denominators is {combined:.6g}, the metric {value:.6g}; make them agree, "
            "or remove sample_terms (the metric then has no interval)")


def metric_terms(spec: MetricSpec, model, outputs: Sequence[Feed], references: Sequence[Feed],
                 indices: Sequence[int] | None = None) -> MetricTerms | None:
    """`outputs`' per-sample terms of `spec`'s metric against the float model's `references` (the same samples,
    in order); None when the metric does not decompose. `model` gives a CTC recognizer's charset. `indices`: the
    evaluation samples `outputs` are (default all, in order); recall@k has no terms on part of its samples (a
    query ranks every document)."""
    def picked(items):
        return list(items) if indices is None else [items[i] for i in indices]

    if spec.kind == "output":
        return snr_terms(outputs, references)
    if spec.kind == "ctc_cer":
        return cer_terms(outputs, picked(tuple(spec.args["references"])), ctc_charset(model))
    if spec.kind == "reference" and spec.args.get("function") not in _BUILTIN:
        fn = user_terms_function(spec)
        return user_terms(spec, fn, outputs, references) if fn is not None else None
    if not decomposes(spec):
        return None
    fn, args = _BUILTIN[spec.args["function"]], dict(spec.args.get("args") or {})
    if fn is output_snr:
        return snr_terms(outputs, references)
    if fn is output_cosine:
        return cosine_terms(outputs, references)
    if fn is top1_agreement:
        return top1_terms(outputs, references, args.get("output"), args.get("axis"))
    if fn is recall_at_k:
        return None if indices is not None else recall_terms(outputs, args.get("k", 1), args.get("pair"), args.get("output"))
    output = args.get("output")
    first = _pick(outputs[0], output, "CER") if outputs else None
    classes = charset_classes(list(args["charset"]), int(first.shape[-1]) if first is not None else None,
                              "the charset", "give the character list the model was trained with")
    labels = args.get("labels")
    truth = picked(labels) if labels is not None else [
        ctc_greedy_decode(_pick(r, output, "CER")[0], classes).strip() for r in references]
    return cer_terms(outputs, truth, classes, output)


__all__ = ["MetricTerms", "metric_terms", "decomposes", "check_user_terms", "snr_terms", "cosine_terms", "cer_terms",
           "top1_terms", "recall_terms", "FORMS"]
