"""What a capture observed a launch write: the one place the checks that fail closed on a kernel
egf-audit does not know (EGF002, EGF005, EGF006, EGF007, EGF008) read their evidence.

A kernel egf-audit does not know, handed a pointer into a buffer, may write anything that
pointer reaches. Two recordings observe what it did write:

- a deep capture's effect after the launch, every live allocation compared;
- without `--deep`, the guard the recorder keeps around every launch of such a kernel
  (auditor/capture/rec_guard.c): each allocation the launch was handed a pointer into, compared
  whole before and after it.

Either gives the runs of bytes the launch changed. A buffer lying wholly inside what was
compared is written exactly when a changed run meets it; anywhere else the launch's writes are
unknown, and the check that needed them fails closed as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from egf_audit.trace.buffers import ELEMENT_BYTES
from egf_audit.trace.spans import Spans

if TYPE_CHECKING:
    from egf_audit.trace.model import Launch, Trace
    from egf_audit.trace.process import Effect


def _observation(ct: Trace, x: Launch) -> Effect | None:
    seq = ct.capture.records[x.index].seq
    return ct.capture.process.effects.get(seq) or ct.capture.process.guards.get(seq)


def observed_write(ct: Trace, x: Launch, buffer: str) -> bool | None:
    """Whether launch `x` changed any byte of `buffer`, as the capture observed it; None where
    no observation covers the whole buffer (no deep effect, no guard, or a guard that compared
    other allocations)."""
    named = ct.capture.layout.buffers.get(buffer)
    effect = _observation(ct, x)
    if named is None or effect is None:
        return None
    start, end = named.base, named.base + named.size * ELEMENT_BYTES
    if effect.compared and not any(b <= start and end <= b + n for b, n in effect.compared):
        return None
    return any(a < end and start < a + n for a, n in effect.changed)


def guard_changes(ct: Trace) -> dict[int, Spans]:
    """By launch seq: what each guarded launch changed in the allocations it was handed."""
    return {seq: Spans.runs(g.changed) for seq, g in ct.capture.process.guards.items()}
