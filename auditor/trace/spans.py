"""Where a captured call may write and what it may read, in device addresses, and the byte-range
sets both are compared in. A capture's launches are judged in the process's own addresses: a
declared region (the kernel table's box on a pointer argument, a GEMM's operand boxes, a memset's
or a copy's destination) becomes the byte ranges it covers, and a deep capture's observed changes
(`Effect.changed`) are compared with them. The invariants' capture checks (EGF013's containment,
EGF002's data flow) read these; nothing here judges.

Bounded work: a box's rows are spelled out only inside the allocation its pointer lay in as the
call ran (nothing outside it can have been changed by the call and seen: the deep recorder
compares allocations; EGF001 judges the box's whole extent by arithmetic), never more than
MAX_BOX_ROWS of them, so no set is larger than the memory it describes: a launch handed rows =
2**31 - 1 against a 12 KiB buffer costs the rows of 12 KiB. A box whose pointer no recorded
allocation holds is spelled out whole, up to the same bound; past it, Unbounded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.trace.allocations import Allocation
from egf_audit.trace.buffers import ELEMENT_BYTES, CaptureLayout
from egf_audit.trace.gemm_operands import gemm_operands
from egf_audit.trace.process import GEMM_KINDS, Record

if TYPE_CHECKING:
    from egf_audit.trace.model import Trace

MAX_BATCHES = 1 << 16  # batches of one strided GEMM spelled out; more is refused (Unbounded)
MAX_BOX_ROWS = 1 << 20  # separate rows of one box spelled out; more is refused (Unbounded)
Window = tuple[int, int] | None  # the bytes [start, end) a box is spelled out in, or all of it


class Unbounded(Exception):
    """A call's regions cannot be spelled out (an unbound GEMM, too many batches)."""


@dataclass(frozen=True)
class Spans:
    """A set of bytes: disjoint, ascending [start, end) ranges, none touching the next."""

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, ranges: Iterable[tuple[int, int]]) -> Spans:
        merged: list[tuple[int, int]] = []
        for start, end in sorted(r for r in ranges if r[1] > r[0]):
            if merged and start <= merged[-1][1]:
                if end > merged[-1][1]:
                    merged[-1] = (merged[-1][0], end)
            else:
                merged.append((start, end))
        return cls(tuple(merged))

    @classmethod
    def runs(cls, runs: Iterable[tuple[int, int]]) -> Spans:
        """From (address, bytes) runs, as an effect lists them."""
        return cls.of((a, a + n) for a, n in runs)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    @property
    def bytes(self) -> int:
        return sum(end - start for start, end in self.ranges)

    def union(self, other: Spans) -> Spans:
        return Spans.of((*self.ranges, *other.ranges))

    def minus(self, other: Spans) -> Spans:
        mine, cut = self.ranges, other.ranges
        if not mine or not cut or cut[0][0] >= mine[-1][1] or cut[-1][1] <= mine[0][0]:
            return self  # nothing of `other` lies within self's extent: a walk would cut nothing
        out: list[tuple[int, int]] = []
        j = 0
        for start, end in mine:
            while j < len(cut) and cut[j][1] <= start:
                j += 1
            k, at = j, start
            while k < len(cut) and cut[k][0] < end:
                if cut[k][0] > at:
                    out.append((at, cut[k][0]))
                at = max(at, cut[k][1])
                k += 1
            if at < end:
                out.append((at, end))
        return Spans(tuple(out))

    def intersect(self, other: Spans) -> Spans:
        rest = self.minus(other)
        return Spans() if rest is self else self.minus(rest)


def box_ranges(
    pointer: int,
    box: tuple[int, int, int, int],
    element_bytes: int = ELEMENT_BYTES,
    window: Window = None,
) -> list[tuple[int, int]]:
    """The bytes of a (relative offset, rows, width, row stride) box, in elements, at
    `pointer`, inside `window` where one is given: one range per row, or one for the whole box
    where its rows touch or overlap. Raises Unbounded past MAX_BOX_ROWS rows."""
    rel, rows, width, ld = box
    if rows <= 0 or width <= 0:
        return []
    start = pointer + rel * element_bytes
    step, length = ld * element_bytes, width * element_bytes
    if step < 0:  # rows walked downwards: the same rows, from the last one up
        start, step = start + (rows - 1) * step, -step
    low, high = window if window is not None else (start, start + (rows - 1) * step + length)
    if rows == 1 or step <= length:  # contiguous: one range
        lo, hi = max(start, low), min(start + (rows - 1) * step + length, high)
        return [(lo, hi)] if lo < hi else []
    first = max(0, -(-(low - start - length + 1) // step))  # the first row ending past `low`
    last = min(rows - 1, (high - 1 - start) // step)  # the last row starting before `high`
    if last - first + 1 > MAX_BOX_ROWS:
        raise Unbounded(f"a box of {last - first + 1} separate rows (more than {MAX_BOX_ROWS})")
    return [
        (max(s, low), min(s + length, high))
        for s in (start + r * step for r in range(first, last + 1))
    ]


def _window(ct: Trace | None, pointer: int, seq: int) -> Window:
    """The allocation `pointer` lay in as the call of seq `seq` ran, where one is recorded."""
    held = None if ct is None else ct.capture.live_holder(pointer, seq)
    return None if held is None else (held.address, held.address + held.bytes)


def _gemm_spans(r: Record, wants: str, ct: Trace | None) -> Spans:
    """Every batch's operand boxes of a GEMM record whose access includes `wants` ("r", "w")."""
    args = r.args
    if "unbound" in args:
        raise Unbounded(f"its operands are not bound ({args['unbound']})")
    batch = int(args.get("batch", 1))
    if batch > MAX_BATCHES:
        raise Unbounded(f"{batch} batches (more than {MAX_BATCHES})")
    ranges: list[tuple[int, int]] = []
    for op in gemm_operands(args):
        if wants not in op.access:
            continue
        role = op.role.split("[")[0]
        if batch == 1 or args.get(f"{role}_ptrs") is not None:
            pointers = [op.pointer]  # one matrix, or one batch of a pointer-array call
        elif "[" in op.role:
            continue  # a strided call's last batch: spelled out with its first below
        else:
            stride = int(args.get(f"stride{role}", 0)) * op.element_bytes
            pointers = [op.pointer + i * stride for i in range(batch)]
        for pointer in pointers:
            window = _window(ct, pointer, r.seq)
            ranges += box_ranges(pointer, (0, *op.box), op.element_bytes, window)
    return Spans.of(ranges)


def gemm_writes(r: Record, ct: Trace | None = None) -> Spans:
    return _gemm_spans(r, "w", ct)


def gemm_reads(r: Record, ct: Trace | None = None) -> Spans:
    return _gemm_spans(r, "r", ct)


def declared(r: Record, mode: str, ct: Trace | None = None) -> Spans:
    """What a decoded ABI kernel, a GEMM, a memset or a copy declares it reads ("r") or writes
    ("w"): the kernel table's boxes on its pointer arguments, every batch's operand boxes, the
    destination (and a copy's source). With the call's capture `ct`, each box is spelled out
    inside the allocation its pointer lay in (module docstring)."""
    if r.kind in GEMM_KINDS:
        return _gemm_spans(r, mode, ct)
    if r.kind in ("memset", "copy"):
        a = r.args
        role = "dst" if mode == "w" else "src" if r.kind == "copy" else None
        if role is None or not a.get(role):
            return Spans()
        return Spans.of([(a[role], a[role] + a["bytes"])])
    if r.kind == "kernel" and r.decoded:
        spec = KERNELS_BY_NAME[r.name]
        return Spans.of(
            rng
            for x in spec.accesses
            if mode in x.mode
            for rng in box_ranges(
                r.args[x.param], x.box(r.args), window=_window(ct, r.args[x.param], r.seq)
            )
        )
    raise Unbounded(f"{r.name} is no kernel egf-audit knows: it declares no regions")


def whole(allocations: Iterable[Allocation]) -> Spans:
    return Spans.of((a.address, a.address + a.bytes) for a in allocations)


def whole_buffers(layout: CaptureLayout, start: int, end: int) -> int | None:
    """Where the named buffers that bytes [start, end) meet end, when they meet at least one
    and each of them whole (a memset or a copy over a group of buffers a trainer allocated
    together, the padding between them included); None when they meet one in part, or none."""
    reach = None
    for b in layout.buffers.values():
        b_end = b.base + b.size * ELEMENT_BYTES
        if b.base < end and start < b_end:
            if b.base < start or b_end > end:
                return None
            reach = max(reach or 0, b_end)
    return reach
