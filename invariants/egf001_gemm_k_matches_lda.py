"""EGF001 gemm-k-matches-lda: every SGEMM operand spans exactly the tensor its pointer resolves
to, and every launch stays inside its buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from egf_audit.invariants.common import mode_traces
from egf_audit.invariants.registry import Invariant, Verdict, failed, passed

if TYPE_CHECKING:
    from egf_audit.runtime.audit_run import AuditRun
    from egf_audit.runtime.trace import Binding, Launch, Trace

GEMM_ARGS = ("transa", "transb", "m", "n", "k", "lda", "ldb", "ldc")


def _extent_problem(b: Binding) -> str | None:
    """Why an SGEMM operand does not span its tensor's full logical extent, or None."""
    if b.region is None:
        return "pointer resolves to no buffer"
    if not b.in_bounds:
        return f"reads past the end of {b.region.buffer}"
    if b.tensor_shape is None:
        return f"points into no tensor of {b.region.buffer}"
    return span_problem(b)


def span_problem(b: Binding) -> str | None:
    """Why an operand resolved into a tensor does not cover it exactly (its first element, all
    its rows and columns, its row stride), or None. The capture's EGF001 uses it too."""
    r, (t_offset, t_rows, t_cols) = b.region, b.tensor_shape
    if r.offset != t_offset:
        return f"starts {r.offset - t_offset} elements into {b.tensor}"
    if r.width != t_cols:
        return f"spans {r.width} of {t_cols} columns of {b.tensor}"
    if r.rows != t_rows:
        return f"spans {r.rows} of {t_rows} rows of {b.tensor}"
    if r.rows > 1 and r.ld != t_cols:
        return f"uses row stride {r.ld} on {b.tensor}, whose row stride is {t_cols}"
    return None


def _operand_facts(b: Binding) -> dict[str, Any]:
    facts: dict[str, Any] = {"operand": b.role, "access": b.access, "tensor": b.tensor}
    if b.region is not None:
        r = b.region
        facts.update(buffer=r.buffer, offset=r.offset, rows_read=r.rows, columns_read=r.width)
        facts["ld"] = r.ld
    if b.tensor_shape is not None:
        t_offset, t_rows, t_cols = b.tensor_shape
        facts.update(tensor_offset=t_offset, rows_held=t_rows, columns_held=t_cols)
    return facts


def _bounds_problem(b: Binding, trace: Trace) -> str | None:
    """Why a kernel/memset/copy region is not inside its buffer, or None."""
    if b.in_bounds:
        return None
    if b.region is None:
        return "pointer resolves to no buffer"
    size = trace.layout.get(b.region.buffer, {}).get("size")
    return f"touches elements up to {b.region.last} of {b.region.buffer} (size {size})"


def _launch_facts(trace: Trace, x: Launch) -> dict[str, Any]:
    return {"scenario": trace.scenario, "step": x.step, "label": x.label, "executed": x.executed}


def check(run: AuditRun, mode: str) -> Verdict:
    traces = mode_traces(run, mode)
    if not traces:
        return failed(f"no production or replay trace for mode {mode}", mode=mode)
    sgemm_count = other_count = 0
    bad_gemms: list[dict[str, Any]] = []
    bad_launches: list[dict[str, Any]] = []
    for _, trace in traces:
        for x in trace.launches:
            if x.kind == "checkpoint":
                continue
            if x.kind == "sgemm":
                sgemm_count += 1
                if x.refused:  # arguments cuBLAS refuses: nothing ran
                    bad_gemms.append(
                        _launch_facts(trace, x)
                        | {"operand": "arguments", "problem": x.refused}
                        | {"sgemm_args": {k: x.args.get(k) for k in GEMM_ARGS}}
                    )
                    continue
                for b in x.bindings:
                    problem = _extent_problem(b)
                    if problem is not None:
                        record = _launch_facts(trace, x) | _operand_facts(b)
                        record["problem"] = problem
                        record["sgemm_args"] = {k: x.args.get(k) for k in GEMM_ARGS}
                        bad_gemms.append(record)
                        break  # one finding per launch: its first offending operand
                continue
            other_count += 1
            for b in x.bindings:
                problem = _bounds_problem(b, trace)
                if problem is not None:
                    record = _launch_facts(trace, x) | _operand_facts(b)
                    bad_launches.append(record | {"kind": x.kind, "problem": problem})
                    break
    counts = {
        "sgemms_checked": sgemm_count,
        "other_launches_checked": other_count,
        "traces": [t.scenario for _, t in traces],
    }
    if sgemm_count == 0:
        return failed(f"mode {mode} recorded no SGEMM at all", **counts)
    if bad_gemms or bad_launches:
        first = (bad_gemms or bad_launches)[0]
        summary = f"{first['label']}: operand {first['operand']} {first['problem']}"
        return failed(
            f"{summary} ({len(bad_gemms)} SGEMMs, {len(bad_launches)} other launches offend)",
            first=first,
            offending_sgemms=len(bad_gemms),
            offending_sgemm_labels=sorted({r["label"] for r in bad_gemms}),
            offending_launches=len(bad_launches),
            offending_launch_labels=sorted({r["label"] for r in bad_launches}),
            **counts,
        )
    return passed(
        f"{sgemm_count} SGEMMs in {len(traces)} traces span every operand's full tensor; "
        f"{other_count} kernel/memset/copy launches stay in bounds",
        **counts,
    )


INVARIANT = Invariant(
    code="EGF001",
    slug="gemm-k-matches-lda",
    message="Every SGEMM reads and writes each operand over its full tensor, with K = LDA.",
    what=(
        "For every SGEMM of the production and replay steps, each operand (A, B, C) resolves to "
        "a named tensor and covers exactly its logical extent: it starts at the tensor's first "
        "element, spans all its rows and columns, and walks it with the tensor's row stride. "
        "Every kernel, memset and copy launch stays inside the buffers it declares."
    ),
    why=(
        "A raw cuBLAS SGEMM with K = SH2 against a weight whose leading dimension is SH2 + 1 "
        "runs, stays in bounds and silently drops the last column. No sanitizer and no "
        "framework shape check sees it; only comparing each call's box with the tensor it "
        "points into does."
    ),
    how=(
        "The recorder turns each call's raw (transa, transb, m, n, k, lda, ldb, ldc) into one "
        "row-major box per operand and resolves the pointer to (buffer, tensor). The check "
        "compares box offset, rows, width and row stride with the tensor's (offset, rows, cols), "
        "and every launch's declared regions with its buffer sizes. The legacy wrapper is judged "
        "by EGF011, not here: only production and replay traces are read. A kernel's regions "
        "come from the kernel table; that the kernel really writes nowhere else, and reads "
        "nothing just past its buffers, is observed on every launch and decided by EGF013."
    ),
    catches=(
        "The historical K mismatches (forward, dW and dX SGEMMs of the direction branch keeping "
        "K = SH2), a call site taking the legacy K = SH2 wrapper path, and any state vector "
        "still sized for SH2 while its GEMV reads w_b0fc."
    ),
    example=(
        "backward_branch_dw[d=0]@main called with (N, T, m=48, n=32, k=64, lda=48, ldb=32, "
        "ldc=49): operand C spans 48 of 49 columns of w_b0fc, so dW of the wire column is never "
        "written."
    ),
    check=check,
    reads=("launches",),
)
