"""The order in which the search's HTP confirmation visits a front (`search.confirmation.walk_front`), for tests."""

from __future__ import annotations

from mpstudio.search.confirmation import walk_front


def front_order(verdicts, at, budget=9, mixed=None, near=None, hopeless=frozenset()) -> list[int]:
    """The candidates `walk_front` checks, in order, over plans whose verdicts are `verdicts` (cheapest first; True
    reaches, False misses, None cannot be built), starting at the pick `at`, until `budget` plans were built; the
    candidates from `mixed` on are all-16-bit plans, those before `near` costing little more than the pick; the
    `hopeless` ones the walk's backend says clearly miss the target."""
    seen = []

    def check(i):
        seen.append(i)
        return verdicts[i]
    walk_front(len(verdicts), at, check, lambda: sum(verdicts[i] is not None for i in seen) >= budget, mixed,
               near, frozenset(hopeless))
    return seen
