"""What a launch was observed to do to memory, as opposed to what the kernel table declares.

The rebuild's recorder watches every executed launch (egf_audit.runtime.launch_watch): guard
zones found overwritten, changes outside the launch's declared write regions, a launch that
crashed, exited or hung the process that ran it. These are its records, part of the trace
model; EGF013 reads them; nothing here decides a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GuardBreach:
    """A guard zone of an allocation found overwritten after a launch."""

    buffer: str
    side: str  # "before" or "after" the buffer
    distance: int  # elements from the buffer's edge to the first changed canary (1 = adjacent)
    count: int  # canaries changed


@dataclass(frozen=True)
class StrayWrite:
    """Elements of a buffer that changed outside every region the launch declared it writes."""

    buffer: str
    element: int  # first changed element (offset inside the buffer)
    tensor: str | None  # the named tensor holding it
    count: int  # elements changed outside the declared regions
    old_bits: int  # uint32 bits before and after, of the first one
    new_bits: int


@dataclass(frozen=True)
class Effects:
    """What one executed launch was seen to do. Empty tuples and no failure: contained."""

    stray_writes: tuple[StrayWrite, ...] = ()
    guard_breaches: tuple[GuardBreach, ...] = ()
    failure: str | None = None  # "crashed with SIGSEGV", "exited with status 0", ...
    not_run: str | None = None  # why a launch was skipped (its kernel failed before)

    @property
    def contained(self) -> bool:
        return not (self.stray_writes or self.guard_breaches or self.failure or self.not_run)


CONTAINED = Effects()
