"""Top-to-bottom positions for drawing a model graph: a layered DAG layout, namespace collapse, disk cache.

Graphviz's `dot` is used when it is on PATH; otherwise (and whenever `dot` fails or takes too long) a
pure-Python layered layout: longest-path layering, dummy nodes on long edges, barycentric crossing reduction
and x positions from isotonic regression (each layer packed as close as it can to its neighbours' mean).
Both are deterministic. Layouts are cached on disk by model identity and collapse state.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pandas as pd

from .cache import cache_root
from .errors import MpstudioError
from .graph import ModelGraph

LAYOUT_VERSION = 1
ENGINES = ("auto", "dot", "layered")
# Edges spanning more layers than this are drawn straight instead of routed through dummy nodes, so a tensor
# consumed all along a deep model (a mask, a position table) does not add thousands of dummies.
MAX_ROUTED_SPAN = 40
DOT_TIMEOUT_S = 60.0

INPUT_PREFIX = "input:"
NAMESPACE_PREFIX = "ns:"

# Columns of GraphLayout.nodes (one row per drawn node, in topological order):
#   id (graph node name, "input:<tensor>" for a graph input, "ns:<namespace>" for a collapsed namespace),
#   label (short text: op type, or namespace tail), op, namespace, kind ("op" | "input" | "namespace"),
#   size (graph nodes it stands for), x, y (y = -layer: the graph flows downwards), layer.
NODE_COLUMNS = ["id", "label", "op", "namespace", "kind", "size", "x", "y", "layer"]
# Columns of GraphLayout.edges: source, target (node ids), xs, ys (the polyline drawn, from source to target).
EDGE_COLUMNS = ["source", "target", "xs", "ys"]


@dataclass(frozen=True)
class GraphLayout:
    """Where each node and edge of a (possibly collapsed) model graph is drawn."""

    nodes: pd.DataFrame
    edges: pd.DataFrame
    members: Mapping[str, tuple[str, ...]]  # drawn node id -> graph node names (inputs: the input tensor name)
    collapsed: tuple[str, ...] = ()
    engine: str = "layered"
    seconds: float = 0.0
    node_of: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "node_of", {m: node_id for node_id, ms in self.members.items() for m in ms})

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def depth(self) -> int:
        return int(self.nodes["layer"].max()) + 1 if len(self.nodes) else 0

    @property
    def width(self) -> float:
        return float(self.nodes["x"].max() - self.nodes["x"].min()) + 1 if len(self.nodes) else 0.0

    def to_json(self) -> dict:
        return {
            "format": LAYOUT_VERSION,
            "engine": self.engine,
            "collapsed": list(self.collapsed),
            "nodes": self.nodes[NODE_COLUMNS].to_dict(orient="list"),
            "edges": self.edges[EDGE_COLUMNS].to_dict(orient="list"),
            "members": {k: list(v) for k, v in self.members.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> "GraphLayout":
        return cls(pd.DataFrame(data["nodes"], columns=NODE_COLUMNS), pd.DataFrame(data["edges"], columns=EDGE_COLUMNS),
                   {k: tuple(v) for k, v in data["members"].items()}, tuple(data["collapsed"]), data["engine"])


# ---- the public entry point ------------------------------------------------------------------------------------
def layout_graph(
    graph: ModelGraph,
    collapsed: Iterable[str] = (),
    engine: str = "auto",
    model_sha256: str | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
) -> GraphLayout:
    """Lay `graph` out top to bottom, with each namespace in `collapsed` drawn as one node.

    `engine`: "dot" (Graphviz, must be on PATH), "layered" (pure Python) or "auto" (dot when present).
    Results are cached under `cache_dir` (default the mpstudio cache) keyed by `model_sha256` (default a
    fingerprint of the graph's structure), the collapse state and the engine.
    """
    if engine not in ENGINES:
        raise MpstudioError(f"unknown layout engine {engine!r}; use one of {', '.join(ENGINES)}")
    known = graph.namespaces()
    collapsed = tuple(sorted(set(collapsed)))
    for namespace in collapsed:
        if not namespace or namespace not in known:
            raise MpstudioError(f"cannot collapse {namespace!r}: the model has no namespace of that name")
    chosen = engine if engine != "auto" else ("dot" if dot_available() else "layered")

    path = None
    if use_cache:
        identity = model_sha256 or graph_fingerprint(graph)
        key = hashlib.sha256(json.dumps([LAYOUT_VERSION, identity, chosen, collapsed]).encode()).hexdigest()[:24]
        path = Path(cache_dir) if cache_dir else cache_root() / "layouts"
        path = path / f"{key}.json"
        if path.is_file():
            try:
                return GraphLayout.from_json(json.loads(path.read_text()))
            except (ValueError, KeyError):
                pass  # a torn or old file: lay out again and overwrite it

    start = time.perf_counter()
    drawn = collapse(graph, collapsed)
    result = None
    if chosen == "dot":
        try:
            result = _dot_positions(drawn)
        except (OSError, subprocess.SubprocessError, ValueError):
            if engine == "dot":
                raise MpstudioError("Graphviz `dot` failed to lay out the graph; use the layered engine") from None
            chosen = "layered"
    if result is None:
        result = _layered_positions(drawn)
    positions, layers, routes = result
    layout = _assemble(drawn, positions, layers, routes, collapsed, chosen, time.perf_counter() - start)

    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(layout.to_json(), separators=(",", ":")))
        os.replace(tmp, path)
    return layout


def dot_available() -> bool:
    return shutil.which("dot") is not None


def graph_fingerprint(graph: ModelGraph) -> str:
    """A hash of the graph's structure (node names, ops, wiring), for when no model hash is at hand."""
    digest = hashlib.sha256()
    for node in graph.nodes.values():
        digest.update(f"{node.name}\x00{node.op_type}\x00{','.join(node.inputs)}\x00{','.join(node.outputs)}\n".encode())
    digest.update(",".join(graph.inputs).encode())
    return digest.hexdigest()


def collapsible_namespaces(graph: ModelGraph, min_nodes: int = 2) -> list[str]:
    """Namespaces worth collapsing (at least `min_nodes` nodes), outermost first, then by name."""
    groups = graph.namespaces()
    names = [ns for ns, members in groups.items() if ns and len(members) >= min_nodes]
    return sorted(names, key=lambda ns: (ns.count("/"), ns))


# ---- the drawn graph: graph inputs and ops, with collapsed namespaces merged ----------------------------------------
@dataclass
class _Drawn:
    ids: list[str]  # in topological order
    info: dict[str, tuple[str, str, str, str]]  # id -> (label, op, namespace, kind)
    members: dict[str, list[str]]
    edges: list[tuple[str, str]]  # deduplicated, both ends drawn, source before target in `ids`


def collapse(graph: ModelGraph, collapsed: Sequence[str] = ()) -> _Drawn:
    """The graph to draw: one node per graph input and per op, the ops of each collapsed namespace merged."""
    outer = sorted(set(collapsed), key=lambda ns: ns.count("/"))

    def group_of(namespace: str) -> str | None:
        for ns in outer:
            if namespace == ns or namespace.startswith(ns + "/"):
                return ns
        return None

    ids: list[str] = []
    info: dict[str, tuple[str, str, str, str]] = {}
    members: dict[str, list[str]] = defaultdict(list)
    owner: dict[str, str] = {}  # graph node name or input tensor -> drawn id
    for name in graph.inputs:
        node_id = INPUT_PREFIX + name
        ids.append(node_id)
        info[node_id] = (name, "Input", "", "input")
        members[node_id].append(name)
        owner[name] = node_id
    for node in graph.nodes.values():
        group = group_of(node.namespace) if outer else None
        if group is None:
            node_id = node.name
            info[node_id] = (node.op_type, node.op_type, node.namespace, "op")
        else:
            node_id = NAMESPACE_PREFIX + group
            if node_id not in info:
                info[node_id] = (group.rsplit("/", 1)[-1], "", group, "namespace")
        if node_id not in members:
            ids.append(node_id)
        members[node_id].append(node.name)
        owner[node.name] = node_id

    position = {node_id: i for i, node_id in enumerate(ids)}
    edges: dict[tuple[str, str], None] = {}
    for node in graph.nodes.values():
        target = owner[node.name]
        for tensor in node.inputs:
            info_t = graph.tensors.get(tensor)
            if info_t is None:
                continue
            source = owner.get(info_t.producer) if info_t.producer else owner.get(tensor)
            if source is None or source == target:
                continue
            # A collapsed namespace can close a cycle among merged nodes; orient every edge by first appearance.
            edge = (source, target) if position[source] < position[target] else (target, source)
            edges[edge] = None
    return _Drawn(ids, info, dict(members), list(edges))


# ---- the pure-Python layered layout ------------------------------------------------------------------------------
def _layered_positions(drawn: _Drawn, sweeps: int = 4, passes: int = 4):
    routed = _Routed.of(drawn, _layers(drawn))
    rows = routed.rows()
    pos = _order_rows(rows, routed, sweeps)
    x = _place_rows(rows, routed, pos, passes)
    layer, chains = routed.layer, routed.chains
    routes = {}
    for s, t in drawn.edges:
        points = [s, *chains.get((s, t), ()), t]
        routes[(s, t)] = ([x[p] for p in points], [-float(layer[p]) for p in points])
    return {v: (x[v], -float(layer[v])) for v in drawn.ids}, {v: layer[v] for v in drawn.ids}, routes


def _layers(drawn: _Drawn) -> dict[str, int]:
    """Longest-path layering from the top, then nodes without predecessors moved down next to their first user."""
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for s, t in drawn.edges:
        preds[t].append(s)
        succs[s].append(t)
    layer: dict[str, int] = {}
    for v in drawn.ids:
        layer[v] = max((layer[u] + 1 for u in preds[v]), default=0)
    for v in reversed(drawn.ids):
        if not preds[v] and succs[v]:
            layer[v] = min(layer[w] for w in succs[v]) - 1
    return layer


@dataclass
class _Routed:
    """The layered graph with dummy nodes on edges spanning several layers, so long edges are routed around
    nodes: neighbours one layer up and down (dummies included), each routed edge's dummies, and each
    dummy's real ends."""

    layer: dict[str, int]
    order_key: dict[str, float]
    up: dict[str, list[str]]
    down: dict[str, list[str]]
    chains: dict[tuple[str, str], list[str]]
    ends: dict[str, tuple[str, str]]

    @classmethod
    def of(cls, drawn: _Drawn, layer: dict[str, int]) -> "_Routed":
        routed = cls(dict(layer), {v: i for i, v in enumerate(drawn.ids)}, defaultdict(list), defaultdict(list), {}, {})
        for s, t in drawn.edges:
            if 1 < layer[t] - layer[s] <= MAX_ROUTED_SPAN:
                routed._route(s, t)
            else:
                routed.down[s].append(t)
                routed.up[t].append(s)
        return routed

    def _route(self, s: str, t: str) -> None:
        layer, span = self.layer, self.layer[t] - self.layer[s]
        chain, previous = [], s
        for k in range(layer[s] + 1, layer[t]):
            d = f"\x00d{len(self.ends) + len(chain)}"
            layer[d] = k
            self.order_key[d] = self.order_key[s] + (k - layer[s]) / (span + 1)
            chain.append(d)
            self.down[previous].append(d)
            self.up[d].append(previous)
            previous = d
        self.down[previous].append(t)
        self.up[t].append(previous)
        self.chains[(s, t)] = chain
        for d in chain:
            self.ends[d] = (s, t)

    def rows(self) -> list[list[str]]:
        rows: list[list[str]] = [[] for _ in range(max(self.layer.values(), default=-1) + 1)]
        for v in sorted(self.layer, key=lambda v: self.order_key[v]):
            rows[self.layer[v]].append(v)
        return rows


def _order_rows(rows: list[list[str]], routed: _Routed, sweeps: int) -> dict[str, float]:
    """Barycentric crossing reduction: sort each layer by the mean position of its neighbours, down then up.
    Sorts `rows` in place; returns each node's centred index in its row."""
    depth = len(rows)
    pos: dict[str, float] = {}
    for row in rows:
        for i, v in enumerate(row):
            pos[v] = i - (len(row) - 1) / 2

    def sweep(row_indices, neighbours):
        for r in row_indices:
            row = rows[r]
            keys = {}
            for v in row:
                ns = neighbours[v]
                keys[v] = sum(pos[u] for u in ns) / len(ns) if ns else pos[v]
            row.sort(key=lambda v: keys[v])
            for i, v in enumerate(row):
                pos[v] = i - (len(row) - 1) / 2

    for _ in range(sweeps):
        sweep(range(1, depth), routed.up)
        sweep(range(depth - 2, -1, -1), routed.down)
    sweep(range(1, depth), routed.up)
    return pos


def _place_rows(rows: list[list[str]], routed: _Routed, pos: dict[str, float], passes: int) -> dict[str, float]:
    """x positions: each layer as close as it can get to its neighbours' mean, one unit apart, order kept."""
    depth, layer, ends, up, down = len(rows), routed.layer, routed.ends, routed.up, routed.down
    x = dict(pos)

    def place(row_indices, neighbours):
        for r in row_indices:
            row = rows[r]
            targets, weights = [], []
            for v in row:
                dummy = v.startswith("\x00")
                ns = neighbours(v)
                if not dummy:
                    # A real node follows the real ends of routed edges, not their dummies: a skip connection
                    # then goes round the main path instead of pushing it sideways block after block.
                    ns = [u if u not in ends else ends[u][0] if layer[u] < layer[v] else ends[u][1] for u in ns]
                targets.append(sum(x[u] for u in ns) / len(ns) if ns else x[v])
                # Dummies give way to real nodes.
                weights.append((0.02 if dummy else 1.0) * (1.0 if ns else 0.25))
            for v, value in zip(row, _pack(targets, weights)):
                x[v] = value

    for _ in range(passes):
        place(range(1, depth), lambda v: up[v])
        place(range(depth - 2, -1, -1), lambda v: down[v])
    place(range(depth), lambda v: up[v] + down[v])
    return x


def _pack(targets: list[float], weights: list[float]) -> list[float]:
    """Positions closest (weighted least squares) to `targets`, in the given order, at least 1 apart.

    With y_i = x_i - i the constraint is y non-decreasing: isotonic regression (pool adjacent violators).
    """
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for i, (t, w) in enumerate(zip(targets, weights)):
        blocks.append([t - i, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks[-1]
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2]
    out, i = [], 0
    for mean, _, count in blocks:
        for _ in range(count):
            out.append(mean + i)
            i += 1
    return out


# ---- Graphviz dot ------------------------------------------------------------------------------------------------
_DOT_NODE_W, _DOT_NODE_H, _DOT_NODESEP, _DOT_RANKSEP = 0.6, 0.3, 0.25, 0.3


def _dot_positions(drawn: _Drawn):
    index = {v: i for i, v in enumerate(drawn.ids)}
    lines = ["digraph G {", "rankdir=TB; ordering=out;",
             f"nodesep={_DOT_NODESEP}; ranksep={_DOT_RANKSEP};",
             f"node [shape=box, fixedsize=true, width={_DOT_NODE_W}, height={_DOT_NODE_H}, label=\"\"];"]
    lines += [f"n{i};" for i in range(len(drawn.ids))]
    lines += [f"n{index[s]} -> n{index[t]};" for s, t in drawn.edges]
    lines.append("}")
    with tempfile.TemporaryDirectory(prefix="mpstudio-dot-") as tmp:
        source = Path(tmp) / "graph.dot"
        source.write_text("\n".join(lines))
        out = subprocess.run(["dot", "-Tplain", str(source)], capture_output=True, text=True,
                             timeout=DOT_TIMEOUT_S, check=True).stdout
    x_unit, y_unit = _DOT_NODE_W + _DOT_NODESEP, _DOT_NODE_H + _DOT_RANKSEP
    raw: dict[str, tuple[float, float]] = {}
    raw_routes: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    top = None
    for line in out.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "graph":
            top = float(parts[3])
        elif parts[0] == "node":
            raw[drawn.ids[int(parts[1][1:])]] = (float(parts[2]), float(parts[3]))
        elif parts[0] == "edge":
            s, t, n = drawn.ids[int(parts[1][1:])], drawn.ids[int(parts[2][1:])], int(parts[3])
            coords = [float(v) for v in parts[4:4 + 2 * n]]
            raw_routes[(s, t)] = (coords[0::2], coords[1::2])
    if top is None or len(raw) != len(drawn.ids):
        raise ValueError("dot output is missing nodes")
    # Normalise: one unit per node slot across, one unit per rank down, y = -layer, x centred on 0.
    xs = [p[0] for p in raw.values()]
    mid = (min(xs) + max(xs)) / 2
    to_x = lambda v: (v - mid) / x_unit  # noqa: E731
    to_y = lambda v: -(top - _DOT_NODE_H / 2 - v) / y_unit  # noqa: E731
    positions = {v: (to_x(px), to_y(py)) for v, (px, py) in raw.items()}
    layers = {v: int(round(-y)) for v, (_, y) in positions.items()}
    routes = {}
    for s, t in drawn.edges:
        rx, ry = raw_routes.get((s, t), ([], []))
        routes[(s, t)] = ([positions[s][0], *map(to_x, rx), positions[t][0]],
                          [positions[s][1], *map(to_y, ry), positions[t][1]])
    return positions, layers, routes


def _assemble(drawn: _Drawn, positions, layers, routes, collapsed, engine, seconds) -> GraphLayout:
    rows = []
    for v in drawn.ids:
        label, op, namespace, kind = drawn.info[v]
        x, y = positions[v]
        rows.append((v, label, op, namespace, kind, len(drawn.members[v]), round(x, 4), round(y, 4), layers[v]))
    nodes = pd.DataFrame(rows, columns=NODE_COLUMNS)
    edges = pd.DataFrame([(s, t, [round(v, 4) for v in routes[(s, t)][0]], [round(v, 4) for v in routes[(s, t)][1]])
                          for s, t in drawn.edges], columns=EDGE_COLUMNS)
    members = {v: tuple(drawn.members[v]) for v in drawn.ids}
    return GraphLayout(nodes, edges, members, tuple(collapsed), engine, seconds)
