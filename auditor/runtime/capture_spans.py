"""Where a captured call may write and what it may read, in device addresses, and the byte-range
sets both are compared in. A capture's launches are judged in the process's own addresses: a
declared region (the kernel table's box on a pointer argument, a GEMM's operand boxes, a memset's
or a copy's destination) becomes the byte ranges it covers, and a deep capture's observed changes
(`Effect.changed`) are compared with them. The invariants' capture checks (EGF013's containment,
EGF002's data flow) read these; nothing here judges.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.runtime.capture_model import GEMM_KINDS, Allocation, Record, gemm_operands
from egf_audit.runtime.memory import ELEMENT_BYTES

MAX_BATCHES = 1 << 16  # batches of one strided GEMM spelled out; more is refused (Unbounded)


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
        out: list[tuple[int, int]] = []
        cut = other.ranges
        j = 0
        for start, end in self.ranges:
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
        return self.minus(self.minus(other))


def box_ranges(
    pointer: int, box: tuple[int, int, int, int], element_bytes: int = ELEMENT_BYTES
) -> list[tuple[int, int]]:
    """The bytes of a (relative offset, rows, width, row stride) box, in elements, at
    `pointer`: one range per row, or one for the whole box where its rows are contiguous."""
    rel, rows, width, ld = box
    if rows <= 0 or width <= 0:
        return []
    start = pointer + rel * element_bytes
    if rows == 1 or ld == width:
        return [(start, start + ((rows - 1) * ld + width) * element_bytes)]
    step, length = ld * element_bytes, width * element_bytes
    return [(start + r * step, start + r * step + length) for r in range(rows)]


def _gemm_spans(args: dict[str, object], wants: str) -> Spans:
    """Every batch's operand boxes of a GEMM record whose access includes `wants` ("r", "w")."""
    if "unbound" in args:
        raise Unbounded(f"its operands are not bound ({args['unbound']})")
    batch = int(args.get("batch", 1))  # type: ignore[call-overload]
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
            stride = int(args.get(f"stride{role}", 0)) * op.element_bytes  # type: ignore[call-overload]
            pointers = [op.pointer + i * stride for i in range(batch)]
        for pointer in pointers:
            ranges += box_ranges(pointer, (0, *op.box), op.element_bytes)
    return Spans.of(ranges)


def gemm_writes(r: Record) -> Spans:
    return _gemm_spans(r.args, "w")


def gemm_reads(r: Record) -> Spans:
    return _gemm_spans(r.args, "r")


def declared(r: Record, mode: str) -> Spans:
    """What a decoded ABI kernel, a GEMM, a memset or a copy declares it reads ("r") or writes
    ("w"): the kernel table's boxes on its pointer arguments, every batch's operand boxes, the
    destination (and a copy's source)."""
    if r.kind in GEMM_KINDS:
        return _gemm_spans(r.args, mode)
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
            for rng in box_ranges(r.args[x.param], x.box(r.args))
        )
    raise Unbounded(f"{r.name} is no kernel egf-audit knows: it declares no regions")


def whole(allocations: Iterable[Allocation]) -> Spans:
    return Spans.of((a.address, a.address + a.bytes) for a in allocations)
