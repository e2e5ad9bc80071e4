"""The device memory a captured process was given, and which allocation held an address when.

`Allocation` is one allocation from its call to the free of its address; `AllocationIndex` finds
every allocation that ever held an address in O(log n + k) (k: how many did), however many
the process made and freed: a trainer passes the same pointers step after step, and a capture
of 100,000 allocations and memsets is judged in seconds, where a scan per pointer was
quadratic.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple


class Allocation(NamedTuple):
    """Device memory the process was given (alloc records: every driver and runtime allocation
    entry point the recorder hooks) and, where it gave it back, when (free records). `made` and
    `freed` are event seqs, so a launch can be judged against what was allocated as it ran."""

    address: int
    bytes: int
    made: int
    freed: int | None = None

    def live_at(self, seq: int) -> bool:
        return self.made < seq and (self.freed is None or seq < self.freed)

    def holds(self, pointer: int) -> bool:
        return self.address <= pointer < self.address + self.bytes


class AllocationIndex:
    """The allocations sorted by address, over them a tree holding the largest end of each span
    of them: the allocations holding an address are those at or below it whose end lies past
    it, and the tree leads straight to each (a span whose largest end is at or below the
    address holds none)."""

    def __init__(self, allocations: list[Allocation]):
        order = sorted(range(len(allocations)), key=lambda i: allocations[i].address)
        self._made = order  # leaf position -> index in the order made
        self._starts = [allocations[i].address for i in order]
        self._size = size = 1 << max(len(order) - 1, 0).bit_length()
        tree = [-1] * (2 * size)
        for leaf, i in enumerate(order):
            tree[size + leaf] = allocations[i].address + allocations[i].bytes
        for node in range(size - 1, 0, -1):
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
        self._tree = tree

    def holding(self, address: int) -> list[int]:
        """The indexes (in the order made) of every allocation that ever held `address`."""
        below = bisect.bisect_right(self._starts, address)  # leaves [0, below) start at or under it
        found: list[int] = []
        tree, size = self._tree, self._size
        stack = [(1, 0, size)]
        while stack:
            node, first, width = stack.pop()
            if first >= below or tree[node] <= address:
                continue
            if node >= size:
                found.append(self._made[node - size])
                continue
            half = width // 2
            stack += ((2 * node, first, half), (2 * node + 1, first + half, half))
        return sorted(found)
