"""What each call of a deep capture was observed to change, and what it was allowed to.

A deep capture (`egf-audit capture --deep`) holds, after every kernel launch, memset and copy,
the runs of bytes that changed in any live allocation (`Effect`). Here they are paired with the
call that made them and with what that call declares it writes, in the process's addresses
(trace/spans.py):

- an ABI kernel egf-audit knows: its kernel-table write boxes on its pointer arguments;
- a GEMM: every batch's C (cuBLASLt: D) box; the kernels cuBLAS launched inside the call (the
  recorder saw a cuBLAS library on the launch's call stack) are the GEMM's, and may also write
  cuBLAS's own workspace: an allocation those kernels were handed that holds none of the
  GEMM's operands;
- a memset or a copy: its destination;
- any other kernel (the trainer's own, CuPy's, a cuBLAS kernel outside a GEMM call): the
  allocations its parameters point into, pointers inside struct parameters included: egf-audit
  does not know its regions, so only its reach is bounded.

EGF013 requires every change inside what its call may write; EGF002 follows the scale's writes
to the GEMMs that compute dW w_b0fc. Every call must carry its effect, and every effect must
have compared every allocation live when its call ran: a gap is a finding, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from egf_audit.trace.process import OBSERVED_KINDS
from egf_audit.trace.spans import Spans, Unbounded, declared, whole

if TYPE_CHECKING:
    from collections.abc import Iterable

    from egf_audit.trace.allocations import Allocation
    from egf_audit.trace.model import Trace
    from egf_audit.trace.process import Effect, Record


@dataclass(frozen=True)
class Observed:
    """One call's observation: its record, what changed, what it may write (None: what it may
    write is unknown, with `unknown` saying why) and the GEMM whose call made it, if any."""

    record: Record
    changed: Spans
    allowed: Spans | None
    unknown: str = ""
    gemm: Record | None = None


def _scanned_problem(effect: Effect, live: tuple[int, int]) -> str | None:
    if (effect.allocations, effect.bytes) == live:
        return None
    return (
        f"its effect compared {effect.allocations} allocations of {effect.bytes} bytes in all; "
        f"{live[0]} of {live[1]} bytes were live when it ran"
    )


def _live_totals(allocations: list[Allocation], seqs: list[int]) -> dict[int, tuple[int, int]]:
    """(count, bytes) of the allocations live at each of `seqs` (ascending). A zero-byte one
    holds nothing to compare: the recorder keeps no copy of it, and it is not counted here."""
    held = [a for a in allocations if a.bytes > 0]
    changes = sorted(
        [(a.made, 1, a.bytes) for a in held]
        + [(a.freed, -1, -a.bytes) for a in held if a.freed is not None]
    )
    out: dict[int, tuple[int, int]] = {}
    count = total = i = 0
    for seq in seqs:
        while i < len(changes) and changes[i][0] < seq:
            count, total = count + changes[i][1], total + changes[i][2]
            i += 1
        out[seq] = (count, total)
    return out


def _handed(ct: Trace, pointers: Iterable[int], seq: int) -> list[Allocation]:
    """The allocations live at `seq` that hold one of `pointers` (Captured.holding)."""
    return list({a for p in pointers for a in ct.capture.holding(p) if a.live_at(seq)})


def _may_write(ct: Trace, r: Record, gemm: Record | None, kernels: list[Record]) -> Spans:
    if gemm is not None:
        operands = [p for p in (gemm.args.get(k) for k in ("A", "B", "C", "D", "bias")) if p]
        handed = _handed(ct, (p for k in kernels for p in k.pointers), r.seq)
        workspace = [a for a in handed if not any(a.holds(p) for p in operands)]
        return declared(gemm, "w", ct).union(whole(workspace))
    if r.kind == "kernel" and not r.decoded:
        return whole(_handed(ct, r.pointers, r.seq))
    return declared(r, "w", ct)


def observations(ct: Trace) -> tuple[list[Observed], list[str]]:
    """Every observed call in program order, and the problems of what is missing or short: a
    call without its effect, an effect that did not compare every live allocation, a launch
    cuBLAS made inside a GEMM call no record holds."""
    proc = ct.capture.process
    by_seq = {r.seq: r for r in ct.capture.records}
    inside = ct.capture.made_inside()
    calls = [
        r for r in ct.capture.records if r.kind in OBSERVED_KINDS and not r.args.get("captured")
    ]
    live = _live_totals(ct.capture.allocations, [r.seq for r in calls])
    out: list[Observed] = []
    problems: list[str] = []
    for r in calls:
        what = f"#{r.seq} {r.name} (line {r.line})"
        effect = proc.effects.get(r.seq)
        if effect is None:
            problems.append(f"{what} ran and no effect of it was recorded")
            continue
        if (problem := _scanned_problem(effect, live[r.seq])) is not None:
            problems.append(f"{what}: {problem}")
            continue
        gemm = by_seq.get(r.within) if r.within is not None and r.within >= 0 else None
        if r.within is not None and r.within >= 0 and gemm is None:
            problems.append(f"{what} was made by cuBLAS inside a call no GEMM record holds")
            continue
        changed = Spans.runs(effect.changed)
        try:
            kernels = inside.get(gemm.seq, []) if gemm is not None else []
            out.append(Observed(r, changed, _may_write(ct, r, gemm, kernels), gemm=gemm))
        except Unbounded as exc:
            out.append(Observed(r, changed, None, unknown=str(exc), gemm=gemm))
    return out, problems


def where(ct: Trace, address: int, seq: int) -> str:
    """A byte address in words: `buffer[element] (tensor)`, else its place in the allocation
    live at `seq` (or past its end), else that no allocation holds it."""
    found = ct.capture.layout.resolve(address - address % 4)
    if found is not None:
        buffer, offset = found
        tensor = ct.capture.layout.tensor_at(buffer, offset)
        named = f" ({tensor[0]})" if tensor and tensor[0] != buffer.name else ""
        return f"{buffer.name}[{offset}]{named}"
    holders = [a for a in ct.capture.holding(address) if a.live_at(seq)]
    if holders:
        a = holders[-1]
        return f"byte {address - a.address} of an allocation of {a.bytes} bytes"
    before = [a for a in ct.capture.allocations if a.live_at(seq) and a.address <= address]
    if before:
        a = max(before, key=lambda a: a.address)
        gap = address - a.address - a.bytes
        return f"memory {gap} bytes after the end of an allocation of {a.bytes} bytes"
    return "memory no live allocation holds"


def calls_changing(observed: list[Observed]) -> dict[int, Spans]:
    """By record seq: what each call changed, a GEMM's being its kernels' together."""
    out: dict[int, Spans] = {}
    for o in observed:
        key = o.gemm.seq if o.gemm is not None else o.record.seq
        out[key] = out.get(key, Spans()).union(o.changed)
    return out
