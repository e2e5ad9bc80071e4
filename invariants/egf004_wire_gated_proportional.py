"""EGF004 wire-gated-proportional: with 0 < ISV[393] <= 1 the scale multiplies the wire column,
and only it, by the gate: fl(alpha * g) bit for bit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Required

import numpy as np
import torch

from egf_audit.invariants.capture_common import (
    all_values,
    named,
    site_name,
    site_scale,
    wire_at_accumulate,
)
from egf_audit.invariants.common import (
    alpha_at,
    bit_mismatch,
    gated_traces,
    json_float,
    steps,
)
from egf_audit.invariants.egf003_wire_zero_under_sentinel import gate_sites
from egf_audit.invariants.registry import (
    Invariant,
    SiteFinding,
    Verdict,
    failed,
    failed_at_sites,
    failed_with,
    passed,
    undecided,
)
from egf_audit.invariants.wire_gate import expected_wire
from egf_audit.oracle.inputs import StepSnapshots, device
from egf_audit.trace.contract import (
    AFTER_BACKWARD_FULL,
    AFTER_INJECT,
    AFTER_SCALE,
    DIR_DX,
    SCALE_KERNEL,
    SITES,
    site_checkpoint,
)
from egf_audit.trace.model import Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Trace


class NotGated(SiteFinding, total=False):
    """An open-gate call site whose wire is not fl(alpha * g), or whose other columns the scale
    changed."""

    alpha: Required[float | str]
    rows_wrong: int
    rows: int
    first_row: int
    g: float | str
    expected_bits: str
    got_bits: str
    elements_touched: int
    columns_touched: list[int]


def _upstream(snaps: StepSnapshots, site: str) -> torch.Tensor:
    """The dX the scale starts from: after an audit injection if there was one, else as
    backward_full left it."""
    try:
        return snaps.array(site_checkpoint(site, AFTER_INJECT), DIR_DX)
    except Missing:
        return snaps.array(site_checkpoint(site, AFTER_BACKWARD_FULL), DIR_DX)


def _bits(value: torch.Tensor) -> str:
    """common.hex_bits of one fp32 element, read as its bits."""
    return f"0x{int(value.view(torch.int32)) & 0xFFFFFFFF:08x}"


def _site_findings(
    trace: Trace, snaps: StepSnapshots, site: str, sh2: int, alpha: np.float32
) -> NotGated | None:
    """On the oracle's device, where the snapshots were copied."""
    found: NotGated = {
        "scenario": trace.scenario,
        "step": snaps.step,
        "site": site,
        "alpha": json_float(alpha),
        "problems": [],
    }
    upstream = _upstream(snaps, site)
    scaled = snaps.array(site_checkpoint(site, AFTER_SCALE), DIR_DX)
    g = upstream[:, sh2]
    expected = expected_wire(alpha, g)
    wrong = scaled[:, sh2].view(torch.int32) != expected.view(torch.int32)
    touched = scaled[:, :sh2].view(torch.int32) != upstream[:, :sh2].view(torch.int32)
    if bool(wrong.any()):
        row = int(wrong.int().argmax())
        found["problems"].append(f"wire column {sh2} is not fl(alpha * g)")
        found |= {
            "rows_wrong": int(wrong.sum()),
            "rows": int(g.numel()),
            "first_row": row,
            "g": json_float(float(g[row])),
            "expected_bits": _bits(expected[row]),
            "got_bits": _bits(scaled[row, sh2]),
        }
    if bool(touched.any()):
        found["problems"].append(f"the scale changed columns [0, {sh2})")
        found |= {
            "elements_touched": int(touched.sum()),
            "columns_touched": torch.nonzero(touched.any(dim=0)).flatten().tolist(),
        }
    return found if found["problems"] else None


def check(run: AuditRun, mode: str) -> Verdict:
    sh2 = run.config.dims.SH2
    checked: list[str] = []
    findings: list[NotGated] = []
    for _, trace in gated_traces(run, mode):
        for step in steps(trace):
            alpha = alpha_at(trace, step)
            if not 0.0 < alpha <= 1.0:  # NaN fails this too
                continue
            checked.append(f"{trace.scenario}@{step}")
            snaps = StepSnapshots(trace, step, device())
            for site in SITES:
                found = _site_findings(trace, snaps, site, sh2, alpha)
                if found is not None:
                    findings.append(found)
    evidence = {"gated_steps": checked}
    verdict = failed_at_sites(findings, evidence)
    if verdict is not None:
        return verdict
    if not checked:
        return failed(f"no step of mode {mode} ran with 0 < ISV[393] <= 1", **evidence)
    return passed(
        f"wire column {sh2} = fl(alpha * g) bitwise and columns [0, {sh2}) untouched at both "
        f"sites in {len(checked)} steps with 0 < alpha <= 1",
        **evidence,
    )


def check_capture(ct: Trace) -> Verdict:
    """At every call site of every step whose scale read 0 < ISV[393] <= 1: the site's scale
    made the wire fl(alpha * g) bitwise on every row (all values are needed: a capture cut
    short by --values-max is missing data), touched no other column, and the site's accumulate
    reads exactly that wire. A site without a scale cannot show fl(alpha * g) and fails, as do
    scales whose arguments or snapshots are not the contract's wire (EGF003's rule). UNDECIDED
    only when no scale was snapshotted, or none ran with an open gate (a sentinel capture)."""
    found = gate_sites(ct, lambda alpha: bool(0.0 < alpha <= 1.0))
    if isinstance(found, Verdict):
        return found
    views, problems, d, open_ = found.views, found.problems, found.dims, found.sites
    for site in open_:
        at = site_name(site)
        v = site_scale(ct, site, views)
        if v is None:
            problems.append(f"{at}: no {SCALE_KERNEL} at this call site: the wire is not gated")
            continue
        if v.wire_before is None or v.wire_after is None or v.alpha is None:
            continue  # named by gate_problems
        try:
            g = all_values(v.wire_before, f"the wire before {named(v.launch)}")
            got = all_values(v.wire_after, f"the wire after {named(v.launch)}")
            _, seen = wire_at_accumulate(ct, site, d.SH2)
        except Missing as exc:  # judge every other site still
            problems.append(f"missing data: {exc}")
            continue
        if g.size != got.size or bit_mismatch(got, expected_wire(v.alpha, g)).any():
            problems.append(f"{at}: the wire is not fl(alpha * g) bitwise after the scale")
        elif seen.size != got.size or bit_mismatch(seen, got).any():
            problems.append(f"{at}: the wire changed between the scale and the accumulate")
        if v.body_same is False:
            problems.append(f"{at}: the scale changed columns other than the wire")
    evidence = {"scale_launches": len(views), "open_gate_sites": len(open_)}
    if problems:
        return failed_with(problems, **evidence)
    if not open_:
        return undecided("no call site ran with 0 < ISV[393] <= 1 (a sentinel-mode capture)")
    return passed(
        f"at {len(open_)} call sites with 0 < ISV[393] <= 1 the wire column is fl(alpha * g) "
        "bitwise on every row after the scale and where the accumulate reads it; the other "
        "columns untouched",
        **evidence,
    )


INVARIANT = Invariant(
    code="EGF004",
    slug="wire-gated-proportional",
    message="With 0 < ISV[393] <= 1 the scale must make the wire column fl(alpha * g), no more.",
    what=(
        "In every step whose gate alpha = ISV[393] lies in (0, 1], column SH2 of "
        "sp14_d_dir_qaux_concat after sp14_scale_wire_col equals the fp32 product alpha * g, "
        "bit for bit, where g is the same column before the scale, at both call sites; columns "
        "[0, SH2), which feed d_h_s2, are bitwise untouched by the scale."
    ),
    why=(
        "Once the producer is live the gate must pass a fraction alpha of the wire gradient to "
        "the aux head: not all of it, not none, and not a neighbouring column. A scale off by "
        "one column both leaves the wire ungated and corrupts a trunk gradient column."
    ),
    how=(
        "The replays force the gate to 0.37 and 1; live production steps whose gate lies in (0,"
        " 1] count too (the replay that removes the scale launch on purpose does not). For each"
        " site the wire column at `cql:after_scale`/`main:after_scale` is compared by bit "
        "pattern with np.float32(alpha) * g, g read at "
        "`cql:after_backward_full`/`main:after_backward_full`, and columns [0, SH2) with the "
        "same snapshot."
    ),
    catches=(
        "A scale launched on column SH2 - 1, a missing scale launch, a site left ungated, and a"
        " scale pointed at another buffer."
    ),
    limits=(
        "It holds the scale to the gate the step read from ISV[393]; whether that gate has the "
        "right value is not asked here (EGF012 bounds it, and EGF010 models the step with it). "
        "Open gates are judged only where the run has them: 0.37 and 1 in the replays and the "
        "live steps' own gates. On a capture it needs every wire value before and after the "
        "scale (one cut short by --values-max is missing data), and a sentinel-mode capture is "
        "UNDECIDED."
    ),
    example=(
        "sp14_scale_wire_col launched with wire_col = SH2 - 1 and alpha = 0.37: the wire column"
        " keeps g unscaled and column SH2 - 1 of d_h_s2's source shrinks to 0.37 of itself."
    ),
    check=check,
    capture=check_capture,
)
