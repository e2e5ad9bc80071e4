"""What each executed launch did to memory, watched for the recorder (runtime/recorder.py).

At the first watched launch the backend copies every buffer (its shadows); after each launch the
buffers the launch can reach are compared with them outside the boxes it declares it writes, and
after a kernel every guard zone is scanned. On the CPU that happens before the next launch runs
(`observe`); on the GPU the comparison is queued behind the launch on the device (`queue`) and
its findings reach the host, named by buffer and tensor, when the trace is read (`settle`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from egf_audit.runtime import costs as cost_kinds
from egf_audit.runtime.backends.base import (
    Backend,
    BreachFound,
    StrayFound,
    StreamWatch,
    Watch,
    in_stream_order,
)
from egf_audit.runtime.costs import Costs
from egf_audit.runtime.guards import LaunchFailed, guard_breaches, stray_writes
from egf_audit.runtime.memory import AddressMap, Layout
from egf_audit.trace.effects import CONTAINED, Effects, GuardBreach, StrayWrite
from egf_audit.trace.model import Binding, Launch


class LaunchSite:
    """One distinct launch of a step: its bindings and what watching it needs, computed once.
    Every step repeats the same launches with the same pointers, so a launch looks its site up
    by the arguments its bindings depend on, and the site is also the key of its observation
    plan on the device (cuda_observe.py)."""

    __slots__ = ("bindings", "executed", "exempt", "reach")

    def __init__(
        self,
        bindings: tuple[Binding, ...],
        exempt: dict[int, tuple[tuple[int, int, int, int], ...]],
        reach: tuple[int, ...],
    ):
        self.bindings = bindings
        self.executed = all(b.in_bounds for b in bindings)  # else refused: out of bounds
        self.exempt = exempt  # per allocation: the boxes the launch may change it in
        self.reach = reach  # the allocations the launch can reach (those its pointers land in)


class LaunchWatcher:
    """The watch over one recorder's launches: started at the first watched launch, then each
    launch run, observed now or queued, and the queue settled onto the launches."""

    def __init__(
        self,
        backend: Backend,
        address_map: AddressMap,
        layout: Layout,
        costs: Costs | None,
        scenario: str,
    ):
        self.backend = backend
        self.amap = address_map
        self.layout = layout
        self.costs = costs
        self.scenario = scenario
        # every buffer as it was after the last launch (made at the first watched launch)
        self._watch: Watch | StreamWatch | None = None
        self._stream: StreamWatch | None = None  # the watch, when it queues (CUDA)
        self._direct: Watch | None = None  # the watch, when it compares now (CPU)
        self._buffer_at: dict[int, str] = {}  # buffer name by base pointer
        # launches whose observation is queued on the device: (index, launch, failure)
        self._queued: list[tuple[int, Launch, str | None]] = []

    @property
    def queues(self) -> bool:
        """The backend observes in stream order: a launch's findings come with `settle`."""
        return self._stream is not None

    def queue(
        self, site: LaunchSite, kind: str, name: str, index: int, launch: Launch,
        failure: str | None,
    ) -> None:  # fmt: skip
        """Queue the observation of `launch`, just run, behind it on the device."""
        assert self._stream is not None
        self._stream.queue(site, kind, name, site.reach, site.exempt, self.costs)
        self._queued.append((index, launch, failure))

    def timed(self, kind: str, work: Callable[[], Any]) -> Any:
        """`work`, charged to `kind` of the profile collecting now (none: just run it)."""
        if self.costs is None:
            return work()
        return self.costs.timed(kind, self.backend.synchronize, work)

    def _start(self) -> None:
        """Copies of every buffer as it is now, made at the first watched launch."""
        bases = list(self.amap.bases.values())
        watch = self._watch = self.timed(cost_kinds.SHADOWS, lambda: self.backend.watch(bases))
        if in_stream_order(watch):
            self._stream = watch
        else:
            self._direct = watch

    def run(self, index: int, name: str, label: str, run: Callable[[], None]) -> str | None:
        """Run a watched launch; what it reported when the process running it failed."""
        if self._watch is None:
            self._start()
        try:
            if self.costs is None:  # the common case: no wrapper per launch
                run()
            else:
                self.timed(cost_kinds.LAUNCH, run)
        except LaunchFailed as exc:
            where = f"{self.scenario} launch #{index} ({label})"
            self.backend.failed_kernels[name] = f"{name} {exc.what} at {where}"
            return exc.what
        return None

    def observe(self, kind: str, site: LaunchSite, failure: str | None) -> Effects:
        """What the launch just run did, observed now (the CPU backend)."""
        watch = self._direct
        assert watch is not None  # made by _start before the launch ran
        breaches: tuple[GuardBreach, ...] = ()
        if kind == "kernel":
            found = self.timed(cost_kinds.GUARDS, self.backend.guard_breaches)
            breaches = self._guard_breaches(found) if found else ()
        exempt = site.exempt
        if self.costs is None:
            changes = watch.changes(exempt)
        else:
            changes = self.timed(cost_kinds.COMPARISONS, lambda: watch.changes(exempt))
        strays = self._stray_writes(changes) if changes else ()
        if failure is None and not breaches and not strays:
            return CONTAINED
        return Effects(strays, breaches, failure)

    def settle(self, launches: list[Launch]) -> None:
        """Bring the findings of every queued observation onto its launch: one wait for the
        device, one copy of the findings. A launch the trace no longer holds (the bench clears
        its trace between steps) is skipped."""
        watch = self._stream
        if watch is None or not self._queued:
            return
        found = self.timed(cost_kinds.READBACK, watch.collect)
        if len(found) != len(self._queued):
            raise RuntimeError(
                f"{len(self._queued)} launches queued for observation, {len(found)} observed"
            )
        held = len(launches)
        for (index, launch, failure), (strays, breaches) in zip(self._queued, found, strict=True):
            if index < held and launches[index] is launch:
                # The recorder completes its own launch in place: its trace is handed out only
                # settled, so no reader has seen the launch yet, and a new Launch per launch
                # would cost as much as the rest of its recording.
                if not strays and not breaches and failure is None:
                    effects = CONTAINED
                else:
                    effects = Effects(
                        self._stray_writes(strays), self._guard_breaches(breaches), failure
                    )
                    effects = CONTAINED if effects.contained else effects
                object.__setattr__(launch, "effects", effects)
        self._queued.clear()

    def _guard_breaches(self, found: list[BreachFound]) -> tuple[GuardBreach, ...]:
        return guard_breaches(found, self._names())

    def _names(self) -> dict[int, str]:
        if len(self._buffer_at) != len(self.amap.bases):
            self._buffer_at = {base: buffer for buffer, base in self.amap.bases.items()}
        return self._buffer_at

    def _stray_writes(self, changes: list[StrayFound]) -> tuple[StrayWrite, ...]:
        return stray_writes(changes, self._names(), self._tensor_at)

    def _tensor_at(self, buffer: str, element: int) -> str | None:
        tensor = self.layout.buffer(buffer).tensor_at(element)
        return tensor.name if tensor else None
