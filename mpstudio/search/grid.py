"""The walk over k (plan k promotes the first k tensors of the order) without assuming that accuracy rises with
k: a coarse geometric grid over [1, cap], then refinement where the evidence points (the edge below the
smallest k that reaches the target, else around the best values), while the evaluation budget allows. It stops
on evidence (the edge pinned to adjacent k, or the best values' neighbours evaluated), or when the budget ends.
Plans a stored plan makes pointless (`choice.pointless_because`) are never evaluated; a plan the walk's backend
cannot build is passed over (seen, never reaching)."""

from __future__ import annotations

from typing import Callable

from ..store import Evaluation
from .evidence import WITHIN_NOISE

# Coarse grid points at most, and how many of the best values' neighbourhoods refinement settles.
GRID_POINTS = 5
BEST_REGIONS = 2


class PrefixGrid:
    """One walk over k. `walk` supplies evaluate / left / reaches / pointless / workers (see `walk.Walk`)."""

    def __init__(self, walk, plan_k: Callable[[int], object], cap: int, known: dict[int, Evaluation],
                 reuse: Callable[[object], Evaluation | None] | None = None, full: int | None = None,
                 demoted_from: str | None = None):
        self.walk, self.plan_k, self.cap, self.known = walk, plan_k, cap, known
        # The top-down walk's k promote on the base what the all-16-bit plan `demoted_from` keeps at 16 bits:
        # its reasons count the tensors demoted from that plan, as its plans' names do.
        self.demoted_from = demoted_from
        # The whole range before the budgets cut it to `cap` (a walk that goes on may widen `cap` up to it).
        self.full = cap if full is None else full
        self.reuse = reuse  # a plan's evaluation this search already counted (another walk's), or None
        self.skipped: dict[int, Evaluation] = {}  # k -> the stored plan that made it pointless
        self.unbuilt: set[int] = set()  # k whose plan the walk's backend cannot build: passed over

    def run(self, prior: int | None = None, points: list[int] | None = None) -> str:
        """Walk until evidence or the budget stops it; returns why it stopped. The first points are `grid(prior)`,
        or `points` when given (the top-down walk's, spread over estimated latency)."""
        first = self.grid(prior) if points is None else sorted(k for k in set(points) if k not in self.known)
        for batch in _chunks(first, self._width()):
            if self.walk.left() <= 0:
                return "evaluation budget"
            self._try(batch)
        while self.walk.left() > 0:
            candidates, reason = self._next()
            if not candidates:
                return reason
            before = len(self.known) + len(self.skipped) + len(self.unbuilt)
            self._try(candidates)
            if len(self.known) + len(self.skipped) + len(self.unbuilt) == before:  # never ask the same again
                return f"no promotion left to evaluate in the walk's range ({self._span()})"
        return "evaluation budget"

    def grid(self, prior: int | None) -> list[int]:
        """Geometric points over [1, cap] (small k are where most of the gain per ms sits), with `prior`."""
        n = max(1, min(GRID_POINTS, self.cap, self.walk.left() - 1))
        points = {max(1, round(self.cap ** (i / n))) for i in range(1, n + 1)} if self.cap > 1 else {1}
        if prior is not None and 0 < prior <= self.cap and n > 1:
            points.add(prior)
        return sorted(k for k in points if k not in self.known)

    # ---- internals ----
    def _width(self) -> int:
        return max(1, len(self.walk.workers))

    def _try(self, ks) -> None:
        """Evaluate the k of `ks` not yet known and not pointless (as many as the agents and the budget allow);
        a k no plan can be evaluated for is remembered as skipped."""
        todo = []
        for k in sorted(set(ks)):
            if k in self.known or k in self.skipped or k in self.unbuilt or not 0 < k <= self.cap:
                continue
            counted = self.reuse(self.plan_k(k)) if self.reuse is not None else None
            if counted is not None:
                self.known[k] = counted
                continue
            why = self.walk.pointless(self.plan_k(k))
            if why is not None:
                self.skipped[k] = why
            else:
                todo.append(k)
        todo = todo[:max(1, min(self._width(), self.walk.left()))]
        if todo:
            for k, evaluation in zip(todo, self.walk.evaluate([self.plan_k(k) for k in todo], pass_over=True)):
                if isinstance(evaluation, Evaluation):
                    self.known[k] = evaluation
                else:
                    self.unbuilt.add(k)

    def _next(self) -> tuple[list[int], str]:
        """The next k to evaluate, or none and why the walk may stop."""
        seen = sorted(set(self.known) | set(self.skipped) | self.unbuilt)
        # Only the walk's range counts: a k known beyond it (all-16-bit, k = every tensor) has no k above it to
        # evaluate, and the range ends where stored plans make dearer ones pointless.
        reaching = [k for k in self.known if k <= self.cap and self.walk.reaches(self.known[k])]
        if reaching:
            top = min(reaching)
            low = max(k for k in seen if k < top) if any(k < top for k in seen) else 0
            if top - low <= 1:
                return [], f"target reached with {self._count(top)}; {self._number(low)} {self._says(low)}"
            return _sections(low, top, self._width()), ""
        sign = 1.0 if self.walk.hib else -1.0
        ranked = sorted((k for k in self.known if k <= self.cap), key=lambda k: -sign * self.known[k].value)
        for k in ranked[:BEST_REGIONS]:
            below = max((j for j in seen if j < k), default=None)
            above = min((j for j in seen if j > k), default=self.cap + 1)
            gaps = [(a, min(b, self.cap + 1)) for a, b in ((below, k), (k, above))
                    if a is not None and min(b, self.cap + 1) - a > 1]
            if gaps:
                return [p for a, b in gaps for p in _sections(a, b, max(1, self._width() // len(gaps)))], ""
        best = ranked[0]
        return [], (f"no promotion reaches the target: the best, {self._count(best)}, and the neighbours of the "
                    f"{min(BEST_REGIONS, len(ranked))} best are evaluated ({self._span()}: dearer ones "
                    "are not worth evaluating)")

    def _number(self, k: int) -> int:
        return k if self.demoted_from is None else self.full - k

    def _count(self, k: int) -> str:
        """Plan k in words: how many promoted on the base, or demoted from the all-16-bit plan."""
        return f"{k} promoted" if self.demoted_from is None else f"{self.full - k} demoted from {self.demoted_from}"

    def _span(self) -> str:
        """The walk's range in words ("1 to 8 promoted"; one plan when it holds one)."""
        first, last = (1, self.cap) if self.demoted_from is None else (self.full - 1, self.full - self.cap)
        numbers = f"{first}" if first == last else f"{first} to {last}"
        return numbers + (" promoted" if self.demoted_from is None else f" demoted from {self.demoted_from}")

    def _says(self, k: int) -> str:
        """What plan k, just below the smallest k that clearly reaches the target, says of it (the stop reason)."""
        if k == 0:
            return "is the base"
        if k in self.skipped:
            return "was not worth evaluating"
        if k in self.unbuilt:
            return "cannot be built"
        evidence = getattr(self.walk, "evidence", None)
        if evidence is not None and evidence.verdict(self.known[k]) == WITHIN_NOISE:
            return "is within noise of it"
        return "misses"


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _sections(lo: int, hi: int, parts: int) -> list[int]:
    """`parts` points splitting (lo, hi) evenly (bisection for one part)."""
    points = {lo + max(1, round((hi - lo) * (i + 1) / (parts + 1))) for i in range(parts)}
    return sorted(k for k in points if lo < k < hi) or [(lo + hi) // 2]


def largest(predicate: Callable[[int], bool], hi: int) -> int:
    """The largest k in [0, hi] for which `predicate` holds, assuming it holds below any k where it does (the
    estimated latency grows with k); 0 when it holds for none above 0. Bisection: no evaluation."""
    if hi <= 0 or predicate(hi):
        return max(hi, 0)
    lo, top = 0, hi
    while top - lo > 1:
        mid = (lo + top) // 2
        if predicate(mid):
            lo = mid
        else:
            top = mid
    return lo


__all__ = ["PrefixGrid", "largest", "GRID_POINTS", "BEST_REGIONS"]
