"""Trace queries the invariants share. None of them raises on a run from a faulty wiring: a
missing snapshot, checkpoint or launch comes back as None, and `where()` words what was missing
so a check can fail with it as evidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from egf_audit.runtime.contract import ALPHA_GRAD_SMOOTHED_INDEX

if TYPE_CHECKING:
    from egf_audit.runtime.audit_run import AuditRun, Scenario
    from egf_audit.runtime.trace import Launch, Region, Trace

SITES = ("cql", "main")  # the two backward_full call sites, in the order they run
DIR_DX = "sp14_d_dir_qaux_concat"  # the dir branch's [B, SH2+1] dX, wire column at SH2
AUDITED_KINDS = ("production", "replay")  # the scenarios that run the trainer's own step


def mode_traces(
    run: AuditRun, mode: str, kinds: tuple[str, ...] = AUDITED_KINDS
) -> list[tuple[Scenario, Trace]]:
    """The production trace of `mode` and its replays (diagnostics and probes left out)."""
    return [(s, t) for s, t in run.for_mode(mode) if s.kind in kinds]


def gated_traces(run: AuditRun, mode: str) -> list[tuple[Scenario, Trace]]:
    """`mode_traces` less the replay that removes the scale launch on purpose (it exists to show
    that dW does not depend on the scale): the traces where the trainer's own gate ran."""
    return [(s, t) for s, t in mode_traces(run, mode) if not s.skip_scale]


def step_indices(trace: Trace) -> list[int]:
    """The training steps the trace ran: those with a `step_start` checkpoint."""
    return sorted(
        {x.step for x in trace.launches if x.kind == "checkpoint" and x.name == "step_start"}
    )


def where(trace: Trace, step: int, checkpoint: str, buffer: str | None = None) -> str:
    """Words for one snapshot, used as evidence when it is missing."""
    what = f"{buffer} at {checkpoint}" if buffer else f"checkpoint {checkpoint}"
    return f"{what} (step {step}) of {trace.scenario}"


def snapshot(
    trace: Trace, step: int, checkpoint: str, buffer: str, tensor: str | None = None
) -> np.ndarray | None:
    """One tensor of a snapshot as a [rows, cols] array (the whole buffer's tensor of the same
    name when `tensor` is None), or None when the checkpoint, buffer or tensor is absent."""
    flat = buffer_snapshot(trace, step, checkpoint, buffer)
    spec = trace.layout.get(buffer, {}).get("tensors", {}).get(tensor or buffer)
    if flat is None or spec is None:
        return None
    offset, rows, cols = spec
    if flat.size < offset + rows * cols:
        return None
    return flat[offset : offset + rows * cols].reshape(rows, cols)


def buffer_snapshot(trace: Trace, step: int, checkpoint: str, buffer: str) -> np.ndarray | None:
    """A whole flat buffer as snapshotted, or None when absent."""
    return trace.snapshots.get((step, checkpoint), {}).get(buffer)


def alpha_at(trace: Trace, step: int) -> np.float32 | None:
    """ISV[393] as the backward of `step` reads it (the after_losses snapshot), or None."""
    isv = trace.snapshots.get((step, "after_losses"), {}).get("isv_signals")
    if isv is None or isv.size <= ALPHA_GRAD_SMOOTHED_INDEX:
        return None
    return np.float32(isv[ALPHA_GRAD_SMOOTHED_INDEX])


def region_values(flat: np.ndarray, region: Region) -> np.ndarray | None:
    """The [rows, width] box a launch operand covers, read out of a flat buffer snapshot; None
    when the box does not fit the snapshot."""
    if region.rows <= 0 or region.width <= 0 or region.offset < 0 or region.last > flat.size:
        return None
    return flat[region.flat_indices()].reshape(region.rows, region.width)


def checkpoint_position(trace: Trace, step: int, name: str) -> int | None:
    """Position of a checkpoint in the launch list, or None."""
    for position, x in enumerate(trace.launches):
        if x.kind == "checkpoint" and x.step == step and x.name == name:
            return position
    return None


def launches_between(trace: Trace, step: int, begin: str, end: str) -> list[Launch] | None:
    """The launches strictly between two checkpoints of one step, or None when either is
    missing or they are out of order."""
    first, last = checkpoint_position(trace, step, begin), checkpoint_position(trace, step, end)
    if first is None or last is None or last < first:
        return None
    return [x for x in trace.launches[first + 1 : last] if x.kind != "checkpoint"]


# ---- bitwise facts ----
def bits(values: np.ndarray) -> np.ndarray:
    """The fp32 bit patterns: +0.0 and -0.0 differ here, and NaN never equals a number."""
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def bit_mismatch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Boolean mask of the elements whose fp32 bit patterns differ (same shapes required)."""
    return bits(a) != bits(b)


def hex_bits(value: float | np.floating) -> str:
    return f"0x{int(bits(np.array([value]))[0]):08x}"


def json_float(value: float | np.floating) -> float | str:
    """A float for evidence: strict JSON has no NaN or Inf, so those become their names."""
    value = float(value)
    return value if np.isfinite(value) else str(value)


def first_index(mask: np.ndarray) -> list[int]:
    """The index (as a list, one entry per axis) of the first True element of a mask."""
    return [int(i) for i in np.argwhere(mask)[0]]


def tensor_of_element(trace: Trace, buffer: str, element: int) -> str | None:
    """The name of the tensor of `buffer` that holds flat element `element`, or None."""
    for name, (offset, rows, cols) in trace.layout.get(buffer, {}).get("tensors", {}).items():
        if offset <= element < offset + rows * cols:
            return name
    return None
