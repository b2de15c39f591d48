"""Load, validate and prepare an ONNX model for quantization: static shapes, folded constants, QNN report."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import uuid
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnx.version_converter
from onnx import helper

from .errors import MpstudioError, brief
from .graph import ModelGraph, node_display_name
from .float16 import float16_to_float32
from .model_file import check_model, load_model, refuse_over_protobuf_limit
from .qnn_probe import verify_support
from .qnn_support import FALLBACK, SupportIssue, check_qnn_support, summarize
from .attention_rewrites import drop_softmax_nan_guards, gather_nd_in_order_to_reshape
from .rank_rewrites import lower_high_rank_transposes
from .rewrites import RewriteResult, rewrite_for_htp

# ORT's quantization tools look for this metadata to know the model was pre-processed.
_PREPROCESSED_KEY = "onnx.quant.pre_process"
_STEPS_KEY = "mpstudio.preparation"


@dataclass(frozen=True)
class TensorSpec:
    """Name, static shape and numpy dtype of a model input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def describe(self) -> str:
        # An axis ONNX knows no size of reads 0 here (a symbolic or unknown dimension): shown as "?".
        return f"{self.name}: {self.dtype}[{', '.join(str(d) if d else '?' for d in self.shape)}]"


@dataclass(frozen=True)
class PreparedModel:
    """A float model ready for quantization, and what preparing it did and found."""

    model: onnx.ModelProto = field(repr=False)
    source: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    steps: tuple[str, ...]
    support_issues: tuple[SupportIssue, ...]
    sha256: str
    rewrites: tuple[RewriteResult, ...] = ()  # what this preparation rewrote (also among `steps`)

    @functools.cached_property
    def graph(self) -> ModelGraph:
        return ModelGraph(self.model)

    @property
    def qnn_ready(self) -> bool:
        """True when no node is expected to fall back to CPU on the QNN EP."""
        return not any(issue.severity == FALLBACK for issue in self.support_issues)

    @property
    def fallback_nodes(self) -> tuple[str, ...]:
        """The nodes expected to run on ORT's CPU EP instead of QNN HTP, in graph order."""
        return tuple(dict.fromkeys(i.node for i in self.support_issues if i.severity == FALLBACK))

    def fallback_refusal(self) -> str:
        """Why a study refuses this model (nodes QNN HTP would leave to the CPU), and what to do about it."""
        issues = [i for i in self.support_issues if i.severity == FALLBACK]
        shown = [f"  {i.node} [{i.op_type}]: {i.reason}" for i in issues[:_REFUSAL_SHOWN]]
        if len(issues) > _REFUSAL_SHOWN:
            shown.append(f"  ... and {len(issues) - _REFUSAL_SHOWN} more (mpstudio prepare MODEL lists them all)")
        rewrites = ("mpstudio's rewrites (" + ", ".join(r.name for r in self.rewrites) + ") did not remove them"
                    if self.rewrites else "none of mpstudio's rewrites (on unless prepare_model(..., rewrite=False); "
                    "the README's Rewrites lists them) applies to them")
        return (f"{len(self.fallback_nodes)} node(s) of {self.source} would not run on QNN HTP:\n" + "\n".join(shown)
                + f"\n{rewrites}. Re-export the model without these ops, or accept them on ORT's CPU EP with "
                "Study.create(..., allow_fallback=True) (command line: --allow-fallback): HTP evaluations then run "
                "those nodes on the CPU and every HTP accuracy and latency says \"HTP + N nodes on CPU\".")

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")  # other processes may save it too
        onnx.save(self.model, tmp)
        os.replace(tmp, path)
        return path

    def report(self) -> str:
        """The preparation and QNN support report, as text for a terminal."""
        g = self.graph
        ops = Counter(node.op_type for node in g.nodes.values())
        lines = [
            f"model: {self.source}",
            f"sha256: {self.sha256}",
            f"inputs: {'; '.join(s.describe() for s in self.inputs)}",
            f"outputs: {'; '.join(s.describe() for s in self.outputs)}",
            f"nodes: {len(g.nodes)}  activations: {len(g.activations())}  weights: {len(g.weights())}",
            "ops: " + ", ".join(f"{op} {n}" for op, n in ops.most_common()),
            "preparation:",
            *(f"  - {step}" for step in self.steps),
        ]
        lines += summarize(list(self.support_issues)).splitlines()
        if not self.qnn_ready:
            lines.append(FALLBACK_HINT)
        return "\n".join(lines)


_REFUSAL_SHOWN = 10
FALLBACK_HINT = (
    "to run it anyway, accept these nodes on ORT's CPU EP: Study.create(..., allow_fallback=True) or "
    "--allow-fallback on the command line (every HTP number is then labelled with the nodes on CPU); or "
    "re-export the model without them")


def prepare_model(
    source: str | os.PathLike | onnx.ModelProto | bytes,
    input_shapes: dict[str, list[int] | tuple[int, ...]] | None = None,
    *,
    optimize: bool = True,
    rewrite: bool = True,
    verify: bool | None = None,
) -> PreparedModel:
    """Validate and prepare a float model for QDQ quantization on the QNN EP.

    Steps: check the model; bring its IR version to one ONNX Runtime accepts; fix dynamic input shapes
    from `input_shapes` (or refuse, naming each dynamic input); fold `Constant` nodes and constant
    subgraphs into initializers (ORT's basic graph optimizations, as ORT's own pre-processing does);
    name unnamed nodes; with `rewrite`, rewrite exporter patterns QNN HTP does not run or quantizes badly
    (`mpstudio.rewrites`: exact Erf-GELU to Gelu, attention-mask sentinels such as -3.4e38 to -100;
    `mpstudio.attention_rewrites`: the NaN guard after an attention Softmax and the GatherND that reads a mask
    in order; `mpstudio.rank_rewrites`: rank-6 window transposes), each named among the steps; infer shapes;
    report nodes QNN's HTP backend would not take. Nodes the documentation does not settle are probed on the HTP
    (`mpstudio.qnn_probe`, verdicts cached per toolchain) unless `verify` is False, else reported as unverified.
    """
    refuse_over_protobuf_limit(source)
    model = onnx.ModelProto()
    model.CopyFrom(load_model(source))
    name = str(source) if isinstance(source, (str, os.PathLike)) else model.graph.name or "model"
    # A model mpstudio prepared before says so in its metadata; keep that history in the report.
    earlier = metadata(model).get(_STEPS_KEY)
    steps: list[str] = [f"earlier: {step}" for step in (json.loads(earlier) if earlier else [])]

    steps += _lower_ir_version(model)

    check_model(model, source)
    steps += float16_to_float32(model)

    steps += _fix_input_shapes(model, input_shapes or {})

    steps += _raise_opset(model)

    steps += _name_unnamed_nodes(model)

    if optimize:
        try:
            model, folded = _fold_constants(model)
        except MpstudioError as exc:
            raise _shape_hint(exc, input_shapes) from exc
        steps += folded

    if rewrite:
        torch_attention = (drop_softmax_nan_guards(model), gather_nd_in_order_to_reshape(model),
                           lower_high_rank_transposes(model))
        rewrites = tuple(rewrite_for_htp(model)) + tuple(r for r in torch_attention if r is not None)
    else:
        rewrites = ()
    steps += [result.step for result in rewrites]
    # ORT's optimizations expand function ops (HardSwish into HardSigmoid and Mul) into unnamed nodes.
    steps += _name_unnamed_nodes(model, "nodes the optimizations and rewrites left unnamed (function ops expanded)")

    unshared = _unshare_small_initializers(model)
    if unshared:
        steps.append(f"gave each consumer its own copy of {unshared} small shared initializers, so each "
                     "node's constant can take its own precision")

    model, inferred = _infer_shapes(model)
    steps += inferred
    return _prepared(model, name, steps, rewrites, verify)


def _lower_ir_version(model: onnx.ModelProto) -> list[str]:
    """Lower an IR version newer than this ONNX Runtime loads (in place); the step it took, if any."""
    max_ir = ort_max_ir_version()
    if model.ir_version > max_ir:
        message = f"IR version {model.ir_version} lowered to {max_ir}, the newest ONNX Runtime accepts"
        model.ir_version = max_ir
        return [message]
    return []


def _name_unnamed_nodes(model: onnx.ModelProto, which: str = "unnamed nodes") -> list[str]:
    """Name each unnamed node after its op type, a name no other node has (in place); the step it took, if any.
    ORT's quantizer refuses a model with an unnamed node ("does not have a name!") as soon as a plan has
    overrides."""
    taken = {node.name for node in model.graph.node if node.name}
    unnamed = 0
    for index, node in enumerate(model.graph.node):
        if not node.name:
            name = stem = node_display_name(node, index)
            suffix = 1
            while name in taken:
                name, suffix = f"{stem}_{suffix}", suffix + 1
            node.name = name
            taken.add(name)
            unnamed += 1
    return [f"named {unnamed} {which} after their op type"] if unnamed else []


def _fold_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with constants folded by ONNX Runtime's basic optimizations, and the steps that says."""
    steps = []
    constants = sum(1 for n in model.graph.node if n.op_type == "Constant")
    before = len(model.graph.node)
    gelus = sum(1 for n in model.graph.node if n.op_type == "Gelu")
    model = _ort_basic_optimize(model)
    _rename_fusion_shapes(model)
    steps.append(
        f"folded constants with ONNX Runtime's basic optimizations ({constants} Constant nodes, "
        f"{before} -> {len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers)"
    )
    fused = sum(1 for n in model.graph.node if n.op_type == "Gelu") - gelus
    if fused > 0:  # from opset 20 ORT fuses exact Erf-GELU itself
        steps.append(f"ONNX Runtime's optimizations fused {fused} exact GELU subgraph(s) into Gelu (ONNX opset "
                     "20), which QNN HTP runs (QNN has no Erf)")
    return model, steps


def _rename_fusion_shapes(model: onnx.ModelProto) -> None:
    """Give the shape constants ONNX Runtime's MatMul+Add fusion wrote (`gemm_input_shape`, ...) names of their
    own: a session's optimizer fusing the same way again names its new constants the same, and ONNX Runtime
    then refuses the model ("Attempt to replace the existing tensor"; the float model of a torch-exported BERT)."""
    renamed = {t.name: f"folded/{t.name}" for t in model.graph.initializer
               if t.name.startswith(("gemm_input_shape", "gemm_output_shape"))}
    for tensor in model.graph.initializer:
        tensor.name = renamed.get(tensor.name, tensor.name)
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)


def _infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with inferred shapes (strict), and the steps: the inference, and tensors still unshaped."""
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise MpstudioError(f"shape inference failed: {brief(exc)}") from exc
    steps = ["inferred shapes"]
    unknown = _tensors_without_static_shape(model)
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        steps.append(f"{len(unknown)} tensors still have no static shape: {shown}")
    return model, steps


def _prepared(model: onnx.ModelProto, name: str, steps: list[str],
              rewrites: tuple[RewriteResult, ...], verify: bool | None = None) -> PreparedModel:
    """Mark the model prepared (its metadata keeps the steps) and describe it: specs, QNN support, sha256."""
    _set_metadata(model, _PREPROCESSED_KEY, "1")
    _set_metadata(model, _STEPS_KEY, json.dumps([s.removeprefix("earlier: ") for s in steps]))
    issues = tuple(verify_support(model, check_qnn_support(model), verify=verify))
    serialized = model.SerializeToString()
    return PreparedModel(
        model=model,
        source=name,
        inputs=_specs(model.graph.input, {i.name for i in model.graph.initializer}),
        outputs=_specs(model.graph.output, set()),
        steps=tuple(steps),
        support_issues=issues,
        sha256=hashlib.sha256(serialized).hexdigest(),
        rewrites=rewrites,
    )


def parse_shape_args(items: list[str] | None) -> dict[str, list[int]]:
    """`["x=1,3,48,320"]` -> `{"x": [1, 3, 48, 320]}`, for the command line."""
    shapes: dict[str, list[int]] = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            raise MpstudioError(f"bad --shape {item!r}: write NAME=D1,D2,... such as x=1,3,224,224") from None
    return shapes


@functools.lru_cache(maxsize=1)
def ort_max_ir_version() -> int:
    """The newest ONNX IR version this ONNX Runtime loads (probed once with a one-node model)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    for ir in range(onnx.IR_VERSION, 6, -1):
        probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir)
        try:
            ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
            return ir
        except Exception:
            continue
    return 7


def _shape_hint(exc: MpstudioError, input_shapes: dict | None) -> MpstudioError:
    """`exc` with the shapes given named when ONNX Runtime's shape inference refused them: the message alone
    names a node deep inside the model, not the user's choice that caused it."""
    if not input_shapes or "ShapeInferenceError" not in str(exc):
        return exc
    given = " ".join(f"--shape {name}={','.join(str(d) for d in dims)}" for name, dims in input_shapes.items())
    if "Graph attribute inferencing failed" in str(exc):  # inside an If/Loop/Scan body, whatever the shape
        return MpstudioError(f"{exc}. ONNX Runtime's shape inference failed inside the subgraph of a control-flow node "
                             f"(If, Loop or Scan) with the shapes given ({given}), which QNN HTP cannot run in any case: "
                             "export the model without control flow (the branch your inputs take) and prepare that")
    return MpstudioError(f"{exc}. The model cannot take the input shape given ({given}): choose another; a network "
                         "that downsamples and upsamples again (a detector, a segmenter) usually needs each spatial "
                         "size to be a multiple of its total stride (often 32)")


def _fix_input_shapes(model: onnx.ModelProto, input_shapes: dict) -> list[str]:
    initializers = {i.name for i in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    unknown = [name for name in input_shapes if name not in inputs]
    if unknown:
        raise MpstudioError(
            f"shapes were given for {', '.join(map(repr, unknown))}, which the model does not have as inputs; "
            f"its inputs are {', '.join(map(repr, inputs))}"
        )
    steps, dynamic = [], []
    for name, vi in inputs.items():
        dims = vi.type.tensor_type.shape.dim
        shown = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?") for d in dims]
        static = vi.type.tensor_type.HasField("shape") and all(isinstance(d, int) for d in shown)
        if name in input_shapes:
            wanted = [int(d) for d in input_shapes[name]]
            if vi.type.tensor_type.HasField("shape") and len(wanted) != len(dims):
                raise MpstudioError(
                    f"input {name!r} has rank {len(dims)} ({shown}) but the given shape {wanted} has rank {len(wanted)}"
                )
            for d, want in zip(shown, wanted):
                if isinstance(d, int) and d != want:
                    raise MpstudioError(f"input {name!r} has fixed dimension {d} where the given shape says {want}")
            if any(w <= 0 for w in wanted):
                raise MpstudioError(f"the shape given for {name!r} must be all positive integers, got {wanted}")
            vi.type.tensor_type.ClearField("shape")
            for want in wanted:
                vi.type.tensor_type.shape.dim.add().dim_value = want
            if not static or shown != wanted:
                steps.append(f"fixed input {name} from {shown} to {wanted}")
        elif not static:
            dynamic.append(f"{name} {shown}")
    if dynamic:
        example = " ".join(f"--shape {d.split(' ')[0]}=..." for d in dynamic)
        raise MpstudioError(
            "the QNN HTP backend needs static shapes, and these inputs are dynamic: "
            + "; ".join(dynamic)
            + f". Give each a concrete shape: on the command line `{example}`, in Python "
            "`prepare_model(path, input_shapes={name: [d1, d2, ...]})`."
        )
    if steps:
        # Intermediate shapes recorded for the old input shapes would contradict the new ones.
        del model.graph.value_info[:]
        for out in model.graph.output:
            if out.type.tensor_type.HasField("shape"):
                out.type.tensor_type.ClearField("shape")
    return steps


# Per-channel DequantizeLinear (its `axis` attribute) needs opset 13.
MIN_OPSET = 13


def _raise_opset(model: onnx.ModelProto) -> list[str]:
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= MIN_OPSET:
        return []
    try:
        converted = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:
        return [f"kept opset {opset}: converting to {MIN_OPSET} failed ({brief(exc)}); per-channel weights need {MIN_OPSET}"]
    model.CopyFrom(converted)
    return [f"converted opset {opset} to {MIN_OPSET} (per-channel quantization needs it)"]


def _ort_basic_optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant folding and simple fusions (BatchNorm into Conv, ...), all in standard ONNX ops."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="mpstudio-prep-") as tmp:
        out = Path(tmp) / "optimized.onnx"
        so.optimized_model_filepath = str(out)
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise MpstudioError(f"ONNX Runtime cannot load the model: {brief(exc)}") from exc
        optimized = onnx.load(str(out))
    _rename_clashing_initializers(optimized, model)
    # ORT writes its own IR and opset imports; keep the producer's metadata.
    del optimized.metadata_props[:]
    optimized.metadata_props.extend(model.metadata_props)
    optimized.ir_version = min(optimized.ir_version, model.ir_version) or model.ir_version
    return optimized


def _rename_clashing_initializers(optimized: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Give the constants ORT's fusions named generically ("gemm_input_shape") a name of their own when needed.

    A later ORT session on the prepared model (the extended optimizations every session runs) can fuse again
    and write a constant of the same generic name, and then fails to load the model ("Attempt to replace the
    existing tensor"); seen on transformer MatMul+Add pairs. Models that load as they are keep their names.
    """
    known = {t.name for t in original.graph.initializer} | {o for n in original.graph.node for o in n.output}
    made = [t for t in optimized.graph.initializer if t.name not in known and "/" not in t.name]
    if not made:
        return
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(optimized.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return
    except Exception:
        pass  # renamed below; if the model still fails, the next session says why
    taken = {t.name for t in optimized.graph.initializer} | {o for n in optimized.graph.node for o in n.output}
    renamed = {}
    for tensor in made:
        name = f"/prepared/{tensor.name}"
        while name in taken:
            name += "_"
        taken.add(name)
        renamed[tensor.name] = name
        tensor.name = name
    for node in optimized.graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]


# Shared constants larger than this stay shared (tied embeddings and the like are worth their memory).
_UNSHARE_MAX_ELEMENTS = 4096


def _unshare_small_initializers(model: onnx.ModelProto) -> int:
    """Copy each small float initializer that several nodes read, one copy per node.

    ORT's QDQ quantizer gives an initializer one quantization, so a constant shared by an 8-bit and a 16-bit
    node (a decomposed HardSwish's `/6` is a typical one) would force one type on both; QNN's HTP backend
    rejects some of the resulting type pairs.
    """
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    users: dict[str, list] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in inits:
                users.setdefault(name, []).append((node, position))
    count = 0
    taken = set(inits) | {o for n in graph.node for o in n.output}
    for name, uses in users.items():
        init = inits[name]
        if len(uses) < 2 or init.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        if int(np.prod(init.dims, dtype=np.int64)) > _UNSHARE_MAX_ELEMENTS:
            continue
        for index, (node, position) in enumerate(uses[1:], start=1):
            copy_name = f"{name}_{index}"
            while copy_name in taken:
                copy_name += "_"
            taken.add(copy_name)
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = copy_name
            graph.initializer.append(copy)
            node.input[position] = copy_name
        count += 1
    return count


def _tensors_without_static_shape(model: onnx.ModelProto) -> list[str]:
    known = {}
    for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        tt = vi.type.tensor_type
        known[vi.name] = tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)
    return [o for n in model.graph.node for o in n.output if o and not known.get(o, False)]


def _specs(values, skip: set[str]) -> tuple[TensorSpec, ...]:
    specs = []
    for vi in values:
        if vi.name in skip:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name if tt.elem_type else "unknown"
        specs.append(TensorSpec(vi.name, tuple(d.dim_value for d in tt.shape.dim), dtype))
    return tuple(specs)


def _set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)


def metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}
