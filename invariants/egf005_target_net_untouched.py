"""EGF005 target-net-untouched: only Polyak writes the target network, and it writes exactly
tau * params + (1 - tau) * target; the target forward and the backward never mix."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

import numpy as np
import torch

from egf_audit.invariants.capture_common import (
    all_values,
    certainly_writes,
    may_write,
    named,
    pointer_problem,
    regions,
)
from egf_audit.invariants.capture_evidence import observed_write
from egf_audit.invariants.common import (
    json_float,
    mode_traces,
    tensor_of_element,
)
from egf_audit.invariants.registry import Invariant, Verdict, failed, failed_with, passed, undecided
from egf_audit.oracle.inputs import device, flat_snapshot
from egf_audit.runtime.contract import (
    AFTER_BACKWARD,
    AFTER_LOSSES,
    BEFORE_POLYAK,
    POLYAK_KERNEL,
    POLYAK_TAU,
    PRELOAD_PREFIXES,
    STEP_END,
    STEP_START,
    TARGET,
    TARGET_FORWARD_BEGIN,
    TARGET_FORWARD_END,
)
from egf_audit.runtime.trace import Missing

if TYPE_CHECKING:
    from egf_audit.runtime.audit_run import AuditRun
    from egf_audit.runtime.capture_model import CaptureTrace
    from egf_audit.runtime.trace import Launch, Trace

MAX_POLYAK_ULP = 2


def _is_backward_buffer(buffer: str) -> bool:
    return buffer == "grad_buf" or buffer.startswith(("d_", "sp14_d_"))


def _is_target_buffer(buffer: str) -> bool:
    return buffer == TARGET or buffer.startswith("tgt_")


def _written_buffers(x: Launch) -> list[str]:
    return [b.region.buffer for b in x.bindings if b.writes and b.region is not None]


def _read_buffers(x: Launch) -> list[str]:
    return [b.region.buffer for b in x.bindings if b.reads and b.region is not None]


def _stray_target_writes(trace: Trace) -> list[dict[str, Any]]:
    """Launches other than polyak_ema that write target_params (the initial copy excepted)."""
    steps = trace.training_steps()
    first_step = trace.checkpoint_index(steps[0], STEP_START) if steps else None
    found = []
    for position, x in enumerate(trace.launches):
        if x.kind == "kernel" and x.name == POLYAK_KERNEL:
            continue
        preload = first_step is not None and position < first_step
        if preload and x.label.startswith(PRELOAD_PREFIXES):
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


@overload
def polyak_error_ulps(
    online: np.ndarray, start: np.ndarray, end: np.ndarray, tau: float
) -> np.ndarray: ...
@overload
def polyak_error_ulps(
    online: torch.Tensor, start: torch.Tensor, end: torch.Tensor, tau: float
) -> torch.Tensor: ...
def polyak_error_ulps(
    online: np.ndarray | torch.Tensor,
    start: np.ndarray | torch.Tensor,
    end: np.ndarray | torch.Tensor,
    tau: float,
) -> np.ndarray | torch.Tensor:
    """|end - (tau * online + (1 - tau) * start)|, exact in float64, in fp32 ulps of the terms'
    magnitude |tau * online| + |(1 - tau) * start|; 0 where a non-finite input propagated, inf
    where the result is not finite and should be. Arrays give an array (a capture's host
    copies); tensors a tensor on their device (the rebuild's snapshots, on the GPU there).

    The kernel rounds each product relative to itself, not to the sum. Where the two terms
    nearly cancel (a parameter crossing zero) the result's own ulp is far below those
    roundings, so the ulp is taken at the terms' magnitude; elsewhere the two agree."""
    if isinstance(online, np.ndarray):
        # a capture's arrays are read-only views of its files, which torch.from_numpy would
        # share and warn about: a writable copy where one is needed (the values are read only)
        host = [
            torch.from_numpy(np.require(a, requirements=("C", "W"))) for a in (online, start, end)
        ]
        return polyak_error_ulps(host[0], host[1], host[2], tau).numpy()
    assert isinstance(start, torch.Tensor) and isinstance(end, torch.Tensor)
    o, t, e = online.double(), start.double(), end.double()
    exact = tau * o + (1.0 - tau) * t
    magnitude = (tau * o).abs() + ((1.0 - tau) * t).abs()
    m32 = magnitude.float()
    ulp = (torch.nextafter(m32, torch.full_like(m32, torch.inf)) - m32).double()  # np.spacing
    ulps = (e - exact).abs() / ulp
    # a non-finite parameter propagates (NaN gives NaN, Inf the same Inf): the blend is right;
    # a non-finite result from finite inputs is infinitely far
    propagated = (exact.isnan() & e.isnan()) | (exact.isinf() & (e == exact))
    return torch.where(propagated, 0.0, torch.where(ulps.isnan(), torch.inf, ulps))


def _first_and_count(mask: torch.Tensor) -> torch.Tensor:
    """[first set element or -1, how many are set] of a flat mask, on its device (float64:
    exact below 2**53), to be read back with the rest of the check."""
    if not mask.numel():
        return torch.tensor([-1.0, 0.0], dtype=torch.float64, device=mask.device)
    first = torch.where(mask.any(), mask.int().argmax(), -1)
    return torch.stack([first, mask.sum()]).double()


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
    changed = _first_and_count(start.view(torch.int32) != before.view(torch.int32))
    ulps = polyak_error_ulps(online, start, end, tau)
    off = _first_and_count(ulps > MAX_POLYAK_ULP)
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
PAD_ELEMENTS = 64  # floats in the 256-byte granule an allocator rounds a buffer up to


def _polyak_argument_problems(ct: CaptureTrace, x: Launch, net: int | None) -> list[str]:
    """polyak_ema(target, online, tau, n) held to the contract: target is the start of
    target_params, online the start of params, n the whole net (the layout's parameter table's
    extent, or it rounded up to a 256-byte granule, where it gives one; else both buffers'
    size, which must agree), tau the layout's `dims.tau`, or the preset's (POLYAK_TAU) for a
    trainer that states none, as the rebuild uses its config's."""
    problems = [
        p
        for p in (
            pointer_problem(ct, x, "target", TARGET),
            pointer_problem(ct, x, "online", "params"),
        )
        if p is not None
    ]
    # n is the whole net: the parameter table's extent, or (a trainer that allocates its
    # parameter buffers in 256-byte granules) that extent rounded up to 64 floats; both buffers
    # of that size. Without a table: both buffers' size.
    sizes = {ct.layout.buffers[TARGET].size, ct.layout.buffers["params"].size}
    room = min(sizes)
    allowed = {max(sizes)} if net is None else {net, -(-net // PAD_ELEMENTS) * PAD_ELEMENTS}
    n = x.args.get("n")
    if len(sizes) != 1 or n not in allowed or not isinstance(n, int) or n > room:
        words = " or ".join(str(a) for a in sorted(allowed))
        problems.append(
            f"n = {n}, the whole net is {words} elements (target_params and params hold "
            f"{' and '.join(str(z) for z in sorted(sizes))})"
        )
    tau, stated = x.args.get("tau"), ct.layout.dims.get("tau")
    expected = POLYAK_TAU if stated is None else stated
    whose = "the preset's (the layout states no dims.tau)" if stated is None else "the layout's"
    if not isinstance(tau, float) or np.float32(tau) != np.float32(expected):
        problems.append(f"tau = {tau}, {whose} tau is {expected}")
    return problems


def _net_elements(ct: CaptureTrace) -> int | None:
    """The parameter table's extent, where the layout file gives one (param_offsets)."""
    params = ct.layout.buffers.get("params")
    if params is None or not ct.layout.from_file or not params.shaped:
        return None
    ends = [offset + rows * cols for offset, rows, cols in params.tensors.values()]
    return max(ends) if ends and "params" not in params.tensors else None


def _snapshot_problems(ct: CaptureTrace, x: Launch) -> tuple[list[str], bool]:
    """(problems, snapshotted) of one Polyak launch's own snapshots, values included."""
    before, after = regions(ct, x, "before"), regions(ct, x, "after")
    if not before and not after:
        return [], False
    n, at = x.args.get("n"), named(x)
    problems = []
    for when, got, names in (
        ("before", before, ("target", "online")),
        ("after", after, ("target",)),
    ):
        for name in names:
            r = got.get(name)
            if r is None:
                problems.append(f"{at}: no {when} snapshot of {name}")
            elif (r.ptr, r.elements) != (x.args.get(name), n):
                problems.append(f"{at}: its {when} snapshot of {name} is not the launch's region")
    if problems:
        return problems, True
    online = all_values(before["online"], f"params before {at}")
    start = all_values(before["target"], f"target_params before {at}")
    end = all_values(after["target"], f"target_params after {at}")
    ulps = polyak_error_ulps(online, start, end, float(np.float32(x.args["tau"])))
    if ulps.size and float(np.max(ulps)) > MAX_POLYAK_ULP:
        problems.append(
            f"{at}: the result is {json_float(np.max(ulps))} ulp from tau * params + (1 - tau) "
            f"* target (at most {MAX_POLYAK_ULP})"
        )
    return problems, True


def _step_start_hashes(ct: CaptureTrace) -> dict[int, str]:
    """The recorder's hash of target_params at the first launch of each step after the first
    (it snapshots the last Polyak's target again there), by step."""
    position = {r.seq: i for i, r in enumerate(ct.records)}
    out = {}
    for s in ct.process.snapshots:
        if s.when == "step_start" and s.region == "target" and s.launch in position:
            out[ct.trace.launches[position[s.launch]].step] = s.hash
    return out


def check_capture(ct: CaptureTrace) -> Verdict:
    """Write sets first: no launch but polyak_ema declares a write of target_params (the
    launches before the first GEMM initialise it); a kernel egf-audit does not know, handed a
    pointer into it, may write it, and passes only where the step's snapshots prove the target
    unchanged. Each Polyak's arguments are the contract's; its result is within the rebuild's
    2 ulp of tau * params + (1 - tau) * target (the same measure); the target at each step's
    start is the previous Polyak's result, and unchanged until this step's Polyak (by the
    recorder's hashes over every element). UNDECIDED only when no Polyak was snapshotted and
    the write sets show nothing wrong."""
    polyaks = list(ct.trace.kernels(POLYAK_KERNEL))
    if not polyaks:
        return failed(f"no {POLYAK_KERNEL} launch: the target net is never updated")
    if TARGET not in ct.layout.buffers or "params" not in ct.layout.buffers:
        raise Missing("target_params and params are not named (layout file or polyak_ema)")
    net = _net_elements(ct)
    problems = [f"{named(x)}: {p}" for x in polyaks for p in _polyak_argument_problems(ct, x, net)]
    snapshotted, values_checked = 0, 0
    for x in polyaks:
        try:
            found, seen = _snapshot_problems(ct, x)
        except Missing as exc:  # judge every other launch still
            found, seen = [f"missing data: {exc}"], True
        problems += found
        snapshotted += seen
        values_checked += seen and not found
    if 0 < snapshotted < len(polyaks):
        problems.append(
            f"{len(polyaks) - snapshotted} of {len(polyaks)} Polyak launches have no snapshots"
        )
    starts = _step_start_hashes(ct)
    polyak_of_step = {x.step: x for x in polyaks}
    proven: set[int] = set()
    for step, x in polyak_of_step.items():
        before = regions(ct, x, "before").get("target")
        previous = polyak_of_step.get(step - 1)
        if step in starts and before is not None:
            if starts[step] != before.hash:
                problems.append(
                    f"step {step}: target_params changed between the step's start and its Polyak"
                )
            else:
                proven.add(step)
        elif step > 0 and snapshotted:
            problems.append(f"step {step}: no snapshot of target_params at the step's start")
        last = regions(ct, previous, "after").get("target") if previous is not None else None
        if step in starts and last is not None and starts[step] != last.hash:
            problems.append(
                f"step {step}: target_params at the step's start is not the previous Polyak's "
                "result (a step repeated, skipped or rolled back)"
            )
    first_gemm = next((x.index for x in ct.trace.sgemms()), len(ct.trace.launches))
    for x in ct.trace.launches:
        # before the first GEMM the trainer initialises: the target's first copy of the online
        # net, by a copy, a memset or a kernel of its own (CuPy's `target[...] = params`)
        if x.name == POLYAK_KERNEL or x.index < first_gemm:
            continue
        if certainly_writes(x, TARGET):
            problems.append(f"{named(x)} writes target_params")
        elif observed_write(ct, x, TARGET):
            problems.append(f"{named(x)} changed target_params (the capture observed it)")
        elif may_write(ct, x, TARGET) and x.step not in proven:
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
