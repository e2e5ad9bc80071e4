"""What a capture recorded of one process, once read: its calls in program order (`Record`), what
a deep or guarded capture observed each call change (`Effect`, `Contents`), and the regions
snapshotted around launches (`SnapshotRegion`). The capture's reader (egf_audit.capture) makes
these from a capture folder; they are the evidence only a capture holds, carried on the trace
(trace/captured.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

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


GEMM_KINDS = ("sgemm", "gemm")  # cublasSgemm_v2, and every other GEMM entry point
