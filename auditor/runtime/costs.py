"""Where an instrumented run's time goes, by kind of work and by scenario: what
`egf-audit bench --profile` reports on either backend.

A profile collects for the code it runs: in this process (`collecting()`), or in a whole
`egf-audit run` process whose environment names a file in COSTS_VARIABLE (written at its exit,
as JSON). Every recorder made meanwhile times its parts with the collector, each bracketed by
device synchronisations so that its time is the device's as well as the host's, and the span of
its scenario (from the recorder's start until its trace is handed over). The brackets stop queued
work from overlapping, so a profiled run is slower than a plain one; the bench times the plain
command apart. Without a collector nothing is timed and nothing waits.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

# the kinds of work of an instrumented launch, in the order the profile lists them
LAUNCH = "launches"  # the pipeline's own work: SGEMMs, kernels, memsets, copies
SHADOWS = "shadow copies"  # the first copy of every buffer a recorder watches
COMPARISONS = "stray-write comparisons"  # buffers against their shadows, shadows refreshed
GUARDS = "guard scans"  # the canary zones after every kernel
SNAPSHOTS = "snapshots"  # the checkpoints' copies
READBACK = "observations read back"  # queued findings brought to the host (CUDA backend)
KINDS = (LAUNCH, SHADOWS, COMPARISONS, GUARDS, SNAPSHOTS, READBACK)
COSTS_VARIABLE = "EGF_AUDIT_COSTS"  # a file: the process's costs as JSON, written at its exit

T = TypeVar("T")


@dataclass
class Costs:
    """Seconds and counts per kind of work, and seconds per scenario."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    scenarios: dict[str, float] = field(default_factory=dict)

    def timed(self, kind: str, sync: Callable[[], None], work: Callable[[], T]) -> T:
        """Run `work` between two synchronisations and charge the time to `kind`."""
        sync()
        start = time.perf_counter()
        try:
            return work()
        finally:
            sync()
            self.seconds[kind] += time.perf_counter() - start
            self.counts[kind] += 1

    def span(self, scenario: str, seconds: float) -> None:
        """A scenario's recorder ran `seconds` from its start until its trace was handed over
        (the latest hand-over counts)."""
        self.scenarios[scenario] = seconds

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "counts": self.counts, "scenarios": self.scenarios}

    def write(self, path: str) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=1) + "\n", encoding="utf-8")


_ACTIVE: ContextVar[Costs | None] = ContextVar("egf_audit_costs", default=None)
_PROCESS: list[Costs] = []  # the collector of a process run with COSTS_VARIABLE set


def current() -> Costs | None:
    """The collector of the profile running now, if any."""
    active = _ACTIVE.get()
    if active is not None:
        return active
    path = os.environ.get(COSTS_VARIABLE)
    if not path:
        return None
    if not _PROCESS:
        _PROCESS.append(Costs())
        atexit.register(_PROCESS[0].write, path)
    return _PROCESS[0]


@contextmanager
def collecting() -> Iterator[Costs]:
    costs = Costs()
    token = _ACTIVE.set(costs)
    try:
        yield costs
    finally:
        _ACTIVE.reset(token)
