"""EGF002 dw-unaffected-by-scale: dW of w_b0fc does not depend on the wire gate."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from egf_audit.invariants.common import alpha_at, bit_mismatch, in_step, json_float, mode_traces
from egf_audit.invariants.registry import Invariant, Verdict, failed, passed
from egf_audit.runtime.contract import (
    AFTER_BACKWARD,
    AFTER_FORWARD,
    AUX_DOWN_INDEX,
    AUX_UP_INDEX,
    REPLAYED_STEP,
    SCALE_KERNEL,
)

if TYPE_CHECKING:
    from egf_audit.runtime.audit_run import AuditRun
    from egf_audit.runtime.trace import Trace


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
    wire_fact = f"wire column {sh2} non-zero" if due else "no wire gradient was due"
    return passed(
        f"dW w_b0fc of step 0 bitwise identical in {', '.join(dw)}; {wire_fact}", **evidence
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
        "it), not by the scenario's name, so a run that lost every launch cannot pass."
    ),
    catches=(
        "sp14_scale_wire_col pointed at dW's wire column instead of the dX buffer, and the "
        "pre-B.10 dW SGEMM on (save_h_s2, SH2) that never writes the wire column of dW."
    ),
    limits=(
        "It compares one step (step 0) at three gates (0, 0.37, 1), without the scale and with "
        "NaN/Inf injected: a dependence on the gate that shows only at other values or in later "
        "steps is not seen, and only the w_b0fc slice of grad_buf is compared. An all-zero wire "
        "column fails only where a gradient was due. A capture cannot decide it: it needs the "
        "same step replayed, and a capture records the trainer's one run."
    ),
    example=(
        "The scale is launched on grad_buf + goff_w_b0fc with ld = SH2 + 1: with the sentinel "
        "gate the wire column of dW becomes 0, with gate 0.37 it shrinks, and the Q-head's "
        "weight on the wire learns at a rate set by the aux head's accuracy."
    ),
    check=check,
    capture_undecidable=(
        "needs the same step replayed with alpha in {0, 0.37, 1} and with the scale skipped; "
        "a capture records the trainer's one run and changes nothing"
    ),
)
