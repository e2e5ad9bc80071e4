"""EGF008 both-call-sites-gated: each call site scales its own wire column, at the right time.

Per production step and call site: after the site's d = 0 dX SGEMM (the SGEMM whose C operand
writes sp14_d_dir_qaux_concat) and before the site's first accumulate that reads that buffer,
a `sp14_scale_wire_col` launch must write exactly column SH2 of it (offset SH2, B rows, row
stride SH2 + 1) and read ISV[393]. Launches are judged by kernel name and bindings; labels only
attribute them to a site.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Required, TypedDict

from egf_audit.invariants.capture_common import (
    dims_of,
    may_write,
    site_count_problems,
    site_launches,
    site_name,
)
from egf_audit.invariants.common import (
    RegionFacts,
    describe,
    listed,
    production,
    steps,
)
from egf_audit.invariants.registry import Invariant, Verdict, failed, failed_with, passed
from egf_audit.trace.contract import (
    ACCUMULATE_KERNEL,
    ALPHA_GRAD_SMOOTHED_INDEX,
    DIR_DX,
    ISV,
    SCALE_KERNEL,
    SITES,
)

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.call_sites import Site
    from egf_audit.trace.model import Launch, Trace


class SiteAt(TypedDict):
    step: int
    site: str  # "cql", "main"


class Gated(SiteAt):
    scale: str  # the label of the scale launch that gates the site


class ScaleFacts(TypedDict):
    """One scale launch of an ungated site: when it ran and why it does not gate the wire."""

    label: str
    when: str  # "before the dX SGEMM", "between", "after the first accumulate"
    dx_concat: RegionFacts | None
    isv: RegionFacts | None
    problems: list[str]


class NotGated(SiteAt, total=False):
    """A call site that is not gated: `kind` says how, the other keys what was found."""

    kind: Required[str]  # "no-dir-dx-sgemm", "no-dir-accumulate", "wire-overwritten", ...
    scale: str
    overwritten_by: list[str]
    dx_sgemm: str
    first_accumulate: str | None
    scale_launches: list[ScaleFacts]


def _dir_dx_sgemm(launches: Sequence[Launch]) -> Launch | None:
    for x in launches:
        c = x.binding("C", required=False)
        if x.kind == "sgemm" and c and c.writes and c.region and c.region.buffer == DIR_DX:
            return x
    return None


def _reads_dir_dx(x: Launch) -> bool:
    return any(b.reads and b.region and b.region.buffer == DIR_DX for b in x.bindings)


def scale_problems(x: Launch, rows: int, sh2: int) -> list[str]:
    """Why a scale launch does not gate the wire: every argument that decides where it reads
    and writes, held to the contract (dx_concat is the start of sp14_d_dir_qaux_concat, rows =
    B, ld = SH2 + 1, wire_col = SH2; isv is the start of isv_signals, isv_index = 393), read
    off its bindings, which the kernel table derives from those arguments. [] when it gates."""
    dx, isv = x.binding("dx_concat", required=False), x.binding("isv", required=False)
    if dx is None or isv is None:
        return ["its dx_concat and isv arguments were not recorded"]
    problems = []
    if dx.region is None or dx.region.buffer != DIR_DX:
        problems.append(
            f"writes {dx.region.buffer if dx.region else 'no named buffer'}, not {DIR_DX}"
        )
    else:
        r = dx.region
        wanted = (sh2, rows, 1, sh2 + 1)
        if (r.offset, r.rows, r.width, r.ld) != wanted:
            problems.append(
                f"writes column {r.offset} of {r.rows} rows with row stride {r.ld}; the wire is "
                f"column {sh2} of {rows} rows with row stride {sh2 + 1}"
            )
        elif r.offset != x.args.get("wire_col"):
            problems.append(f"dx_concat does not point at the start of {DIR_DX}")
    if isv.region is None or isv.region.buffer != ISV:
        problems.append(
            f"reads its gate from {isv.region.buffer if isv.region else 'no named buffer'}, not "
            f"{ISV}"
        )
    elif isv.region.offset != ALPHA_GRAD_SMOOTHED_INDEX:
        problems.append(
            f"reads ISV[{isv.region.offset}], the gate is ISV[{ALPHA_GRAD_SMOOTHED_INDEX}]"
        )
    elif isv.region.offset != x.args.get("isv_index"):
        problems.append(
            f"reads ISV[393] through isv = {ISV}[{isv.region.offset - x.args.get('isv_index', 0)}] "
            f"and isv_index = {x.args.get('isv_index')}: the contract passes the start of {ISV}"
        )
    if not dx.writes or not isv.reads:
        problems.append("its declared accesses are not a write of dx_concat and a read of isv")
    return problems


def _scale_facts(
    x: Launch, dx_index: int, acc_index: int | None, rows: int, sh2: int
) -> ScaleFacts:
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
        "problems": scale_problems(x, rows, sh2),
    }


def site_failure(
    launches: Sequence[Launch], rows: int, sh2: int, where: SiteAt, ct: Trace | None = None
) -> tuple[NotGated | None, str]:
    """(failure or None, label of the gating scale launch) of one call site's launches, in
    order: its d = 0 dX SGEMM, then a scale that gates the wire, then the first accumulate that
    reads the dX, with nothing but that scale writing (or, for a kernel egf-audit does not
    know, possibly writing) sp14_d_dir_qaux_concat in between. The rebuild and the capture
    both judge a site with this (`ct`: the capture, whose observations of an unknown kernel
    clear it where they show it wrote nothing of the dX)."""
    dx = _dir_dx_sgemm(launches)
    if dx is None:
        failure: NotGated = {
            "kind": "no-dir-dx-sgemm",
            "step": where["step"],
            "site": where["site"],
        }
        return failure, ""
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
        if dx.index < x.index and (acc is None or x.index < acc.index):
            if scale_problems(x, rows, sh2):
                continue
            if acc is None:
                failure = {
                    "kind": "no-dir-accumulate",
                    "step": where["step"],
                    "site": where["site"],
                    "scale": x.label,
                }
                return failure, x.label
            overwrites = [
                y.label
                for y in launches
                if x.index < y.index < acc.index and may_write(ct, y, DIR_DX)
            ]
            if overwrites:
                failure = {
                    "kind": "wire-overwritten",
                    "step": where["step"],
                    "site": where["site"],
                    "scale": x.label,
                    "overwritten_by": overwrites,
                }
                return failure, ""
            return None, x.label
    failure = {
        "kind": "site-ungated",
        "step": where["step"],
        "site": where["site"],
        "dx_sgemm": dx.label,
        "first_accumulate": acc.label if acc else None,
        "scale_launches": [
            _scale_facts(x, dx.index, acc.index if acc else None, rows, sh2) for x in scales
        ],
    }
    return failure, ""


def _site_failure(
    trace: Trace, found: Site | None, step: int, site: str, rows: int, sh2: int
) -> tuple[NotGated | None, str]:
    launches = [] if found is None else trace.launches[found.begin : found.end + 1]
    return site_failure(launches, rows, sh2, {"step": step, "site": site})


def check(run: AuditRun, mode: str) -> Verdict:
    trace = production(run, mode)
    dims = run.config.dims
    failures: list[NotGated] = []
    gated: list[Gated] = []
    sites = trace.call_sites_by_step()  # cut once, as a capture's sites are, labels unread
    for step in steps(trace):
        for site in SITES:
            found = sites.get((step, site))
            failure, label = _site_failure(trace, found, step, site, dims.B, dims.SH2)
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


def _words(failure: NotGated) -> str:
    kind = failure["kind"]
    if kind == "no-dir-dx-sgemm":
        return f"no d = 0 dX GEMM writes {DIR_DX}"
    if kind == "no-dir-accumulate":
        return f"no accumulate reads {DIR_DX} after its scale"
    if kind == "wire-overwritten":
        return f"{DIR_DX} is written again after the scale by {failure['overwritten_by'][0]}"
    scales = failure["scale_launches"]
    wrong = [f for f in scales if f["when"] == "between" and f["problems"]]
    if wrong:
        return f"{wrong[0]['label']} does not gate the wire: {wrong[0]['problems'][0]}"
    return f"no {SCALE_KERNEL} gates {DIR_DX} between its dX GEMM and its first accumulate"


def check_capture(ct: Trace) -> Verdict:
    """Each call site of the capture (cut by convert.py's site model) judged by `site_failure`,
    the rebuild's rule; every step must have both call sites."""
    if not ct.call_sites():  # a process audited for its ABI launches whose backward never ran
        return failed(f"no {ACCUMULATE_KERNEL} launch: no call site, none gated")
    d = dims_of(ct)
    problems = site_count_problems(ct)
    failures: list[NotGated] = []
    gated: list[Gated] = []
    for site in ct.call_sites():
        where: SiteAt = {"step": site.step, "site": site.name}
        failure, label = site_failure(site_launches(ct, site), d.B, d.SH2, where, ct)
        if failure:
            failures.append(failure)
            problems.append(f"{site_name(site)}: {_words(failure)}")
        else:
            gated.append({**where, "scale": label})
    if problems:
        return failed_with(problems, **listed(failures), gated=gated)
    return passed(
        f"each of {len(ct.call_sites())} call sites scales {DIR_DX}[:, SH2] by ISV[393] between "
        "its d = 0 dX GEMM and its first accumulate, with every scale argument as the contract "
        "says",
        **listed([]),
        gated=gated,
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
    limits=(
        "It judges from the launches alone where the scale runs and the regions it declares: "
        "what the scale computes is EGF003's and EGF004's, what it really writes EGF013's. The "
        "rebuild reads the production trace only and gives a launch to a site by its label "
        "suffix (@cql, @main); a capture's sites are cut at its accumulate launches, and a "
        "capture with neither an accumulate nor a scale launch is UNDECIDED."
    ),
    example=(
        "`launch_sp14_scale_wire_col` added after the main `backward_full` only: the CQL aux "
        "site's wire gradient reaches the aux head unscaled."
    ),
    check=check,
    capture=check_capture,
)
