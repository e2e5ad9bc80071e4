"""EGF011 wrapper-path-residual: the legacy K = SH2 wrapper is diagnostic-only.

The wrapper path is recognised by what its launches do, never by their labels: an SGEMM that
spans only SH2 of the SH2 + 1 columns of `w_b0fc` (its weight in `params`, its gradient in
`grad_buf`) or of the dir concat (`sp14_dir_qaux_concat_scratch`, `sp14_d_dir_qaux_concat`).
FAIL when any production or replay trace of the mode holds one. Otherwise WARN, the one
invariant that does: the wrapper is a documented residual, and the `diagnostic/wrapper` scenario
measures what it does. Its d = 0 dW SGEMM writes SH2 of the SH2 + 1 columns of w_b0fc, so
dW[:, SH2] stays zero after the wrapper (`wrapper:after`, grad_buf zeroed before) while the full
backward_full on the same dQ writes it (`wrapper:full`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import numpy as np

from egf_audit.invariants.common import listed, mode_traces, only_trace
from egf_audit.invariants.gemm_spans import k_sh2_signature
from egf_audit.invariants.registry import (
    WARN,
    Invariant,
    Verdict,
    failed,
    passed,
    undecided,
    warned,
)
from egf_audit.trace.contract import (
    DIR_CONCAT,
    DIR_DX,
    WRAPPER_AFTER,
    WRAPPER_BEFORE,
    WRAPPER_FULL,
    WRAPPER_SCENARIO,
)
from egf_audit.trace.model import Binding, Launch, Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Trace

GROWN = "w_b0fc"  # the weight B.8 grew to [ADV, SH2 + 1]


class Reached(TypedDict):
    """A production or replay trace whose SGEMMs take the K = SH2 path."""

    kind: str
    scenario: str
    launches: int
    sites: list[str]
    first: str
    first_operand: str
    columns: int


class Residual(TypedDict):
    """What the wrapper does in the diagnostic scenario (the documented residual)."""

    dw_label: str
    dw_columns_written: int
    w_b0fc_cols: int | None
    dx_label: str | None
    dx_columns_read: int | None
    dx_writes: str | None
    wire_col_nonzero_after_wrapper: int
    wire_col_nonzero_after_full: int
    wire_col_rows: int


def short_operands(x: Launch, sh2: int) -> list[Binding]:
    """The operands of an SGEMM that span only SH2 columns of a tensor B.8-B.10 grew to SH2 + 1:
    the K = SH2 of the wrapper path, whatever the launch is called."""
    if x.kind != "sgemm":
        return []
    return [
        b
        for b in x.bindings
        if b.region is not None
        and (b.tensor == GROWN or b.region.buffer in (DIR_CONCAT, DIR_DX))
        and b.tensor_shape is not None
        and b.tensor_shape[2] == sh2 + 1
        and b.region.width == sh2
    ]


def k_sh2_path(x: Launch, sh2: int) -> tuple[list[Binding], str | None]:
    """EGF011's one rule, for the rebuild's launches and a capture's alike: whether an SGEMM
    takes the K = SH2 path. (Its operands that span SH2 of the SH2 + 1 columns of a grown
    tensor, and, where some operand lies in no named buffer, the K = SH2 signature its
    arguments show); ([], None) where it takes no such path. The rebuild names every operand,
    so there the signature never applies; a capture without a layout file may name none."""
    if x.kind != "sgemm":
        return [], None
    unnamed = any(b.region is None for b in x.bindings)
    return short_operands(x, sh2), k_sh2_signature(x, sh2) if unnamed else None


def _reached(run: AuditRun, mode: str) -> tuple[list[Reached], int]:
    """(K = SH2 SGEMMs per production/replay trace, traces searched)."""
    audited = mode_traces(run, mode)
    if not audited:
        raise Missing(f"no production or replay trace for mode {mode}")
    sh2 = run.config.dims.SH2
    out: list[Reached] = []
    for sc, trace in audited:
        hits = [(x, path) for x in trace.sgemms() if any(path := k_sh2_path(x, sh2))]
        if hits:
            first, (ops, signature) = hits[0]
            region = ops[0].region if ops else None
            out.append(
                {
                    "kind": "k-sh2-gemm",
                    "scenario": sc.name,
                    "launches": len(hits),
                    "sites": sorted({x.site for x, _ in hits if x.site}),
                    "first": first.label,
                    "first_operand": (
                        f"{ops[0].role}: {region.buffer} {ops[0].tensor}"
                        if region is not None
                        else str(signature)
                    ),
                    "columns": region.width if region is not None else sh2,
                }
            )
    return out, len(audited)


def _wrapper_call(trace: Trace) -> list[Launch]:
    """The SGEMMs of the wrapper's call in the diagnostic (between its two checkpoints)."""
    marks = [x.step for x in trace.launches if x.kind == "checkpoint" and x.name == WRAPPER_BEFORE]
    if not marks:
        raise Missing(f"no checkpoint {WRAPPER_BEFORE} in {trace.scenario}")
    between = trace.launches_between(marks[0], WRAPPER_BEFORE, WRAPPER_AFTER)
    return [x for x in between if x.kind == "sgemm"]


def _writes_grown_grad(x: Launch) -> Binding | None:
    c = x.binding("C", required=False)
    if c and c.writes and c.region and c.region.buffer == "grad_buf" and c.tensor == GROWN:
        return c
    return None


def _residual(run: AuditRun) -> Residual:
    trace = only_trace(run, "diagnostic", WRAPPER_SCENARIO)
    wire = run.config.dims.SH2
    call = _wrapper_call(trace)
    written = next(((x, c) for x in call if (c := _writes_grown_grad(x))), None)
    if written is None:
        raise Missing(
            f"no SGEMM of the wrapper's call writes grad_buf w_b0fc in {WRAPPER_SCENARIO}"
        )
    dw, c = written
    assert c.region is not None  # _writes_grown_grad keeps a C with a region only
    read = next(
        (
            (x, a.region)
            for x in call
            if (a := x.binding("A", required=False))
            and a.region
            and a.region.buffer == "params"
            and a.tensor == GROWN
        ),
        None,
    )
    dx, dx_a = read if read is not None else (None, None)
    step = dw.step
    after = trace.snapshot(step, WRAPPER_AFTER, "grad_buf", GROWN)
    full = trace.snapshot(step, WRAPPER_FULL, "grad_buf", GROWN)
    if after.shape[1] <= wire or full.shape[1] <= wire:
        raise Missing(f"grad_buf w_b0fc has no column {wire} in {WRAPPER_SCENARIO}")
    dx_c = dx.binding("C", required=False) if dx else None
    return {
        "dw_label": dw.label,
        "dw_columns_written": c.region.width,
        "w_b0fc_cols": c.tensor_shape[2] if c.tensor_shape else None,
        "dx_label": dx.label if dx else None,
        "dx_columns_read": dx_a.width if dx_a else None,
        "dx_writes": dx_c.region.buffer if dx_c is not None and dx_c.region else None,
        "wire_col_nonzero_after_wrapper": int(np.count_nonzero(after[:, wire])),
        "wire_col_nonzero_after_full": int(np.count_nonzero(full[:, wire])),
        "wire_col_rows": int(after.shape[0]),
    }


def check(run: AuditRun, mode: str) -> Verdict:
    reached, searched = _reached(run, mode)
    if reached:
        sites = sorted({s for r in reached for s in r["sites"]})
        return failed(
            f"a K = SH2 SGEMM on w_b0fc or the dir concat (the legacy wrapper path) runs in "
            f"{len(reached)} of {searched} production/replay traces "
            f"(sites: {', '.join(sites) or 'none'}; first {reached[0]['first']})",
            **listed(reached),
        )
    r = _residual(run)
    after = "stays zero" if r["wire_col_nonzero_after_wrapper"] == 0 else "is non-zero"
    full = "non-zero" if r["wire_col_nonzero_after_full"] else "zero"
    return warned(
        f"no production call site reaches the legacy wrapper (no K = SH2 SGEMM on w_b0fc or the "
        f"dir concat in {searched} traces); residual in {WRAPPER_SCENARIO}: its d = 0 dW writes "
        f"{r['dw_columns_written']} of {r['w_b0fc_cols']} columns of w_b0fc, dW[:, SH2] {after} "
        f"after the wrapper and is {full} after the full backward_full",
        **listed([]),
        **r,
    )


def check_capture(ct: Trace) -> Verdict:
    """On a capture the trainer's own step is production: any GEMM on the K = SH2 path fails.
    Judged by the rebuild's rule, `k_sh2_path`: the operands' spans where the layout names
    w_b0fc or the dir concat, the arguments' K = SH2 signature where they stay unnamed."""
    sh2 = ct.capture.dim("SH2")
    if sh2 is None:
        return undecided("no sp14_dir_concat_qaux launch and no layout dims: SH2 unknown")
    hits: list[dict[str, object]] = []
    for x in ct.sgemms():
        ops, signature = k_sh2_path(x, sh2)
        short = [b.role for b in ops]
        if short or signature:
            what = (
                f"operands {', '.join(short)} span SH2 of SH2 + 1 columns" if short else signature
            )
            hits.append({"launch": x.index, "step": x.step, "label": x.label, "problem": what})
    if hits:
        return failed(
            f"{len(hits)} GEMMs take the legacy K = SH2 path on w_b0fc or the dir concat (first: "
            f"{hits[0]['label']}, launch {hits[0]['launch']}: {hits[0]['problem']})",
            **listed(hits),
        )
    return passed(
        "no GEMM of the trainer's process takes the K = SH2 path on w_b0fc or the dir concat",
        **listed([]),
    )


INVARIANT = Invariant(
    code="EGF011",
    slug="wrapper-path-residual",
    message="No production call site may reach the legacy K = SH2 backward_full wrapper.",
    what=(
        "The production and replay traces contain no launch of the legacy wrapper path "
        "(`backward_full(..., 0, 0)`): no SGEMM that spans only SH2 of the SH2 + 1 columns of "
        "`w_b0fc` or of the dir concat, whatever its label. What the wrapper does is measured "
        "in a diagnostic scenario and reported as a known residual: a warning, never a pass, "
        "so it stays visible in every audit."
    ),
    why=(
        "The wrapper keeps the pre-B.10 `K = SH2` path for callers that pass `0` for the two new "
        "pointers. It runs, reads in-bounds memory, and silently drops the wire column of dW "
        "and the whole wire dX; its dir dX even overwrites `d_h_s2` with beta = 0. A call site "
        "that reaches it undoes B.10 without any error."
    ),
    how=(
        "In every production and replay trace of the mode, every SGEMM operand bound to "
        "`w_b0fc` (params or grad_buf) or to the dir concat buffers is measured: a box of SH2 "
        "columns in a tensor of SH2 + 1 is the wrapper's K = SH2 (FAIL if any). Labels are not "
        "read: a wrapper wired in without its label is caught the same. Then, in "
        "`diagnostic/wrapper`, between `wrapper:before` and `wrapper:after`: the SGEMM writing "
        "`grad_buf` `w_b0fc` gives the columns written (its C "
        "binding's width against the tensor's columns); `grad_buf` snapshots give the non-zero "
        "entries of dW[:, SH2] after the wrapper (`wrapper:after`, grad_buf zeroed before) "
        "and after the full `backward_full` on the same dQ (`wrapper:full`)."
    ),
    catches=(
        "A production call site (typically the main online one) that calls the legacy "
        "wrapper and so takes the K = SH2 path."
    ),
    limits=(
        "It recognises the wrapper only by an SGEMM box of SH2 columns on w_b0fc or the dir "
        "concat: a legacy path wrong in another way, with full widths, is left to the other "
        "invariants. On the rebuild it never passes: a clean run is a WARN by design, so the "
        "residual stays visible. On a capture with neither an sp14_dir_concat_qaux launch nor "
        "layout dims, SH2 is unknown and it is UNDECIDED; an operand no layout names is judged "
        "by the arguments' K = SH2 signature alone."
    ),
    example=(
        "`self.backward_full(&dq_main, 0, 0)` at the main online call site: the d = 0 dW "
        "SGEMM runs with `(save_h_s2, SH2)` and `grad_buf[goff_w_b0fc..]`'s wire column stays 0."
    ),
    check=check,
    holds_as=WARN,
    capture=check_capture,
)
