"""The guard zones around every allocation and the comparison a backend makes after a launch:
what the rebuild's launch watch observes (the records it makes of it are in
egf_audit.trace.effects), and the error a worker raises when the launch killed it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from egf_audit.trace.effects import GuardBreach, StrayWrite

# The bit pattern every guard zone holds: a signalling NaN no kernel of the pipeline writes.
CANARY_BITS = 0x7FA5A5A5
GUARD_ELEMENTS = 64  # elements of canary on each side of a buffer (the CPU adds PROT_NONE zones)


class LaunchFailed(RuntimeError):
    """The process running a launch died, exited or timed out; `what` says which, in words."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def changed_outside(
    xp: Any, live: Any, shadow: Any, exempt: tuple[tuple[int, int, int, int], ...]
) -> tuple[int, int, int, int] | None:
    """Compare `live` with `shadow` bitwise, then bring `shadow` up to date. Changes inside the
    `exempt` boxes (offset, rows, width, row stride) are allowed; for the others return
    (first index, count, old bits, new bits), else None. `xp` is numpy or cupy."""
    if any(_covers(box, live.shape[0]) for box in exempt):  # the launch may write it all
        shadow[...] = live
        return None
    live_bits, shadow_bits = live.view(xp.uint32), shadow.view(xp.uint32)
    changed = live_bits != shadow_bits
    if not bool(changed.any()):
        return None
    for box in exempt:
        _clear_box(changed, box)
    found = None
    if bool(changed.any()):
        where = xp.flatnonzero(changed)
        first = int(where[0])
        found = (first, int(where.size), int(shadow_bits[first]), int(live_bits[first]))
    shadow[...] = live
    return found


def _covers(box: tuple[int, int, int, int], size: int) -> bool:
    offset, rows, width, ld = box
    return offset == 0 and (width >= size if rows <= 1 else width == ld and rows * ld >= size)


def _clear_box(flags: Any, box: tuple[int, int, int, int]) -> None:
    """flags[offset + r * ld + c] = False for r < rows, c < width, clipped to the array."""
    offset, rows, width, ld = box
    size = flags.shape[0]
    if rows <= 0 or width <= 0 or offset >= size:
        return
    if rows == 1 or ld == width or ld <= 0:
        rows = 1 if ld <= 0 else rows
        flags[max(offset, 0) : min(offset + (rows - 1) * ld + width, size)] = False
        return
    full = min(rows, max(0, (size - offset) // ld))  # rows whose whole stride lies inside
    if full and offset >= 0:
        flags[offset : offset + full * ld].reshape(full, ld)[:, : min(width, ld)] = False
    for r in range(full, rows):
        start = offset + r * ld
        flags[max(start, 0) : min(start + width, size)] = False


def guard_breaches(
    found: list[tuple[int, str, int, int]], names: dict[int, str]
) -> tuple[GuardBreach, ...]:
    """A backend's guard findings (base, side, distance, count) named by buffer; a base no
    buffer starts at (freed since) is dropped."""
    return tuple(
        GuardBreach(names[base], side, distance, count)
        for base, side, distance, count in found
        if base in names
    )


def stray_writes(
    changes: list[tuple[int, int, int, int, int]],
    names: dict[int, str],
    tensor_at: Callable[[str, int], str | None],
) -> tuple[StrayWrite, ...]:
    """A backend's changes outside the declared regions (base, first, count, old, new) named by
    buffer and by the tensor holding the first changed element."""
    return tuple(
        StrayWrite(names[base], first, tensor_at(names[base], first), count, old, new)
        for base, first, count, old, new in changes
    )
