"""Where a plan imported from AIMET's QDQ model differs from that model, and what each difference does to the score.

    MPSTUDIO_AIMET_PYTHON=... python benchmarks/aimet_exchange.py --models demo --keep FOLDER
    python benchmarks/aimet_gap.py FOLDER [--seeds 4]

Reads FOLDER/demo (the study) and FOLDER/demo-aimet/aimet_qdq.onnx (AIMET's `to_onnx_qdq`; no AIMET needed here),
imports it, and compares the plan's QDQ model with AIMET's op input by op input: float, or through a
DequantizeLinear with which scale, zero point and integer codes. Each class of difference is then made as AIMET
has it, alone and together, in a copy of the plan's model, and scored on ORT's CPU (CER over the evaluation
lines). `--seeds` copies round each int32 bias down or up at random instead of to nearest: how far the score
moves under changes far below one quantization step.
"""

from __future__ import annotations

import argparse
import copy
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from mpstudio.demos.ocr import load_demo
from mpstudio.loop.inprocess import run_outputs
from mpstudio.metrics import output_snr
from mpstudio.study import Study

FEEDS = "QuantizeLinear", "DequantizeLinear", "Constant"


def op_inputs(path: Path):
    """(node name, input index) -> ("float", tensor, None) or ("q", source tensor, (scale, zero point, codes))."""
    model = onnx.load(str(path))
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    values.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
                   if n.op_type == "Constant"})
    producer = {o: n for n in model.graph.node for o in n.output}
    inputs = {(n.name, k): _trace(x, producer, values) for n in model.graph.node if n.op_type not in FEEDS
              for k, x in enumerate(n.input)}
    return model, inputs, values


def _axis(node) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


def _trace(value, producer, values):
    dq = producer.get(value)
    if dq is None or dq.op_type != "DequantizeLinear":
        return "float", value, None
    scale, zero = values[dq.input[1]], values[dq.input[2]]
    q = producer.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear":
        return "q", dq.input[0], (scale, zero, values.get(dq.input[0]))
    source = q.input[0]
    codes = _quantize(values[source], scale, zero, _axis(q)) if source in values else None
    return "q", source, (scale, zero, codes)


def _shaped(scale, zero, ndim, axis):
    if scale.size == 1:
        return scale, zero.astype(np.int64)
    shape = [1] * ndim
    shape[axis] = -1
    return scale.reshape(shape), zero.astype(np.int64).reshape(shape)


def _quantize(w, scale, zero, axis):
    s, z = _shaped(scale, zero, w.ndim, axis)
    info = np.iinfo(zero.dtype)
    return np.clip(np.rint(w / s) + z, info.min, info.max).astype(np.int64)


def _dequantize(scale, zero, codes):
    s, z = _shaped(scale, zero, codes.ndim, 0)
    return ((codes.astype(np.int64) - z).astype(np.float32) * s).astype(np.float32)


def classify(aimet: dict, ours: dict, graph) -> dict[str, list]:
    classes = defaultdict(list)
    for key in sorted(set(aimet) & set(ours)):
        a, b = aimet[key], ours[key]
        if a[0] == "float" and b[0] == "q":
            kind = graph.tensors[a[1]].kind if a[1] in graph.tensors else "constant"
            classes[{"activation": "layernorm insides", "bias": "biases"}.get(kind, "layernorm constants")].append(key)
        elif a[0] == "q" and b[0] == "float":
            classes["clip bounds"].append(key)
        elif a[0] == "q" and a[2][2] is not None and b[2][2] is not None and np.any(
                a[2][2].astype(np.int64) != b[2][2].astype(np.int64)):
            classes["weight codes"].append(key)
    return classes


def as_aimet(model, classes, chosen, aimet, ours, values):
    """A copy of the plan's `model` with the `chosen` classes as AIMET has them."""
    model = copy.deepcopy(model)
    nodes = {n.name: n for n in model.graph.node}
    inits = {i.name: i for i in model.graph.initializer}

    def constant(name, array):
        if name not in inits:
            inits[name] = numpy_helper.from_array(array.astype(np.float32), name)
            model.graph.initializer.append(inits[name])
        return name

    for c in chosen:
        for node, k in classes.get(c, []):
            a, b = aimet[(node, k)], ours[(node, k)]
            n = nodes[node]
            if c == "layernorm insides":
                n.input[k] = b[1]  # the float tensor the plan's QuantizeLinear reads
            elif c in ("biases", "layernorm constants"):
                n.input[k] = constant(f"aimet_float::{a[1]}", values[a[1]])
            elif c == "clip bounds":
                n.input[k] = constant(f"aimet_qdq::{a[1]}", _dequantize(*a[2]))
            else:
                dq = next(x for x in model.graph.node if n.input[k] in x.output)
                stored = inits[dq.input[0]]
                stored.CopyFrom(numpy_helper.from_array(
                    a[2][2].astype(numpy_helper.to_array(stored).dtype), stored.name))
    return model


def biases_rounded_at_random(model, classes, aimet, ours, values, seed):
    model = copy.deepcopy(model)
    rng = np.random.default_rng(seed)
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    nodes = {n.name: n for n in model.graph.node}
    for node, k in classes["biases"]:
        scale = ours[(node, k)][2][0].astype(np.float64)
        ratio = values[aimet[(node, k)][1]].astype(np.float64) / scale
        codes = np.where(rng.random(ratio.shape) < 0.5, np.floor(ratio), np.ceil(ratio)).astype(np.int32)
        stored = producer[nodes[node].input[k]].input[0]
        inits[stored].CopyFrom(numpy_helper.from_array(codes, stored))
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args(argv)
    study = Study.open(args.folder / "demo")
    metric = load_demo().metric.fn
    source = args.folder / "demo-aimet" / "aimet_qdq.onnx"
    reference = run_outputs(study.folder / "model.onnx", study.evaluation_data)
    imported = study.import_plan(source)
    plan_model = study.quantizer.generate(imported.plan)
    _, aimet, values = op_inputs(source)
    model, ours, _ = op_inputs(plan_model)
    classes = classify(aimet, ours, study.graph)
    print("| model | CER | SNR against float (dB) |\n|---|---|---|")

    def row(label, path):
        outputs = run_outputs(path, study.evaluation_data)
        print(f"| {label} | {metric(outputs):.4f} | {output_snr(outputs, reference):.2f} |", flush=True)

    row("float", study.folder / "model.onnx")
    row("AIMET to_onnx_qdq", source)
    row("imported plan", plan_model)
    scratch = args.folder / "gap"
    scratch.mkdir(exist_ok=True)
    runs = [[c] for c in classes] + [["layernorm insides", "layernorm constants"], list(classes)]
    for chosen in runs:
        path = scratch / f"{'+'.join(chosen).replace(' ', '_')}.onnx"
        onnx.save(as_aimet(model, classes, chosen, aimet, ours, values), str(path))
        row("imported plan, as AIMET: " + " + ".join(f"{c} ({len(classes[c])})" for c in chosen), path)
    for seed in range(args.seeds):
        path = scratch / f"biases-seed{seed}.onnx"
        onnx.save(biases_rounded_at_random(model, classes, aimet, ours, values, seed), str(path))
        row(f"imported plan, int32 biases rounded down or up at random (seed {seed})", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
