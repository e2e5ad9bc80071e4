"""Whether a pointer's extent stays inside the allocation holding it as a call ran: EGF001's
rule for an operand or region no named tensor covers (every recorded allocation entry point;
frees close them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from egf_audit.trace.allocations import Allocation
    from egf_audit.trace.model import Trace


def allocation_problem(ct: Trace, pointer: object, extent_bytes: int, at: int) -> str | None:
    """Why `extent_bytes` from `pointer` leave the allocation holding it as the launch at event
    `at` ran (every recorded allocation entry point; frees close them), or None (inside, or in
    no recorded allocation: then nothing is known). Memory an allocation held and gave back
    before the launch is a finding, not an unknown."""
    if not isinstance(pointer, int):
        return None
    found = allocation_of(ct, pointer, at)
    if found is None:
        return None
    if not found.live_at(at):
        return f"points into an allocation freed before it ran (event {found.freed})"
    end = pointer + extent_bytes
    if end > found.address + found.bytes:
        return f"reaches {end - found.address - found.bytes} bytes past the end of its allocation"
    return None


def allocation_of(ct: Trace, pointer: object, at: int) -> Allocation | None:
    """The allocation holding `pointer` as event `at` ran: the latest made before it and not yet
    freed; else the latest made before it and freed since (a use after free)."""
    if not isinstance(pointer, int):
        return None
    before = [a for a in ct.capture.holding(pointer) if a.made < at]
    live = [a for a in before if a.live_at(at)]
    chosen = live or before
    return chosen[-1] if chosen else None
