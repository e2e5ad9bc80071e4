"""The device allocations live as a process's events are read, by address.

The driver never hands out memory that is still live, so two live allocations never overlap: an
allocation that would overlap one is refused. What lies inside them bounds what other events
name: a snapshot region lies inside the allocation that holds its pointer (the recorder copied
or hashed it there; adjacent live allocations count as one memory), and each run a deep
capture's effect lists lies inside an allocation the recorder compared, each compared up to its
256-byte-rounded end but never into the next allocation. A pointer no recorded allocation holds
(memory the recorder sees no allocation call for) bounds nothing here; the domain of every
address (capture/schema.py) still holds.

Lookups are O(log n): the live allocations are kept sorted by address.
"""

from __future__ import annotations

import bisect

DEEP_ROUND = 256  # a deep recorder compares each allocation up to its 256-byte-rounded end


class LiveMemory:
    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._lines: list[int] = []

    def _at(self, address: int) -> int | None:
        """The index of the live allocation holding `address`, if one does."""
        i = bisect.bisect_right(self._starts, address) - 1
        return i if i >= 0 and address < self._ends[i] else None

    def alloc(self, address: int, size: int, line: int) -> str | None:
        """Record a new allocation, or say why it cannot be one (it overlaps a live one)."""
        if not size:
            return None  # cudaMalloc(0): it holds nothing
        i = bisect.bisect_right(self._starts, address)
        for j in (i - 1, i):
            if 0 <= j < len(self._starts) and self._overlaps(j, address, address + size):
                return (
                    f"an allocation of {size} bytes at {address} overlaps the live allocation of "
                    f"{self._ends[j] - self._starts[j]} bytes at {self._starts[j]} (line "
                    f"{self._lines[j]}): the driver never hands out memory that is live"
                )
        self._starts.insert(i, address)
        self._ends.insert(i, address + size)
        self._lines.insert(i, line)
        return None

    def _overlaps(self, j: int, start: int, end: int) -> bool:
        return self._starts[j] < end and start < self._ends[j]

    def free(self, address: int) -> None:
        """A free of a live allocation's address ends it; any other frees nothing."""
        i = bisect.bisect_left(self._starts, address)
        if i < len(self._starts) and self._starts[i] == address:
            del self._starts[i], self._ends[i], self._lines[i]

    def region_problem(self, pointer: int, size: int) -> str | None:
        """Why `size` bytes from `pointer` cannot be a region the recorder read, if they cannot:
        they run past the end of the live memory holding `pointer`."""
        i = self._at(pointer)
        if i is None:
            return None
        end = self._ends[i]
        while pointer + size > end and i + 1 < len(self._starts) and self._starts[i + 1] == end:
            i += 1
            end = self._ends[i]  # the next allocation begins where this one ends
        if pointer + size <= end:
            return None
        return (
            f"{size} bytes from {pointer} run {pointer + size - end} bytes past the end of the "
            "live allocation holding it"
        )

    def compared_extent(self, address: int) -> int | None:
        """The bytes a recorder compares of the live allocation starting at `address` (up to
        its 256-byte-rounded end, never into the next allocation); None: no live allocation
        starts there."""
        i = bisect.bisect_left(self._starts, address)
        if i == len(self._starts) or self._starts[i] != address:
            return None
        end = -(-self._ends[i] // DEEP_ROUND) * DEEP_ROUND
        if i + 1 < len(self._starts):
            end = min(end, self._starts[i + 1])
        return end - address

    def compared_problem(self, runs: list[list[int]]) -> str | None:
        """Why a deep effect's changed runs cannot be what the recorder compared, if they cannot:
        a run outside every live allocation's compared extent."""
        for start, size in runs:
            i = bisect.bisect_right(self._starts, start) - 1
            if i < 0:
                return f"changed bytes at {start}, below every live allocation"
            end = -(-self._ends[i] // DEEP_ROUND) * DEEP_ROUND
            if i + 1 < len(self._starts):
                end = min(end, self._starts[i + 1])
            if start + size > end:
                return (
                    f"changed bytes {start} to {start + size}, outside every live allocation "
                    "the recorder compared (each up to its 256-byte-rounded end)"
                )
        return None
