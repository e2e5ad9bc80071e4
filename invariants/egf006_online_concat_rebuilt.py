"""EGF006 online-concat-rebuilt: the d = 0 dW SGEMM reads the ONLINE [save_h_s2 | wire], not the
target concat the target forward left in the shared scratch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from egf_audit.invariants.capture_common import (
    Dims,
    concat_contract,
    dims_of,
    may_write,
    named,
    pointer_problem,
    site_name,
    value_problems,
)
from egf_audit.invariants.common import describe, mode_traces, region_values, steps
from egf_audit.invariants.registry import (
    Invariant,
    Verdict,
    failed,
    failed_at_sites,
    failed_with,
    passed,
)
from egf_audit.oracle.inputs import StepSnapshots, device, flat_snapshot
from egf_audit.trace.contract import (
    ACCUMULATE_KERNEL,
    AFTER_FORWARD,
    AUX_DOWN_INDEX,
    AUX_UP_INDEX,
    CONCAT_KERNEL,
    DIR_CONCAT,
    SITES,
    at_site,
)
from egf_audit.trace.gemm_rules import contraction
from egf_audit.trace.model import Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.call_sites import Site
    from egf_audit.trace.model import Binding, Launch, Region, Trace

SOFTMAX = "aux_nb_softmax_buf"

X_OPERAND = "A"  # the dW layout is (N, T): A is x [B, in_w] (auditor/pipeline/gemm.py, gemm_dw)


def dw_label(site: str) -> str:
    return at_site("backward_branch_dw[d=0]", site)


def _concat(snaps: StepSnapshots, h_s2: str, softmax: str) -> torch.Tensor:
    """[h_s2 | p[:, up] - p[:, down]] from after_forward snapshots, the wire subtracted in fp32
    as the concat kernel does; on the oracle's device, where the snapshots were copied."""
    h = snaps.array(AFTER_FORWARD, h_s2)
    p = snaps.array(AFTER_FORWARD, softmax)
    wire = p[:, AUX_UP_INDEX] - p[:, AUX_DOWN_INDEX]  # one fp32 subtraction
    return torch.cat([h, wire[:, None]], dim=1)


def _box(flat: torch.Tensor, region: Region) -> torch.Tensor:
    """common.region_values for a tensor: the [rows, width] box, as a strided view."""
    if region.rows <= 0 or region.width <= 0 or region.offset < 0 or region.last > flat.numel():
        raise Missing(f"the box {describe(region)} does not fit a snapshot of {region.buffer}")
    if region.ld < 0:  # rows running backwards: no strided view, read as region_values reads
        return torch.from_numpy(region_values(flat.cpu().numpy(), region)).to(flat.device)
    return flat.as_strided((region.rows, region.width), (region.ld, 1), region.offset)


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """common.bit_mismatch for fp32 tensors: +0.0 and -0.0 differ, NaN never equals."""
    return a.view(torch.int32) != b.view(torch.int32)


def _site_findings(
    trace: Trace, snaps: StepSnapshots, site: str, online: torch.Tensor
) -> dict[str, Any]:
    step = snaps.step
    label = dw_label(site)
    at = {"scenario": trace.scenario, "step": step, "site": site, "label": label}
    launches = [x for x in trace.launches if x.step == step and x.label == label]
    if not launches:
        raise Missing(f"no launch {label} (step {step}) in {trace.scenario}")
    x_operand = launches[0].binding(X_OPERAND)
    if x_operand.region is None:
        return at | {"problem": "the x operand resolves to no buffer"}
    region = x_operand.region
    facts = at | {"buffer": region.buffer, "tensor": x_operand.tensor}
    facts |= {"rows_read": region.rows, "columns_read": region.width}
    if (region.rows, region.width) != tuple(online.shape):
        return facts | {
            "problem": f"the x operand is {region.rows} x {region.width}, the online concat "
            f"{online.shape[0]} x {online.shape[1]}",
        }
    inputs = flat_snapshot(trace, step, f"input:{label}", region.buffer, snaps.dev)
    try:
        x = _box(inputs, region)
    except Missing:
        return facts | {"problem": "the x operand does not fit its buffer's snapshot"}
    wrong = _differs(x, online)
    if bool(wrong.any()):
        target = _concat(snaps, "tgt_h_s2", "tgt_aux_softmax")
        return facts | {
            "problem": "the x operand is not the online concat",
            "elements_differing": int(wrong.sum()),
            "columns_differing": int(wrong.any(dim=0).sum()),
            "equals_target_concat": not bool(_differs(x, target).any()),
        }
    return {}


def check(run: AuditRun, mode: str) -> Verdict:
    findings, checked = [], []
    for _, trace in mode_traces(run, mode):
        for step in steps(trace):
            snaps = StepSnapshots(trace, step, device())
            online = _concat(snaps, "save_h_s2", "aux_nb_softmax_buf")
            for site in SITES:
                found = _site_findings(trace, snaps, site, online)
                if found:
                    findings.append(found)
                else:
                    checked.append(f"{trace.scenario}@{step}:{site}")
    evidence = {"launches_checked": len(checked)}
    if not findings and not checked:
        return failed(f"mode {mode} ran no d = 0 dW SGEMM", **evidence)
    failing = failed_at_sites(
        findings,
        evidence,
        says=lambda f: f"{f['label']} in {f['scenario']} step {f['step']}: {f['problem']}",
        counted="launches fail",
        listed="failing",
    )
    if failing is not None:
        return failing
    # the values hold; the data flow, the capture's rule, must hold too (the right tensor read
    # through the right launches, not equal values by chance)
    flow = _flow_problems(run, mode)
    if flow:
        return failed_with(flow, **evidence)
    return passed(
        f"{len(checked)} d = 0 dW SGEMMs read the online [save_h_s2 | wire] bitwise over all "
        f"{run.config.dims.SH2 + 1} columns",
        **evidence,
    )


# ---- the same invariant on a capture of the trainer's process ----
def _start_problem(ct: Trace | None, x: Launch, param: str, buffer: str) -> str | None:
    """Why the pointer argument `param` of `x` is not the first element of `buffer`, or None: a
    capture's pointer through its layout, the rebuild's through the binding its recorder made
    (the same place: the kernel table's region at that pointer)."""
    if ct is not None:
        return pointer_problem(ct, x, param, buffer)
    b = x.binding(param, required=False)
    r = None if b is None else b.region
    if r is not None and (r.buffer, r.offset) == (buffer, 0):
        return None
    where = "no named buffer" if r is None else f"{r.buffer}[{r.offset}]"
    return f"{param} points at {where}, not at the start of {buffer}"


def concat_problems(ct: Trace | None, x: Launch, online: bool, d: Dims) -> list[str]:
    """sp14_dir_concat_qaux held to the contract: it writes the start of the scratch with rows =
    B, sh2 = SH2, auxk = AUXK, up_idx = 2, down_idx = 0; the online rebuild reads save_h_s2 and
    aux_nb_softmax_buf from their starts."""
    problems = value_problems(x, concat_contract(d))
    wanted = [("concat", DIR_CONCAT)]
    if online:
        wanted += [("h_s2", "save_h_s2"), ("aux_softmax", SOFTMAX)]
    for param, buffer in wanted:
        if ct is not None and buffer not in ct.capture.layout.buffers and param == "aux_softmax":
            continue  # inference names the softmax from this very argument
        if (p := _start_problem(ct, x, param, buffer)) is not None:
            problems.append(p)
    return problems


def _dw_of_dir(x: Launch) -> Binding | None:
    """The operand through which a GEMM reads the concat scratch as a weight gradient's x
    (contracting over its rows: dW = dY^T . x), or None."""
    if x.kind != "sgemm":
        return None
    for b in x.bindings:
        on_scratch = b.role in ("A", "B") and b.region is not None and b.region.buffer == DIR_CONCAT
        if on_scratch and contraction(b.role, x.args["transa"], x.args["transb"]) == "rows":
            return b
    return None


def site_concat_problems(
    ct: Trace | None, launches: list[Launch], site: Site, d: Dims
) -> list[str]:
    """EGF006's one rule for a call site, for the rebuild's launches and a capture's alike: its
    d = 0 dW GEMM (the last one contracting the concat scratch over its rows) reads all
    B x (SH2 + 1) of it, and the last launch that writes, or may write, the scratch before that
    GEMM is sp14_dir_concat_qaux on the online save_h_s2 with every argument as the contract
    says. `launches` are the trace's, by position; `ct` the capture where there is one (what it
    observed of a kernel egf-audit does not know, its pointers through its layout)."""
    at = site_name(site)
    inside = launches[site.begin : site.end + 1]
    dws = [(x, b) for x in inside if (b := _dw_of_dir(x)) is not None]
    if not dws:
        return [f"{at}: no GEMM reads {DIR_CONCAT} as the d = 0 dW's x"]
    problems = []
    x, operand = dws[-1]
    r = operand.region
    if r is not None and (r.offset, r.rows, r.width) != (0, d.B, d.concat_width):
        problems.append(
            f"{at}: {x.label} reads {r.rows} x {r.width} of the concat at element "
            f"{r.offset}, the online concat is {d.B} x {d.concat_width}"
        )
    writer = next((y for y in reversed(launches[: x.index]) if may_write(ct, y, DIR_CONCAT)), None)
    if writer is None or writer.name != CONCAT_KERNEL:
        what = named(writer) if writer is not None else "nothing"
        return [*problems, f"{at}: the last writer of the concat before {x.label} is {what}"]
    problems += [
        f"{at}: the rebuild {named(writer)}: {p}" for p in concat_problems(ct, writer, True, d)
    ]
    return problems


def _flow_problems(run: AuditRun, mode: str) -> list[str]:
    """The rule above on the rebuild's own traces of the mode, site by site."""
    dims = run.config.dims
    d = Dims(dims.B, dims.SH2, dims.AUXK)
    problems: list[str] = []
    for _, trace in mode_traces(run, mode):
        for site in trace.call_sites():
            problems += [
                f"{trace.scenario}: {p}"
                for p in site_concat_problems(None, trace.launches, site, d)
            ]
    return problems


def check_capture(ct: Trace) -> Verdict:
    """At every call site the d = 0 dW GEMM (the one contracting the concat scratch over its
    rows) reads all B x (SH2 + 1) of it, and the last launch that writes, or may write, the
    scratch before that GEMM is sp14_dir_concat_qaux on the online save_h_s2 with every
    argument as the contract says. The values themselves are not captured: where the rebuild
    compares bits, the capture proves the data flow."""
    if not ct.call_sites():  # a process audited for its ABI launches whose backward never ran
        return failed(f"no {ACCUMULATE_KERNEL} launch: no call site, no d = 0 dW GEMM to judge")
    d = dims_of(ct)
    problems = []
    for site in ct.call_sites():
        problems += site_concat_problems(ct, ct.launches, site, d)
    for x in ct.kernels(CONCAT_KERNEL):
        problems += [f"{named(x)}: {p}" for p in concat_problems(ct, x, False, d)]
    if problems:
        return failed_with(sorted(set(problems), key=problems.index), sites=len(ct.call_sites()))
    return passed(
        f"at all {len(ct.call_sites())} call sites the d = 0 dW GEMM reads the whole "
        f"online rebuild of the concat ({CONCAT_KERNEL} on save_h_s2, every argument as the "
        "contract says)",
        sites=len(ct.call_sites()),
    )


INVARIANT = Invariant(
    code="EGF006",
    slug="online-concat-rebuilt",
    message="The d = 0 dW SGEMM must read the online concat, not the target's leftover.",
    what=(
        "At both call sites, the x operand of backward_branch_dw[d=0], as captured just before "
        "the SGEMM ran, equals the online [save_h_s2 | p[:, up] - p[:, down]] bit for bit over "
        "all SH2 + 1 columns."
    ),
    why=(
        "The online and the target forward both write sp14_dir_qaux_concat_scratch, the target "
        "last. Unless each call site rebuilds the online concat first, dW of the direction "
        "head is computed against the target net's activations on next_obs: wrong gradients "
        "of the right shape, invisible to every shape check."
    ),
    how=(
        "The recorder snapshots every buffer the d = 0 dW SGEMM reads just before it runs. The "
        "box of operand A (x in the N, T dW layout) is read out of that snapshot and compared "
        "by bit pattern with the concat recomputed from the after_forward snapshots of "
        "save_h_s2 and aux_nb_softmax_buf (the wire subtracted in fp32). A missing launch or "
        "snapshot, or an operand narrower than SH2 + 1 columns, fails. Both modes then follow "
        "the same data flow at every call site (a capture keeps no values, so there it is the "
        "whole evidence): the d = 0 dW GEMM reads the whole scratch, and the last launch that "
        "writes or may write it before that GEMM is sp14_dir_concat_qaux on the online "
        "save_h_s2, every argument as the contract says."
    ),
    catches=(
        "The call sites skipping sp14_dir_concat_qaux(save_h_s2) before backward_full, and "
        "any dW wired to a narrower x than the concat."
    ),
    limits=(
        "It reads the d = 0 dW SGEMM only, found by its label: the other branches' dW inputs "
        "are not compared. On a capture the values are not kept, so it proves the data flow "
        "instead (the scratch's last writer before that GEMM is sp14_dir_concat_qaux on "
        "save_h_s2, every argument as the contract says): a concat kernel that computes wrong "
        "values from the right pointers is not seen there."
    ),
    example=(
        "Without the rebuild, backward_branch_dw[d=0]@cql reads the scratch as the target "
        "forward left it: every column differs from the online concat and equals the target's."
    ),
    check=check,
    capture=check_capture,
)
