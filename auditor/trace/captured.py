"""What only a capture of the trainer's own process holds, carried on its trace
(`Trace.captured`): the records the launches were made from, the layout that named its pointers,
the allocations it was given, and its process's snapshots and observed effects. The rebuild's
trace carries none (`Trace.captured` is None): it holds its scenarios' checkpoints instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egf_audit.trace.allocations import Allocation, AllocationIndex
from egf_audit.trace.buffers import CaptureLayout
from egf_audit.trace.call_sites import Site
from egf_audit.trace.config_view import HyperView
from egf_audit.trace.hyper import Hyper
from egf_audit.trace.process import ProcessCapture, Record


@dataclass
class Captured:
    """One audited process's own evidence: the layout that named its pointers, what the reader
    read of the process, the record each launch of the trace was made from, and the
    allocations it was given."""

    layout: CaptureLayout
    process: ProcessCapture
    records: list[Record] = field(default_factory=list)  # parallel to the trace's launches
    # its call sites, cut by the reader from the launches it made (trace/call_sites.py)
    sites: list[Site] | None = None
    allocations: list[Allocation] = field(default_factory=list)  # in the order made
    # the allocations that ever held a pointer, in the order made, by pointer (holding())
    _holding: dict[int, list[Allocation]] = field(default_factory=dict, repr=False)
    _index: AllocationIndex | None = field(default=None, repr=False)
    _inside: dict[int, list[Record]] | None = field(default=None, repr=False)
    # the process launched an SP14 ABI kernel; a process that did not is judged only by the
    # checks that need no SP14 name (`Invariant.any_process`), the others are not applicable
    sp14: bool = True
    # the hyper-parameters EGF010's oracle runs with: the contract's (a capture has no config)
    hyper: HyperView = field(default_factory=Hyper)

    def made_inside(self) -> dict[int, list[Record]]:
        """The launches cuBLAS made inside each GEMM call, by the GEMM record's seq (memoised)."""
        if self._inside is None:
            self._inside = {}
            for r in self.records:
                if r.within is not None and r.within >= 0:
                    self._inside.setdefault(r.within, []).append(r)
        return self._inside

    def holding(self, pointer: int) -> list[Allocation]:
        """Every allocation that ever held `pointer`, in the order made: O(log n) through the
        index, and memoised (a trainer passes the same pointers step after step)."""
        found = self._holding.get(pointer)
        if found is None:
            if self._index is None:
                self._index = AllocationIndex(self.allocations)
            made = self._index.holding(pointer)
            found = self._holding[pointer] = [self.allocations[i] for i in made]
        return found

    def live_holder(self, pointer: int, seq: int) -> Allocation | None:
        """The allocation holding `pointer` as the call of seq `seq` ran, if one did (live
        allocations never overlap: the reader refuses a capture in which they would)."""
        live = [a for a in self.holding(pointer) if a.live_at(seq)]
        return live[-1] if live else None

    def dim(self, name: str) -> int | None:
        value = self.layout.dims.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
