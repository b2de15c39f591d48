"""How close a quantized model's outputs are to the float model's, and the task metrics a study can rebuild.

One definition of SNR and cosine serves the sensitivity engine (per tensor, streamed) and the study (model
outputs); `MetricSpec` is how a study stores its task metric so that a reopened study, in any process,
evaluates it again.

A metric a study stores by reference is a function `fn(outputs, reference, **args) -> float`, named as
`module:function` (`mpstudio search --metric pkg.mod:fn`, or `metric_spec("pkg.mod:fn")` from Python):

- `outputs`: the quantized plan's outputs, a list with one dict per evaluation sample, in the order of the
  study's evaluation data; each dict maps the model's output names to the arrays the model returned
  (batch axis included);
- `reference`: the float model's outputs on the same samples (ONNX Runtime, CPU), in the same form;
- `args`: the JSON object given with `--metric-args` (stored in the study with the reference);
- it returns one finite number. Whether higher is better comes from the function's `higher_is_better`
  attribute or `--metric-direction`; its name from its `metric_name` attribute (else the function's name);
- optionally `sample_terms`, called like it: a (numerator, denominator) per sample (`metric_terms.user_terms`).

The module must be importable in every process that evaluates plans (on `PYTHONPATH`); stored results are
read without it. The built-in metrics (`BUILTIN_METRICS`) are such functions too: top-1 agreement with the
float model, output cosine, output SNR, CTC character error rate with a charset, and retrieval recall@k.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .data import Feed, TaskMetric
from .ctc_text import (cer_metric, character_error_rate, charset_classes, ctc_charset, ctc_greedy_decode,
                       read_charset, read_labels)
from .errors import MpstudioError

OUTPUT_SNR = "output SNR (dB)"  # the default metric: SNR of all model outputs against the float model's
SNR_CAP_DB = 200.0  # an exact match has no finite SNR; stored and plotted values stop here
_EPS = float(np.finfo(np.float64).eps)


# ---- agreement with the float model --------------------------------------------------------------------------
def snr_db(signal_power: float, noise_power: float) -> float:
    """10·log10(signal / noise), with ORT's epsilon floor on both (so an exact match is finite); a tensor that is
    zero and stays exactly zero (an attention mask's branch when no token is masked) has lost nothing: SNR_CAP_DB,
    not the 0 dB the floors alone give, which would rank it as the most damaged tensor."""
    if signal_power <= 0.0 and noise_power <= 0.0:
        return SNR_CAP_DB
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
        """Add a pair; integer and boolean values (a model's labels or indices: decisions, not values to
        compare in power) are left out (`output_note`)."""
        if np.asarray(reference).dtype.kind not in "fc":
            return
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


def output_note(outputs) -> str:
    """What output SNR and cosine leave out of a model's outputs (`TensorSpec`s): its integer and boolean ones
    ("" when every output is float), and what to do when that is all of them."""
    left_out = [spec for spec in outputs if np.dtype(spec.dtype).kind not in "fc"]
    if not left_out:
        return ""
    named = ", ".join(f"{spec.name} ({spec.dtype})" for spec in left_out[:3]) + (" ..." if len(left_out) > 3 else "")
    if len(left_out) < len(outputs):
        return f"note: output SNR and cosine compare the float outputs; {named} left out"
    return (f"warning: every output of the model is an integer or boolean ({named}): output SNR and cosine compare "
            "float outputs and see nothing here. Score with a task metric, or export the model with the float "
            "tensors these are computed from (e.g. the logits before an ArgMax) as outputs.")


def output_agreement(references: Sequence[Feed], outputs: Sequence[Feed]) -> tuple[float, float]:
    """SNR (dB, capped at SNR_CAP_DB) and cosine of every output against the float model's, over all samples."""
    acc = ErrorAccumulator(np.float64)
    for ref, out in zip(references, outputs):
        for name, value in ref.items():
            acc.add(value, out[name])
    return float(min(acc.snr_db, SNR_CAP_DB)), float(acc.cosine)


# ---- built-in metrics: functions fn(outputs, reference, **args), named from the command line --------------------
def metric_range(name: str) -> tuple[float | None, float | None] | None:
    """The values a built-in metric can take, by its name (None: unbounded or not known here)."""
    if name == "output cosine":
        return (-1.0, 1.0)
    if name == "top-1 agreement" or name.startswith("R@"):
        return (0.0, 1.0)
    if name == "CER":
        return (0.0, None)
    return None


def _metric(name: str, higher_is_better: bool):
    def mark(fn):
        fn.metric_name, fn.higher_is_better = name, higher_is_better
        return fn
    return mark


def _pick(sample: Feed, output: str | None, what: str) -> np.ndarray:
    if output is None:
        return np.asarray(next(iter(sample.values())))
    if output not in sample:
        raise MpstudioError(f"{what}: the model has no output {output!r}; its outputs are {sorted(sample)}")
    return np.asarray(sample[output])


def top1_labels(sample: Feed, output: str | None = None, axis: int | None = None) -> np.ndarray:
    """The argmax of a sample's `output` (default the first) over the class axis `axis`: by default the last of
    up to 3 dimensions; given for 4 or more (a class map is N, C, H, W from PyTorch, N, H, W, C from TensorFlow)."""
    value = _pick(sample, output, "top-1 agreement")
    name = output if output is not None else next(iter(sample))
    return value.argmax(axis=top1_axis(name, value.shape, axis))


def top1_axis(name: str, shape: Sequence[int], axis: int | None) -> int:
    """The class axis of top-1 agreement on output `name` of `shape`, or a refusal that says which to give."""
    ndim, shown = len(shape), "x".join(str(d) for d in shape)
    if axis is None:
        if ndim >= 4:
            square = shape[-1] == shape[-2] != shape[1]  # a map's height and width come last
            guess = " (its axis 1 looks like the classes)" if square else ""
            raise MpstudioError(
                f"top-1 agreement: output {name!r} is {shown}; say which axis holds the classes{guess}: "
                "--metric-args '{\"axis\": 1}' for N, C, H, W (a PyTorch export's class map), "
                "'{\"axis\": -1}' for N, H, W, C (metric_spec(\"top1\", args={\"axis\": 1}) from Python)")
        return -1
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise MpstudioError(f"top-1 agreement: axis {axis!r} is not an axis of output {name!r} ({shown}); give an "
                            f"integer from {-ndim} to {ndim - 1}")
    return int(axis)


def check_top1_axis(spec: "MetricSpec", model) -> None:
    """Refuse a study's built-in top-1 metric whose class axis its output's static shape leaves open or does not
    have, before the study is made (the first evaluation would refuse it, after the data is copied)."""
    if spec.kind != "reference" or spec.args.get("function") != f"{top1_agreement.__module__}:top1_agreement":
        return
    args = spec.args.get("args") or {}
    outputs = {o.name: o for o in model.graph.output}
    name = args.get("output") or next(iter(outputs), None)
    if name not in outputs:
        raise MpstudioError(f"top-1 agreement: the model has no output {name!r}; its outputs are {sorted(outputs)}")
    dims = outputs[name].type.tensor_type.shape.dim
    if dims and all(d.HasField("dim_value") for d in dims):
        top1_axis(name, [d.dim_value for d in dims], args.get("axis"))


@_metric("top-1 agreement", True)
def top1_agreement(outputs: list[Feed], reference: list[Feed], output: str | None = None,
                   axis: int | None = None) -> float:
    """The fraction of argmaxes (over the class axis of `output`, `top1_labels`; at every other position, e.g.
    each timestep of a sequence or pixel of a class map) that equal the float model's."""
    agree = total = 0
    for out, ref in zip(outputs, reference, strict=True):
        a = top1_labels(out, output, axis)
        b = top1_labels(ref, output, axis)
        agree += int(np.sum(a == b))
        total += a.size
    return agree / total if total else float("nan")


@_metric("output cosine", True)
def output_cosine(outputs: list[Feed], reference: list[Feed]) -> float:
    """Cosine similarity of every output against the float model's, over all samples at once."""
    return output_agreement(reference, outputs)[1]


@_metric(OUTPUT_SNR, True)
def output_snr(outputs: list[Feed], reference: list[Feed]) -> float:
    """SNR (dB) of every output against the float model's, over all samples (what a study scores by default)."""
    return output_agreement(reference, outputs)[0]


@_metric("CER", False)
def ctc_cer(outputs: list[Feed], reference: list[Feed], charset: list[str], labels: list[str] | None = None,
            output: str | None = None) -> float:
    """Character error rate of a CTC text recognizer, decoded greedily with `charset` (the file's lines: class 0
    is the blank, then one class per line, then a space when the model has one more class).

    Against `labels` (one reference text per sample) when given, else against the float model's own text.
    Texts are compared stripped (a line crop's margins may read as spaces).
    """
    if labels is not None and len(labels) != len(outputs):
        raise MpstudioError(f"CER has {len(labels)} labels for {len(outputs)} evaluation samples; give one label "
                            "per evaluation sample, in order")
    first = _pick(outputs[0], output, "CER") if outputs else None
    classes = charset_classes(list(charset), int(first.shape[-1]) if first is not None else None, "the charset",
                              "give the character list the model was trained with")

    def text(sample):
        return ctc_greedy_decode(_pick(sample, output, "CER")[0], classes).strip()

    truth = list(labels) if labels is not None else [text(r) for r in reference]
    return character_error_rate([text(o) for o in outputs], truth)


@_metric("R@k", True)
def recall_at_k(outputs: list[Feed], reference: list[Feed], k: int = 1, pair: list[str] | None = None,
                output: str | None = None) -> float:
    """Retrieval recall@k over paired samples.

    Pairs: with `pair = [query_output, document_output]`, each sample gives a query and its document (two
    outputs of one model); otherwise samples alternate, sample 2i the query and 2i+1 its document (both from
    `output`, default the first output). An embedding is its output averaged over every axis but the last
    (mean pooling over tokens, padding included: export a pooled output for masked pooling). Every query
    ranks every document by cosine similarity; it is a hit when its own document is among the first k
    (documents exactly as similar as its own do not push it down). R@k is hits / queries. Only the plan's
    outputs count: the float model's R@k is the same function on its outputs.
    """
    if int(k) < 1:
        raise MpstudioError(f"recall@k needs k >= 1, not {k}")
    if pair is not None:
        if len(pair) != 2:
            raise MpstudioError(f"recall@k 'pair' names two outputs (query, document), not {pair!r}")
        queries = [_pick(o, pair[0], "recall@k") for o in outputs]
        documents = [_pick(o, pair[1], "recall@k") for o in outputs]
    else:
        if len(outputs) % 2:
            raise MpstudioError(f"recall@k pairs samples two by two (query, document) but there are {len(outputs)} "
                                "evaluation samples; give an even number, or name two outputs with 'pair'")
        vectors = [_pick(o, output, "recall@k") for o in outputs]
        queries, documents = vectors[0::2], vectors[1::2]

    def embed(items):
        m = np.stack([np.asarray(v, np.float64).reshape(-1, np.shape(v)[-1]).mean(axis=0) for v in items])
        return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), _EPS)

    similarity = embed(queries) @ embed(documents).T
    own = np.diag(similarity)
    rank = (similarity > own[:, None]).sum(axis=1)  # documents strictly more similar than its own
    return float(np.mean(rank < int(k))) if len(own) else float("nan")


# Names the command line takes (`--metric top1`); "recall@K" (or "r@K") takes its k from the name.
BUILTIN_METRICS = {"top1": top1_agreement, "cosine": output_cosine, "snr": output_snr, "cer": ctc_cer,
                   "recall@k": recall_at_k}


# ---- metrics a study stores ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSpec:
    """How a study rebuilds its task metric when reopened: a kind and its arguments (JSON).

    Kinds: "output" (output SNR against the float model, the default), "reference" (a function
    `fn(outputs, reference, **args)` named by import path: `args` holds `function` ("module:function"),
    its JSON `args`, and `file`, where it was loaded from, for messages), "ctc_cer" (character error rate
    of a CTC text recognizer: `references` and the model's `character` metadata), "python" (a metric given
    in Python; pass it again to `Study.open(metric=...)` to evaluate more plans).
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

    def describe(self) -> str:
        """The metric in a few words, with where it comes from."""
        if self.kind == "reference":
            args = self.args.get("args") or {}
            shown = {k: (f"<{len(v)} items>" if isinstance(v, list) and len(v) > 4 else v) for k, v in args.items()}
            return f"{self.name} ({self.args['function']}" + (f", {json.dumps(shown)}" if shown else "") + ")"
        return {"output": f"{self.name} (against the float model)", "ctc_cer": f"{self.name} (the model's charset)",
                "python": f"{self.name} (given in Python)"}.get(self.kind, self.name)

    def build(self, model) -> TaskMetric | None:
        """The task metric this spec describes for `model` (None: output SNR, computed by the study itself)."""
        if self.kind == "output":
            return None
        if self.kind == "ctc_cer":
            return cer_metric(tuple(self.args["references"]), ctc_charset(model))
        if self.kind == "reference":
            ref, args = self.args["function"], dict(self.args.get("args") or {})
            fn = load_metric_function(ref, args, self.args.get("file"))
            return TaskMetric(self.name, _checked_call(ref, fn, args), self.higher_is_better, needs_reference=True)
        if self.kind == "python":
            raise MpstudioError(
                f"this study's metric {self.name!r} was given in Python; open it with Study.open(folder, metric=...) "
                "to evaluate more plans (stored results can be read without it)"
            )
        raise MpstudioError(f"this study's metric has kind {self.kind!r}, which this mpstudio does not know")


def load_metric_function(ref: str, args: dict | None = None, origin: str | None = None) -> Callable:
    """The function `ref` ("module:function") names, checked to be callable as `fn(outputs, reference, **args)`."""
    module_name, sep, attr = str(ref).partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise MpstudioError(f"metric {ref!r} is neither module:function (e.g. mypkg.metrics:accuracy) nor a built-in "
                            f"metric ({', '.join(_BUILTIN_NAMES)})")
    where = f" (the study found it in {origin})" if origin else ""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise MpstudioError(f"cannot import module {module_name!r} of metric {ref!r}: no module named {exc.name!r}"
                                f"{where}; put the folder that holds it on PYTHONPATH") from None
        raise MpstudioError(f"importing {module_name!r} (metric {ref!r}) failed: {exc}; install what it needs") from exc
    except Exception as exc:
        raise MpstudioError(f"importing {module_name!r} (metric {ref!r}) raised {type(exc).__name__}: {exc}; "
                            "fix the module") from exc
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                             and getattr(v, "__module__", None) == module.__name__)
            raise MpstudioError(f"module {module_name!r} ({getattr(module, '__file__', 'no file')}) has no function "
                                f"{attr!r}; it defines: {', '.join(defined[:12]) or 'no public functions'}")
        target = getattr(target, part)
    if not callable(target):
        raise MpstudioError(f"{ref!r} is a {type(target).__name__}, not a function fn(outputs, reference) -> float")
    args = args or {}
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return target  # a builtin without a signature: checked when it runs
    try:
        signature.bind(None, None, **args)
    except TypeError as exc:
        extra = "".join(f", {k}=..." for k in args)
        raise MpstudioError(f"metric function {ref}{signature} cannot be called as fn(outputs, reference{extra}): "
                            f"{exc}. A metric takes the plan's outputs and the float model's outputs (each a list of "
                            "{output name: array}, one per evaluation sample) and returns a number: define "
                            "def fn(outputs, reference, ...) -> float") from None
    return target


def metric_value(value, what: str) -> float:
    """`value` as a float, or a clear error when a metric returned something else."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.number)):
        shown = repr(value)
        raise MpstudioError(f"metric {what} returned a {type(value).__name__} ({shown[:60]}"
                            f"{'...' if len(shown) > 60 else ''}), not a number; a metric returns one float")
    value = float(value)
    if not math.isfinite(value):
        raise MpstudioError(f"metric {what} returned {value}; a metric returns a finite number")
    return value


def _checked_call(ref: str, fn: Callable, args: dict) -> Callable:
    def call(outputs: list[Feed], reference: list[Feed]) -> float:
        try:
            value = fn(outputs, reference, **args)
        except MpstudioError:
            raise
        except Exception as exc:
            raise MpstudioError(f"metric {ref} raised {type(exc).__name__}: {exc}") from exc
        return metric_value(value, ref)

    return call


_BUILTIN_NAMES = ("top1", "cosine", "snr", "cer (with a charset)", "recall@K")
_RECALL = re.compile(r"^(?:recall|r)@(\d+)$", re.IGNORECASE)


def metric_spec(text: str, *, args: dict | str | None = None, direction: str | None = None,
                charset: str | Path | list[str] | None = None, labels: str | Path | list[str] | None = None,
                name: str | None = None) -> MetricSpec:
    """The MetricSpec a study stores for a metric named on the command line (`--metric`).

    `text` is a built-in name (`top1`, `cosine`, `snr`, `cer`, `recall@5`) or `module:function` (imported
    now, so a bad reference fails before any work). `args` is a dict or JSON object of keyword arguments of
    the function; `direction` ("higher" or "lower") says whether higher is better when the function does not
    (its `higher_is_better` attribute); `charset` (a file or its lines) and `labels` (a file or one text per
    evaluation sample) are for `cer`.
    """
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as exc:
            raise MpstudioError(f"--metric-args is not valid JSON ({exc.msg}): give an object like '{{\"k\": 5}}'")
    args = dict(args or {})
    if not all(isinstance(k, str) for k in args):
        raise MpstudioError("metric arguments must be a JSON object of name: value")
    if direction not in (None, "higher", "lower"):
        raise MpstudioError(f"the metric direction is 'higher' or 'lower' (is better), not {direction!r}")
    key = str(text).strip()
    if (charset is not None or labels is not None) and key.lower() != "cer":
        raise MpstudioError("--charset and --labels go with --metric cer")
    lowered = key.lower()
    if lowered in ("snr", "output"):
        if args:
            raise MpstudioError("the snr metric takes no arguments")
        return MetricSpec()
    recall = _RECALL.match(lowered)
    if lowered == "cer":
        if charset is None:
            raise MpstudioError("--metric cer needs the recognizer's character list: --charset FILE (one character "
                                "per line; class 0 is the CTC blank, then one class per line)")
        args["charset"] = read_charset(charset) if isinstance(charset, (str, Path)) else list(charset)
        if labels is not None:
            args["labels"] = read_labels(labels) if isinstance(labels, (str, Path)) else list(labels)
        fn = ctc_cer
    elif lowered == "top1":
        fn = top1_agreement
    elif lowered == "cosine":
        fn = output_cosine
    elif recall:
        args["k"] = int(recall.group(1))
        fn = recall_at_k
    elif ":" in key:
        fn = load_metric_function(key, args)
        module = importlib.import_module(key.partition(":")[0])
        higher = getattr(fn, "higher_is_better", None)
        if direction is not None:
            higher = direction == "higher"
        if not isinstance(higher, (bool, np.bool_)):
            raise MpstudioError(f"say whether a higher {key} is better: pass --metric-direction higher|lower (or set "
                                "the function's higher_is_better attribute to True or False)")
        label = name or getattr(fn, "metric_name", None) or key.partition(":")[2]
        return MetricSpec("reference", str(label), bool(higher),
                          {"function": key, "args": args, "file": getattr(module, "__file__", None)})
    else:
        raise MpstudioError(f"unknown metric {key!r}: give module:function (a function fn(outputs, reference) -> "
                            f"float on your PYTHONPATH) or a built-in metric: {', '.join(_BUILTIN_NAMES)}")
    ref = f"{__name__}:{fn.__name__}"
    load_metric_function(ref, args)  # the arguments fit the function
    higher = fn.higher_is_better if direction is None else direction == "higher"
    label = name or (f"R@{args['k']}" if fn is recall_at_k else fn.metric_name)
    return MetricSpec("reference", label, higher, {"function": ref, "args": args})


__all__ = ["OUTPUT_SNR", "ErrorAccumulator", "snr_db", "output_agreement", "MetricSpec", "metric_spec",
           "load_metric_function", "metric_value", "BUILTIN_METRICS", "top1_agreement", "output_cosine", "output_snr",
           "ctc_cer", "recall_at_k", "top1_labels", "top1_axis", "check_top1_axis"]
