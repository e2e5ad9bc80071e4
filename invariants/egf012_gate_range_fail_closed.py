"""EGF012 gate-range-fail-closed: ISV[393] starts at +0.0, stays in [0, 1], and fails closed.

Before any producer, ISV[393] is bitwise +0.0 (step_start of step 0, production trace). Sentinel
mode: nothing of the trainer writes element 393 in any sentinel trace (the audit's own uploads
are the exceptions: `audit:*` forces the gate, `replay:load_state:*` restores the saved state,
whose ISV[393] must then read +0.0 at step_start), and ISV[393] is +0.0 after the losses of
every step. Live mode: the producer writes ISV[393] every step, finite and in [0, 1]. Both
modes: in the `probe/gate` scenario, every probe result is finite and in [0, 1], and every
probe with a non-finite input or previous gate gives exactly +0.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, SupportsFloat, TypedDict

from egf_audit.invariants.capture_common import named, scale_views
from egf_audit.invariants.common import (
    in_step,
    is_plus_zero,
    json_float,
    kinds,
    listed,
    only_trace,
    production,
    steps,
    writes_element,
)
from egf_audit.invariants.registry import Invariant, Verdict, failed, failed_with, passed, undecided
from egf_audit.trace.contract import (
    AFTER_LOSSES,
    ALPHA_GRAD_SMOOTHED_INDEX,
    GATE_PROBE_PREFIX,
    GATE_PROBE_SCENARIO,
    ISV,
    PRELOAD_PREFIXES,
    SCALE_KERNEL,
    STEP_START,
)

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Launch, Trace

NONFINITE_INPUTS = ("nan", "inf")


class Probe(TypedDict):
    """One gate-producer probe: its inputs as recorded and the gate it gave."""

    input: object  # the probe's softmax kind ("nan", "inf", ...)
    previous: object  # the gate before it
    alpha: float | str
    nonfinite: bool  # a non-finite input or previous gate: the gate must close


def alpha(trace: Trace, step: int, point: str) -> float:
    values = trace.buffer_snapshot(step, point, ISV)
    if values.size <= ALPHA_GRAD_SMOOTHED_INDEX:
        return float("nan")  # a truncated ISV reads as no gate at all
    return float(values[ALPHA_GRAD_SMOOTHED_INDEX])


def in_unit_range(value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= 1.0


@dataclass(frozen=True)
class GateReading:
    """One value of ISV[393] a trace holds, and what the contract asks of it there. The rebuild
    reads it at its checkpoints (step_start, after_losses) and gate probes, a capture where each
    scale launch read it; the modes differ in these readings, never in `reading_problem`."""

    value: float | None  # None: the trace holds no snapshot of it there
    in_range: bool  # must be finite and in [0, 1] (what the producer writes, what the scale reads)
    closed: bool  # must be exactly +0.0 (before any producer, a sentinel step, a non-finite input)


def reading_problem(reading: GateReading) -> str | None:
    """EGF012's one rule, for the rebuild's readings and a capture's alike: "missing",
    "out-of-range" or "not-closed" (in that order: a probe that should close and reads 2.0 is
    out of range first), or None where the reading holds."""
    if reading.value is None:
        return "missing"
    if reading.in_range and not in_unit_range(reading.value):
        return "out-of-range"
    if reading.closed and not is_plus_zero(reading.value):
        return "not-closed"
    return None


def _writes_gate(x: Launch) -> bool:
    return writes_element(x, ISV, ALPHA_GRAD_SMOOTHED_INDEX)


def _sentinel_failures(run: AuditRun) -> tuple[list[dict[str, object]], int]:
    """(failures, traces searched): nothing but the audit writes ISV[393] in sentinel mode."""
    out: list[dict[str, object]] = []
    searched = 0
    for sc, trace in run.for_mode("sentinel"):
        searched += 1
        for x in trace.launches:
            if not _writes_gate(x):
                continue
            if x.name == "upload" and x.label.startswith("audit:"):
                continue  # the audit forcing the gate (replays alpha=0.37, alpha=1)
            if x.name == "upload" and x.label.startswith(PRELOAD_PREFIXES[1]):
                value = alpha(trace, x.step, STEP_START)
                if reading_problem(GateReading(value, in_range=False, closed=True)):
                    out.append(
                        {
                            "kind": "restored-gate-nonzero",
                            "scenario": sc.name,
                            "alpha": json_float(value),
                        }
                    )
                continue
            out.append(
                {"kind": "sentinel-producer", "scenario": sc.name, "step": x.step, "label": x.label}
            )
    return out, searched


def _step_failures(trace: Trace, mode: str) -> tuple[list[dict[str, object]], list[float | str]]:
    """(failures, ISV[393] after the losses per step) of the production trace."""
    out: list[dict[str, object]] = []
    values: list[float | str] = []
    for step in steps(trace):
        value = alpha(trace, step, AFTER_LOSSES)
        values.append(json_float(value))
        reading = GateReading(value, in_range=mode == "live", closed=mode == "sentinel")
        problem = reading_problem(reading)
        if problem == "not-closed":
            out.append({"kind": "sentinel-gate-open", "step": step, "alpha": json_float(value)})
        if problem == "out-of-range":
            out.append({"kind": "gate-out-of-range", "step": step, "alpha": json_float(value)})
        if mode == "live" and not _produced(trace, step):
            out.append({"kind": "no-producer", "step": step})
    return out, values


def _produced(trace: Trace, step: int) -> bool:
    """A launch of the trainer (not an upload) writes ISV[393] before after_losses."""
    end = trace.checkpoint(step, AFTER_LOSSES).index
    return any(
        x.index < end and x.name != "upload" and _writes_gate(x) for x in in_step(trace, step)
    )


def _probe_failures(run: AuditRun) -> tuple[list[dict[str, object]], dict[str, Probe]]:
    trace = only_trace(run, "probe", GATE_PROBE_SCENARIO)
    out: list[dict[str, object]] = []
    probes: dict[str, Probe] = {}
    start = alpha(trace, 0, f"{GATE_PROBE_PREFIX}start")
    if reading_problem(GateReading(start, in_range=False, closed=True)):
        out.append({"kind": "probe-start-nonzero", "alpha": json_float(start)})
    marks = [
        x
        for x in trace.launches
        if x.kind == "checkpoint"
        and x.name.startswith(GATE_PROBE_PREFIX)
        and x.name != f"{GATE_PROBE_PREFIX}start"
    ]
    for x in marks:
        name = x.name[len(GATE_PROBE_PREFIX) :]
        value = alpha(trace, x.step, x.name)
        previous = x.args.get("previous")
        nonfinite = x.args.get("input") in NONFINITE_INPUTS or (
            isinstance(previous, float) and math.isnan(previous)
        )
        probes[name] = {
            "input": x.args.get("input"),
            "previous": json_float(previous) if isinstance(previous, float | int) else previous,
            "alpha": json_float(value),
            "nonfinite": nonfinite,
        }
        problem = reading_problem(GateReading(value, in_range=True, closed=nonfinite))
        if problem is not None:  # "probe-out-of-range", "probe-not-closed"
            out.append({"kind": f"probe-{problem}", "probe": name, "alpha": json_float(value)})
    if not marks or not any(p["nonfinite"] for p in probes.values()):
        out.append({"kind": "probes-missing", "probes": len(marks)})
    return out, probes


def check(run: AuditRun, mode: str) -> Verdict:
    trace = production(run, mode)
    failures: list[dict[str, object]] = []
    start = alpha(trace, steps(trace)[0], STEP_START)
    if reading_problem(GateReading(start, in_range=False, closed=True)):
        failures.append({"kind": "gate-not-zero-at-start", "alpha": json_float(start)})
    searched = 0
    if mode == "sentinel":
        found, searched = _sentinel_failures(run)
        failures += found
    found, after_losses = _step_failures(trace, mode)
    failures += found
    found, probes = _probe_failures(run)
    failures += found

    evidence = {
        **listed(failures),
        "alpha_at_start": json_float(start),
        "alpha_after_losses": after_losses,
        "probes": probes,
    }
    if failures:
        found_kinds = ", ".join(kinds(failures))
        return failed(f"{len(failures)} gate violation(s): {found_kinds}", **evidence)
    closed = sum(1 for p in probes.values() if p["nonfinite"])
    per_mode = (
        f"nothing but the audit writes ISV[393] in {searched} sentinel traces and it is +0.0 "
        f"after the losses at {len(after_losses)} steps"
        if mode == "sentinel"
        else f"the producer writes a finite ISV[393] in [0, 1] at {len(after_losses)} steps"
    )
    return passed(
        f"ISV[393] is +0.0 before any producer; {per_mode}; {len(probes)} gate probes in "
        f"[0, 1], the {closed} with a non-finite input or previous gate give +0.0",
        **evidence,
    )


def _value(alpha: SupportsFloat | None) -> float | None:
    return None if alpha is None else float(alpha)


def check_capture(ct: Trace) -> Verdict:
    """The gate every scale launch read (its `alpha` snapshot) is finite and in [0, 1]. A scale
    launch without that snapshot fails, when others have one; UNDECIDED only when no scale was
    snapshotted. The producer's own inputs and the value before any producer are not visible
    in a capture (the rebuild's probe decides them)."""
    views = scale_views(ct)
    if not any(v.alpha is not None for v in views):
        return undecided(f"no snapshot of ISV[393] at a {SCALE_KERNEL} launch")
    # what each scale read: in [0, 1]; whether its step is a sentinel one a capture cannot tell
    # (the trainer's mode is no launch argument), so none is held to +0.0 here
    found = [
        (v, reading_problem(GateReading(_value(v.alpha), in_range=True, closed=False)))
        for v in views
    ]
    problems = [f"{named(v.launch)}: no snapshot of ISV[393]" for v, p in found if p == "missing"]
    problems += [
        f"{named(v.launch)}: read ISV[393] = {float(v.alpha)}, outside [0, 1]"
        for v, p in found
        if p == "out-of-range" and v.alpha is not None
    ]
    alphas = [json_float(v.alpha) for v in views if v.alpha is not None]
    if problems:
        return failed_with(problems, alphas=alphas[:20])
    return passed(
        f"every one of {len(views)} scale launches read a finite gate in [0, 1]",
        alphas=alphas[:20],
    )


INVARIANT = Invariant(
    code="EGF012",
    slug="gate-range-fail-closed",
    message="ISV[393] must start at +0.0, stay in [0, 1], and be +0.0 for non-finite input.",
    what=(
        "`ISV[393]` (ALPHA_GRAD_SMOOTHED_INDEX) is exactly +0.0 before any producer runs; in "
        "sentinel mode nothing but the audit writes it and it stays +0.0; in live mode the "
        "producer writes a finite value in [0, 1] every step; the producer probes give values "
        "in [0, 1] and exactly +0.0 when the accuracy or the previous gate is not finite."
    ),
    why=(
        "The wire gate multiplies the gradient flowing into the aux head. Above 1 it amplifies "
        "the Q-loss gradient, below 0 it reverses it (the aux head then learns to hurt the "
        "direction head), and NaN poisons the aux weights at the next Adam step. Before B.11 "
        "the sentinel 0.0 is the safety state; it is only safe if nothing else writes it and "
        "if the producer fails closed."
    ),
    how=(
        "Snapshots of `isv_signals` at `step_start` (step 0) and at every step's "
        "`after_losses` of the production trace, compared bitwise with +0.0 (sentinel) or "
        "checked finite and in [0, 1] (live, where a non-upload launch must write element 393 "
        "each step). Sentinel mode also walks every sentinel trace: any launch whose write "
        "region holds element 393 fails unless it is an `audit:*` upload or a "
        "`replay:load_state:*` restore whose result reads +0.0; a write to element 393 that a "
        "launch does not declare is seen by the before/after comparison of every buffer "
        "(EGF013), so declared regions are all this walk needs. The `probe/gate` scenario runs "
        "the producer on crafted inputs (below chance, perfect, NaN, Inf, NaN previous gate)."
    ),
    catches=(
        "`alpha_grad_compute` without its clamp to [0, 1]: a below-chance aux head drives the "
        "gate negative. Also a producer wired in sentinel mode, and a producer that lets a "
        "non-finite accuracy or previous gate through."
    ),
    limits=(
        "It bounds the gate (finite, in [0, 1], +0.0 where it must be); it does not check that "
        "a live gate is the value the producer's formula gives, so a producer wrong in a way "
        "that stays in [0, 1] passes. Fail-closed is probed on crafted inputs in `probe/gate`. "
        "On a capture only the gate each scale read is seen: the producer's inputs and the "
        "value before any producer are not, and a capture with no snapshot of ISV[393] is "
        "UNDECIDED."
    ),
    example=(
        "`raw = (acc - 1/K) / (1 - 1/K)` fed to the EMA unclamped: accuracy 0 gives raw = "
        "-1/2 and `ISV[393] = 0.1 * -1/2 = -0.05`."
    ),
    check=check,
    capture=check_capture,
)
