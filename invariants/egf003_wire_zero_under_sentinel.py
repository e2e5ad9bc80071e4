"""EGF003 wire-zero-under-sentinel: with ISV[393] = 0 the wire gradient is exactly +0.0 at both
call sites, also when the upstream dX is not finite, and the aux head receives nothing from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from egf_audit.invariants.capture_common import (
    Dims,
    ScaleView,
    dims_of,
    named,
    scale_views,
    site_name,
    site_scale,
    step_alphas,
    wire_at_accumulate,
    zeros_hash,
)
from egf_audit.invariants.common import (
    alpha_at,
    bit_mismatch,
    first_index,
    gated_traces,
    hex_bits,
    json_float,
    steps,
)
from egf_audit.invariants.egf008_both_call_sites_gated import scale_problems
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
from egf_audit.trace.contract import (
    ACCUMULATE_KERNEL,
    AFTER_INJECT,
    AFTER_SCALE,
    AUX_AFTER_WIRE,
    AUX_BEFORE_WIRE,
    DIR_DX,
    NONFINITE_PATTERN,
    SCALE_KERNEL,
    SITES,
    site_checkpoint,
)
from egf_audit.trace.model import Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.call_sites import Site
    from egf_audit.trace.model import Trace


class WireNotZero(SiteFinding, total=False):
    """A gate-0 call site whose wire is not +0.0 or whose aux head received the wire."""

    injected: dict[str, int]  # what the wire column held instead of the injected pattern
    rows_not_plus_zero: int
    rows: int
    first_row: int
    first_value: float | str
    first_bits: str
    aux_elements_changed: int
    aux_first_element: list[int]
    aux_max_abs_change: float | str


def _injected_kinds(wire: np.ndarray) -> dict[str, int]:
    """How many rows of the upstream wire dX hold each kind of value the audit injects."""
    return {
        "nan": int(np.isnan(wire).sum()),
        "+inf": int(np.isposinf(wire).sum()),
        "-inf": int(np.isneginf(wire).sum()),
        "negative_finite": int((np.isfinite(wire) & (wire < 0)).sum()),
    }


def _injection_seen(wire: np.ndarray) -> bool:
    """The wire column holds exactly what the audit injected: NaN, +Inf, -Inf, -1 cycled over
    the rows (the first rows only, when B < 4)."""
    expected = np.resize(np.array(NONFINITE_PATTERN, np.float32), wire.size)
    return not bit_mismatch(wire, expected).any()


def _site_findings(
    trace: Trace, step: int, site: str, sh2: int, injected: bool
) -> WireNotZero | None:
    """What one call site of one gate-0 step shows: its `problems`, or None when it holds."""
    found: WireNotZero = {"scenario": trace.scenario, "step": step, "site": site, "problems": []}
    if injected:
        upstream = trace.snapshot(step, site_checkpoint(site, AFTER_INJECT), DIR_DX)
        if not _injection_seen(upstream[:, sh2]):
            # the injection did not reach the wire column: the NaN-safety claim would be vacuous
            found["problems"].append("injection not visible in the wire column")
            found["injected"] = _injected_kinds(upstream[:, sh2])
            return found
    scaled = trace.snapshot(step, site_checkpoint(site, AFTER_SCALE), DIR_DX)
    before = trace.snapshot(step, site_checkpoint(site, AUX_BEFORE_WIRE), "d_aux_logits")
    after = trace.snapshot(step, site_checkpoint(site, AUX_AFTER_WIRE), "d_aux_logits")
    wire = scaled[:, sh2]
    not_plus_zero = bit_mismatch(wire, expected_wire(np.float32(0.0), wire))
    if not_plus_zero.any():
        row = first_index(not_plus_zero)[0]
        found["problems"].append(f"wire column {sh2} of {DIR_DX} is not +0.0 after the scale")
        found |= {
            "rows_not_plus_zero": int(not_plus_zero.sum()),
            "rows": int(wire.size),
            "first_row": row,
            "first_value": json_float(wire[row]),
            "first_bits": hex_bits(wire[row]),
        }
    # bitwise, except that a zero may change its sign: with lambda_aux = 0 the CE gradient is -0.0
    # and the trainer's own add of the closed wire's +0.0 gives +0.0; that carries no gradient
    changed = bit_mismatch(before, after) & ~((before == 0) & (after == 0))
    if changed.any():
        with np.errstate(invalid="ignore"):  # a leaked NaN makes the change NaN: reported so
            largest = np.max(np.abs(after - before)[changed])
        found["problems"].append("aux_wire_backward changed d_aux_logits under gate 0")
        found |= {
            "aux_elements_changed": int(changed.sum()),
            "aux_first_element": first_index(changed),
            "aux_max_abs_change": json_float(largest),
        }
    return found if found["problems"] else None


def check(run: AuditRun, mode: str) -> Verdict:
    sh2 = run.config.dims.SH2
    checked: list[str] = []
    injected_checked = 0
    findings: list[WireNotZero] = []
    for scenario, trace in gated_traces(run, mode):
        for step in steps(trace):
            if alpha_at(trace, step) != 0.0:
                continue
            checked.append(f"{trace.scenario}@{step}")
            injected_checked += bool(scenario.inject_nonfinite)
            for site in SITES:
                found = _site_findings(trace, step, site, sh2, scenario.inject_nonfinite)
                if found is not None:
                    findings.append(found)
    evidence = {"gate_zero_steps": checked, "injected_steps": injected_checked}
    verdict = failed_at_sites(findings, evidence)
    if verdict is not None:
        return verdict
    if not checked:
        return failed(f"no step of mode {mode} ran with ISV[393] = 0.0", **evidence)
    if not injected_checked:
        return failed(
            f"no step of mode {mode} injected NaN/Inf into the wire dX under ISV[393] = 0.0",
            **evidence,
        )
    return passed(
        f"wire column {sh2} is +0.0 after the scale and d_aux_logits bitwise unchanged by the "
        f"wire at both sites in {len(checked)} gate-0 steps ({injected_checked} with NaN/Inf "
        "injected)",
        **evidence,
    )


def gate_problems(ct: Trace, views: list[ScaleView]) -> list[str]:
    """What every scale launch must show before its values mean anything, whatever its gate:
    the contract's arguments (EGF008's rule, so the snapshot is of the wire column SH2 of
    [B, SH2 + 1]) and its own snapshots. EGF003 and EGF004 both report these."""
    d = dims_of(ct)
    problems = []
    for v in views:
        for p in scale_problems(v.launch, d.B, d.SH2):
            problems.append(f"{named(v.launch)}: {p}, so its snapshot is not of the wire")
        problems += [f"{named(v.launch)}: {p}" for p in v.problems]
    return problems


@dataclass(frozen=True)
class GateSites:
    """The call sites a gate check judges, and what the scale launches already showed."""

    views: list[ScaleView]
    problems: list[str]  # gate_problems: every scale's arguments and snapshots
    dims: Dims
    sites: list[Site]  # the sites of the steps whose gate the check judges


def gate_sites(ct: Trace, judged: Callable[[np.float32], bool]) -> Verdict | GateSites:
    """What EGF003 and EGF004 start from: a FAIL when no scale launch ran, UNDECIDED when none
    was snapshotted, else the sites of the steps whose ISV[393] `judged` accepts."""
    views = scale_views(ct)
    if not views:
        return failed(f"no {SCALE_KERNEL} launch: the wire is never gated")
    if not any(v.alpha is not None or v.wire_after is not None for v in views):
        return undecided(f"the capture has no snapshots around {SCALE_KERNEL} (--snapshot)")
    if not ct.call_sites():
        return failed(
            f"{SCALE_KERNEL} runs but no {ACCUMULATE_KERNEL} launch: no call site shows where the "
            "gated wire goes"
        )
    alphas = step_alphas(views)
    sites = [site for site in ct.call_sites() if site.step in alphas and judged(alphas[site.step])]
    return GateSites(views, gate_problems(ct, views), dims_of(ct), sites)


def check_capture(ct: Trace) -> Verdict:
    """At every call site of every step whose scale read ISV[393] = 0.0, the wire column is +0.0
    on every row where the site's accumulate reads the dir dX (its snapshot, all values; the
    rebuild reads it right after the scale), the site's scale left +0.0 on every row (the
    recorder's hash over all rows) and touched no other column. A site without a scale, a scale
    without snapshots, or one whose arguments or snapshot are not the contract's wire fails.
    UNDECIDED only when no scale launch was snapshotted, or none ran with the gate at 0 (a
    live-mode capture). What the aux head receives is not captured (the rebuild decides it)."""
    found = gate_sites(ct, lambda alpha: bool(alpha == 0.0))
    if isinstance(found, Verdict):
        return found
    views, problems, d, closed = found.views, found.problems, found.dims, found.sites
    for site in closed:
        at = site_name(site)
        scale = site_scale(ct, site, views)
        if scale is None:
            problems.append(f"{at}: no {SCALE_KERNEL} at this call site: the wire is not gated")
        elif scale.wire_after is not None:
            after = scale.wire_after
            if after.hash != zeros_hash(after.elements, after.hash_kind):
                problems.append(f"{at}: ISV[393] = 0 but the scale left a wire row not +0.0")
            elif bit_mismatch(after.values, expected_wire(np.float32(0.0), after.values)).any():
                problems.append(f"{at}: ISV[393] = 0 but a kept wire value is not +0.0")
            if scale.body_same is False:
                problems.append(f"{at}: the scale changed columns other than the wire")
        try:
            acc, wire = wire_at_accumulate(ct, site, d.SH2)
        except Missing as exc:
            problems.append(f"missing data: {exc}")
            continue
        wrong = bit_mismatch(wire, expected_wire(np.float32(0.0), wire))
        if wrong.any():
            rows = int(wrong.sum())
            problems.append(
                f"{at}: ISV[393] = 0 but {rows} wire rows are not +0.0 when {named(acc)} reads them"
            )
    evidence = {"scale_launches": len(views), "gate_zero_sites": len(closed)}
    if problems:
        return failed_with(problems, **evidence)
    if not closed:
        return undecided("no call site ran with ISV[393] = 0.0 (a live-mode capture)")
    return passed(
        f"at {len(closed)} call sites with ISV[393] = 0.0 the wire column is +0.0 on every row "
        "after the scale (hash over all rows) and where the accumulate reads it; the other "
        "columns untouched",
        **evidence,
    )


INVARIANT = Invariant(
    code="EGF003",
    slug="wire-zero-under-sentinel",
    message="With ISV[393] = 0.0 the wire gradient must be exactly +0.0 and reach no aux head.",
    what=(
        "In every step where ISV[393] is 0.0 (the sentinel, and the fail-closed gate), column "
        "SH2 of sp14_d_dir_qaux_concat holds exactly +0.0 (bits 0x00000000) after "
        "sp14_scale_wire_col at both call sites, even when the upstream dX there is NaN, +Inf, "
        "-Inf or negative; and aux_wire_backward leaves d_aux_logits bitwise as it was (the CE "
        "gradient at the main site, zeros at the CQL site)."
    ),
    why=(
        "Gate 0 is the conservative safety state: before the producer is wired, and whenever it"
        " fails closed, no Q-head gradient may leak into the aux head. A plain multiply gives "
        "NaN * 0 = NaN and -g * 0 = -0.0, so only an explicit alpha == 0 branch closes the "
        "wire; an ungated call site or a scale on the wrong buffer leaves it open."
    ),
    how=(
        "Every production and replay step of the mode whose after_losses ISV[393] is 0.0 is "
        "checked (not the replay that removes the scale launch on purpose). The non-finite "
        "replay cycles NaN, +Inf, -Inf and -1 into the wire dX after backward_full, and the "
        "check first confirms that `cql:after_inject`/`main:after_inject` holds exactly those "
        "values. The wire column at `cql:after_scale`/`main:after_scale` is compared by bit "
        "pattern with +0.0; d_aux_logits at `cql:aux_after_wire`/`main:aux_after_wire` with "
        "`cql:aux_before_wire`/`main:aux_before_wire` by bit pattern too, except that -0.0 and "
        "+0.0 count as the same zero there: adding the closed wire's +0.0 to a -0.0 CE gradient"
        " (lambda_aux = 0) gives +0.0 in IEEE arithmetic, on the trainer as here, and delivers "
        "no gradient; any other change, NaN included, fails."
    ),
    catches=(
        "A missing scale launch, a call site left ungated, a scale pointed at the x concat or "
        "at dW, a scale without the alpha == 0 branch, and a scale given the wrong column."
    ),
    limits=(
        "It is judged only at steps whose ISV[393] is 0.0, and the NaN-safety only against the "
        "values the audit injects (NaN, +Inf, -Inf and -1 cycled over the rows); -0.0 and +0.0 "
        "in d_aux_logits count as the same zero. On a capture nothing is injected and what the "
        "aux head receives is not captured; a capture with no snapshot around the scale, or "
        "with no step at gate 0 (a live-mode run), is UNDECIDED."
    ),
    example=(
        "sp14_scale_wire_col computes *g = *g * a: with the sentinel gate a row whose upstream "
        "wire gradient is -0.02 ends as -0.0 (0x80000000), and an injected NaN stays NaN and "
        "poisons the aux head."
    ),
    check=check,
    capture=check_capture,
)
