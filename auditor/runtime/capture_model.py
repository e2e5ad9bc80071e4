"""What a capture of the trainer's own process is, once read: the records of one process, the
buffers its pointers land in, and the same `Trace` the rebuild records, cut into steps and call
sites. egf_audit.capture reads capture folders into these types; the invariants judge them. The
types live here, below both, so an invariant's capture check sits beside its rebuild check and
neither imports the code that reads the files.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from egf_audit.runtime.memory import ELEMENT_BYTES
from egf_audit.runtime.trace import BufferLayout, Trace


@dataclass(frozen=True)
class Record:
    """One captured call, in the process's program order."""

    seq: int
    kind: str  # "kernel", "sgemm", "gemm" (another cuBLAS GEMM), "memset", "copy", "alloc"
    name: str  # kernel symbol, cuBLAS function, or the kind
    api: str  # the driver/runtime/cuBLAS entry point
    args: dict[str, Any]
    decoded: bool = True  # kernels: parameters named from egf-audit's kernel table
    line: int = 0  # the events file's line it came from (1-based), for messages


@dataclass(frozen=True)
class SnapshotRegion:
    """One snapshotted region around a launch: the FNV-1a hash of every element (`hash`), and
    the values of the first `values.size` of its `elements` (the body of a concat keeps its hash
    only). `rows`, `ld` and `skip_col` say how the recorder walked it."""

    launch: int  # the seq of the launch it was taken around
    when: str  # "before", "after", "step_start"
    region: str  # "wire", "body", "alpha", "d_h_s2", "d_concat", "target", "online"
    ptr: int
    elements: int
    hash: str
    values: np.ndarray
    rows: int = 1
    ld: int = 0
    skip_col: int = -1

    @property
    def complete(self) -> bool:
        """Every element's value was kept (not only its hash)."""
        return self.skip_col < 0 and self.values.size == self.elements


@dataclass
class ProcessCapture:
    pid: int
    init: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    snapshots: list[SnapshotRegion] = field(default_factory=list)
    ended: bool = False  # the recorder wrote its exit event: the process ended through exit()
    events_file: str = ""  # the file it was read from, for messages
    cut_off: str = ""  # "events-<pid>.jsonl line N": its last line, cut off mid-write
    _regions: dict[tuple[int, str], dict[str, SnapshotRegion]] | None = field(
        default=None, repr=False
    )

    def kernels(self, name: str | None = None) -> list[Record]:
        return [r for r in self.records if r.kind == "kernel" and (name is None or r.name == name)]

    def regions(self, launch: int, when: str) -> dict[str, SnapshotRegion]:
        """The regions snapshotted around the launch of seq `launch`, by region name."""
        if self._regions is None:
            self._regions = {}
            for s in self.snapshots:
                self._regions.setdefault((s.launch, s.when), {})[s.region] = s
        return self._regions.get((launch, when), {})


@dataclass
class Buffer:
    name: str
    base: int  # device address
    size: int  # elements
    tensors: dict[str, tuple[int, int, int]]  # name -> (offset, rows, cols)
    source: str  # how it was named
    shaped: bool = True  # False: a flat allocation; its own-name tensor is a placeholder
    bounded: bool = True  # False: `size` is only what inference saw of it, a lower bound

    def contains(self, ptr: int) -> bool:
        return self.base <= ptr < self.base + self.size * ELEMENT_BYTES


class NamedBuffer(TypedDict):
    """How one buffer of a capture was named: a row of the capture document's buffer table."""

    buffer: str
    elements: int
    named_by: str


@dataclass
class CaptureLayout:
    buffers: dict[str, Buffer] = field(default_factory=dict)
    dims: dict[str, Any] = field(default_factory=dict)
    from_file: bool = False
    _by_base: list[Buffer] | None = field(default=None, repr=False)
    _bases: list[int] = field(default_factory=list, repr=False)

    def add(self, buffer: Buffer) -> None:
        self.buffers.setdefault(buffer.name, buffer)
        self._by_base = None

    def resolve(self, ptr: int) -> tuple[Buffer, int] | None:
        """The innermost named buffer holding `ptr`, and the element offset into it. Buffers
        nest (a tensor's own name inside a flat buffer) but never partly overlap, so the
        holder with the highest base at or below `ptr` is the innermost."""
        if self._by_base is None:
            self._by_base = sorted(self.buffers.values(), key=lambda b: (b.base, -b.size))
            self._bases = [b.base for b in self._by_base]
        i = bisect.bisect_right(self._bases, ptr) - 1
        while i >= 0 and not self._by_base[i].contains(ptr):
            i -= 1
        if i < 0:
            return None
        inner = self._by_base[i]
        byte_offset = ptr - inner.base
        if byte_offset % ELEMENT_BYTES:
            return None
        return inner, byte_offset // ELEMENT_BYTES

    def base_of(self, name: str) -> int | None:
        buffer = self.buffers.get(name)
        return None if buffer is None else buffer.base

    def tensor_at(self, buffer: Buffer, offset: int) -> tuple[str, tuple[int, int, int]] | None:
        """The named tensor of `buffer` holding element `offset` (never a placeholder)."""
        for name, (t_offset, rows, cols) in buffer.tensors.items():
            if not buffer.shaped and name == buffer.name:
                continue  # the placeholder of a flat allocation names no shape
            if t_offset <= offset < t_offset + rows * cols:
                return name, (t_offset, rows, cols)
        return None

    def as_trace_layout(self) -> dict[str, BufferLayout]:
        """The form `Trace.layout` has: buffer -> dtype, size, tensors."""
        return {
            b.name: {
                "dtype": "f32",
                "size": b.size,
                "tensors": {k: list(v) for k, v in b.tensors.items()},
            }
            for b in self.buffers.values()
        }

    def naming(self) -> list[NamedBuffer]:
        return [
            {"buffer": b.name, "elements": b.size, "named_by": b.source}
            for b in sorted(self.buffers.values(), key=lambda b: b.name)
        ]


@dataclass
class Site:
    """One backward_full call site of one step: its launches run from `begin` (the first
    launch after the previous site, or the step's first GEMM) to `end` (its last accumulate)."""

    name: str
    step: int
    begin: int  # positions in CaptureTrace.trace.launches
    first_accumulate: int
    end: int


@dataclass
class CaptureTrace:
    """One audited process: its launches as a `Trace` (the same launches, bindings and labels
    the rebuild records), the layout that named its pointers, and its call sites."""

    trace: Trace
    layout: CaptureLayout
    process: ProcessCapture
    records: list[Record] = field(default_factory=list)  # parallel to trace.launches
    sites: list[Site] = field(default_factory=list)
    allocations: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes)

    def dim(self, name: str) -> int | None:
        value = self.layout.dims.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def record_of(self, index: int) -> Record:
        return self.records[index]

    def steps(self) -> list[int]:
        """The training steps the capture ran: those that reached their polyak_ema."""
        return sorted({s.step for s in self.sites})
