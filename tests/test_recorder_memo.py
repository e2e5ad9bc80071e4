"""What the recorder computes once and reuses every step (runtime/recorder.py, trace.py,
backends/cpu.py): a launch's record made without the dataclass's __init__ is the same Launch,
a step after the first makes no new binding or launch site, and the CPU watch's memoised
exemptions never stand for another launch's."""

from __future__ import annotations

import dataclasses

import numpy as np

from egf_audit.runtime.memory import BufferSpec, Tensor
from egf_audit.trace.effects import CONTAINED, Effects
from egf_audit.trace.model import Binding, Launch, Region, recorded_launch


def test_a_recorded_launch_is_the_launch_its_fields_make():
    binding = Binding("x", 4096, "rw", Region("b", 0, 2, 3, 4), "t", (0, 2, 4), True)
    fields = (7, 1, "kernel", "relu", "relu@main", {"n": 3}, (binding,), True, Effects(failure="x"))
    made = recorded_launch(*fields)
    assert made == Launch(*fields)
    assert vars(made) == vars(Launch(*fields))  # every field, refused (None) included
    assert set(vars(made)) == {f.name for f in dataclasses.fields(Launch)}
    assert made.binding("x") is binding and made.site == "main"


def test_a_second_step_makes_no_new_binding_and_no_new_site(cpu_backend, ci_config):
    from egf_audit.pipeline.step import SP14Pipeline

    pipe = SP14Pipeline(ci_config, cpu_backend, instrumented=True, scenario="memo")
    try:
        pipe.initialize()
        rec = pipe.rec
        pipe.step("sentinel", upload_batch=True)
        first = [x for x in rec.trace.launches if x.step == 0 and x.kind != "checkpoint"]
        sites, bindings = len(rec._sites), len(rec._bindings)
        pipe.step("sentinel", upload_batch=True)
        second = [x for x in rec.trace.launches if x.step == 1 and x.kind != "checkpoint"]
        assert (len(rec._sites), len(rec._bindings)) == (sites, bindings)
        assert [x.label for x in second] == [x.label for x in first]
        assert all(b.bindings is a.bindings for a, b in zip(first, second, strict=True))
        assert all(x.executed and x.effects is CONTAINED for x in first + second)
        indices = [x.index for x in rec.trace.launches]
        assert indices == list(range(len(indices)))
    finally:
        pipe.release()


def test_the_cpu_watch_reads_each_launchs_own_exemptions(cpu_backend):
    spec = BufferSpec("memo_w", "f32", (Tensor("memo_w", 0, 2, 5),))
    ptr = cpu_backend.alloc(spec)
    try:
        watch = cpu_backend.watch([ptr])
        first_five = {ptr: ((0, 1, 5, 5),)}

        written = [0.0]

        def write(element: int) -> None:  # a value the element never held
            written[0] += 1.0
            cpu_backend.upload(ptr + 4 * element, np.array(written, np.float32))

        write(2)
        write(7)
        assert [c[:3] for c in watch.changes(first_five)] == [(ptr, 7, 1)]
        write(2)
        assert [c[:3] for c in watch.changes({})] == [(ptr, 2, 1)]  # no exemptions: found
        write(3)
        assert watch.changes(first_five) == []  # the first launch's again
        write(3)
        assert [c[:3] for c in watch.changes({ptr: ((5, 1, 5, 5),)})] == [(ptr, 3, 1)]
    finally:
        cpu_backend.free(ptr)
