"""EGF005 target-net-untouched: only Polyak writes the target network, and it writes exactly
tau * params + (1 - tau) * target; the target forward and the backward never mix."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from egf_audit.invariants.capture_common import (
    certainly_writes,
    may_write,
    named,
)
from egf_audit.invariants.common import (
    json_float,
    mode_traces,
    tensor_of_element,
)
from egf_audit.invariants.polyak import (
    MAX_POLYAK_ULP,
    first_and_count,
    net_elements,
    polyak_argument_problems,
    polyak_error_ulps,
    polyak_snapshot_problems,
    target_chain_problems,
)
from egf_audit.invariants.registry import Invariant, Verdict, failed, failed_with, passed, undecided
from egf_audit.oracle.inputs import device, flat_snapshot
from egf_audit.trace.contract import (
    AFTER_BACKWARD,
    AFTER_LOSSES,
    BEFORE_POLYAK,
    POLYAK_KERNEL,
    PRELOAD_PREFIXES,
    STEP_END,
    STEP_START,
    TARGET,
    TARGET_FORWARD_BEGIN,
    TARGET_FORWARD_END,
)
from egf_audit.trace.evidence import observed_write
from egf_audit.trace.model import Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Launch, Trace


def _is_backward_buffer(buffer: str) -> bool:
    return buffer == "grad_buf" or buffer.startswith(("d_", "sp14_d_"))


def _is_target_buffer(buffer: str) -> bool:
    return buffer == TARGET or buffer.startswith("tgt_")


def _written_buffers(x: Launch) -> list[str]:
    return [b.region.buffer for b in x.bindings if b.writes and b.region is not None]


def _read_buffers(x: Launch) -> list[str]:
    return [b.region.buffer for b in x.bindings if b.reads and b.region is not None]


def target_write(ct: Trace | None, x: Launch, proven: bool) -> str | None:
    """EGF005's rule for who writes the target net, for the rebuild's launches and a capture's
    alike (the trainer's initial copy is its caller's to leave out): None where `x` is Polyak or
    writes nothing of target_params; "declared" where it declares a write there (a kernel's
    table region, a GEMM's C, a memset's or copy's dst); "observed" where the capture `ct` saw
    it change the target; "unproven" where it is a kernel egf-audit does not know, handed a
    pointer into the target, and no observation of it nor the step's snapshots (`proven`) show
    the target unchanged. The rebuild knows every kernel it runs and observes their writes
    with EGF013, so only "declared" reaches it."""
    if x.kind == "kernel" and x.name == POLYAK_KERNEL:
        return None
    if certainly_writes(x, TARGET):
        return "declared"
    if ct is not None and observed_write(ct, x, TARGET):
        return "observed"
    if may_write(ct, x, TARGET) and not proven:
        return "unproven"
    return None


def _stray_target_writes(trace: Trace) -> list[dict[str, Any]]:
    """Launches other than polyak_ema that write target_params (the initial copy excepted)."""
    steps = trace.training_steps()
    first_step = trace.checkpoint_index(steps[0], STEP_START) if steps else None
    found = []
    for position, x in enumerate(trace.launches):
        preload = first_step is not None and position < first_step
        if preload and x.label.startswith(PRELOAD_PREFIXES):
            continue
        written = target_write(None, x, proven=False)
        if written is None:
            continue
        if written != "declared":  # a launch without a declared region on the target
            found.append(
                {
                    "problem": "a launch other than polyak_ema may write target_params",
                    "scenario": trace.scenario,
                    "step": x.step,
                    "label": x.label,
                }
            )
            continue
        for b in x.bindings:
            if b.writes and b.region is not None and b.region.buffer == TARGET:
                found.append(
                    {
                        "problem": "a launch other than polyak_ema writes target_params",
                        "scenario": trace.scenario,
                        "step": x.step,
                        "label": x.label,
                        "operand": b.role,
                        "tensor": b.tensor,
                    }
                )
    return found


def _step_measures(trace: Trace, step: int, tau: float) -> torch.Tensor:
    """One step's values measured on the oracle's device, from the snapshots where they were
    copied (oracle/inputs.py): [first changed element, elements changed, first element off,
    elements off, max ulp], read back with every other step's (one host read a mode, not three
    a step)."""
    dev = device()
    start = flat_snapshot(trace, step, STEP_START, TARGET, dev)
    before = flat_snapshot(trace, step, BEFORE_POLYAK, TARGET, dev)
    online = flat_snapshot(trace, step, BEFORE_POLYAK, "params", dev)
    end = flat_snapshot(trace, step, STEP_END, TARGET, dev)
    # the bit patterns: +0.0 and -0.0 differ, NaN never equals a number
    changed = first_and_count(start.view(torch.int32) != before.view(torch.int32))
    ulps = polyak_error_ulps(online, start, end, tau)
    off = first_and_count(ulps > MAX_POLYAK_ULP)
    largest = ulps.max().reshape(1).double() if ulps.numel() else changed.new_zeros(1)
    return torch.cat([changed, off, largest])


def _value_findings(
    trace: Trace, step: int, tau: float, measured: list[float]
) -> list[dict[str, Any]]:
    """What one step's values show, from its _step_measures read back (`measured`)."""
    at = {"scenario": trace.scenario, "step": step}
    found = []
    element, changed = int(measured[0]), int(measured[1])
    if changed:
        found.append(
            at
            | {
                "problem": "target_params changed between step_start and before_polyak",
                "elements_changed": changed,
                "first_tensor": tensor_of_element(trace, TARGET, element),
            }
        )
    element, off = int(measured[2]), int(measured[3])
    if off:
        found.append(
            at
            | {
                "problem": f"step_end target is not tau * params + (1 - tau) * target "
                f"within {MAX_POLYAK_ULP} ulp",
                "elements_off": off,
                "max_ulp": json_float(measured[4]),
                "first_tensor": tensor_of_element(trace, TARGET, element),
                "first_element": element,
                "tau": tau,
            }
        )
    return found


def _target_forward_findings(trace: Trace, step: int) -> list[dict[str, Any]]:
    """Launches inside one step's target forward that are no forward launch or write a
    backward buffer."""
    at = {"scenario": trace.scenario, "step": step}
    found = []
    target_forward = trace.launches_between(step, TARGET_FORWARD_BEGIN, TARGET_FORWARD_END)
    if not target_forward:
        found.append(at | {"problem": "no target forward between its checkpoints"})
    for x in target_forward:
        written = [b for b in _written_buffers(x) if _is_backward_buffer(b)]
        if not x.label.startswith("forward") or written:
            found.append(
                at
                | {
                    "problem": "a backward launch runs inside the target forward",
                    "label": x.label,
                    "writes": written,
                }
            )
    return found


def _backward_reads_of_target(trace: Trace) -> list[dict[str, Any]]:
    """Backward launches (labelled backward*, or run between after_losses and after_backward)
    that read the target network or its activations."""
    backward = {x.index: x for x in trace.launches if x.label.startswith("backward")}
    for step in trace.training_steps():
        for x in trace.launches_between(step, AFTER_LOSSES, AFTER_BACKWARD):
            backward[x.index] = x
    found = []
    for index in sorted(backward):
        x = backward[index]
        read = [b for b in _read_buffers(x) if _is_target_buffer(b)]
        if read:
            found.append(
                {
                    "problem": "a backward launch reads the target network",
                    "scenario": trace.scenario,
                    "step": x.step,
                    "label": x.label,
                    "reads": read,
                }
            )
    return found


def check(run: AuditRun, mode: str) -> Verdict:
    tau = float(run.config.hyper.tau)
    traces = mode_traces(run, mode)
    # Every step's values are measured on the device, all read back at once, then reported in
    # the order of the checks: per trace its write sets, then per step its values and its
    # target forward. What raises Missing raises where it did when each step read its own.
    checked: list[tuple[Trace, list[dict[str, Any]], list[tuple[int, list[dict[str, Any]]]]]]
    checked, measures = [], []
    for _, trace in traces:
        launches = _stray_target_writes(trace) + _backward_reads_of_target(trace)
        forwards = []
        for step in trace.training_steps():
            measures.append(_step_measures(trace, step, tau))
            forwards.append((step, _target_forward_findings(trace, step)))
        checked.append((trace, launches, forwards))
    read = iter(torch.stack(measures).tolist() if measures else [])
    findings: list[dict[str, Any]] = []
    max_ulp = 0.0
    for trace, launches, forwards in checked:
        findings += launches
        for step, forward in forwards:
            measured = next(read)
            max_ulp = max(max_ulp, measured[4])
            findings += _value_findings(trace, step, tau, measured) + forward
    steps_checked = len(measures)
    evidence = {
        "steps_checked": steps_checked,
        "traces": [t.scenario for _, t in traces],
        "polyak_max_ulp": json_float(max_ulp),
    }
    if findings:
        first = findings[0]
        where_ = f"{first['label']} in " if "label" in first else ""
        return failed(
            f"{where_}{first['scenario']} step {first['step']}: {first['problem']} "
            f"({len(findings)} findings)",
            first=first,
            findings=findings[:20],
            **evidence,
        )
    if not steps_checked:
        return failed(f"mode {mode} ran no training step", **evidence)
    return passed(
        f"only polyak_ema writes target_params; target bitwise unchanged until Polyak and "
        f"within {MAX_POLYAK_ULP} ulp of tau * params + (1 - tau) * target after it, in "
        f"{steps_checked} steps; no backward launch in or on the target net",
        **evidence,
    )


# ---- the same invariant on a capture of the trainer's process ----
def check_capture(ct: Trace) -> Verdict:
    """Write sets first: no launch but polyak_ema declares a write of target_params (the
    launches before the first GEMM initialise it); a kernel egf-audit does not know, handed a
    pointer into it, may write it, and passes only where the step's snapshots prove the target
    unchanged. Each Polyak's arguments are the contract's; its result is within the rebuild's
    2 ulp of tau * params + (1 - tau) * target (the same measure); the target at each step's
    start is the previous Polyak's result, and unchanged until this step's Polyak (by the
    recorder's hashes over every element). UNDECIDED only when no Polyak was snapshotted and
    the write sets show nothing wrong."""
    polyaks = list(ct.kernels(POLYAK_KERNEL))
    if not polyaks:
        return failed(f"no {POLYAK_KERNEL} launch: the target net is never updated")
    if TARGET not in ct.capture.layout.buffers or "params" not in ct.capture.layout.buffers:
        raise Missing("target_params and params are not named (layout file or polyak_ema)")
    net = net_elements(ct)
    problems = [f"{named(x)}: {p}" for x in polyaks for p in polyak_argument_problems(ct, x, net)]
    snapshotted, values_checked = 0, 0
    for x in polyaks:
        try:
            found, seen = polyak_snapshot_problems(ct, x)
        except Missing as exc:  # judge every other launch still
            found, seen = [f"missing data: {exc}"], True
        problems += found
        snapshotted += seen
        values_checked += seen and not found
    if 0 < snapshotted < len(polyaks):
        problems.append(
            f"{len(polyaks) - snapshotted} of {len(polyaks)} Polyak launches have no snapshots"
        )
    chained, proven = target_chain_problems(ct, polyaks, bool(snapshotted))
    problems += chained
    first_gemm = next((x.index for x in ct.sgemms()), len(ct.launches))
    for x in ct.launches:
        # before the first GEMM the trainer initialises: the target's first copy of the online
        # net, by a copy, a memset or a kernel of its own (CuPy's `target[...] = params`)
        if x.index < first_gemm:
            continue
        written = target_write(ct, x, x.step in proven)
        if written == "declared":
            problems.append(f"{named(x)} writes target_params")
        elif written == "observed":
            problems.append(f"{named(x)} changed target_params (the capture observed it)")
        elif written == "unproven":
            problems.append(
                f"{named(x)} is a kernel egf-audit does not know, handed a pointer into "
                "target_params, and neither an observation of the launch nor a snapshot proves "
                "the target unchanged in its step"
            )
    evidence = {"polyak_launches": len(polyaks), "snapshotted": snapshotted}
    evidence["values_checked"] = values_checked
    if problems:
        return failed_with(problems, **evidence)
    if not snapshotted:
        return undecided(
            f"only {POLYAK_KERNEL} writes target_params ({len(polyaks)} launches, every "
            "argument as the contract says), but no snapshot shows the values it wrote",
            **evidence,
        )
    return passed(
        f"only {POLYAK_KERNEL} writes target_params ({len(polyaks)} launches); the target is "
        f"unchanged within each step and chained from step to step; Polyak within "
        f"{MAX_POLYAK_ULP} ulp of tau * params + (1 - tau) * target on every element",
        **evidence,
    )


INVARIANT = Invariant(
    code="EGF005",
    slug="target-net-untouched",
    message="Only Polyak may write the target net, and exactly tau * params + (1 - tau) * target.",
    what=(
        "From the recorded write sets, no launch but the polyak_ema kernel writes "
        "target_params (the initial copy aside); target_params is bitwise unchanged from "
        "step_start to just before Polyak, and after it equals tau * params + (1 - tau) * "
        "target within 2 ulp; the target forward contains only forward launches, and no "
        "backward launch reads target_params or a tgt_* activation."
    ),
    why=(
        "The target net defines the TD target. If a gradient leaks into it, or Polyak blends "
        "the wrong way round, the target follows the online net and DQN loses the stability "
        "the target exists for, with no error anywhere. Hand-wired offsets make such a leak a "
        "one-character bug (goff_* added to the wrong base)."
    ),
    how=(
        "Every binding that writes records its buffer, so the write set of each launch is "
        "known; that a launch writes nothing outside it (target_params included) is observed "
        "by comparing every buffer before and after each launch (EGF013). Snapshots of "
        "target_params at step_start, before_polyak and step_end, and of "
        "params at before_polyak, give the Polyak update recomputed in float64; the error is "
        "counted in fp32 ulps of |tau * params| + |(1 - tau) * target|, the size the kernel "
        "rounds at, so a parameter crossing zero (the terms cancel) is not a false failure. "
        "The launches between forward_target:begin and :end, and those between after_losses "
        "and after_backward, are checked for what they read and write."
    ),
    catches=(
        "A backward dW SGEMM that writes through a goff_* offset on target_params' base "
        "instead of grad_buf's, and a Polyak update with tau and 1 - tau swapped."
    ),
    limits=(
        "Polyak's result is held to 2 ulp, so a blend wrong by less passes; the target forward "
        "and the backward are found by their labels and checkpoints, and a write outside a "
        "launch's declared regions is EGF013's. A capture has no checkpoints and no forward or "
        "backward labels: its check cannot see the target forward's own launches or what the "
        "backward reads, only who writes target_params and what Polyak wrote, with tau held to "
        "the layout's dims.tau or, where the trainer states none, to the preset's. Without a "
        "snapshot of Polyak it is UNDECIDED."
    ),
    example=(
        "backward_value_out_dw@cql computes target_params + goff_w_v1 as its C pointer: the "
        "value head's dW accumulates into the target net and grad_buf never receives it."
    ),
    check=check,
    capture=check_capture,
)
