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
from egf_audit.runtime.guards import CANARY_BITS, GUARD_ELEMENTS

SLOTS = 1 << 16  # (launch, reached allocation) records between two read-backs
ZONE_COUNTERS = 1 << 22  # zone counters (three a zone, a set per kernel launch) between them


@cache
def _function() -> tuple[Any, Any]:
    module = cupy.RawModule(code=records.SOURCE, options=("-std=c++17",))
    return module, module.get_function("egf_observe")


class _Call:
    """egf_observe launched through cuLaunchKernel with an argument block kept between calls:
    the driver copies the arguments at each launch, so only the values are set. CuPy's generic
    launch costs several microseconds of Python per call, and there is one call per launch.
    Each plan keeps a block of its own (`_Plan.call`) whose values stay set but for the two
    that move from launch to launch: the first slot and the first zone counter."""

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

    SLOT_BASE, ZONE_COUNTS = 4, 9  # the values that move

    def __init__(self) -> None:
        self._module, function = _function()  # the module must outlive the function
        self.function = function.kernel.ptr  # RawKernel.kernel: the loaded CUfunction
        self.values = [t() for t in self.TYPES]
        self.block = (ctypes.c_void_p * len(self.values))(
            *(ctypes.addressof(v) for v in self.values)
        )
        self.address = ctypes.addressof(self.block)
        self.slot_base = self.values[self.SLOT_BASE]
        self.zone_counts = self.values[self.ZONE_COUNTS]

    def set(self, *values: int) -> None:
        for slot, value in zip(self.values, values, strict=True):
            slot.value = value

    def launch(self, blocks: int, stream: int) -> None:
        """egf_observe with the values as they are set now."""
        cupy.cuda.driver.launchKernel(
            self.function, blocks, 1, 1, records.THREADS, 1, 1, 0, stream, self.address, 0
        )

    def __call__(self, blocks: int, stream: int, *values: int) -> None:
        self.set(*values)
        self.launch(blocks, stream)


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


class _Plan:
    """One launch's observation, made once: its comparison's table on the device and, set in
    an argument block of its own, every value of its egf_observe call but the first slot and
    the first zone counter (`aim` sets the zone table's, which changes with the
    allocations)."""

    __slots__ = (
        "bases",
        "blocks",
        "call",
        "counters",
        "kind",
        "n_zones",
        "name",
        "reach",
        "table",
        "tasks",
        "width",
        "zones",
    )

    def __init__(self, kind: str, name: str, table: Any, tasks: int, reach: tuple[int, ...]):
        self.kind, self.name = kind, name  # what the plan was made for
        self.table = table  # cupy int64: the tasks, then the boxes (kept alive: the kernel reads)
        self.tasks = tasks
        self.reach = reach  # the allocations compared, in slot order
        self.width = len(reach)  # slots a launch takes
        self.call = _Call()
        self.zones: ZoneTable | None = None  # the zone table the block is aimed at
        self.bases: tuple[int, ...] = ()  # the allocations whose zones the scan covers
        self.n_zones = 0
        self.counters = 0  # zone counters a launch takes: three a zone
        self.blocks = tasks  # of the egf_observe call: the tasks', then the zone scan's

    @property
    def address(self) -> int:
        """Of the tasks."""
        return int(self.table.data.ptr)

    @property
    def boxes(self) -> int:
        """Address of the boxes."""
        return self.address + 8 * records.TASK * self.tasks

    def aim(self, zones: ZoneTable | None, slots: int) -> None:
        """Set the block's values for the guard zones of `zones` (None: no scan) and the slots
        at `slots`."""
        self.zones, self.n_zones = zones, zones.count if zones else 0
        self.bases = zones.bases if zones else ()
        self.counters = 3 * self.n_zones
        self.blocks = self.tasks + records.zone_blocks(self.n_zones, GUARD_ELEMENTS)
        self.call.set(
            self.address, self.tasks, self.boxes, slots, 0,
            zones.address if zones else 0, self.n_zones, GUARD_ELEMENTS, CANARY_BITS, 0,
        )  # fmt: skip


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
        # the allocations whose zones its scan covered, () when none)
        self._queued: list[tuple[int, tuple[int, ...], int, tuple[int, ...]]] = []
        self._slots_used = 0
        self._counters_used = 0
        self._found: list[tuple[list[StrayFound], list[BreachFound]]] = []

    def _plan(self, key: object, kind: str, name: str, reach: Sequence[int], exempt: dict) -> _Plan:
        """The plan of the launches `key` names, made at the first (a key names one kind and
        name of launch; the recorder's sites do)."""
        everything = kind == "kernel" and self._untrusted(name)
        watched = tuple(p for p in (self._memory if everything else reach) if p in self._memory)
        table, tasks = records.plan(watched, self._memory, exempt)
        with self._stream():
            device = cupy.asarray(table)
        plan = self._plans[key] = _Plan(kind, name, device, tasks, watched)
        plan.aim(self._zones() if kind == "kernel" else None, self._slots_at)
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
        plan = self._plans.get(key)
        if plan is None or plan.kind != kind or plan.name != name:
            plan = self._plan(key, kind, name, reach, exempt)
        if kind == "kernel":
            zones = self._zones()
            if zones is not plan.zones:  # the allocations changed since the plan was aimed
                plan.aim(zones, self._slots_at)
        if (
            self._slots_used + plan.width > SLOTS
            or self._counters_used + plan.counters > ZONE_COUNTERS
        ):
            self._read_back()
        stream = self._stream()
        call = plan.call
        call.slot_base.value = self._slots_used
        call.zone_counts.value = self._counters_at + 4 * self._counters_used
        if costs is None:
            if plan.blocks:
                call.launch(plan.blocks, stream.ptr)
        else:  # apart, so that the profile tells the two kinds of work apart
            self._queue_apart(plan, stream, costs)
        # (first slot, reach, first zone counter, the allocations whose zones it scans): as
        # records.decode reads them
        self._queued.append((self._slots_used, plan.reach, self._counters_used, plan.bases))
        self._slots_used += plan.width
        self._counters_used += plan.counters

    def _queue_apart(self, plan: _Plan, stream: Any, costs: Costs) -> None:
        """The plan's comparison and its zone scan as two launches, each timed on its own."""
        values = [v.value for v in plan.call.values]
        tasks, n_zones = plan.tasks, plan.n_zones
        zone_blocks = records.zone_blocks(n_zones, GUARD_ELEMENTS)
        apart = self._call
        if tasks:
            values[1], values[6] = tasks, 0

            def compare() -> None:
                apart(tasks, stream.ptr, *values)

            costs.timed(cost_kinds.COMPARISONS, stream.synchronize, compare)
        if zone_blocks:
            values[1], values[6] = 0, n_zones

            def scan() -> None:
                apart(zone_blocks, stream.ptr, *values)

            costs.timed(cost_kinds.GUARDS, stream.synchronize, scan)

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
        self._found += records.decode(slots, counters, self._queued, GUARD_ELEMENTS)
        self._queued = []
        self._slots_used = self._counters_used = 0
