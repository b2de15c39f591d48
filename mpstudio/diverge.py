"""Divergence triage: for one plan, the first tensors where the HTP and ORT's CPU reference disagree by more
than quantization noise.

Both backends run the plan's QDQ model with intermediate tensors exposed as extra graph outputs, a chunk of
tensors per session (as Polygraphy marks outputs); every tensor is compared in units of its own quantization
step. A tensor *diverges* when the RMS of (HTP - CPU) exceeds `threshold_steps` steps; it is a *first*
divergence when it diverges while every quantized tensor its op reads agrees: the op itself is where the two
backends part, not an upstream difference carried along.

What is exposed is each tensor's DequantizeLinear output, the value its consumers read. Exposing the float
op output before its QuantizeLinear instead breaks the DQ -> op -> Q unit the QNN EP turns into one quantized
HTP op (the op then needs a float kernel, and session creation fails), and every extra graph output is a
tensor the HTP graph must write back to host memory. So tensors are exposed a chunk at a time; each chunk
session also returns the model's own outputs, which are checked against an unmodified HTP run
(`DivergenceReport.perturbed` says when exposing changed them), and a chunk the HTP backend refuses is split
in halves down to single tensors, so one unexposable tensor costs only its own row.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import qdq
from .data import Cancelled, DataSource, Progress
from .errors import MpstudioError
from .graph import ModelGraph, namespace_of
from .metrics import SNR_CAP_DB, ErrorAccumulator
from .plan import BASELINES, PrecisionPlan
from .loop.runners import runner_for

DEFAULT_SAMPLES = 2
DEFAULT_CHUNK = 64
# HTP and ORT's CPU kernels round differently (fixed-point requantization, lookup tables), so equal
# tensors differ by one code in a few percent of elements: well under half a step RMS on the demo's a8w8.
# One step RMS is twice that, and far below what a real difference gives (tens of steps).
DEFAULT_THRESHOLD_STEPS = 1.0
DIVERGENCE_DIR = "divergence"

# Columns of `DivergenceReport.frame` (one row per quantized activation tensor of the plan's QDQ model, in
# topological order):
#   order: position in topological order; tensor: the float model's name; kind: input, activation or output
#   (a graph input or output of the model); op, node, namespace: its producer
#   ("" for a graph input); dtype, step: its encoding (step = scale, the size of one quantization code);
#   exposed: the QDQ model value compared (the tensor's DequantizeLinear output);
#   status: "compared", or why not ("graph input (fed alike)": both backends quantize it on the CPU from
#   the same feed; "htp: ..." when the HTP backend could not expose it);
#   rms_steps, max_steps: RMS and largest |HTP - CPU| in steps, over every element of every sample;
#   mismatch: the share of elements whose codes differ (|HTP - CPU| >= half a step);
#   snr_db (capped at SNR_CAP_DB), cosine: HTP against CPU as reference; max_abs: largest |HTP - CPU|;
#   diverges: rms_steps > the threshold; inputs: the compared tensors its op reads (through unquantized
#   values), ";"-joined; inputs_agree: none of them diverges; first: diverges while its inputs agree;
#   snr_drop_db: the lowest snr_db of its compared inputs minus its own (dB; large where this op widens the
#   gap, useful below a first divergence, where everything diverges; NaN without compared inputs);
#   isolated_rms_steps, isolated_max_steps: the same comparison of the op alone, both backends fed the CPU's
#   codes of its inputs (computed for first divergences and the tensors where the gap widens most; NaN
#   elsewhere); cause: for those, "op" when the op alone diverges (the HTP computes it differently), "inputs"
#   when it does not (the op amplifies its inputs' small differences), "isolation failed: ..." when the op
#   could not be cut out; "" elsewhere;
#   samples: how many samples were compared.
COLUMNS = ["order", "tensor", "kind", "op", "node", "namespace", "dtype", "step", "exposed", "status", "rms_steps",
           "max_steps", "mismatch", "snr_db", "cosine", "max_abs", "diverges", "inputs", "inputs_agree", "first",
           "snr_drop_db", "isolated_rms_steps", "isolated_max_steps", "cause", "samples"]
SUMMARY_COLUMNS = ["tensor", "op", "dtype", "rms_steps", "max_steps", "mismatch", "snr_db", "isolated_rms_steps",
                   "cause", "inputs"]
WIDENING = 5  # tensors below the first divergences, where the gap widens most, also isolated


@dataclass(frozen=True)
class DivergenceReport:
    """The per-tensor comparison of one plan on HTP and on ORT's CPU (`frame`, see COLUMNS).

    `cpu_source` and `htp_source` name where each side ran (the HTP emulator is never called a device);
    `perturbed` lists the chunks whose model outputs differed from a run of the unmodified model on either
    backend (empty: exposing the tensors left both numerics as they are); `chunks` counts the HTP sessions.
    """

    frame: pd.DataFrame
    plan: PrecisionPlan
    model_path: Path
    threshold_steps: float
    samples: int
    chunk_size: int
    chunks: int
    cpu_source: str
    htp_source: str
    perturbed: tuple[int, ...] = ()
    csv_path: Path | None = None
    provider_options: dict = field(default_factory=dict)

    def first(self) -> pd.DataFrame:
        """The first diverging tensors, in topological order."""
        return self.frame[self.frame["first"]].reset_index(drop=True)

    def diverging(self) -> pd.DataFrame:
        return self.frame[self.frame["diverges"]].reset_index(drop=True)

    def describe(self, top: int = 10) -> str:
        """A plain-text summary: what was compared and the first diverging tensors."""
        frame = self.frame
        compared = int((frame["status"] == "compared").sum())  # graph inputs are fed alike, not compared
        lines = [(f"plan {self.plan.name or self.plan.summary()}: {compared} of {len(frame)} tensors compared on "
                  f"{self.samples} sample(s), {self.htp_source} vs {self.cpu_source}, in {self.chunks} HTP "
                  f"session(s) of up to {self.chunk_size} tensors"),
                 (f"{int(frame['diverges'].sum())} tensor(s) differ by more than {self.threshold_steps:g} "
                  f"quantization step(s) RMS; {int(frame['first'].sum())} of them are first divergences "
                  "(their inputs agree)")]
        if self.perturbed:
            lines.append(f"warning: exposing tensors changed the model's outputs in chunk(s) "
                         f"{', '.join(str(c) for c in self.perturbed)}; those tensors' values may not be the "
                         "unmodified model's")
        failed = frame[~frame["status"].isin(["compared", "graph input (fed alike)"])]
        if len(failed):
            lines.append(f"{len(failed)} tensor(s) could not be compared: "
                         f"{', '.join(failed['tensor'].head(5))}{' ...' if len(failed) > 5 else ''}")
        for row in frame[(frame["kind"] == "output") & (frame["status"] == "compared")].itertuples():
            lines.append(f"model output {row.tensor}: {row.rms_steps:.3g} steps RMS, {row.max_steps:.3g} at most, "
                         f"{row.mismatch:.2%} of codes differ, SNR {row.snr_db:.1f} dB")
        first = self.first()
        if first.empty:
            lines.append("no first divergence: HTP and CPU agree within the threshold on every compared tensor")
        else:
            shown = first[SUMMARY_COLUMNS].head(top).rename(columns={"isolated_rms_steps": "isolated"})
            shown["inputs"] = [_short_list(v) for v in shown["inputs"]]
            lines.append("first diverging tensors (rms/max in quantization steps, mismatch = share of codes that "
                         "differ; isolated = the op alone fed the same input codes: cause op = the HTP computes it "
                         "differently, inputs = it amplifies its inputs' small differences):")
            lines.append(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
            if len(first) > top:
                lines.append(f"... and {len(first) - top} more")
        if not first.empty and (first["cause"] == "inputs").all():
            mismatch = dict(zip(frame["tensor"], frame["mismatch"].fillna(0.0)))
            quiet_inputs = np.array([all(mismatch.get(i, 0.0) == 0 for i in inputs.split(";") if i)
                                     for inputs in frame["inputs"]], dtype=bool)
            origin = frame[(frame["mismatch"] > 0).to_numpy() & quiet_inputs]
            if len(origin):
                lines.append("every first divergence is carried from below the threshold; codes first differ at: "
                             + ", ".join(f"{row.tensor} ({row.op}, {row.mismatch:.1%} of codes, "
                                         f"{row.rms_steps:.2f} steps RMS, {row.max_steps:.0f} at most)"
                                         for row in origin.head(5).itertuples()))
        widening = frame[frame["diverges"] & ~frame["first"]].nlargest(WIDENING, "snr_drop_db")
        widening = widening[widening["snr_drop_db"] > 3]
        if len(widening):
            lines.append("below them, the gap widens most at: " + ", ".join(
                f"{row.tensor} ({row.op}, -{row.snr_drop_db:.1f} dB"
                + (f", isolated {row.isolated_rms_steps:.2f} steps: {row.cause}" if row.cause in ("op", "inputs")
                   else "") + ")" for row in widening.itertuples()))
        return "\n".join(lines)


# ---- plans ---------------------------------------------------------------------------------------------------
def resolve_plan(study, plan: str | int | PrecisionPlan | None) -> PrecisionPlan:
    """A plan by id, name (a stored plan's, or a8w8 / a16w8 / a8w8-pc / a16w8-pc), hash prefix or JSON file;
    None: a8w8."""
    if isinstance(plan, PrecisionPlan):
        return plan
    if plan is None:
        return PrecisionPlan.a8w8()
    text = str(plan).strip()
    stored = study.plans() if study is not None else pd.DataFrame(columns=["plan_id", "name"])
    if text.isdigit():
        if study is None:
            raise MpstudioError(f"plan {text!r} is an id, but there is no study to look it up in; give a plan name "
                                f"({', '.join(BASELINES)}) or a plan JSON file")
        return study.plan(int(text))
    named = stored[stored["name"] == text]
    if len(named) == 1:
        return study.plan(int(named["plan_id"].iloc[0]))
    if len(named) > 1:
        raise MpstudioError(f"{len(named)} plans are named {text!r} (ids {', '.join(map(str, named['plan_id']))}); "
                            "give the id")
    if text in BASELINES:
        return BASELINES[text]()
    if text.endswith(".json") or Path(text).is_file():
        if not Path(text).is_file():
            raise MpstudioError(f"plan file not found: {text}")
        return PrecisionPlan.load(text)
    if study is not None and len(text) >= 4 and all(c in "0123456789abcdef" for c in text.lower()):
        try:
            return study.plan(text)
        except MpstudioError:
            pass
    known = [f"{i} ({n})" for i, n in zip(stored["plan_id"].head(20), stored["name"].head(20))]
    raise MpstudioError(f"unknown plan {text!r}: give a plan id or name"
                        + (f" of this study ({', '.join(known)})" if known else "")
                        + f", one of {', '.join(BASELINES)}, or a plan JSON file")


# ---- the comparison ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Target:
    """One tensor to compare: its row's identity and the value exposed."""

    tensor: str
    kind: str  # input / activation / output
    exposed: str
    order: int
    op: str
    node: str
    dtype: str
    step: float
    inputs: tuple[str, ...]


class _Stats:
    """Streamed HTP-vs-CPU statistics of one tensor."""

    def __init__(self, step: float):
        self.step = step
        self.error = ErrorAccumulator(np.float64)
        self.mismatched = 0

    def add(self, cpu: np.ndarray, htp: np.ndarray) -> None:
        cpu = np.asarray(cpu, dtype=np.float64)
        htp = np.asarray(htp, dtype=np.float64)
        if cpu.shape != htp.shape:
            raise MpstudioError(f"the CPU and HTP runs gave shapes {cpu.shape} and {htp.shape} for one tensor")
        self.error.add(cpu, htp)
        self.mismatched += int(np.count_nonzero(np.abs(htp - cpu) >= 0.5 * self.step))

    def row(self) -> dict:
        e = self.error
        rms = math.sqrt(e.mse) if e.count else math.nan
        return {"rms_steps": rms / self.step, "max_steps": e.max_abs / self.step,
                "mismatch": self.mismatched / e.count if e.count else math.nan,
                "snr_db": float(min(e.snr_db, SNR_CAP_DB)), "cosine": e.cosine, "max_abs": e.max_abs}


def _targets(model) -> list[_Target]:
    """Every quantized activation of a QDQ model with its exposed value and the compared tensors its op reads,
    in topological order."""
    read = qdq.read(model)
    order_of = {out: info.order for info in ModelGraph(read.model).nodes.values() for out in info.outputs}
    producer = {out.tensor: op for op in read.ops for out in op.outputs}
    activations = {name: t for name, t in read.activations().items() if t.post and not t.encoding.per_channel}

    def upstream(tensor: str, seen: set[str]) -> list[str]:
        op = producer.get(tensor)
        found: list[str] = []
        for operand in (op.activations if op is not None else ()):
            name = operand.tensor
            if name in seen:
                continue
            seen.add(name)
            found += [name] if name in activations else upstream(name, seen)
        return found

    targets = []
    for name, t in activations.items():
        op = producer.get(name)
        node = op.name if op is not None else ""
        kind = "input" if name in read.graph_inputs else "output" if name in read.graph_outputs else "activation"
        targets.append(_Target(name, kind, t.post, order_of.get(t.post, -1),
                               op.op_type if op is not None else "", node, t.encoding.dtype, t.encoding.step,
                               tuple(dict.fromkeys(upstream(name, {name})))))
    return sorted(targets, key=lambda t: t.order)


def compare(model: str | Path, data: DataSource, *, plan: PrecisionPlan | None = None, samples: int = DEFAULT_SAMPLES,
            chunk_size: int = DEFAULT_CHUNK, threshold_steps: float = DEFAULT_THRESHOLD_STEPS,
            provider_options: dict | None = None, runner=None, tensors: Sequence[str] | None = None,
            progress: Progress | None = None, cancel: threading.Event | None = None) -> DivergenceReport:
    """Compare a QDQ model's tensors on HTP and on ORT's CPU over the first `samples` samples of `data`.

    `runner`: None runs both backends in this process; an AgentClient or AgentPool runs the HTP side there
    (the CPU side always runs here). `tensors` limits the comparison to those tensors (default: all).
    """
    _check_settings(data, samples, chunk_size, threshold_steps)
    model = Path(model)
    read = qdq.read(model)
    if not read.quantized:
        raise MpstudioError(f"{model.name} has no quantized activations; give a QDQ model (or a float model and a "
                            "plan)")
    targets = _selected(_targets(read), tensors)
    data = data.head(min(samples, len(data)))
    options = {"htp_arch": "75", **(provider_options or {})}
    sides = _Sides(runner_for(None), runner_for(runner), options, cancel)
    stats = {t.tensor: _Stats(t.step) for t in targets}
    failed: dict[str, str] = {}
    # Both backends quantize a graph input on the CPU from the same feed (the QNN EP leaves a graph input's
    # QuantizeLinear to ORT), so it agrees by definition; exposed on HTP it reads back unquantized.
    exposable = [t for t in targets if t.kind != "input"]
    pending = [exposable[i:i + chunk_size] for i in range(0, len(exposable), chunk_size)]
    steps = _Steps(len(pending) + 2, progress, cancel)
    with tempfile.TemporaryDirectory(prefix="mpstudio-diverge-") as tmp:
        message = f"comparing {len(exposable)} tensors on htp and cpu, {chunk_size} at a time"
        sessions, perturbed = _compare_chunks(read, model, data, pending, sides, Path(tmp), stats, failed, steps,
                                              message)
        frame = _frame(targets, stats, failed, threshold_steps, len(data))
        chosen = _to_isolate(frame)
        if chosen:
            steps.tick(f"isolating {len(chosen)} op(s) on htp and cpu")
            _isolate(read, {t.tensor: t for t in targets}, chosen, frame, data, sides.here, sides.htp, options,
                     Path(tmp), threshold_steps, cancel)
    if progress:
        progress(steps.total, steps.total, "compared")
    return DivergenceReport(frame, plan or PrecisionPlan(name=model.stem), model, float(threshold_steps), len(data),
                            chunk_size, sessions, sides.here.source("cpu"), sides.htp.source("htp"),
                            tuple(perturbed), provider_options=options)


def _check_settings(data: DataSource, samples: int, chunk_size: int, threshold_steps: float) -> None:
    if samples < 1:
        raise MpstudioError(f"samples must be at least 1, not {samples}")
    if chunk_size < 1:
        raise MpstudioError(f"the chunk size must be at least 1 tensor, not {chunk_size}")
    if not threshold_steps > 0:
        raise MpstudioError(f"the threshold must be a positive number of quantization steps, not {threshold_steps}")
    if len(data) == 0:
        raise MpstudioError(f"{data.name} holds no samples to compare on")


def _selected(targets: list[_Target], tensors: Sequence[str] | None) -> list[_Target]:
    """The targets of `tensors` (all of them when None); a name that is no quantized activation is an error."""
    if tensors is None:
        return targets
    unknown = [t for t in tensors if t not in {x.tensor for x in targets}]
    if unknown:
        raise MpstudioError(f"not quantized activations of this model: {', '.join(unknown[:5])}")
    wanted = set(tensors)
    return [t for t in targets if t.tensor in wanted]


@dataclass(frozen=True)
class _Sides:
    """The two backends of a comparison: `here` runs the CPU side in this process, `htp` the HTP side."""

    here: object
    htp: object
    options: dict
    cancel: threading.Event | None


class _Steps:
    """A comparison's progress: steps done of a total that grows when a chunk is split; checks cancellation."""

    def __init__(self, total: int, progress: Progress | None, cancel: threading.Event | None):
        self.total = total
        self.done = 0
        self._progress = progress
        self._cancel = cancel

    def tick(self, message: str) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled(f"divergence triage cancelled after {self.done} of {self.total} steps")
        if self._progress:
            self._progress(self.done, self.total, message)


def _compare_chunks(read, model: Path, data: DataSource, pending: list[list[_Target]], sides: _Sides, folder: Path,
                    stats: dict[str, _Stats], failed: dict[str, str], steps: _Steps,
                    message: str) -> tuple[int, list[int]]:
    """Compare the `pending` chunks, each exposed as extra outputs of one HTP and one CPU session, into `stats`
    (`failed`: tensors the HTP refuses to expose). Returns (HTP chunk sessions, chunks whose exposure changed
    the model's own outputs)."""
    outputs = list(read.graph_outputs)
    steps.tick(message)
    reference = sides.htp.outputs(model, data, "htp", sides.options, None, sides.cancel)
    cpu_reference = sides.here.outputs(model, data, "cpu", None, None, sides.cancel)
    steps.done += 1
    chunk_index = 0
    sessions = 0
    perturbed: list[int] = []
    while pending:
        chunk = pending.pop(0)
        chunk_index += 1
        steps.tick(message)
        path = folder / f"chunk-{chunk_index}.onnx"
        exposed = [t.exposed for t in chunk]
        path.write_bytes(qdq.with_outputs(read, outputs + [e for e in exposed if e not in outputs]))
        try:
            htp = sides.htp.outputs(path, data, "htp", sides.options, None, sides.cancel)
        except Cancelled:
            raise
        except MpstudioError as exc:
            if len(chunk) > 1:  # find the tensor the HTP backend refuses to expose: halves, down to one
                half = len(chunk) // 2
                pending[:0] = [chunk[:half], chunk[half:]]
                steps.total += 1
                continue
            failed[chunk[0].tensor] = f"htp: {str(exc).splitlines()[0][:200]}"
            steps.done += 1
            continue
        sessions += 1
        cpu = sides.here.outputs(path, data, "cpu", None, None, sides.cancel)
        path.unlink()
        if not (_same_outputs(htp, reference, outputs) and _same_outputs(cpu, cpu_reference, outputs)):
            perturbed.append(chunk_index)
        _accumulate(chunk, cpu, htp, stats, sides.cancel)
        del cpu, htp
        steps.done += 1
    return sessions, perturbed


def _accumulate(chunk: list[_Target], cpu, htp, stats: dict[str, _Stats], cancel: threading.Event | None) -> None:
    """Add each sample's HTP and CPU values of the chunk's tensors to their statistics."""
    for t in chunk:
        for c, h in zip(cpu, htp):
            stats[t.tensor].add(c[t.exposed], h[t.exposed])
        if cancel is not None and cancel.is_set():
            raise Cancelled("divergence triage cancelled")


def _same_outputs(runs, reference, names) -> bool:
    return all(np.array_equal(run[n], ref[n]) for run, ref in zip(runs, reference) for n in names)


def _frame(targets: list[_Target], stats: dict[str, _Stats], failed: dict[str, str], threshold: float,
           samples: int) -> pd.DataFrame:
    rows = []
    for t in targets:
        status = "graph input (fed alike)" if t.kind == "input" else failed.get(t.tensor, "compared")
        row = {"order": t.order, "tensor": t.tensor, "kind": t.kind, "op": t.op, "node": t.node,
               "namespace": namespace_of(t.node) if t.node else "", "dtype": t.dtype, "step": t.step,
               "exposed": t.exposed, "status": status, "inputs": ";".join(t.inputs), "samples": samples}
        if status != "compared" or stats[t.tensor].error.count == 0:
            row.update({"rms_steps": math.nan, "max_steps": math.nan, "mismatch": math.nan, "snr_db": math.nan,
                        "cosine": math.nan, "max_abs": math.nan})
        else:
            row.update(stats[t.tensor].row())
        rows.append(row)
    derived = ("diverges", "inputs_agree", "first", "snr_drop_db", "isolated_rms_steps", "isolated_max_steps", "cause")
    frame = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in derived])
    frame["order"] = range(len(frame))
    frame["diverges"] = frame["rms_steps"] > threshold  # NaN (not compared) is not a divergence
    diverging = set(frame.loc[frame["diverges"], "tensor"])
    frame["inputs_agree"] = [not any(i in diverging for i in inputs.split(";") if i) for inputs in frame["inputs"]]
    frame["first"] = frame["diverges"] & frame["inputs_agree"]
    snr = dict(zip(frame["tensor"], frame["snr_db"]))
    worst_input = [min((snr[i] for i in inputs.split(";") if i and np.isfinite(snr.get(i, np.nan))), default=np.nan)
                   for inputs in frame["inputs"]]
    frame["snr_drop_db"] = np.asarray(worst_input, dtype=float) - frame["snr_db"].to_numpy(float)
    frame["isolated_rms_steps"] = np.nan
    frame["isolated_max_steps"] = np.nan
    frame["cause"] = ""
    return frame[COLUMNS]


def _to_isolate(frame: pd.DataFrame) -> list[str]:
    """The first divergences and, below them, the tensors where the gap widens most."""
    first = frame.loc[frame["first"], "tensor"].tolist()
    widening = frame[frame["diverges"] & ~frame["first"] & (frame["snr_drop_db"] > 3)].nlargest(WIDENING, "snr_drop_db")
    return [t for t in frame["tensor"] if t in set(first) | set(widening["tensor"]) and frame.loc[
        frame["tensor"] == t, "inputs"].iloc[0]]


def _isolate(read, targets: dict, chosen: list[str], frame: pd.DataFrame, data: DataSource, here, htp_runs,
             options: dict, tmp: Path, threshold: float, cancel) -> None:
    """Run each chosen tensor's op alone on both backends, fed the CPU's codes of its inputs, into `frame`.

    The op is cut out of the QDQ model from its inputs' QuantizeLinear inputs to its own DequantizeLinear
    output, so both backends quantize the same float values (on grid: the CPU's dequantized codes) and run
    the same Q/DQ unit.
    """
    import onnx
    from onnx import TensorProto, helper
    from onnx.utils import Extractor

    from .data import FeedList

    activations = read.activations()
    needed = list(dict.fromkeys(i for t in chosen for i in targets[t].inputs))
    try:
        inferred = onnx.shape_inference.infer_shapes(read.model)
        # ONNX's inference leaves out some values (16-bit Q/DQ at older opsets); the cut needs a type for its
        # inputs and outputs, which are all float.
        known = {v.name for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
        ends = [activations[i].pre for i in needed] + [targets[t].exposed for t in chosen]
        inferred.graph.value_info.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                                         for name in dict.fromkeys(ends) if name not in known)
        extractor = Extractor(inferred)
    except Exception as exc:  # noqa: BLE001 - ONNX's checker and inference raise many types; the row says why
        frame.loc[frame["tensor"].isin(chosen), "cause"] = f"isolation failed: {str(exc).splitlines()[0][:120]}"
        return
    path = tmp / "inputs.onnx"
    path.write_bytes(qdq.with_outputs(read, [activations[i].post for i in needed]))
    inputs = here.outputs(path, data, "cpu", None, None, cancel)
    for tensor in chosen:
        row = frame.index[frame["tensor"] == tensor][0]
        names = targets[tensor].inputs
        try:
            sub = extractor.extract_model([activations[i].pre for i in names], [targets[tensor].exposed])
            cut = tmp / "isolated.onnx"
            onnx.save(sub, cut)
            feeds = FeedList([{activations[i].pre: run[activations[i].post] for i in names} for run in inputs],
                             f"CPU codes of the inputs of {tensor}")
            cpu = here.outputs(cut, feeds, "cpu", None, None, cancel)
            htp = htp_runs.outputs(cut, feeds, "htp", options, None, cancel)
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - an op that cannot be cut out or run alone keeps its row
            frame.loc[row, "cause"] = f"isolation failed: {str(exc).splitlines()[0][:120]}"
            continue
        stats = _Stats(targets[tensor].step)
        for c, h in zip(cpu, htp):
            stats.add(c[targets[tensor].exposed], h[targets[tensor].exposed])
        isolated = stats.row()
        frame.loc[row, ["isolated_rms_steps", "isolated_max_steps"]] = [isolated["rms_steps"], isolated["max_steps"]]
        frame.loc[row, "cause"] = "op" if isolated["rms_steps"] > threshold else "inputs"


# ---- studies -------------------------------------------------------------------------------------------------
def report_path(study, plan_id: int) -> Path:
    """Where a study keeps the divergence table of one of its plans."""
    return Path(study.folder) / DIVERGENCE_DIR / f"plan-{plan_id}.csv"


def diverge(study, plan: str | int | PrecisionPlan | None = None, *, samples: int = DEFAULT_SAMPLES,
            chunk_size: int = DEFAULT_CHUNK, threshold_steps: float = DEFAULT_THRESHOLD_STEPS, runner=None,
            progress: Progress | None = None, cancel: threading.Event | None = None) -> DivergenceReport:
    """Divergence triage of a study's plan (id, name, hash, PrecisionPlan; default a8w8) on its evaluation data.

    The plan is stored in the study; the table is written to `STUDY/divergence/plan-ID.csv` with a `.json`
    beside it saying how it was made.
    """
    chosen = resolve_plan(study, plan)
    plan_id = study.add_plan(chosen, "diverge")
    chosen = study.plan(plan_id)
    path = study.quantizer.generate(chosen, progress, cancel)
    report = compare(path, study.evaluation_data, plan=chosen, samples=samples, chunk_size=chunk_size,
                     threshold_steps=threshold_steps, provider_options={"htp_arch": study.htp_arch}, runner=runner,
                     progress=progress, cancel=cancel)
    out = report_path(study, plan_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    report.frame.to_csv(tmp, index=False)
    tmp.replace(out)
    out.with_suffix(".json").write_text(json.dumps({
        "plan_id": plan_id, "plan_hash": chosen.hash, "plan_name": chosen.name, "samples": report.samples,
        "chunk_size": chunk_size, "chunks": report.chunks, "threshold_steps": threshold_steps,
        "cpu_source": report.cpu_source, "htp_source": report.htp_source, "perturbed": list(report.perturbed),
        "provider_options": report.provider_options}, indent=2) + "\n")
    return DivergenceReport(report.frame, chosen, path, report.threshold_steps, report.samples, chunk_size,
                            report.chunks, report.cpu_source, report.htp_source, report.perturbed, out,
                            report.provider_options)


def load_report(study, plan_id: int) -> pd.DataFrame | None:
    """The divergence table a study keeps for a plan (see COLUMNS), or None when it has none."""
    path = report_path(study, plan_id)
    if not path.exists():
        return None
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    for column in ("inputs", "cause", "op", "node", "namespace"):
        frame[column] = frame[column].fillna("").astype(str)
    return frame


def _short_list(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[:width - 1] + "\u2026"


__all__ = ["COLUMNS", "DEFAULT_CHUNK", "DEFAULT_SAMPLES", "DEFAULT_THRESHOLD_STEPS", "DivergenceReport", "compare",
           "diverge", "load_report", "report_path", "resolve_plan"]
