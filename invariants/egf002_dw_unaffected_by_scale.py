"""EGF002 dw-unaffected-by-scale: dW of w_b0fc does not depend on the wire gate."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from egf_audit.invariants.common import (
    alpha_at,
    bit_mismatch,
    json_float,
    mode_traces,
    snapshot,
    where,
)
from egf_audit.invariants.registry import Invariant, Verdict, failed, passed
from egf_audit.runtime.contract import AUX_DOWN_INDEX, AUX_UP_INDEX

if TYPE_CHECKING:
    from egf_audit.runtime.audit_run import AuditRun

REPLAYED_STEP = 0  # every replay re-runs step 0 from the production run's initial state


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
    dw, alphas, missing = {}, {}, []
    for trace in [*production, *replays]:
        grad = snapshot(trace, REPLAYED_STEP, "after_backward", "grad_buf", "w_b0fc")
        alpha = alpha_at(trace, REPLAYED_STEP)
        if grad is None:
            missing.append(where(trace, REPLAYED_STEP, "after_backward", "grad_buf"))
        else:
            dw[trace.scenario] = grad
        if alpha is None:
            missing.append(where(trace, REPLAYED_STEP, "after_losses", "isv_signals"))
        else:
            alphas[trace.scenario] = json_float(alpha)
    softmax = snapshot(production[0], REPLAYED_STEP, "after_forward", "aux_nb_softmax_buf")
    if softmax is None:
        missing.append(where(production[0], REPLAYED_STEP, "after_forward", "aux_nb_softmax_buf"))
    if missing:
        return failed(f"{len(missing)} snapshots missing, first: {missing[0]}", missing=missing)

    # the claim needs gate 0, a gate in (0, 1), gate 1 and a step without the scale launch
    seen = [a for a in alphas.values() if isinstance(a, float)]
    covered = 0.0 in seen and 1.0 in seen and any(0.0 < a < 1.0 for a in seen)
    if not (covered and any(s.skip_scale for s, _ in traces)):
        return failed(
            "the compared steps do not cover gate 0, 0 < gate < 1, gate 1 and a skipped scale",
            alphas=alphas,
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
        "production step's; the alphas each step used (ISV[393] at after_losses) are reported."
    ),
    catches=(
        "sp14_scale_wire_col pointed at dW's wire column instead of the dX buffer, and the "
        "pre-B.10 dW SGEMM on (save_h_s2, SH2) that never writes the wire column of dW."
    ),
    example=(
        "The scale is launched on grad_buf + goff_w_b0fc with ld = SH2 + 1: with the sentinel "
        "gate the wire column of dW becomes 0, with gate 0.37 it shrinks, and the Q-head's "
        "weight on the wire learns at a rate set by the aux head's accuracy."
    ),
    check=check,
)
