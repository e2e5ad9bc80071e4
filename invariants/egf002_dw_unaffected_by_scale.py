"""EGF002 dw-unaffected-by-scale: dW of w_b0fc does not depend on the wire gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from egf_audit.invariants.common import alpha_at, bit_mismatch, in_step, json_float, mode_traces
from egf_audit.invariants.registry import Invariant, Verdict, failed, failed_with, passed, undecided
from egf_audit.trace.buffers import tensor_table
from egf_audit.trace.contract import (
    AFTER_BACKWARD,
    AFTER_FORWARD,
    AUX_DOWN_INDEX,
    AUX_UP_INDEX,
    REPLAYED_STEP,
    SCALE_KERNEL,
)
from egf_audit.trace.evidence import guard_changes
from egf_audit.trace.model import Missing
from egf_audit.trace.observed import calls_changing, observations
from egf_audit.trace.process import GEMM_KINDS
from egf_audit.trace.spans import Spans, Unbounded, box_ranges, declared

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Launch, Trace
    from egf_audit.trace.process import Record


def writes_dw_w_b0fc(trace: Trace) -> bool:
    """Whether the replayed step of `trace` ran an SGEMM that writes grad_buf's w_b0fc: the
    dW compared below was computed in the step, not left over (read from the operands)."""
    return any(
        x.kind == "sgemm"
        and (c := x.binding("C", required=False)) is not None
        and c.region is not None
        and c.region.buffer == "grad_buf"
        and c.tensor == "w_b0fc"
        for x in in_step(trace, REPLAYED_STEP)
    )


def runs_the_scale(trace: Trace) -> bool:
    """Whether the replayed step of `trace` launched the scale kernel at all (read from the
    trace's launches, not from what the scenario was meant to do)."""
    return any(x.kind == "kernel" and x.name == SCALE_KERNEL for x in in_step(trace, REPLAYED_STEP))


def check(run: AuditRun, mode: str) -> Verdict:
    sh2 = run.config.dims.SH2
    traces = mode_traces(run, mode)
    production = [t for s, t in traces if s.kind == "production"]
    replays = [t for s, t in traces if s.kind == "replay"]
    if not production or not replays:
        return failed(
            f"mode {mode} lacks its production trace or its replays",
            traces=[t.scenario for _, t in traces],
        )
    dw, alphas = {}, {}
    for trace in [*production, *replays]:
        dw[trace.scenario] = trace.snapshot(REPLAYED_STEP, AFTER_BACKWARD, "grad_buf", "w_b0fc")
        alphas[trace.scenario] = json_float(alpha_at(trace, REPLAYED_STEP))
    softmax = production[0].snapshot(REPLAYED_STEP, AFTER_FORWARD, "aux_nb_softmax_buf")

    # the claim needs gate 0, a gate in (0, 1), gate 1 and a step without the scale launch
    seen = [a for a in alphas.values() if isinstance(a, float)]
    covered = 0.0 in seen and 1.0 in seen and any(0.0 < a < 1.0 for a in seen)
    # ... and a step without the scale launch, every step computing its dW (as launches show)
    scaled = {t.scenario: runs_the_scale(t) for _, t in traces}
    computed = all(writes_dw_w_b0fc(t) for _, t in traces)
    if not (covered and computed and not all(scaled.values())):
        return failed(
            "the compared steps do not cover gate 0, 0 < gate < 1, gate 1 and a step without "
            "the scale launch, each computing dW w_b0fc",
            alphas=alphas,
            ran_the_scale=scaled,
            computed_dw=computed,
            traces=[t.scenario for _, t in traces],
        )

    reference = production[0].scenario
    masks = {name: bit_mismatch(grad, dw[reference]) for name, grad in dw.items()}
    differing = {name: int(mask.sum()) for name, mask in masks.items() if name != reference}
    columns = np.any(np.stack(list(masks.values())), axis=(0, 1))
    wire = dw[reference][:, sh2]
    # zeros in the wire column prove a dropped column only where non-zeros were due: some
    # gradient reached the branch (dW[:, :SH2] not all zero) and the wire input p[:, up] -
    # p[:, down] is not zero in every row (at tiny shapes either can legitimately fail)
    due = bool(np.any(dw[reference][:, :sh2] != 0)) and bool(
        np.any(softmax[:, AUX_UP_INDEX] != softmax[:, AUX_DOWN_INDEX])
    )
    evidence = {
        "alphas": alphas,
        "elements_differing": differing,
        "columns_differing": [int(c) for c in np.nonzero(columns)[0]],
        "wire_column_due": due,
        "wire_column_zero_elements": int((wire == 0).sum()),
        "wire_column_rows": int(wire.size),
        "wire_column_max_abs": json_float(np.max(np.abs(wire))),
    }
    worst = max(differing, key=lambda name: differing[name])
    if differing[worst]:
        return failed(
            f"grad_buf[goff_w_b0fc..] of {worst} differs from {reference} in "
            f"{differing[worst]} of {wire.size * (sh2 + 1)} elements",
            **evidence,
        )
    if due and not np.any(wire != 0):
        return failed(
            f"the wire column (column {sh2}) of dW w_b0fc is all zero in {reference}", **evidence
        )
    # the values agree at every gate; the flow, the capture's rule, must hold too (it sees a
    # GEMM that reads the scale's output even at the gates where it changes nothing)
    flow: list[str] = []
    base, dw_bytes, cols = _rebuild_bytes(production[0])
    for step in production[0].training_steps():
        calls = _rebuild_calls(production[0], step, base)
        found, unplaced = dw_flow_problems(calls, dw_bytes, cols, step)
        flow += found + [f"step {step}: cannot be placed: {u}" for u in unplaced]
    if flow:
        return failed_with(flow, **evidence)
    wire_fact = f"wire column {sh2} non-zero" if due else "no wire gradient was due"
    return passed(
        f"dW w_b0fc of step 0 bitwise identical in {', '.join(dw)}; {wire_fact}", **evidence
    )


def _dw_w_b0fc(ct: Trace) -> tuple[Spans, int] | None:
    """The bytes of grad_buf's w_b0fc and its row width, where the layout names them."""
    grad = ct.capture.layout.buffers.get("grad_buf")
    spec = grad.tensors.get("w_b0fc") if grad is not None else None
    if grad is None or spec is None:
        return None
    offset, rows, cols = spec
    start = grad.base + 4 * offset
    return Spans.of([(start, start + 4 * rows * cols)]), cols


@dataclass(frozen=True)
class FlowCall:
    """One call of a step as EGF002's data flow reads it, made from the rebuild's launches and a
    capture's records alike. Spans are bytes: a capture's addresses, or the rebuild's buffers
    laid side by side (`_rebuild_bytes`)."""

    what: str  # "name #seq", for the findings
    seq: int
    gemm: bool
    scale: bool
    writes: Spans | None  # declared (and observed) writes; None: unknown (a kernel not known)
    reads: Spans | None = None  # a GEMM that writes dW w_b0fc: what it declares it reads
    unplaced: str | None = None  # a GEMM whose writes cannot be spelled out: why
    unread: str | None = None  # a GEMM writing dW whose reads cannot be spelled out: why


def dw_flow_problems(
    calls: list[FlowCall], dw: Spans, cols: int, step: int
) -> tuple[list[str], list[str]]:
    """EGF002's one rule, for the rebuild's launches and a capture's alike: every element of dW
    w_b0fc is written by the step's GEMMs, none of which read an element whose last writer was
    the scale, and no element of it holds the scale's output when the step ends. (findings,
    what cannot be judged): a GEMM whose operands cannot be placed may read the scale's output
    or compute part of dW; its step's coverage is then not judged either."""
    taint = Spans()  # bytes whose last writer is the scale
    computed = Spans()  # bytes of dW w_b0fc the step's GEMMs wrote
    problems: list[str] = []
    unplaced: list[str] = []
    for c in calls:
        if c.unplaced is not None:
            unplaced.append(f"step {step}: {c.what} ({c.unplaced})")
            continue
        if c.gemm and c.writes is not None and (part := c.writes.intersect(dw)):
            computed = computed.union(part)
            if c.reads is None:  # what it reads cannot be spelled out: judged as unknown
                unplaced.append(f"step {step}: {c.what} ({c.unread})")
            elif hit := c.reads.intersect(taint):
                problems.append(
                    f"step {step}: the GEMM #{c.seq} that computes dW w_b0fc read "
                    f"{hit.bytes // 4} elements the scale wrote"
                )
        if c.scale:
            taint = taint.union(c.writes or Spans())
        elif c.writes is not None:
            taint = taint.minus(c.writes)  # overwritten: no longer the scale's
    if left := taint.intersect(dw):
        problems.append(
            f"step {step}: dW w_b0fc holds {left.bytes // 4} elements the scale wrote when the "
            "step ends"
        )
    if (missing := dw.minus(computed)) and not unplaced:
        first = (missing.ranges[0][0] - dw.ranges[0][0]) // 4
        problems.append(
            f"step {step}: the step's GEMMs leave {missing.bytes // 4} of {dw.bytes // 4} "
            f"elements of dW w_b0fc unwritten (first: row {first // cols}, column {first % cols})"
        )
    return problems, unplaced


def _captured_calls(
    ct: Trace, records: list[Record], dw: Spans, changed: dict[int, Spans]
) -> list[FlowCall]:
    """A capture's records of one step as the flow reads them: declared writes, and what each
    call was seen to change (deep, or a guarded unknown kernel)."""
    calls = []
    for r in records:
        if r.within is not None:
            continue  # cuBLAS's own launch: part of its GEMM call (in `changed` under the GEMM)
        what, gemm = f"{r.name} #{r.seq}", r.kind in GEMM_KINDS
        scale = r.kind == "kernel" and r.name == SCALE_KERNEL
        try:
            declared_writes: Spans | None = declared(r, "w", ct)
        except Unbounded as exc:
            if gemm:
                calls.append(FlowCall(what, r.seq, gemm, scale, None, unplaced=str(exc)))
                continue
            declared_writes = None  # an unknown kernel: only a deep capture saw its writes
        reads, unread = None, None
        if gemm and declared_writes is not None and declared_writes.intersect(dw):
            try:
                reads = declared(r, "r", ct)
            except Unbounded as exc:
                unread = str(exc)
        # what the call wrote: its declared writes and, in a deep capture, what it changed;
        # None where neither is known (an unknown kernel of a capture that is not deep)
        seen = changed.get(r.seq)
        if declared_writes is None or seen is None:
            writes = declared_writes if seen is None else seen
        else:
            writes = declared_writes.union(seen)
        calls.append(FlowCall(what, r.seq, gemm, scale, writes, reads, unread=unread))
    return calls


def _rebuild_bytes(trace: Trace) -> tuple[dict[str, int], Spans, int]:
    """The rebuild's buffers as bytes, for the flow: each buffer of the trace's layout laid at
    its own base, apart from the next, so that the same byte arithmetic serves both modes; with
    dW w_b0fc's bytes and its row width."""
    base: dict[str, int] = {}
    at = 0
    for name, buffer in trace.layout.items():
        base[name] = at
        at += 4 * buffer["size"] + 4096
    tensor = tensor_table(trace.layout, "grad_buf").get("w_b0fc")
    if tensor is None:
        raise Missing(f"the layout of {trace.scenario} has no tensor w_b0fc in grad_buf")
    offset, rows, cols = tensor
    start = base["grad_buf"] + 4 * offset
    return base, Spans.of([(start, start + 4 * rows * cols)]), cols


def _rebuild_calls(trace: Trace, step: int, base: dict[str, int]) -> list[FlowCall]:
    """One step's launches as the flow reads them, in the bytes of `_rebuild_bytes`."""
    launches = [x for x in in_step(trace, step) if x.kind != "checkpoint" and x.executed]
    # only bytes of the buffers the scale writes and of grad_buf can meet the taint or dW: the
    # others are left unspelled (a column box of B rows is B ranges, a step has hundreds)
    relevant = {"grad_buf"} | {
        b.region.buffer
        for x in launches
        if x.kind == "kernel" and x.name == SCALE_KERNEL
        for b in x.bindings
        if b.writes and b.region is not None
    }

    def spans(x: Launch, access: str) -> Spans:
        return Spans.of(
            rng
            for b in x.bindings
            if access in b.access and b.region is not None and b.region.buffer in relevant
            for rng in box_ranges(
                base[b.region.buffer], (b.region.offset, b.region.rows, b.region.width, b.region.ld)
            )
        )

    calls = [
        FlowCall(
            f"{x.label} #{x.index}",
            x.index,
            x.kind == "sgemm",
            x.kind == "kernel" and x.name == SCALE_KERNEL,
            spans(x, "w"),
            spans(x, "r") if x.kind == "sgemm" else None,
        )
        for x in launches
    ]
    return calls


def check_capture(ct: Trace) -> Verdict:
    """Data flow, step by step: every element of dW w_b0fc is written by the step's GEMMs, none
    of which read an element whose last writer was the scale, and no element of it holds the
    scale's output when the step ends. Writes are the calls' declared regions, and in a deep
    capture also what each call was seen to change (without --deep, what each guarded launch of
    a kernel egf-audit does not know was seen to change in the allocations it was handed)."""
    found = _dw_w_b0fc(ct)
    if found is None:
        return undecided(
            "the layout names no w_b0fc in grad_buf: dW w_b0fc cannot be placed (a layout "
            "file with grad_buf and the parameter table decides it)"
        )
    dw, cols = found
    changed: dict[int, Spans] = {}
    if ct.capture.process.deep:
        observed, missing = observations(ct)
        if missing:
            return failed_with([f"missing data: {m}" for m in missing])
        changed = calls_changing(observed)
    else:  # what each guarded launch changed in what it was handed: its writes there are known
        changed = guard_changes(ct)
    steps = ct.site_steps()
    if not steps:
        return failed("no training step reached its polyak_ema: no dW w_b0fc to follow")
    problems: list[str] = []
    unplaced: list[str] = []
    for step in steps:
        records = [
            r for r, x in zip(ct.capture.records, ct.launches, strict=True) if x.step == step
        ]
        calls = _captured_calls(ct, records, dw, changed)
        step_problems, step_unplaced = dw_flow_problems(calls, dw, cols, step)
        problems += step_problems
        unplaced += step_unplaced
    writes = "declared and observed (--deep)" if ct.capture.process.deep else "declared"
    if ct.capture.process.guards:
        writes += " and, for kernels egf-audit does not know, observed (guards)"
    if problems:
        return failed_with(problems, writes=writes, unplaced=unplaced)
    if unplaced:
        return undecided(
            f"{len(unplaced)} GEMMs cannot be placed, so whether they read the scale's output "
            f"or compute dW w_b0fc is unknown (first: {unplaced[0]})",
            unplaced=unplaced,
        )
    return passed(
        f"dW w_b0fc computed whole in {len(steps)} steps, from nothing the scale wrote, and "
        "holding none of its output",
        writes=writes,
        steps=len(steps),
    )


INVARIANT = Invariant(
    code="EGF002",
    slug="dw-unaffected-by-scale",
    message="The direction head's dW, wire column included, must not depend on the wire gate.",
    what=(
        "grad_buf[goff_w_b0fc..], the weight gradient of the direction branch's first FC "
        "[ADV, SH2 + 1], is bitwise the same whatever ISV[393] holds (0, 0.37, 1), when the "
        "scale launch is skipped and when non-finite values are injected into the wire dX; and "
        "its wire column SH2 is not all zero (wherever a gradient reached the branch and the "
        "wire input is not zero in every row)."
    ),
    why=(
        "The gate only stops the gradient flowing back into the aux head. The Q-head must keep "
        "learning to use the wire: its dW = dY^T . x_concat is computed before the scale and "
        "must not see it. A scale pointed at dW, or a dW SGEMM that stops at K = SH2, would "
        "freeze or distort the wire's weight without any error."
    ),
    how=(
        "Step 0 is replayed from the same saved state with the gate forced to 0.37 and 1, with "
        "the scale launch removed, and with NaN/Inf injected under gate 0. The w_b0fc slice of "
        "the after_backward grad_buf snapshot of each replay is compared bit for bit with the "
        "production step's; the alphas each step used (ISV[393] at after_losses) are reported. "
        "The step without the scale is recognised by its launches (no sp14_scale_wire_col in "
        "it), not by the scenario's name, so a run that lost every launch cannot pass. Both "
        "modes then follow the same data flow (a capture records one run and cannot replay "
        "it, so there the flow is the whole evidence): in every step the GEMMs that write "
        "grad_buf's w_b0fc cover all of it, none "
        "of them reads an element whose last writer was the scale (writes are the declared "
        "regions, and with `--deep` also every change the recorder saw), and none of dW "
        "w_b0fc holds the scale's output when the step ends."
    ),
    catches=(
        "sp14_scale_wire_col pointed at dW's wire column instead of the dX buffer, and the "
        "pre-B.10 dW SGEMM on (save_h_s2, SH2) that never writes the wire column of dW."
    ),
    limits=(
        "It compares one step (step 0) at three gates (0, 0.37, 1), without the scale and with "
        "NaN/Inf injected: a dependence on the gate that shows only at other values or in later "
        "steps is not seen, and only the w_b0fc slice of grad_buf is compared. An all-zero wire "
        "column fails only where a gradient was due. On a capture the data flow is direct, one "
        "launch deep: a kernel that reads the scale's output and writes something a dW GEMM "
        "then reads is not followed; an unknown kernel of a capture without `--deep` clears "
        "the scale's marks only where its guard saw it write (outside the allocations it was "
        "handed its writes are unknown), so it can only add findings; the "
        "layout must name grad_buf's w_b0fc (else UNDECIDED)."
    ),
    example=(
        "The scale is launched on grad_buf + goff_w_b0fc with ld = SH2 + 1: with the sentinel "
        "gate the wire column of dW becomes 0, with gate 0.37 it shrinks, and the Q-head's "
        "weight on the wire learns at a rate set by the aux head's accuracy."
    ),
    check=check,
    capture=check_capture,
)
