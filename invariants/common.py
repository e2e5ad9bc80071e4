"""What the invariant checks share: which traces to read, and the bitwise and evidence helpers.

Missing data has one convention: the trace's queries (egf_audit.trace.model) raise `Missing`
naming what was absent, and `evaluate()` turns it into a FAIL whose evidence says so. A check
therefore reads straight through. Nothing else is caught: any other exception is a bug in
egf-audit and surfaces as one (exit 3).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from egf_audit.trace.buffers import tensor_table
from egf_audit.trace.contract import AFTER_LOSSES, ALPHA_GRAD_SMOOTHED_INDEX, ISV
from egf_audit.trace.model import Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun, Scenario
    from egf_audit.trace.model import Launch, Region, Trace

AUDITED_KINDS = ("production", "replay")  # the scenarios that run the trainer's own step
MAX_LISTED = 20  # failures listed in the evidence; the total is always given


# ---- which traces ----
def mode_traces(
    run: AuditRun, mode: str, kinds: tuple[str, ...] = AUDITED_KINDS
) -> list[tuple[Scenario, Trace]]:
    """The production trace of `mode` and its replays (diagnostics and probes left out)."""
    return [(s, t) for s, t in run.for_mode(mode) if s.kind in kinds]


def gated_traces(run: AuditRun, mode: str) -> list[tuple[Scenario, Trace]]:
    """`mode_traces` less the replay that removes the scale launch on purpose (it exists to show
    that dW does not depend on the scale): the traces where the trainer's own gate ran."""
    return [(s, t) for s, t in mode_traces(run, mode) if not s.skip_scale]


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
    """The training steps of a trace; a trace that ran none is missing its data."""
    found = trace.training_steps()
    if not found:
        raise Missing(f"no step_start checkpoint in {trace.scenario}")
    return found


def in_step(trace: Trace, step: int) -> list[Launch]:
    return [x for x in trace.launches if x.step == step]


def alpha_at(trace: Trace, step: int) -> np.float32:
    """ISV[393] as the backward of `step` reads it (the after_losses snapshot)."""
    isv = trace.buffer_snapshot(step, AFTER_LOSSES, ISV)
    if isv.size <= ALPHA_GRAD_SMOOTHED_INDEX:
        raise Missing(f"{ISV} at {AFTER_LOSSES} (step {step}) of {trace.scenario} has no [393]")
    return np.float32(isv[ALPHA_GRAD_SMOOTHED_INDEX])


# ---- regions ----
def region_values(flat: np.ndarray, region: Region) -> np.ndarray:
    """The [rows, width] box a launch operand covers, read out of a flat buffer snapshot."""
    if region.rows <= 0 or region.width <= 0 or region.offset < 0 or region.last > flat.size:
        raise Missing(f"the box {describe(region)} does not fit a snapshot of {region.buffer}")
    box: np.ndarray = flat[region.flat_indices()]
    return box.reshape(region.rows, region.width)


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


class RegionFacts(TypedDict):
    """A launch operand's box, as evidence."""

    buffer: str
    offset: int
    rows: int
    width: int
    ld: int


def describe(region: Region | None) -> RegionFacts | None:
    if region is None:
        return None
    return {
        "buffer": region.buffer,
        "offset": region.offset,
        "rows": region.rows,
        "width": region.width,
        "ld": region.ld,
    }


def tensor_of_element(trace: Trace, buffer: str, element: int) -> str | None:
    """The name of the tensor of `buffer` that holds flat element `element`, or None."""
    for name, (offset, rows, cols) in tensor_table(trace.layout, buffer).items():
        if offset <= element < offset + rows * cols:
            return name
    return None


# ---- bitwise facts ----
def bits(values: np.ndarray) -> np.ndarray:
    """The fp32 bit patterns: +0.0 and -0.0 differ here, and NaN never equals a number."""
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def bit_mismatch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Boolean mask of the elements whose fp32 bit patterns differ (same shapes required)."""
    mismatch: np.ndarray = bits(a) != bits(b)
    return mismatch


def is_plus_zero(value: float) -> bool:
    """Bitwise +0.0 (-0.0 and NaN are not)."""
    return int(bits(np.array([value]))[0]) == 0


def hex_bits(value: float | np.floating) -> str:
    return f"0x{int(bits(np.array([value]))[0]):08x}"


# ---- evidence ----
def json_float(value: float | np.floating) -> float | str:
    """A float for evidence: strict JSON has no NaN or Inf, so those become their names."""
    value = float(value)
    return value if np.isfinite(value) else str(value)


def first_index(mask: np.ndarray) -> list[int]:
    """The index (as a list, one entry per axis) of the first True element of a mask."""
    return [int(i) for i in np.argwhere(mask)[0]]


def listed(failures: Sequence[Mapping[str, object]]) -> dict[str, object]:
    return {"failures": failures[:MAX_LISTED], "failures_total": len(failures)}


def kinds(failures: Iterable[Mapping[str, object]]) -> list[str]:
    """The kinds of failure found, sorted, each once."""
    return sorted({str(f["kind"]) for f in failures})


def count_by(failures: Iterable[Mapping[str, object]], kind: str) -> int:
    return sum(1 for f in failures if f["kind"] == kind)


# ---- a box of rows against a buffer (EGF007) ----
def covers_all(region: Region, n: int) -> bool:
    """Whether the region's rows together write every element of [0, n), elements outside it
    ignored: its rows as intervals cut to [0, n), sorted, the first starting at 0 and each
    starting at or before what the rows before it reached, the last reach n. Row by row, never
    listing the elements (a prod d_h_s2 has 2 Mi of them and 4096 rows)."""
    if n <= 0:
        return True
    if region.rows <= 0 or region.width <= 0:
        return False
    starts = region.offset + np.arange(region.rows, dtype=np.int64) * region.ld
    ends = starts + region.width
    inside = (ends > 0) & (starts < n)
    starts, ends = np.maximum(starts[inside], 0), ends[inside]
    if starts.size == 0:
        return False
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # one past the last element written so far
    return bool(starts[0] == 0 and reach[-1] >= n and (starts[1:] <= reach[:-1]).all())


def column_hits(region: Region, period: int, column: int) -> int:
    """How many elements of a box lie in `column` of rows `period` wide (flat index % period
    == column): counted row by row, as the box's flat indices would be, without listing them."""
    if region.rows <= 0 or region.width <= 0:
        return 0
    starts = (region.offset + np.arange(region.rows, dtype=np.int64) * region.ld) % period
    first = (column - starts) % period  # the first c in [0, width) with (start + c) % period
    return int(np.where(first < region.width, (region.width - 1 - first) // period + 1, 0).sum())
