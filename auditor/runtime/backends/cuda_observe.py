"""What a launch did to device memory, observed in stream order (the CUDA backend's default).

After each launch one kernel, queued behind it on the pipeline's stream, compares every
allocation the launch can reach with its shadow copy outside the boxes the launch declares it
writes, refreshes the shadows, and, after a kernel, checks every guard zone of every allocation
and restores the ones it finds changed (stream_records.py: the kernel and its records). Nothing
waits for the device per launch: `collect` copies the records to the host once, when the trace
is read, or earlier when they are full.

What a launch can reach: for egf-audit's own code (a bundled kernel, an SGEMM, a memset, a
copy) the allocations its pointer arguments land in, each buffer with its guard zones; for a
kernel egf-audit does not ship (`--kernels`, a fault's patch: the worker runs it) every
allocation, since such code may compute any address.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import cupy
import numpy as np

from egf_audit.runtime import costs as cost_kinds
from egf_audit.runtime.backends import stream_records as records
from egf_audit.runtime.backends.base import BreachFound, StrayFound
from egf_audit.runtime.costs import Costs
from egf_audit.runtime.effects import CANARY_BITS, GUARD_ELEMENTS

SLOTS = 1 << 16  # (launch, reached allocation) records between two read-backs
ZONE_COUNTERS = 1 << 22  # zone counters (three a zone, a set per kernel launch) between them


@cache
def _function() -> tuple[Any, Any]:
    module = cupy.RawModule(code=records.SOURCE, options=("-std=c++17",))
    return module, module.get_function("egf_observe")


class _Call:
    """egf_observe launched through cuLaunchKernel with one argument block kept between calls:
    the driver copies the arguments at each launch, so only the values are set. CuPy's generic
    launch costs several microseconds of Python per call, and there is one call per launch."""

    TYPES = (
        ctypes.c_uint64,  # tasks
        ctypes.c_int,  # n_tasks
        ctypes.c_uint64,  # boxes
        ctypes.c_uint64,  # slots
        ctypes.c_longlong,  # slot_base
        ctypes.c_uint64,  # zones
        ctypes.c_int,  # n_zones
        ctypes.c_int,  # zone_len
        ctypes.c_uint32,  # canary
        ctypes.c_uint64,  # zone_counts
    )

    def __init__(self) -> None:
        self._module, function = _function()  # the module must outlive the function
        self.function = function.kernel.ptr  # RawKernel.kernel: the loaded CUfunction
        self.values = [t() for t in self.TYPES]
        self.block = (ctypes.c_void_p * len(self.values))(
            *(ctypes.addressof(v) for v in self.values)
        )

    def __call__(self, blocks: int, stream: int, *values: int) -> None:
        for slot, value in zip(self.values, values, strict=True):
            slot.value = value
        cupy.cuda.driver.launchKernel(
            self.function, blocks, 1, 1, records.THREADS, 1, 1, 0, stream,
            ctypes.addressof(self.block), 0,
        )  # fmt: skip


@dataclass(frozen=True)
class ZoneTable:
    """The guard zones of every allocation the backend holds, as device pointers."""

    pointers: Any  # cupy uint64: zones[2i] in front of allocation i, zones[2i + 1] behind it
    bases: tuple[int, ...]  # allocation i by the base pointer of its buffer

    @property
    def count(self) -> int:
        return 2 * len(self.bases)

    @property
    def address(self) -> int:
        return int(self.pointers.data.ptr)


def zone_table(wholes: dict[int, Any], guarded: bool) -> ZoneTable:
    """`wholes`: each buffer's whole allocation (uint32, its guard zones included), by the
    buffer's base pointer. Unguarded (under compute-sanitizer) there are no zones."""
    ptrs = []
    if guarded:
        for w in wholes.values():
            ptrs += [w.data.ptr, w.data.ptr + (w.size - GUARD_ELEMENTS) * 4]
    table = cupy.asarray(np.array(ptrs or [0], np.uint64))
    return ZoneTable(table, tuple(wholes) if guarded else ())


@dataclass(frozen=True)
class _Plan:
    table: Any  # cupy int64: the tasks, then the boxes (kept alive: the kernel reads it)
    tasks: int
    reach: tuple[int, ...]  # the allocations compared, in slot order
    address: int  # of the tasks
    boxes: int  # address of the boxes


class StreamObserver:
    """Shadow copies of a pipeline's buffers on the device and the records of what each queued
    launch changed (base.StreamWatch)."""

    def __init__(
        self,
        buffers: dict[int, Any],
        stream: Callable[[], Any],
        zones: Callable[[], ZoneTable],
        untrusted: Callable[[str], bool],
    ):
        self._stream, self._zones, self._untrusted = stream, zones, untrusted
        with stream():
            shadows = {p: b.copy() for p, b in buffers.items()}
            self._blank = cupy.asarray(records.blank_slots(SLOTS))
            self._slots = self._blank.copy()
            self._counters = cupy.zeros(ZONE_COUNTERS, np.uint32)
        self._shadows = shadows  # kept alive: the plans hold their addresses
        self._memory = {p: (b.data.ptr, shadows[p].data.ptr, b.size) for p, b in buffers.items()}
        self._call = _Call()
        # the addresses every launch passes, read once
        self._slots_at = int(self._slots.data.ptr)
        self._counters_at = int(self._counters.data.ptr)
        self._plans: dict[object, _Plan] = {}
        # launches queued since the last read-back: (first slot, reach, first zone counter,
        # zone table or None)
        self._queued: list[tuple[int, tuple[int, ...], int, ZoneTable | None]] = []
        self._slots_used = 0
        self._counters_used = 0
        self._found: list[tuple[list[StrayFound], list[BreachFound]]] = []

    def _plan(self, key: object, kind: str, name: str, reach: Sequence[int], exempt: dict) -> _Plan:
        plan = self._plans.get((key, kind, name))
        if plan is None:
            everything = kind == "kernel" and self._untrusted(name)
            watched = tuple(p for p in (self._memory if everything else reach) if p in self._memory)
            table, tasks = records.plan(watched, self._memory, exempt)
            with self._stream():
                device = cupy.asarray(table)
            address = int(device.data.ptr)
            plan = _Plan(device, tasks, watched, address, address + 8 * records.TASK * tasks)
            self._plans[(key, kind, name)] = plan
        return plan

    def queue(
        self,
        key: object,
        kind: str,
        name: str,
        reach: Sequence[int],
        exempt: dict[int, tuple[tuple[int, int, int, int], ...]],
        costs: Costs | None = None,
    ) -> None:
        plan = self._plan(key, kind, name, reach, exempt)
        zones = self._zones() if kind == "kernel" else None
        n_zones = zones.count if zones else 0
        if self._slots_used + len(plan.reach) > SLOTS or (
            self._counters_used + 3 * n_zones > ZONE_COUNTERS
        ):
            self._read_back()
        stream = self._stream()
        counters = self._counters_at + 4 * self._counters_used
        head = (plan.boxes, self._slots_at, self._slots_used, zones.address if zones else 0)
        tail = (GUARD_ELEMENTS, CANARY_BITS, counters)
        zone_blocks = records.zone_blocks(n_zones, GUARD_ELEMENTS)
        table = plan.address
        if costs is None:
            if plan.tasks + zone_blocks:
                blocks = plan.tasks + zone_blocks
                self._call(blocks, stream.ptr, table, plan.tasks, *head, n_zones, *tail)
        else:  # apart, so that the profile tells the two kinds of work apart
            if plan.tasks:
                costs.timed(
                    cost_kinds.COMPARISONS,
                    stream.synchronize,
                    lambda: self._call(plan.tasks, stream.ptr, table, plan.tasks, *head, 0, *tail),
                )
            if zone_blocks:
                costs.timed(
                    cost_kinds.GUARDS,
                    stream.synchronize,
                    lambda: self._call(zone_blocks, stream.ptr, table, 0, *head, n_zones, *tail),
                )
        self._queued.append((self._slots_used, plan.reach, self._counters_used, zones))
        self._slots_used += len(plan.reach)
        self._counters_used += 3 * n_zones

    def collect(self) -> list[tuple[list[StrayFound], list[BreachFound]]]:
        self._read_back()
        found, self._found = self._found, []
        return found

    def _read_back(self) -> None:
        """Wait for the device once, copy the used records to the host, and empty them."""
        if not self._queued:
            return
        stream = self._stream()
        used, counted = self._slots_used, self._counters_used
        with stream:
            stream.synchronize()
            slots = cupy.asnumpy(self._slots[:used]) if used else np.zeros((0, 3), np.uint64)
            counters = cupy.asnumpy(self._counters[:counted]) if counted else np.zeros(0, np.uint32)
            if used:
                cupy.cuda.runtime.memcpyAsync(
                    self._slots_at,
                    int(self._blank.data.ptr),
                    used * records.SLOT * 8,
                    cupy.cuda.runtime.memcpyDeviceToDevice,
                    stream.ptr,
                )
            if counted:
                cupy.cuda.runtime.memsetAsync(self._counters_at, 0, counted * 4, stream.ptr)
        queued = [(s, reach, c, z.bases if z else ()) for s, reach, c, z in self._queued]
        self._found += records.decode(slots, counters, queued, GUARD_ELEMENTS)
        self._queued = []
        self._slots_used = self._counters_used = 0
