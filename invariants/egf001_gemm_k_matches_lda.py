"""EGF001 gemm-k-matches-lda: every SGEMM operand spans exactly the tensor its pointer resolves
to, and every launch stays inside its buffers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict, TypeGuard

from egf_audit.invariants.allocation_bounds import allocation_of, allocation_problem
from egf_audit.invariants.capture_roles import role_problems
from egf_audit.invariants.common import mode_traces
from egf_audit.invariants.gemm_spans import (
    implied_slice_problem,
    k_sh2_signature,
    rows_problem,
    slice_problem,
    span_problem,
)
from egf_audit.invariants.launch_shape import launch_shape_problem
from egf_audit.invariants.registry import Invariant, Verdict, failed, passed, undecided
from egf_audit.trace.buffers import ELEMENT_BYTES, buffer_size
from egf_audit.trace.gemm_operands import GemmOperand, gemm_operands
from egf_audit.trace.gemm_rules import GEMM_ARGS
from egf_audit.trace.spans import whole_buffers

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Binding, Launch, Trace


class OffendingLaunches(TypedDict):
    """The part of a failed rebuild verdict that names the offending launches: the wire-status
    table (egf_audit.reports.wire_status) reads it to find the stage a failure belongs to."""

    offending_sgemms: int
    offending_sgemm_labels: list[str]
    offending_launches: int
    offending_launch_labels: list[str]


def names_offenders(evidence: Mapping[str, object]) -> TypeGuard[OffendingLaunches]:
    """Whether a verdict's evidence names the offending launches (not every failure does: a
    mode without SGEMMs, missing data)."""
    return OffendingLaunches.__required_keys__ <= evidence.keys()


def _extent_problem(b: Binding) -> str | None:
    """Why an SGEMM operand does not span its tensor's full logical extent, or None."""
    if b.region is None:
        return "pointer resolves to no buffer"
    if not b.in_bounds:
        return f"reads past the end of {b.region.buffer}"
    if b.tensor_shape is None:
        return f"points into no tensor of {b.region.buffer}"
    return span_problem(b.region, b.tensor_shape, b.tensor)


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
    size = buffer_size(trace.layout, b.region.buffer)
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
            if (shape := launch_shape_problem(x)) is not None:
                facts = {"operand": "launch shape", "kind": x.kind, "problem": shape}
                bad_launches.append(_launch_facts(trace, x) | facts)
                continue
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
        offenders: OffendingLaunches = {
            "offending_sgemms": len(bad_gemms),
            "offending_sgemm_labels": sorted({r["label"] for r in bad_gemms}),
            "offending_launches": len(bad_launches),
            "offending_launch_labels": sorted({r["label"] for r in bad_launches}),
        }
        return failed(
            f"{summary} ({len(bad_gemms)} SGEMMs, {len(bad_launches)} other launches offend)",
            first=first,
            **offenders,
            **counts,
        )
    return passed(
        f"{sgemm_count} SGEMMs in {len(traces)} traces span every operand's full tensor; "
        f"{other_count} kernel/memset/copy launches stay in bounds",
        **counts,
    )


# ---- the same invariant on a capture of the trainer's process ----
def _capture_operand_problem(
    ct: Trace, x: Launch, b: Binding, op: GemmOperand | None, at: int
) -> str | None:
    """The rebuild's operand rule where the capture named the operand's tensor (whole rows of it
    in a process that is no SP14 trainer); a flat allocation the layout gives no shape, or an
    operand no name covers, is judged by its span of the allocation holding it (the span from
    the GEMM's own arguments)."""
    if b.region is None or (not ct.capture.sp14 and b.in_bounds and b.tensor_shape is None):
        # no name covers it (in a process that is no SP14 trainer, a part of a named buffer
        # that no tensor names is no finding either): its span of its allocation, and the
        # slices its own batch stride implies
        if op is None:
            return None
        found = allocation_problem(ct, b.pointer, op.extent_bytes, at)
        return found or implied_slice_problem(x.args, b.role.partition("[")[0], op.box)
    buffer = ct.capture.layout.buffers.get(b.region.buffer)
    if b.in_bounds and b.tensor_shape is None and buffer is not None and not buffer.shaped:
        return None
    shape = None if buffer is None or b.tensor is None else buffer.shapes.get(b.tensor)
    if b.in_bounds and b.tensor_shape is not None and shape is not None:
        return slice_problem(b.region, b.tensor_shape, shape, b.tensor)
    if not ct.capture.sp14 and b.in_bounds and b.tensor_shape is not None:
        return rows_problem(b.region, b.tensor_shape, b.tensor)
    return _extent_problem(b)


def b_extent(b: Binding) -> int:
    """Elements from the operand's pointer to one past its last element."""
    return 0 if b.region is None else b.region.last - b.region.offset


def _undecided_operand(ct: Trace, b: Binding, at: int) -> bool:
    """An operand in no named buffer: judged by its allocation in a process that is no SP14
    trainer (that is all such a check claims), undecided in an SP14 trainer (whose claim is
    its tensor's exact span) and wherever no recorded allocation holds it."""
    if b.region is not None:
        return False
    return ct.capture.sp14 or allocation_of(ct, b.pointer, at) is None


def _group(ct: Trace, x: Launch, b: Binding) -> bool:
    """A memset's or copy's end that spans whole named buffers (a group allocated together),
    ending where its last buffer ends, or that is its whole allocation; a copy whose other end
    lies inside one named buffer moves one buffer, and is held to it."""
    pointer, size = b.pointer, x.args.get("bytes")
    if x.kind not in ("memset", "copy") or not isinstance(pointer, int):
        return False
    if not isinstance(size, int) or any(
        o is not b and o.region is not None and o.in_bounds for o in x.bindings
    ):
        return False
    reach = whole_buffers(ct.capture.layout, pointer, pointer + size)
    held = allocation_of(ct, pointer, ct.capture.records[x.index].seq)
    whole = held is not None and (pointer, size) == (held.address, held.bytes)
    return reach is not None and (reach == pointer + size or whole)


def _finding(x: Launch, operand: str, problem: str) -> dict[str, Any]:
    return dict(launch=x.index, step=x.step, label=x.label, operand=operand, problem=problem)


def _memory_problems(ct: Trace) -> list[dict[str, Any]]:
    """Every memset, copy and kernel region outside its buffer or its allocation, and every
    trainer's launch of a kernel of egf-audit's table short of the threads it needs."""
    bad = []
    for x in ct.launches:
        if x.kind == "sgemm":
            continue
        record = ct.capture.records[x.index]
        at = record.seq
        if record.decoded and record.within is None and (shape := launch_shape_problem(x)):
            bad.append(_finding(x, "launch shape", shape))
            continue
        if x.kind in ("memset", "copy"):  # either end, named or not, inside its allocation
            extent = int(x.args.get("bytes", 0))
            for end in ("dst", "src"):
                pointer = x.args.get(end)
                if pointer and (problem := allocation_problem(ct, pointer, extent, at)):
                    bad.append(_finding(x, end, problem))
                    break
        for b in x.bindings:
            if b.region is not None and not b.in_bounds and not _group(ct, x, b):
                problem = f"touches elements up to {b.region.last} of {b.region.buffer}"
            else:
                problem = allocation_problem(ct, b.pointer, b_extent(b) * ELEMENT_BYTES, at)
            if problem is not None:
                bad.append(_finding(x, b.role, problem))
                break
    return bad


def check_capture(ct: Trace) -> Verdict:
    """What the capture shows of EGF001: every GEMM's operands, of every entry point and every
    batch, against the tensors the layout (or inference) names, with the same rule as the
    rebuild (in a process that is no SP14 trainer: whole rows of the named tensor); an operand
    in a shape-less allocation by its span of it; the K = SH2 signature wherever SH2 is known;
    every kernel, memset and copy region inside its buffer and allocation. In an SP14 trainer,
    UNDECIDED only for GEMMs whose operands no layout names (listed): give a layout file to
    decide them; in any other process an operand no name covers is judged by its allocation."""
    sh2 = ct.capture.dim("SH2")
    gemms = list(ct.sgemms())
    if not gemms and ct.capture.sp14:
        return failed("the process recorded no cuBLAS GEMM at all", gemms=0)
    bad: list[dict[str, Any]] = []
    unnamed: list[dict[str, Any]] = []
    wrong_tensor = role_problems(ct)  # which tensor each GEMM reads and writes (SP14 only)
    for x in gemms:
        facts = {"launch": x.index, "step": x.step, "label": x.label}
        facts |= {"sgemm_args": {k: x.args.get(k) for k in GEMM_ARGS}}
        if x.refused:  # the arguments cuBLAS refuses: nothing ran (the rebuild's rule)
            bad.append(facts | {"problem": x.refused})
            continue
        if "unbound" in x.args or not x.bindings:
            why = (
                x.args.get("unbound") or f"{x.args.get('api', 'GEMM')}: its operands are not bound"
            )
            unnamed.append(facts | {"why": why})
            continue
        operands = {op.role: op for op in gemm_operands(x.args)}
        problem = k_sh2_signature(x, sh2)
        at = ct.capture.records[x.index].seq
        for b in x.bindings:
            if problem is None:
                p = _capture_operand_problem(ct, x, b, operands.get(b.role), at)
                problem = None if p is None else f"operand {b.role} {p}"
        if problem is None and x.index in wrong_tensor:
            problem = wrong_tensor[x.index]
        if problem is not None:
            bad.append(facts | {"problem": problem})
        elif any(_undecided_operand(ct, b, at) for b in x.bindings):
            roles = [b.role for b in x.bindings if _undecided_operand(ct, b, at)]
            where = (
                "no named buffer"
                if ct.capture.sp14
                else "no named buffer and no recorded allocation"
            )
            unnamed.append(facts | {"why": f"operands {', '.join(roles)} land in {where}"})
    bad_launches = _memory_problems(ct)
    counts = {
        "gemms": len(gemms),
        "gemms_decided": len(gemms) - len(unnamed),
        "undecided_gemms": unnamed[:MAX_LISTED_CAPTURE],
        "undecided_total": len(unnamed),
    }
    if bad or bad_launches:
        first = (bad or bad_launches)[0]
        return failed(
            f"{first['label']} (launch {first['launch']}): {first['problem']} "
            f"({len(bad)} GEMMs, {len(bad_launches)} other launches offend)",
            first=first,
            offending_gemms=bad[:MAX_LISTED_CAPTURE],
            offending_launches=bad_launches[:MAX_LISTED_CAPTURE],
            **counts,
        )
    if unnamed:
        first = unnamed[0]
        return undecided(
            f"{len(unnamed)} of {len(gemms)} GEMMs cannot be judged: {first['why']} (first: "
            f"{first['label']}, launch {first['launch']}); the other {len(gemms) - len(unnamed)} "
            "span their tensors",
            **counts,
        )
    if not ct.capture.sp14:
        return passed(
            f"{len(gemms)} GEMMs keep every operand of every batch inside its allocation, and "
            "whole rows of its tensor where the layout names one; kernel, memset and copy "
            "regions stay in bounds",
            **counts,
        )
    return passed(
        f"{len(gemms)} GEMMs span every operand's full tensor (or its allocation), none reads "
        "SH2 columns of a row stride SH2 + 1; kernel, memset and copy regions stay in bounds",
        **counts,
    )


MAX_LISTED_CAPTURE = 20


INVARIANT = Invariant(
    code="EGF001",
    slug="gemm-k-matches-lda",
    message="Every SGEMM reads and writes each operand over its full tensor, with K = LDA.",
    what=(
        "For every SGEMM of the production and replay steps, each operand (A, B, C) resolves to "
        "a named tensor and covers exactly its logical extent: it starts at the tensor's first "
        "element, spans all its rows and columns, and walks it with the tensor's row stride. "
        "Every kernel, memset and copy launch stays inside the buffers it declares, and every "
        "launch of a kernel of egf-audit's table runs the threads its contract asks for: a 1-D "
        "grid and block whose threads cover its rows or elements. On a "
        "capture, each GEMM of the contract also reads and writes the tensors the contract "
        "names (online or target weights, save_h_s2 or its scratch, the dir concat or a "
        "branch's), after the GEMM that writes its input in the step, and an operand on a "
        "tensor declared with leading axes covers whole slices of it, rows included."
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
        "and every launch's declared regions with its buffer sizes; a kernel launch's grid "
        "times block with the threads the kernel table says it needs "
        "(invariants/launch_shape.py). The legacy wrapper is judged "
        "by EGF011, not here: only production and replay traces are read. A kernel's regions "
        "come from the kernel table; that the kernel really writes nowhere else, and reads "
        "nothing just past its buffers, is observed on every launch and decided by EGF013."
    ),
    catches=(
        "The historical K mismatches (forward, dW and dX SGEMMs of the direction branch keeping "
        "K = SH2), a call site taking the legacy K = SH2 wrapper path, and any state vector "
        "still sized for SH2 while its GEMV reads w_b0fc; a kernel launched with too few "
        "blocks for its rows (`rows / 256` blocks), which leaves the last rows unwritten with "
        "every pointer and size right."
    ),
    limits=(
        "It judges the regions a launch declares (an SGEMM's boxes from its arguments, a "
        "kernel's from the kernel table), not the elements it really touches: that is EGF013's. "
        "On the rebuild the tensors each SGEMM reads are the pipeline's wiring, held to the "
        "contract's table by a test, not by this check; on a capture a tensor the layout does "
        "not name is not compared, and which values the right tensor holds is not read (EGF006 "
        "asks what the concat scratch holds when the d = 0 dW reads it). The legacy wrapper "
        "is left to EGF011. On a capture, a GEMM with an operand in no buffer the layout or "
        "inference names is UNDECIDED unless its arguments show the K = SH2 signature or the "
        "operand overruns its allocation, and a buffer the layout gives no shape is judged by "
        "its span alone."
    ),
    example=(
        "backward_branch_dw[d=0]@main called with (N, T, m=48, n=32, k=64, lda=48, ldb=32, "
        "ldc=49): operand C spans 48 of 49 columns of w_b0fc, so dW of the wire column is never "
        "written."
    ),
    check=check,
    reads=("launches",),
    capture=check_capture,
    any_process=True,
)
