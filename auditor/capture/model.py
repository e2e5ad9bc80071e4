"""What a capture of the trainer's own process is, once read: the records of one process, the
buffers its pointers land in, and the same `Trace` the rebuild records, cut into steps and call
sites. The reader beside it (events.py, layout.py, convert.py) makes these from a capture
folder; the invariants, a floor above, judge them. The capture's room holds no check and
imports no invariant (cli/capture_audit.py runs them).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from egf_audit.capture.allocations import Allocation, AllocationIndex
from egf_audit.capture.gemm_operands import gemm_operands
from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.runtime.call_sites import Site
from egf_audit.runtime.config_view import HyperView
from egf_audit.runtime.hyper import Hyper
from egf_audit.runtime.memory import ELEMENT_BYTES
from egf_audit.runtime.trace import Binding, BufferLayout, Region, Trace

if TYPE_CHECKING:  # numpy is not imported to run a capture: `capture` reads it only afterwards
    import numpy as np

# How a recorder hashed its snapshot regions (its init event's "hash"; absent: fnv1a, the
# byte-by-byte FNV-1a of recorders before mix64). invariants/capture_common.py computes both.
HASH_FNV1A, HASH_MIX64 = "fnv1a", "mix64"
HASH_KINDS = (HASH_FNV1A, HASH_MIX64)


@dataclass(frozen=True)
class Record:
    """One captured call, in the process's program order."""

    seq: int
    kind: str  # "kernel", "sgemm" (cublasSgemm_v2), "gemm" (any other), "memset", "copy", "alloc"
    name: str  # kernel symbol, cuBLAS function, or the kind
    api: str  # the driver/runtime/cuBLAS entry point
    args: dict[str, Any]
    decoded: bool = True  # kernels: parameters named from egf-audit's kernel table
    line: int = 0  # the events file's line it came from (1-based), for messages
    # a kernel launch made by cuBLAS itself (the recorder found a cuBLAS library
    # on its call stack): the seq of the GEMM record whose call made it, -1 inside a cuBLAS call
    # that is no GEMM; None for the trainer's own launches
    within: int | None = None
    # a deep capture's unknown kernel: every 8-byte value among its parameters (plain ones and
    # the aligned words of struct parameters), the pointers it may have been handed
    pointers: tuple[int, ...] = ()


OBSERVED_KINDS = ("kernel", "memset", "copy")  # what a deep recorder writes an effect after


class Effect(NamedTuple):
    """What one call was observed to change, in a deep capture (`egf-audit capture --deep`):
    once the call had finished, the recorder compared every live allocation word by word with
    its own device copy of it, on the GPU, and wrote the runs of words that differ (then
    brought its copy up to date). `allocations` and `bytes` say what it compared, so a capture
    that skipped memory is seen."""

    launch: int  # the seq of the call's record
    allocations: int
    bytes: int
    changed: tuple[tuple[int, int], ...]  # (address, bytes) runs, in address order
    # where the runs' new bytes start in the process's values file (a deep capture with
    # values); None: not recorded, so memory is unknown from this call on
    values: int | None = None
    # a guard (not deep: a kernel egf-audit does not know): the (base, bytes) of each
    # allocation compared around the launch; () for a deep effect, which compared them all
    compared: tuple[tuple[int, int], ...] = ()


class Contents(NamedTuple):
    """A new allocation's non-zero words as it was made, in a deep capture with values: with
    every call's changes after it, they make the allocation's bytes known at any point."""

    alloc: int  # the seq of the alloc record
    changed: tuple[tuple[int, int], ...]  # (address, bytes) runs of non-zero words
    values: int | None = None  # as Effect.values


@dataclass(frozen=True)
class SnapshotRegion:
    """One snapshotted region around a launch: the hash of every element (`hash`, of the kind
    `hash_kind` the recorder's init event names), and the values of the first `values.size` of
    its `elements` (the body of a concat keeps its hash only). `rows`, `ld` and `skip_col` say
    how the recorder walked it."""

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
    hash_kind: str = "fnv1a"  # HASH_KINDS: a capture whose init event names none is fnv1a

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
    internal_lt: int = 0  # cublasLtMatmul calls cuBLAS made inside a logged classic call
    graph_launches: int = 0  # cuGraphLaunch / cudaGraphLaunch calls: replays it cannot follow
    deep: bool = False  # recorded with --deep: an Effect after every launch, memset and copy
    effects: dict[int, Effect] = field(default_factory=dict)  # by the call's seq
    # not deep: a guard after each launch of a kernel egf-audit does not know (rec_guard.c)
    guarded: bool = False
    guards: dict[int, Effect] = field(default_factory=dict)  # by the launch's seq
    # recorded with values (init "values"): every effect's and every allocation's bytes
    values: bool = False
    contents: dict[int, Contents] = field(default_factory=dict)  # by the alloc record's seq
    values_bytes: int = 0  # how long the values file must be for every event that names it
    # the values file's bytes, read when first called (egf_audit.capture reads the file)
    read_values: Callable[[], np.ndarray] | None = field(default=None, repr=False)
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
    # named by its allocation, not its address: (bytes, index) = the index-th allocation of that
    # many bytes the process made; its base is 0 until the layout is placed in a process
    allocation: tuple[int, int] | None = None
    # the declared shape of each tensor the layout gives leading axes the program slices
    # (`[L, B*T, C]`: its rows above are L * B*T); the last two axes are one slice's rows, cols
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def contains(self, ptr: int) -> bool:
        return self.base <= ptr < self.base + self.size * ELEMENT_BYTES


def _end(b: Buffer) -> int:
    return b.base + b.size * ELEMENT_BYTES


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
    # by position in _by_base: the buffer below it still open where it starts (-1: none)
    _parent: list[int] = field(default_factory=list, repr=False)

    def add(self, buffer: Buffer) -> None:
        self.buffers.setdefault(buffer.name, buffer)
        self._by_base = None

    def _index(self) -> list[Buffer]:
        if self._by_base is None:
            by_base = sorted(self.buffers.values(), key=lambda b: (b.base, -b.size))
            self._bases = [b.base for b in by_base]
            self._parent = []
            open_: list[int] = []  # the buffers not ended where the next one starts, in order
            for i, b in enumerate(by_base):
                while open_ and _end(by_base[open_[-1]]) <= b.base:
                    open_.pop()
                self._parent.append(open_[-1] if open_ else -1)
                open_.append(i)
            self._by_base = by_base
        return self._by_base

    def resolve(self, ptr: int) -> tuple[Buffer, int] | None:
        """The innermost named buffer holding `ptr`, and the element offset into it. Buffers
        nest (a tensor's own name inside a flat buffer) but never partly overlap, so the
        holder with the highest base at or below `ptr` is the innermost. Only a buffer still
        open where the last one at or below `ptr` starts can hold it (one that ended before
        ends below `ptr`), and those are that buffer's chain of parents: O(log n + depth)."""
        by_base = self._index()
        i = bisect.bisect_right(self._bases, ptr) - 1
        while i >= 0 and not by_base[i].contains(ptr):
            i = self._parent[i]
        if i < 0:
            return None
        inner = by_base[i]
        byte_offset = ptr - inner.base
        if byte_offset % ELEMENT_BYTES:
            return None
        return inner, byte_offset // ELEMENT_BYTES

    def outermost(self) -> CaptureLayout:
        """The same layout without the buffers that lie inside another (a view the file names
        inside `params`, say): every pointer resolves to the allocation-level buffer. One
        sweep in address order: a buffer lies inside another when one before it (a lower
        base, or the same base and more elements) ends at or after its end."""
        inside: set[int] = set()
        reach, group, group_reach = -1, None, -1  # the furthest end before this group
        for b in sorted(self.buffers.values(), key=lambda b: (b.base, -b.size)):
            if (b.base, b.size) != group:  # a group: buffers of one span, none inside another
                group, group_reach = (b.base, b.size), reach
            if group_reach >= _end(b):
                inside.add(id(b))
            reach = max(reach, _end(b))
        kept = {name: b for name, b in self.buffers.items() if id(b) not in inside}
        return CaptureLayout(kept, self.dims, self.from_file)

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
class CaptureTrace:
    """One audited process: its launches as a `Trace` (the same launches, bindings and labels
    the rebuild records), the layout that named its pointers, and its call sites."""

    trace: Trace
    layout: CaptureLayout
    process: ProcessCapture
    records: list[Record] = field(default_factory=list)  # parallel to trace.launches
    sites: list[Site] = field(default_factory=list)
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

    def record_of(self, index: int) -> Record:
        return self.records[index]

    def steps(self) -> list[int]:
        """The training steps the capture ran: those that reached their polyak_ema."""
        return sorted({s.step for s in self.sites})


# ---- a record's operands as the rebuild's bindings ----
GEMM_KINDS = ("sgemm", "gemm")  # cublasSgemm_v2, and every other GEMM entry point


def _binding(layout: CaptureLayout, role: str, ptr: int, access: str, box: tuple) -> Binding:
    rel, rows, width, ld = box
    where = layout.resolve(ptr) if isinstance(ptr, int) else None
    if where is None:
        return Binding(role, ptr, access, None, None, None, False)
    buffer, offset = where
    region = Region(buffer.name, offset + rel, rows, width, ld)
    # a buffer inference sized from what it saw is known no further: the allocation holding
    # it bounds the launch instead (EGF001)
    in_bounds = region.fits(buffer.size) if buffer.bounded else region.offset >= 0
    found = layout.tensor_at(buffer, region.offset)
    name, shape = found if found else (None, None)
    return Binding(role, ptr, access, region, name, shape, in_bounds)


def bindings_of(layout: CaptureLayout, r: Record) -> tuple[Binding, ...]:
    a = r.args
    if r.kind in GEMM_KINDS:
        # every entry point alike: each batch's operands where they were judged; an operand of
        # another element size than the layout's fp32 is placed by its allocation alone (EGF001)
        return tuple(
            _binding(layout, op.role, op.pointer, op.access, (0, *op.box))
            if op.element_bytes == ELEMENT_BYTES
            else Binding(op.role, op.pointer, op.access, None, None, None, False)
            for op in gemm_operands(a)
        )
    if r.kind in ("memset", "copy"):
        count = -(-a["bytes"] // ELEMENT_BYTES)  # a partial last element is still touched
        ends = [("dst", "w")] + ([("src", "r")] if r.kind == "copy" else [])
        found = (
            _binding(layout, role, a.get(role, 0), acc, (0, 1, count, count)) for role, acc in ends
        )
        return tuple(b for b in found if b.region is not None)
    if r.kind == "kernel" and r.within is not None and r.within >= 0:
        # a launch cuBLAS made inside a GEMM call (the recorder saw cuBLAS on its call stack):
        # the GEMM's record binds what it reads and writes
        return ()
    if r.kind == "kernel" and r.decoded:
        spec = KERNELS_BY_NAME[r.name]
        return tuple(_binding(layout, x.param, a[x.param], x.mode, x.box(a)) for x in spec.accesses)
    if r.kind == "kernel":
        # a kernel egf-audit does not know: which named buffers its arguments point into, with
        # the access unknown ("?")
        found = (
            _binding(layout, k, v, "?", (0, 1, 1, 1)) for k, v in a.items() if k.startswith("p")
        )
        return tuple(b for b in found if b.region is not None)
    return ()
