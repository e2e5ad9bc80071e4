"""EGF011 wrapper-path-residual: the legacy K = SH2 wrapper is diagnostic-only.

FAIL when any production or replay trace of the mode holds a launch of the wrapper path (label
prefix `backward_full_wrapper:`). Otherwise WARN, the one invariant that does: the wrapper is a
documented residual, and the `diagnostic/wrapper` scenario measures what it does. Its d = 0 dW
SGEMM writes SH2 of the SH2 + 1 columns of w_b0fc, so dW[:, SH2] stays zero after the wrapper
(`wrapper:after`, grad_buf zeroed before) while the full backward_full on the same dQ writes it
(`wrapper:full`).
"""

from __future__ import annotations

import numpy as np

from egf_audit.invariants.common import listed, mode_traces, only_trace
from egf_audit.invariants.registry import WARN, Invariant, Verdict, failed, warned
from egf_audit.runtime.contract import WRAPPER_PREFIX, WRAPPER_SCENARIO
from egf_audit.runtime.trace import Missing


def _reached(run, mode: str) -> tuple[list[dict], int]:
    """(wrapper launches per production/replay trace, traces searched)."""
    audited = mode_traces(run, mode)
    if not audited:
        raise Missing(f"no production or replay trace for mode {mode}")
    out = []
    for sc, trace in audited:
        hits = [x for x in trace.launches if x.label.startswith(WRAPPER_PREFIX)]
        if hits:
            out.append(
                {
                    "kind": "wrapper-reached",
                    "scenario": sc.name,
                    "launches": len(hits),
                    "sites": sorted({x.site for x in hits if x.site}),
                    "first": hits[0].label,
                }
            )
    return out, len(audited)


def _wrapper_dw(trace):
    """The wrapper's SGEMM that writes grad_buf's w_b0fc: its d = 0 dW."""
    for x in trace.launches:
        c = x.binding("C", required=False)
        if (
            x.kind == "sgemm"
            and x.label.startswith(WRAPPER_PREFIX)
            and c is not None
            and c.writes
            and c.region is not None
            and c.region.buffer == "grad_buf"
            and c.tensor == "w_b0fc"
        ):
            return x, c
    raise Missing(f"no wrapper SGEMM writes grad_buf w_b0fc in {WRAPPER_SCENARIO}")


def _wrapper_dx(trace) -> dict:
    """Where the wrapper's d = 0 dX SGEMM (the one reading params w_b0fc) reads and writes."""
    for x in trace.launches:
        a, c = x.binding("A", required=False), x.binding("C", required=False)
        if (
            x.kind == "sgemm"
            and x.label.startswith(WRAPPER_PREFIX)
            and a is not None
            and a.region is not None
            and a.region.buffer == "params"
            and a.tensor == "w_b0fc"
        ):
            return {
                "dx_label": x.label,
                "dx_columns_read": a.region.width,
                "dx_writes": c.region.buffer if c is not None and c.region else None,
            }
    return {"dx_label": None}


def _residual(run) -> dict:
    trace = only_trace(run, "diagnostic", WRAPPER_SCENARIO)
    wire = run.config.dims.SH2
    dw, c = _wrapper_dw(trace)
    cols = c.tensor_shape[2] if c.tensor_shape else None
    step = dw.step
    after = trace.tensor(
        trace.buffer_snapshot(step, "wrapper:after", "grad_buf"), "grad_buf", "w_b0fc"
    )
    full = trace.tensor(
        trace.buffer_snapshot(step, "wrapper:full", "grad_buf"), "grad_buf", "w_b0fc"
    )
    if after.shape[1] <= wire or full.shape[1] <= wire:
        raise Missing(f"grad_buf w_b0fc has no column {wire} in {WRAPPER_SCENARIO}")
    return {
        "dw_label": dw.label,
        "dw_columns_written": c.region.width,
        "w_b0fc_cols": cols,
        **_wrapper_dx(trace),
        "wire_col_nonzero_after_wrapper": int(np.count_nonzero(after[:, wire])),
        "wire_col_nonzero_after_full": int(np.count_nonzero(full[:, wire])),
        "wire_col_rows": int(after.shape[0]),
    }


def check(run, mode: str) -> Verdict:
    reached, searched = _reached(run, mode)
    if reached:
        return failed(
            f"the legacy wrapper path runs in {len(reached)} of {searched} production/replay "
            f"traces (sites: {', '.join(sorted({s for r in reached for s in r['sites']}))})",
            **listed(reached),
        )
    r = _residual(run)
    after = "stays zero" if r["wire_col_nonzero_after_wrapper"] == 0 else "is non-zero"
    full = "non-zero" if r["wire_col_nonzero_after_full"] else "zero"
    return warned(
        f"no production call site reaches the legacy wrapper (0 launches in {searched} traces); "
        f"residual in {WRAPPER_SCENARIO}: its d = 0 dW writes {r['dw_columns_written']} of "
        f"{r['w_b0fc_cols']} columns of w_b0fc, dW[:, SH2] {after} after the wrapper and is "
        f"{full} after the full backward_full",
        **listed([]),
        **r,
    )


INVARIANT = Invariant(
    code="EGF011",
    slug="wrapper-path-residual",
    message="No production call site may reach the legacy K = SH2 backward_full wrapper.",
    what=(
        "The production and replay traces contain no launch of the legacy wrapper path "
        "(`backward_full(..., 0, 0)`). What the wrapper does is measured in a diagnostic "
        "scenario and reported as a known residual: a warning, never a pass, so it stays "
        "visible in every audit."
    ),
    why=(
        "The wrapper keeps the pre-B.10 `K = SH2` path for callers that pass `0` for the two new "
        "pointers. It runs, reads in-bounds memory, and silently drops the wire column of dW "
        "and the whole wire dX; its dir dX even overwrites `d_h_s2` with beta = 0. A call site "
        "that reaches it undoes B.10 without any error."
    ),
    how=(
        "Count launches whose label starts with `backward_full_wrapper:` in every production "
        "and replay trace of the mode (FAIL if any). Then, in `diagnostic/wrapper`: the "
        "wrapper's SGEMM writing `grad_buf` `w_b0fc` gives the columns written (its C "
        "binding's width against the tensor's columns); `grad_buf` snapshots give the non-zero "
        "entries of dW[:, SH2] after the wrapper (`wrapper:after`, grad_buf zeroed before) "
        "and after the full `backward_full` on the same dQ (`wrapper:full`)."
    ),
    catches=(
        "A production call site (typically the main online one) that calls the legacy "
        "wrapper and so takes the K = SH2 path."
    ),
    example=(
        "`self.backward_full(&dq_main, 0, 0)` at the main online call site: the d = 0 dW "
        "SGEMM runs with `(save_h_s2, SH2)` and `grad_buf[goff_w_b0fc..]`'s wire column stays 0."
    ),
    check=check,
    holds_as=WARN,
)
