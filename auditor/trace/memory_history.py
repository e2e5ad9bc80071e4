"""A deep capture with values read as a memory history: the bytes of any recorded address range
as they were just before any call of the process.

`egf-audit capture --deep` compares every live allocation after every call and, with values
(its init event's "values"), writes the new bytes of every changed run and, when an allocation
is made, its non-zero words. An allocation therefore starts as zeros plus its contents, and each
call's effect brings it forward. What the history cannot vouch for is never guessed: a byte is
unknown where no recorded allocation holds it, after its allocation is freed, after a call whose
effect is missing (the recorder stopped comparing), where a change's bytes were not kept (the
values budget ran out) or lie past the end of a cut-off values file. Reading an unknown byte
raises the trace's `Missing`, naming why.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from egf_audit.trace.model import Missing
from egf_audit.trace.process import OBSERVED_KINDS, ProcessCapture


class Request(NamedTuple):
    """`bytes` bytes from `address`, as they were just before the record of seq `before`."""

    key: str
    before: int
    address: int
    bytes: int


@dataclass
class _Image:
    """The current bytes of one requested range, and why each unknown byte is unknown."""

    address: int
    data: np.ndarray  # uint8
    known: np.ndarray  # bool per byte
    why: str = "no recorded allocation holds it"

    @property
    def end(self) -> int:
        return self.address + self.data.size


@dataclass(frozen=True)
class _Change:
    """One event of the history in the order it applies: an allocation made (its contents), a
    call's effect, or a free."""

    at: int  # the record's seq: it applies to every request before a later record
    what: str  # "contents", "effect", "free"
    runs: tuple[tuple[int, int], ...] = ()
    values: int | None = None
    extent: tuple[int, int] = (0, 0)  # contents and free: the allocation's [address, end)


@dataclass
class MemoryHistory:
    """The memory of one process, replayed from its deep capture (module docstring)."""

    process: ProcessCapture
    _changes: list[_Change] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        proc = self.process
        if not (proc.deep and proc.values and proc.read_values is not None):
            return
        live: dict[int, int] = {}  # address -> bytes of the live allocation made there
        for r in proc.records:
            if r.kind == "alloc" and r.args and r.args["bytes"] > 0:
                address, size = r.args["dst"], r.args["bytes"]
                # as the recorder compares it: up to its 256-byte-rounded end, never into the
                # next live allocation (a pool may pack them closer)
                end = address + -(-size // 256) * 256
                end = min([end, *(b for b in live if address < b < end)])
                live[address] = size
                made = proc.contents.get(r.seq)
                if made is not None:
                    self._changes.append(
                        _Change(r.seq, "contents", made.changed, made.values, (address, end))
                    )
            elif r.kind == "free" and r.args and r.args["dst"] in live:
                address = r.args["dst"]
                # its own bytes: the slack after it may hold an allocation packed against it
                extent = (address, address + live.pop(address))
                self._changes.append(_Change(r.seq, "free", extent=extent))
        for e in proc.effects.values():
            self._changes.append(_Change(e.launch, "effect", e.changed, e.values))
        self._changes.sort(key=lambda c: c.at)

    def unknown_from(self) -> tuple[int, str] | None:
        """The first call after which no byte is known (its effect is missing), and why."""
        proc = self.process
        missing = [
            r.seq for r in proc.records if r.kind in OBSERVED_KINDS and r.seq not in proc.effects
        ]
        if not missing:
            return None
        first = min(missing)
        return first, f"call {first} has no effect: the recorder stopped comparing memory there"

    def read(self, requests: list[Request]) -> dict[str, np.ndarray | Missing]:
        """Each request's bytes (uint8), or the `Missing` that says why some are unknown."""
        proc = self.process
        if not proc.deep:
            why = "the capture is not deep (egf-audit capture --deep)"
            return {q.key: Missing(why) for q in requests}
        if not proc.values or proc.read_values is None:
            return {
                q.key: Missing(
                    "the deep capture kept no values (EGF_CAPTURE_DEEP_VALUES_MAX 0, "
                    "or a recorder before values)"
                )
                for q in requests
            }
        values = proc.read_values()
        images: dict[tuple[int, int], _Image] = {}
        for q in requests:
            span = (q.address, q.bytes)
            if span not in images:
                images[span] = _Image(
                    q.address, np.zeros(q.bytes, np.uint8), np.zeros(q.bytes, np.bool_)
                )
        ordered = sorted(images.values(), key=lambda im: im.address)
        starts = [im.address for im in ordered]
        stop = self.unknown_from()
        out: dict[str, np.ndarray | Missing] = {}
        pending = sorted(requests, key=lambda q: q.before)
        at = 0
        for change in self._changes:
            while at < len(pending) and pending[at].before <= change.at:
                q = pending[at]
                out[q.key] = _taken(images[(q.address, q.bytes)], q, stop)
                at += 1
            if at == len(pending):
                break
            _apply(change, ordered, starts, values)
        for q in pending[at:]:
            out[q.key] = _taken(images[(q.address, q.bytes)], q, stop)
        return out


def _overlapping(ordered: list[_Image], starts: list[int], lo: int, hi: int) -> list[_Image]:
    """The images that share a byte with [lo, hi). Ranges may nest (a tensor inside its
    buffer), so every image that starts before `hi` is asked."""
    return [im for im in ordered[: bisect.bisect_left(starts, hi)] if lo < im.end]


def _apply(change: _Change, ordered: list[_Image], starts: list[int], values: np.ndarray) -> None:
    if change.what in ("contents", "free"):
        lo, hi = change.extent
        for im in _overlapping(ordered, starts, lo, hi):
            a, b = max(lo, im.address) - im.address, min(hi, im.end) - im.address
            im.data[a:b] = 0
            im.known[a:b] = change.what == "contents"
            if change.what == "free":
                im.why = f"its allocation was freed (record {change.at})"
    if change.what == "free":
        return
    offset = change.values
    for address, size in change.runs:
        hit = _overlapping(ordered, starts, address, address + size)
        if hit and offset is None:
            why = (
                f"record {change.at} changed it and its bytes were not kept (the deep values "
                "budget ran out: the recorder's note says so)"
            )
        elif hit and offset is not None and offset + size > values.size:
            why = (
                f"the values file ends at byte {values.size}: the bytes record {change.at} "
                "wrote are cut off"
            )
        else:
            why = ""
        for im in hit:
            lo, hi = max(address, im.address), min(address + size, im.end)
            a, b = lo - im.address, hi - im.address
            if why:
                im.known[a:b] = False
                im.why = why
            else:
                assert offset is not None
                im.data[a:b] = values[offset + lo - address : offset + hi - address]
                im.known[a:b] = True  # written, and its new bytes kept
        if offset is not None:
            offset += size


def _taken(im: _Image, q: Request, stop: tuple[int, str] | None) -> np.ndarray | Missing:
    if stop is not None and stop[0] < q.before:
        return Missing(f"{q.key} before record {q.before}: {stop[1]}")
    if not im.known.all():
        first = int(np.flatnonzero(~im.known)[0])
        return Missing(f"{q.key} before record {q.before}: byte {first} is unknown ({im.why})")
    return im.data.copy()
