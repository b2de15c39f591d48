"""Reading ORT's verbose session log: which nodes QNN refused, and where each node of a model was placed."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..protocol import IO_QUANTIZATION_REASON, NodeFallback, Placement

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BLOCK = re.compile(r"Validation (FAILED|PASSED) for \d+ nodes in \w+ \(([^)]*)\)")
_BLOCK_NODE = re.compile(r"^\s*Operator type: (\S+) Node name: (.*?) Node index: \d+")
_BLOCK_REASON = re.compile(r"^\s*REASON : (.*)")
_PLACED = re.compile(r"(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)")
_PLACED_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s+(\S+) \((.*)\)\s*$")
_IO_Q = "not take Q nodes that consume a graph input"
_IO_DQ = "not take DQ nodes that produce a graph output"


def _clean_reason(reason: str) -> str:
    if _IO_Q in reason or _IO_DQ in reason:
        return f"{IO_QUANTIZATION_REASON} (offload_graph_io_quantization)"
    return reason.strip() or "QNN validation failed"


def _validation_blocks(text: str) -> list[list]:
    """[FAILED|PASSED, [(op_type, node)], reason] for each node-unit validation QNN logged."""
    blocks = []
    current = None
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        match = _BLOCK.search(line)
        if match:
            current = [match.group(1), [], ""]
            blocks.append(current)
            continue
        if current is None:
            continue
        node = _BLOCK_NODE.match(line)
        if node:
            current[1].append((node.group(1), node.group(2)))
            continue
        reason = _BLOCK_REASON.match(line)
        if reason:
            current[2] = reason.group(1)
            continue
        if line.strip() == "" or line.startswith("20"):
            current = None
    return blocks


def parse_refusals(text: str) -> list[NodeFallback]:
    """Nodes QNN refused (not counting graph-I/O quantization it leaves to CPU by design), with reasons."""
    refused: dict[str, NodeFallback] = {}
    for status, nodes, reason in _validation_blocks(text):
        if status != "FAILED":
            continue
        reason = _clean_reason(reason)
        if reason.startswith(IO_QUANTIZATION_REASON):
            continue
        for op_type, name in nodes:
            refused.setdefault(name, NodeFallback(name, op_type, reason))
    return list(refused.values())


def parse_placement(text: str, model_nodes: Sequence[tuple[str, str]]) -> Placement:
    """Placement from ORT's verbose session log: its final node assignment, with QNN's reasons for CPU nodes."""
    reasons: dict[str, str] = {}
    for status, nodes, reason in _validation_blocks(text):
        if status == "FAILED":
            for _, name in nodes:
                reasons.setdefault(name, _clean_reason(reason))
    provider = None
    partitions = 0
    cpu: list[NodeFallback] = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        placed = _PLACED.search(line)
        if placed:
            provider = placed.group(2)
            if provider == "QNNExecutionProvider":
                partitions = int(placed.group(3))
            continue
        node = _PLACED_NODE.search(line)
        if node and provider == "CPUExecutionProvider":
            op_type, name = node.group(1), node.group(2)
            cpu.append(NodeFallback(name, op_type, reasons.get(name, "not taken into a QNN partition")))
    on_cpu = {f.node for f in cpu}
    on_htp = tuple(name for name, _ in model_nodes if name not in on_cpu)
    return Placement("htp", on_htp, tuple(cpu), partitions)
