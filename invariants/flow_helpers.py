"""Trace helpers of the data-flow invariants (EGF007, EGF008, EGF009, EGF011, EGF012).

A fault may remove launches, checkpoints or snapshots, and a check must still answer with a
verdict. The queries of `common` return None for what is absent; the ones here raise `Missing`
instead, so a check reads straight through and `guarded` turns the first absence into a FAIL
whose evidence names it. Nothing else is caught: any other exception is a bug in egf-audit and
must surface as one (exit 3).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from egf_audit.invariants import common
from egf_audit.invariants.registry import Verdict, failed

if TYPE_CHECKING:
    from egf_audit.runtime.audit_run import AuditRun
    from egf_audit.runtime.trace import Binding, Launch, Region, Trace

MAX_LISTED = 20  # failures listed in the evidence; the total is always given


class Missing(Exception):
    """Data a check needs is absent from the run."""


def guarded(check: Callable[[AuditRun, str], Verdict]) -> Callable[[AuditRun, str], Verdict]:
    @functools.wraps(check)
    def wrapper(run: AuditRun, mode: str) -> Verdict:
        try:
            return check(run, mode)
        except Missing as exc:
            return failed(f"missing data: {exc}", missing=str(exc))

    return wrapper


# ---- traces and snapshots ----
def production(run: AuditRun, mode: str) -> Trace:
    for _scenario, trace in run.for_mode(mode, "production"):
        return trace
    raise Missing(f"no production trace for mode {mode}")


def only_trace(run: AuditRun, kind: str, name: str) -> Trace:
    for scenario, trace in run.of_kind(kind):
        if scenario.name == name:
            return trace
    raise Missing(f"no {kind} scenario {name}")


def steps(trace: Trace) -> list[int]:
    """The training steps of a trace: those with a `step_start` checkpoint."""
    found = common.step_indices(trace)
    if not found:
        raise Missing(f"no step_start checkpoint in {trace.scenario}")
    return found


def checkpoint(trace: Trace, step: int, name: str) -> Launch:
    index = common.checkpoint_position(trace, step, name)
    if index is None:
        raise Missing(f"no {common.where(trace, step, name)}")
    return trace.launches[index]


def snapshot(trace: Trace, step: int, name: str, buffer: str) -> np.ndarray:
    flat = common.buffer_snapshot(trace, step, name, buffer)
    if flat is None:
        raise Missing(f"no snapshot of {common.where(trace, step, name, buffer)}")
    return flat


def tensor(trace: Trace, array: np.ndarray, buffer: str, name: str | None = None) -> np.ndarray:
    """A [rows, cols] view of one tensor of a buffer snapshot, by the trace's own layout."""
    try:
        offset, rows, cols = trace.layout[buffer]["tensors"][name or buffer]
    except KeyError:
        raise Missing(f"no tensor {name or buffer} in {buffer} of {trace.scenario}") from None
    if array.size < offset + rows * cols:
        raise Missing(f"snapshot of {buffer} in {trace.scenario} is shorter than its layout")
    return array[offset : offset + rows * cols].reshape(rows, cols)


def in_step(trace: Trace, step: int) -> list[Launch]:
    return [x for x in trace.launches if x.step == step]


# ---- bindings ----
def binding(launch: Launch, role: str) -> Binding | None:
    return next((b for b in launch.bindings if b.role == role), None)


def writes_element(launch: Launch, buffer: str, element: int) -> bool:
    return any(
        b.writes
        and b.region is not None
        and b.region.buffer == buffer
        and covers(b.region, element)
        for b in launch.bindings
    )


def covers(region: Region, element: int) -> bool:
    return bool(np.any(region.flat_indices() == element))


def size(region: Region) -> int:
    return max(region.rows, 0) * max(region.width, 0)


def describe(region: Region | None) -> dict[str, Any] | None:
    if region is None:
        return None
    return {
        "buffer": region.buffer,
        "offset": region.offset,
        "rows": region.rows,
        "width": region.width,
        "ld": region.ld,
    }


# ---- values ----
def is_plus_zero(value: float) -> bool:
    """Bitwise +0.0 (-0.0 and NaN are not)."""
    return int(common.bits(np.array([value]))[0]) == 0


def listed(failures: list[dict[str, Any]]) -> dict[str, Any]:
    return {"failures": failures[:MAX_LISTED], "failures_total": len(failures)}


def count_by(failures: Iterable[dict[str, Any]], kind: str) -> int:
    return sum(1 for f in failures if f["kind"] == kind)
