"""EGF008 both-call-sites-gated: each call site scales its own wire column, at the right time.

Per production step and call site: after the site's d = 0 dX SGEMM (the SGEMM whose C operand
writes sp14_d_dir_qaux_concat) and before the site's first accumulate that reads that buffer,
a `sp14_scale_wire_col` launch must write exactly column SH2 of it (offset SH2, B rows, row
stride SH2 + 1) and read ISV[393]. Launches are judged by kernel name and bindings; labels only
attribute them to a site.
"""

from __future__ import annotations

from egf_audit.invariants.common import describe, in_step, listed, production, steps
from egf_audit.invariants.registry import Invariant, Verdict, failed, passed
from egf_audit.runtime.contract import (
    ACCUMULATE_KERNEL,
    ALPHA_GRAD_SMOOTHED_INDEX,
    DIR_DX,
    SCALE_KERNEL,
    SITES,
)


def _dir_dx_sgemm(launches):
    for x in launches:
        c = x.binding("C", required=False)
        if x.kind == "sgemm" and c and c.writes and c.region and c.region.buffer == DIR_DX:
            return x
    return None


def _reads_dir_dx(x) -> bool:
    return any(b.reads and b.region and b.region.buffer == DIR_DX for b in x.bindings)


def _gates_wire(x, rows: int, sh2: int) -> bool:
    """Writes exactly column SH2 of every row of the dir concat dX and reads ISV[393]."""
    dx, isv = x.binding("dx_concat", required=False), x.binding("isv", required=False)
    if dx is None or isv is None or dx.region is None or isv.region is None:
        return False
    r = dx.region
    wire = (r.buffer, r.offset, r.rows, r.width, r.ld) == (DIR_DX, sh2, rows, 1, sh2 + 1)
    gate = isv.region.buffer == "isv_signals" and isv.region.flat_indices().tolist() == [
        ALPHA_GRAD_SMOOTHED_INDEX
    ]
    return dx.writes and wire and isv.reads and gate


def _scale_facts(x, dx_index: int, acc_index: int | None) -> dict:
    if x.index < dx_index:
        when = "before the dX SGEMM"
    elif acc_index is not None and x.index > acc_index:
        when = "after the first accumulate"
    else:
        when = "between"
    dx, isv = x.binding("dx_concat", required=False), x.binding("isv", required=False)
    return {
        "label": x.label,
        "when": when,
        "dx_concat": describe(dx.region) if dx else None,
        "isv": describe(isv.region) if isv else None,
    }


def _site_failure(trace, step: int, site: str, rows: int, sh2: int) -> tuple[dict | None, str]:
    """(failure or None, label of the gating scale launch)."""
    launches = [x for x in in_step(trace, step) if x.site == site]
    where = {"step": step, "site": site}
    dx = _dir_dx_sgemm(launches)
    if dx is None:
        return {"kind": "no-dir-dx-sgemm", **where}, ""
    acc = next(
        (
            x
            for x in launches
            if x.index > dx.index and x.name == ACCUMULATE_KERNEL and _reads_dir_dx(x)
        ),
        None,
    )
    scales = [x for x in launches if x.kind == "kernel" and x.name == SCALE_KERNEL]
    for x in scales:
        if (
            dx.index < x.index
            and (acc is None or x.index < acc.index)
            and _gates_wire(x, rows, sh2)
        ):
            if acc is None:
                return {"kind": "no-dir-accumulate", **where, "scale": x.label}, x.label
            return None, x.label
    return {
        "kind": "site-ungated",
        **where,
        "dx_sgemm": dx.label,
        "first_accumulate": acc.label if acc else None,
        "scale_launches": [_scale_facts(x, dx.index, acc.index if acc else None) for x in scales],
    }, ""


def check(run, mode: str) -> Verdict:
    trace = production(run, mode)
    dims = run.config.dims
    failures, gated = [], []
    for step in steps(trace):
        for site in SITES:
            failure, label = _site_failure(trace, step, site, dims.B, dims.SH2)
            if failure:
                failures.append(failure)
            else:
                gated.append({"step": step, "site": site, "scale": label})
    pairs = len(failures) + len(gated)
    evidence = {**listed(failures), "gated": gated}
    if failures:
        ungated = sorted({f["site"] for f in failures})
        return failed(
            f"{len(failures)} of {pairs} site-steps not gated between the d = 0 dX SGEMM and "
            f"the first accumulate (sites: {', '.join(ungated)})",
            **evidence,
        )
    return passed(
        f"both call sites run {SCALE_KERNEL} on {DIR_DX}[:, SH2] reading ISV[393] between their "
        f"d = 0 dX SGEMM and first accumulate, at {pairs} site-steps",
        **evidence,
    )


INVARIANT = Invariant(
    code="EGF008",
    slug="both-call-sites-gated",
    message="Each backward_full call site must scale its own dX wire column by ISV[393].",
    what=(
        "At both call sites (CQL aux and main online) of every production step, a "
        "`sp14_scale_wire_col` launch writes column SH2 of `sp14_d_dir_qaux_concat` (all B "
        "rows, row stride SH2 + 1) and reads `ISV[393]`, after the site's d = 0 dX SGEMM wrote "
        "that buffer and before the site's first accumulate reads it."
    ),
    why=(
        "The gate is the only thing between the direction Q-head and the aux head: an ungated "
        "site passes the raw Q-loss gradient into the aux softmax even while the sentinel "
        "says closed. The seed wires both call sites atomically; a refactor that touches one "
        "site, or points the scale at the wrong buffer, leaves the other half open. Scaling "
        "before the dX SGEMM is overwritten by it; scaling after the accumulate is too late."
    ),
    how=(
        "From the launch trace only. Per step and site (the label suffix `@cql` / `@main`): "
        "the dX SGEMM is the site's SGEMM whose C binding writes `sp14_d_dir_qaux_concat`; the "
        "first accumulate is the site's next `accumulate_d_h_s2_from_concat` reading it; "
        "between them there must be a `sp14_scale_wire_col` whose `dx_concat` binding is the "
        "region (`sp14_d_dir_qaux_concat`, offset SH2, B rows, width 1, ld SH2 + 1) and whose "
        "`isv` binding is element 393 of `isv_signals`. These bindings are the kernel's "
        "declared regions; that the scale writes nothing else (not the rest of the row, not "
        "ISV) is observed on every launch and decided by EGF013."
    ),
    catches=(
        "A call site with no scale launch (only the main site gated, or neither), and a scale "
        "pointed at the wrong buffer: the x concat scratch, or dW's wire column in `grad_buf`."
    ),
    example=(
        "`launch_sp14_scale_wire_col` added after the main `backward_full` only: the CQL aux "
        "site's wire gradient reaches the aux head unscaled."
    ),
    check=check,
)
