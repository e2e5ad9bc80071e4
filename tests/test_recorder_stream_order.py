"""The recorder's queued path (runtime/launch_watch.py), which the CUDA backend takes, run on the
CPU: the CPU backend wrapped so that its watch queues each launch's checks (as a `StreamWatch`
does) and hands every finding over only when the trace is read. The launches' effects must be
the ones the direct path records for the same run, launch by launch: for a clean audit and for
the two faults whose kernels write where they do not declare (EGF013's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from egf_audit.invariants import FAIL, evaluate
from egf_audit.pipeline.wiring import Wiring
from egf_audit.runtime.backends import select_backend
from egf_audit.runtime.backends.base import in_stream_order
from egf_audit.scenarios.audit import Auditor
from egf_audit.scenarios.faults import FAULTS_BY_NAME


class QueueingWatch:
    """The CPU's watch behind the StreamWatch interface: `queue` checks at once (the launch has
    run) but keeps the findings; `collect` hands over all of them, in queue order."""

    def __init__(self, backend: Any, watch: Any) -> None:
        self.backend, self.watch = backend, watch
        self.found: list[tuple[list, list]] = []
        self.queued = 0

    def queue(self, key, kind, name, reach: Sequence[int], exempt, costs=None) -> None:
        breaches = self.backend.guard_breaches() if kind == "kernel" else []
        self.found.append((self.watch.changes(exempt), breaches))
        self.queued += 1

    def collect(self) -> list[tuple[list, list]]:
        found, self.found = self.found, []
        return found


class StreamOrderCpu:
    """The CPU backend, observing as the GPU does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.watches: list[QueueingWatch] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def watch(self, ptrs: Sequence[int]) -> QueueingWatch:
        watch = QueueingWatch(self.inner, self.inner.watch(ptrs))
        self.watches.append(watch)
        return watch


def _effects(run) -> list:
    return [
        (name, x.index, x.label, x.executed, x.effects)
        for name, trace in sorted(run.traces.items())
        for x in trace.launches
        if x.kind != "checkpoint"
    ]


@pytest.mark.parametrize(
    "fault", [None, "scale-writes-past-region", "sn-normalize-writes-neighbour"]
)
def test_queued_observation_records_what_the_direct_one_records(ci_config, kernel_set, fault):
    spec = FAULTS_BY_NAME[fault] if fault else None
    kernels = spec.apply_kernels(kernel_set) if spec else kernel_set
    wiring = spec.wiring if spec else Wiring()
    direct = Auditor(ci_config, select_backend("cpu", kernels), wiring, steps=2).run(("live",))
    queued_backend = StreamOrderCpu(select_backend("cpu", kernels))
    queued = Auditor(ci_config, queued_backend, wiring, steps=2).run(("live",))
    assert queued_backend.watches and all(in_stream_order(w) for w in queued_backend.watches)
    assert sum(w.queued for w in queued_backend.watches) > 100  # the queued path was taken
    assert _effects(queued) == _effects(direct)
    caught = {r.code for r in evaluate(queued) if r.verdict.status == FAIL}
    assert caught == (set(spec.expected) if spec else set())
