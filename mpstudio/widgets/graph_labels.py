"""Which node labels the graph draws, and how short, at the figure's real pixel scale.

Labels are placed greedily, the most important first (selected nodes, then by rank): each takes the longest of
its forms that overlaps no label placed before it and no other node's marker, to the right of its node (the first
node of a row may take its left). A label with no room is left out until a zoom makes room, the way map and graph
viewers declutter their labels.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

FONT_PX = 10  # the labels' font size
LINE_PX = 13.0  # the height of a 10 px label's box
GAP_PX = 11.0  # from a node's centre to the near end of its label
PAD_PX = 1.0  # kept clear around every label
MIN_CHARS = 3  # a cut label keeps at least this many characters beside its ellipsis
ELLIPSIS = "\u2026"

# Widths of 10 px characters, px: DejaVu Sans's (where "helvetica" and "sans-serif" fall back to on Linux, and the
# widest of the usual fallbacks; Helvetica and Arial are narrower), rounded up per group.
_WIDTHS = {
    **dict.fromkeys("'ijlIJ,. ", 3.2), **dict.fromkeys("/:;\\|f-", 3.6), **dict.fromkeys("()[]t!r", 4.1),
    **dict.fromkeys("KAVXZBRCUNHDG", 7.7), **dict.fromkeys("&OQw", 8.2), **dict.fromkeys("#+<=>^~M", 8.6),
    **dict.fromkeys("%mW@" + ELLIPSIS, 10.0),
}
_DEFAULT_WIDTH = 6.4  # the other letters, digits, "_" and the like
_WIDE = 10.0  # characters outside the table


def text_width(text: str) -> float:
    """The width in px of `text` drawn in the labels' font (an upper bound over the usual sans-serif fonts)."""
    return sum(_WIDTHS.get(c, _DEFAULT_WIDTH if c.isascii() else _WIDE) for c in text)


@dataclass(frozen=True)
class PlacedLabels:
    """The labels drawn: for each, the node (index into the arguments of `place_labels`), its text, the side of
    its node it is drawn on ("right" or "left") and its box in px ((x0, y0, x1, y1), screen y downwards)."""

    nodes: list[int]
    texts: list[str]
    sides: list[str]
    boxes: list[tuple[float, float, float, float]]


def label_forms(labels, ys, ops, tensors) -> list[list[str]]:
    """Per node, the texts it may be labelled with, most telling first: its full label; for an op producing one
    tensor, what tells it apart from its row ("MatMul query/MatMul", "query/MatMul", then the part its row has
    least: "query"), or, alone in its row, its tensor name's tail. `tensors`: each node's activation tensors."""
    rows: dict[float, list[int]] = defaultdict(list)
    for i, y in enumerate(ys):
        rows[float(y)].append(i)
    forms: list[list[str]] = [[] for _ in labels]
    for members in rows.values():
        parts = {i: _parts(tensors[i][0]) for i in members if len(tensors[i]) == 1}
        shared = _common_prefix(list(parts.values())) if len(parts) > 1 else 0
        for i in members:
            texts = [labels[i]]
            mine = parts.get(i, [])
            if mine and len(parts) > 1:
                rest = mine[shared:] or mine[-1:]
                texts += [f"{ops[i]} {'/'.join(rest)}", "/".join(rest), _telling(rest, parts)]
            elif mine:
                texts += ["/".join(mine[-k:]) for k in range(len(mine), 0, -1)]
            forms[i] = list(dict.fromkeys(t for t in texts if t))
    return forms


def place_labels(forms, xs, ys, sizes, order, px_per_x: float, px_per_y: float,
                 x_span: tuple[float, float] = (-np.inf, np.inf)) -> PlacedLabels:
    """Labels for the nodes at data positions `xs`, `ys` (markers `sizes` px across) that overlap neither one
    another nor another node's marker, nor run out of the window's `x_span` (data units), at `px_per_x` /
    `px_per_y` px per data unit. `order`: the nodes from the most to the least important; `forms`: each node's
    texts, most telling first (`label_forms`)."""
    sx = np.asarray(xs, dtype=float) * px_per_x
    sy = -np.asarray(ys, dtype=float) * px_per_y
    taken = _Boxes(x_span[0] * px_per_x, x_span[1] * px_per_x)
    for i, (x, y, size) in enumerate(zip(sx, sy, sizes)):
        r = float(size) / 2
        taken.add((x - r, y - r, x + r, y + r), i)
    first_of_row = _first_of_rows(xs, ys)
    placed = PlacedLabels([], [], [], [])
    for i in order:
        if not forms[i]:
            continue
        sides = ("right", "left") if i in first_of_row else ("right",)
        found = _whole(forms[i], sides, sx[i], sy[i], taken, i) or _cut(forms[i][-1], sides, sx[i], sy[i], taken, i)
        if found is None:
            continue
        text, side, box = found
        taken.add(box, -1)
        placed.nodes.append(int(i))
        placed.texts.append(text)
        placed.sides.append(side)
        placed.boxes.append(box)
    return placed


def _box(text: str, side: str, x: float, y: float) -> tuple[float, float, float, float]:
    width = text_width(text)
    x0 = x + GAP_PX if side == "right" else x - GAP_PX - width
    return x0 - PAD_PX, y - LINE_PX / 2, x0 + width + PAD_PX, y + LINE_PX / 2


def _whole(texts, sides, x, y, taken, owner):
    """The first of `texts` that fits whole on one of `sides` (tried in order)."""
    for text in texts:
        for side in sides:
            box = _box(text, side, x, y)
            if not taken.hits(box, owner):
                return text, side, box
    return None


def _cut(text: str, sides, x, y, taken, owner):
    """`text` cut to the room there is, if MIN_CHARS survive: a name path or a numbered name keeps its end (what
    tells "branch0" from "branch1"), a word its start."""
    keep_end = any(c in text for c in "/._") or text[-1:].isdigit()
    for side in sides:
        low, high, best = MIN_CHARS, len(text) - 1, None
        while low <= high:  # a longer text's box holds a shorter one's: bisect on the length kept
            mid = (low + high) // 2
            cut = ELLIPSIS + text[-mid:] if keep_end else text[:mid] + ELLIPSIS
            box = _box(cut, side, x, y)
            if taken.hits(box, owner):
                high = mid - 1
            else:
                best, low = (cut, side, box), mid + 1
        if best is not None:
            return best
    return None


def _first_of_rows(xs, ys) -> set[int]:
    """The leftmost node of each row (nodes of one y)."""
    first: dict[float, int] = {}
    for i, (x, y) in enumerate(zip(xs, ys)):
        if float(y) not in first or x < xs[first[float(y)]]:
            first[float(y)] = i
    return set(first.values())


class _Boxes:
    """Boxes in px on a grid of cells, each with its owner (a node's marker) or -1 (a label)."""

    CELL = 64.0

    def __init__(self, left: float = -np.inf, right: float = np.inf):
        self.left, self.right = left, right
        self._cells: dict[tuple[int, int], list[tuple[tuple[float, float, float, float], int]]] = defaultdict(list)

    def _keys(self, box):
        x0, y0, x1, y1 = (int(np.floor(v / self.CELL)) for v in box)
        return ((cx, cy) for cx in range(x0, x1 + 1) for cy in range(y0, y1 + 1))

    def add(self, box, owner: int) -> None:
        for key in self._keys(box):
            self._cells[key].append((box, owner))

    def hits(self, box, owner: int) -> bool:
        """Whether `box` runs out of the window or overlaps a box other than `owner`'s marker."""
        x0, y0, x1, y1 = box
        if x0 < self.left or x1 > self.right:
            return True
        for key in self._keys(box):
            for (a0, b0, a1, b1), who in self._cells.get(key, ()):
                if who != owner and x0 < a1 and a0 < x1 and y0 < b1 and b0 < y1:
                    return True
        return False


def _telling(rest: list[str], parts: dict) -> str:
    """The one part of a name its row's other names have least (the last such before the op's own name):
    "value" for the value projection beside key and query."""
    counts: dict[str, int] = {}
    for others in parts.values():
        for part in set(others):
            counts[part] = counts.get(part, 0) + 1
    candidates = rest[:-1] or rest
    fewest = min(counts.get(part, 0) for part in candidates)
    return [part for part in candidates if counts.get(part, 0) == fewest][-1]


def _parts(name: str) -> list[str]:
    """A tensor's name as path parts, without ORT's "_output_0": "/l.0/attn/query/MatMul_output_0" is
    [l.0, attn, query, MatMul]."""
    return [p for p in name.removesuffix("_output_0").split("/") if p]


def _common_prefix(names: list[list[str]]) -> int:
    """How many leading parts all `names` share."""
    count = 0
    for column in zip(*names):
        if len(set(column)) != 1:
            break
        count += 1
    return count
