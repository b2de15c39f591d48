"""Isolation scores: the output metric when one tensor (or region) alone is promoted to 16 bits from the
all-8-bit plan, and when it alone stays at 8 bits in the all-16-bit plan.

Regenerating a QDQ model and opening a session per candidate costs about a second each. Instead, the
all-8-bit QDQ model is turned once into a *switchable* model: every activation QuantizeLinear/
DequantizeLinear pair becomes Clip -> QuantizeLinear(uint16) -> DequantizeLinear whose range, scale and zero
point are graph inputs. Feeding a tensor's 8-bit parameters (with the Clip at the 8-bit range) reproduces
8-bit quantization exactly; feeding its 16-bit parameters promotes it. One session then evaluates any
promotion. What the switchable model leaves out: the 16-bit constants ORT's QNN config gives element-wise
ops next to a promoted tensor (weights keep their all-8-bit quantization), and integer kernel rounding.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
from onnx import TensorProto, helper

from ..data import Cancelled, DataSource, Feed, Progress, TaskMetric
from ..errors import MpstudioError
from . import qdq
from .stats import ErrorAccumulator

_MS_DOMAIN = "com.microsoft"  # ORT's contrib QuantizeLinear takes uint16 at any opset


@dataclass(frozen=True)
class OutputMetric:
    """How a set of model outputs is scored against the float model's: higher is better unless said otherwise."""

    name: str
    higher_is_better: bool


OUTPUT_SNR = OutputMetric("output SNR (dB)", True)


class SwitchableModel:
    """The all-8-bit QDQ model with every activation's bit width chosen at run time (see module docstring)."""

    def __init__(self, qdq_model_8, params_16: Mapping[str, qdq.QuantParams], threads: int | None = None):
        model = qdq.load(qdq_model_8)
        self.quantized = qdq.quantized_tensors(model)
        self.tensors: list[str] = list(self.quantized)
        self.params_8 = {t: q.params for t, q in self.quantized.items()}
        # A tensor the 16-bit model does not quantize keeps its 8-bit parameters in both settings.
        self.params_16 = {t: params_16.get(t, self.params_8[t]) for t in self.tensors}
        self._output_followers = self._graph_output_followers(model)
        self.model = self._rewrite(model)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.threads = threads or 1
        # Samples run concurrently, one thread each: better use of the cores than intra-op threads on
        # the small tensors of a mobile model.
        options.intra_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(self.model.SerializeToString(), options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise MpstudioError(f"ONNX Runtime could not open the switchable model: {exc}") from exc
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._feeds_8 = self._param_feeds(self.params_8)
        self._feeds_16 = self._param_feeds(self.params_16)

    def _rewrite(self, model: onnx.ModelProto) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        graph = out.graph
        by_q = {q.quantize_node: q for q in self.quantized.values()}
        dq_of = {q.post for q in self.quantized.values()}
        nodes = []
        for index, node in enumerate(graph.node):
            name = node.name or f"QuantizeLinear_{index}"
            if node.op_type == "QuantizeLinear" and name in by_q:
                t = by_q[name]
                p = _input_names(t.name)
                nodes += [
                    helper.make_node("Clip", [t.pre, p["lo"], p["hi"]], [p["clipped"]], name=f"{p['prefix']}Clip"),
                    helper.make_node("QuantizeLinear", [p["clipped"], p["scale"], p["zp"]], [p["q"]],
                                     name=f"{p['prefix']}Quantize", domain=_MS_DOMAIN),
                    helper.make_node("DequantizeLinear", [p["q"], p["scale"], p["zp"]], [t.post],
                                     name=f"{p['prefix']}Dequantize", domain=_MS_DOMAIN),
                ]
                continue
            if node.op_type == "DequantizeLinear" and node.output[0] in dq_of:
                continue
            nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
        for t in self.tensors:
            p = _input_names(t)
            for key in ("lo", "hi", "scale"):
                graph.input.append(helper.make_tensor_value_info(p[key], TensorProto.FLOAT, []))
            graph.input.append(helper.make_tensor_value_info(p["zp"], TensorProto.UINT16, []))
        if not any(op.domain == _MS_DOMAIN for op in out.opset_import):
            out.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
        return out

    def _graph_output_followers(self, model: onnx.ModelProto) -> dict[str, set[str]]:
        """Tensor -> graph outputs computed directly from it. ORT's QNN config makes a node that reads a
        16-bit tensor compute at 16 bits; its output is converted back to 8 bits for 8-bit consumers, but a
        graph output has none, so it stays 16-bit: promoting the tensor promotes that output too."""
        outputs = {o.name for o in model.graph.output}
        by_post = {q.post: t for t, q in self.quantized.items()}
        by_pre = {q.pre: t for t, q in self.quantized.items() if q.post in outputs}
        followers: dict[str, set[str]] = {}
        for node in model.graph.node:
            produced = [by_pre[o] for o in node.output if o in by_pre]
            if not produced:
                continue
            for name in node.input:
                if name in by_post:
                    followers.setdefault(by_post[name], set()).update(produced)
        return followers

    def effective(self, sixteen) -> frozenset[str]:
        """The tensors a QNN-valid plan promoting `sixteen` quantizes at 16 bits (see above)."""
        extra = set().union(*(self._output_followers.get(t, set()) for t in sixteen)) if sixteen else set()
        return frozenset(sixteen) | extra

    @staticmethod
    def _param_feeds(table: Mapping[str, qdq.QuantParams]) -> dict[str, dict[str, np.ndarray]]:
        feeds = {}
        for t, params in table.items():
            p = _input_names(t)
            lo, hi = params.clip_range
            feeds[t] = {
                p["lo"]: np.array(lo, np.float32), p["hi"]: np.array(hi, np.float32),
                p["scale"]: np.array(params.scale, np.float32),
                p["zp"]: np.array(params.zero_point - params.qmin, np.uint16),
            }
            if params.qmin != 0:
                raise MpstudioError(f"{t!r} is quantized to signed {params.dtype}; HTP activations are unsigned")
        return feeds

    def parameter_feed(self, sixteen: set[str] | frozenset[str]) -> Feed:
        """Graph inputs selecting 16 bits for the tensors in `sixteen` and 8 bits for the others."""
        feed: Feed = {}
        for t in self.tensors:
            feed.update(self._feeds_16[t] if t in sixteen else self._feeds_8[t])
        return feed

    def run(self, sample: Feed, sixteen: set[str] | frozenset[str]) -> list[np.ndarray]:
        """The model's outputs with `sixteen` (and what a QNN-valid plan promotes with it) at 16 bits."""
        return self.session.run(self.output_names, {**sample, **self.parameter_feed(self.effective(sixteen))})


def _input_names(tensor: str) -> dict[str, str]:
    prefix = f"mpstudio_switch/{tensor}/"
    return {"prefix": prefix, "lo": prefix + "lo", "hi": prefix + "hi", "scale": prefix + "scale",
            "zp": prefix + "zero_point", "clipped": prefix + "clipped", "q": prefix + "quantized"}


class OutputScorer:
    """Scores a configuration's outputs over the evaluation samples: output SNR, or a task metric."""

    def __init__(self, references: Sequence[list[np.ndarray]], output_names: Sequence[str],
                 metric: TaskMetric | None = None):
        self.references, self.output_names, self.metric = list(references), list(output_names), metric

    @property
    def higher_is_better(self) -> bool:
        return self.metric.higher_is_better if self.metric else True

    @property
    def name(self) -> str:
        return self.metric.name if self.metric else OUTPUT_SNR.name

    def score(self, outputs: Sequence[list[np.ndarray]]) -> float:
        if self.metric is not None:
            return self.metric([dict(zip(self.output_names, o)) for o in outputs])
        acc = ErrorAccumulator()
        for reference, values in zip(self.references, outputs):
            for r, v in zip(reference, values):
                acc.add(r, v)
        return acc.snr_db

    def gain(self, value: float, baseline: float) -> float:
        """How much better `value` is than `baseline`, positive when better, in the metric's units."""
        return (value - baseline) if self.higher_is_better else (baseline - value)


def float_references(float_model, data: DataSource, output_names: Sequence[str]) -> list[list[np.ndarray]]:
    """The float model's outputs for every sample (small: the model outputs only)."""
    from ..runtime import create_session

    session = create_session(qdq.model_path_or_bytes(float_model))
    return [session.run(list(output_names), feed) for feed in data.feeds()]


# Columns of `isolation_scores` (one row per candidate: a tensor or a region):
#   region, source (tensor/namespace/qnn/selection/...), tensors (how many activation tensors), members
#   (their names, joined by ";"), promoted (metric with only this region at 16 bits in the all-8-bit plan),
#   promoted_gain (its improvement over all-8-bit, positive = better), demoted (metric with only this region
#   at 8 bits in the all-16-bit plan), demoted_loss (its loss against all-16-bit, positive = worse).
ISOLATION_COLUMNS = ["region", "source", "tensors", "members", "promoted", "promoted_gain", "demoted", "demoted_loss"]


@dataclass(frozen=True)
class Region:
    """A named group of activation tensors that is promoted or demoted together."""

    name: str
    tensors: tuple[str, ...]
    source: str = "tensor"


@dataclass(frozen=True)
class IsolationResult:
    """Isolation scores with the two baselines they are measured from."""

    scores: pd.DataFrame  # ISOLATION_COLUMNS
    metric: str
    higher_is_better: bool
    all_8: float
    all_16: float
    samples: int


def isolation_scores(
    switchable: SwitchableModel,
    data: DataSource,
    regions: Sequence[Region],
    scorer: OutputScorer,
    both_directions: bool = True,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> IsolationResult:
    """Evaluate each region promoted alone (and, if `both_directions`, demoted alone) on `data`."""
    samples = list(data.feeds())  # the evaluation subset is small; every configuration reuses it
    everything = frozenset(switchable.tensors)
    configs: list[frozenset[str]] = [frozenset(), everything]
    for region in regions:
        members = frozenset(region.tensors) & everything
        configs.append(members)
        if both_directions:
            configs.append(everything - members)
    total = len(configs)
    done = [0]
    lock = threading.Lock()

    def evaluate(config: frozenset[str]) -> float:
        if cancel is not None and cancel.is_set():
            raise Cancelled("isolation scoring cancelled")
        value = scorer.score([switchable.run(s, config) for s in samples])
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], total, "isolation scores")
        return value

    workers = max(1, switchable.threads)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        values = list(pool.map(evaluate, configs))
    all_8, all_16 = values[0], values[1]
    rows = []
    position = 2
    for region in regions:
        promoted = values[position]
        position += 1
        demoted = np.nan
        if both_directions:
            demoted = values[position]
            position += 1
        rows.append({
            "region": region.name, "source": region.source, "tensors": len(set(region.tensors) & everything),
            "members": ";".join(region.tensors), "promoted": promoted,
            "promoted_gain": scorer.gain(promoted, all_8),
            "demoted": demoted, "demoted_loss": scorer.gain(all_16, demoted) if both_directions else np.nan,
        })
    return IsolationResult(pd.DataFrame(rows, columns=ISOLATION_COLUMNS), scorer.name, scorer.higher_is_better,
                           all_8, all_16, len(samples))


def tensor_regions(tensors: Sequence[str]) -> list[Region]:
    return [Region(t, (t,), "tensor") for t in tensors]
