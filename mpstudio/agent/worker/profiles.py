"""Per-op profiles inside the worker: a profiled session, and ORT's CPU JSON and QNN's CSV read into op costs."""

from __future__ import annotations

import csv
import json
import re
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from ... import runtime
from ..protocol import OpCost, OpProfile
from . import model_file


def profile_ops(request: dict, feeds: dict, workdir: Path, intra_op_threads: int, source: str,
                device: str) -> OpProfile:
    """Profile `profile_runs` runs of the request's model (after one unprofiled-in-the-mean first run)."""
    runs = max(1, min(int(request.get("profile_runs", 5)), 50))
    backend = request["backend"]
    prefix = workdir / f"profile-{uuid.uuid4().hex}"
    path = prefix.with_suffix(".csv") if backend == "htp" else prefix
    session = runtime.create_session(
        request["model_path"], backend, request["provider_options"], profiling_file=path, profile_ops=True,
        allow_cpu_fallback=bool(request.get("allow_cpu_fallback")), intra_op_threads=intra_op_threads,
    )
    session.run(None, feeds)  # the first run carries one-time costs: profiled but left out below
    for _ in range(runs):
        session.run(None, feeds)
    nodes = model_file.model_nodes(request["model_path"])
    if backend == "cpu":
        json_path = Path(session.end_profiling())
        del session
        ops = parse_cpu_profile(json.loads(json_path.read_text()), nodes, skip_runs=1)
        json_path.unlink(missing_ok=True)
        unit = "us"
    else:
        del session  # the CSV is complete once the session is gone
        try:
            ops = parse_qnn_profile(path.read_text(), nodes, skip_runs=1)
        finally:
            # QNN writes a log beside the CSV and an op trace in the working directory on every profiled run.
            for leftover in (path, *workdir.glob(f"{prefix.name}*"), workdir / "qnn_op_trace.json"):
                leftover.unlink(missing_ok=True)
        unit = "cycles"
    return OpProfile(ops=tuple(ops), unit=unit, source=source, device=device, backend=backend, runs=runs)


_REWRITTEN = re.compile(r"/htp_(?:requantize|accumulator)/.*$")


def _map_op(sources: list[str], qnn_op: str, model_nodes: dict[str, str]) -> tuple[str, str, tuple[str, ...]]:
    """(node, op_type, onnx_nodes) for a profiled op: its main ONNX node is the first that is not a Q/DQ."""
    known: list[str] = []
    # ORT's graph rewrites suffix node names with "_token_N"; the stem is the ONNX node. The CPU numerics write a
    # node's HTP arithmetic as nodes named "<node>/htp_requantize/..." or "<node>/htp_accumulator/...": theirs.
    for name in sources or [qnn_op]:
        stem = name if name in model_nodes else re.sub(r"(_token_\d+)+$", "", name)
        stem = stem if stem in model_nodes else _REWRITTEN.sub("", stem)
        if stem in model_nodes and stem not in known:
            known.append(stem)
    if not known:
        return qnn_op, "", ()
    main = next((s for s in known if model_nodes[s] not in ("QuantizeLinear", "DequantizeLinear")), known[0])
    return main, model_nodes[main], tuple(known)


def parse_qnn_profile(text: str, model_nodes: Sequence[tuple[str, str]], skip_runs: int = 1) -> list[OpCost]:
    """Mean cycles per run of each QNN op in a detailed profile CSV with the ONNX source-ops column."""
    nodes = dict(model_nodes)
    runs: list[list[tuple[str, float, list[str]]]] = []
    for row in csv.DictReader(text.splitlines()):
        event = row.get("Event Identifier") or ""
        if row.get("Message") == "BACKEND" and event == "Accelerator (execute) time (cycles)":
            runs.append([])
        elif row.get("Message") == "NODE" and runs and row.get("Unit of Measurement") == "CYCLES":
            name = re.sub(r"(:OpId_\d+)? \(cycles\)$", "", event)
            if name.startswith(("Input OpId", "Output OpId")):
                continue
            sources = [s for s in (row.get("ONNX Source Ops") or "").split(";") if s]
            runs[-1].append((name, float(row["Time"]), sources))
    kept = runs[skip_runs:] or runs
    totals: OrderedDict[str, list] = OrderedDict()
    for run in kept:
        for name, cycles, sources in run:
            entry = totals.setdefault(name, [0.0, sources])
            entry[0] += cycles
    ops = []
    for name, (cycles, sources) in totals.items():
        node, op_type, onnx_nodes = _map_op(sources, name, nodes)
        ops.append(OpCost(op=name, node=node, op_type=op_type, onnx_nodes=onnx_nodes,
                          cost=cycles / max(len(kept), 1), unit="cycles"))
    return ops


def parse_cpu_profile(events: list[dict], model_nodes: Sequence[tuple[str, str]],
                      skip_runs: int = 1) -> list[OpCost]:
    """Mean microseconds per run of each ORT CPU kernel, from ORT's JSON profile."""
    nodes = dict(model_nodes)
    run_starts = [e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    cutoff = sorted(run_starts)[skip_runs] if len(run_starts) > skip_runs else -1
    runs = max(len(run_starts) - (skip_runs if cutoff >= 0 else 0), 1)
    totals: OrderedDict[str, list] = OrderedDict()
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time") or event["ts"] < cutoff:
            continue
        name = event["name"][: -len("_kernel_time")]
        entry = totals.setdefault(name, [0.0, event.get("args", {}).get("op_name", "")])
        entry[0] += float(event["dur"])
    ops = []
    for name, (dur, kernel) in totals.items():
        node, op_type, onnx_nodes = _map_op([], name, nodes)
        ops.append(OpCost(op=f"{name} ({kernel})" if kernel else name, node=node, op_type=op_type,
                          onnx_nodes=onnx_nodes, cost=dur / runs, unit="us"))
    return ops
