"""EGF003, EGF004 and EGF012 on a capture: the wire gate, from the snapshots the recorder takes
around each sp14_scale_wire_col launch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from egf_audit.runtime.contract import (
    ALPHA_GRAD_SMOOTHED_INDEX,
    DIR_DX,
    SCALE_KERNEL,
)
from egf_audit.runtime.trace import Launch

from .convert import CaptureTrace, Site
from .verdict import (
    FAIL,
    PASS,
    UNDECIDED,
    CaptureVerdict,
    bits,
    failed,
)


# ---- EGF003 / EGF004 / EGF012: the scale snapshots ----
@dataclass
class _Scale:
    launch: Launch
    alpha: np.float32 | None
    before: np.ndarray | None
    after: np.ndarray | None
    body_same: bool | None


def _scales(ct: CaptureTrace) -> list[_Scale]:
    out = []
    for x, r in zip(ct.trace.launches, ct.records, strict=True):
        if x.kind != "kernel" or x.name != SCALE_KERNEL:
            continue
        before, after = ct.process.regions(r.seq, "before"), ct.process.regions(r.seq, "after")
        alpha = before.get("alpha")
        same = None
        if "body" in before and "body" in after:
            same = before["body"].hash == after["body"].hash
        out.append(
            _Scale(
                x,
                np.float32(alpha.values[0]) if alpha is not None and alpha.values.size else None,
                before["wire"].values if "wire" in before else None,
                after["wire"].values if "wire" in after else None,
                same,
            )
        )
    return out


def _site_scales(ct: CaptureTrace) -> tuple[list[_Scale], list[Site]]:
    """The scale launches, and the call sites that ran none."""
    scales = _scales(ct)
    missing = []
    for site in ct.sites:
        between = ct.trace.launches[site.begin : site.first_accumulate]
        if not any(x.kind == "kernel" and x.name == SCALE_KERNEL for x in between):
            missing.append(site)
    return scales, missing


def _wire_target_problem(ct: CaptureTrace, s: _Scale) -> str | None:
    a = s.launch.args
    if a.get("wire_col") != a.get("ld", 0) - 1:
        return f"scales column {a.get('wire_col')}, the wire is column {a.get('ld', 0) - 1}"
    if a.get("isv_index") != ALPHA_GRAD_SMOOTHED_INDEX:
        return f"reads ISV[{a.get('isv_index')}], the gate is ISV[{ALPHA_GRAD_SMOOTHED_INDEX}]"
    target = next((b for b in s.launch.bindings if b.role == "dx_concat"), None)
    if target is not None and target.region is not None and target.region.buffer != DIR_DX:
        return f"scales {target.region.buffer}, not {DIR_DX}"
    return None


def _gate_check(ct: CaptureTrace, code: str, closed: bool) -> CaptureVerdict:
    scales, missing = _site_scales(ct)
    if not scales and not ct.sites:
        return CaptureVerdict(code, UNDECIDED, "no call site and no scale launch was recorded")
    if not scales:
        return CaptureVerdict(code, FAIL, f"no {SCALE_KERNEL} launch: the wire is never gated")
    # what the launch arguments alone show, snapshots or not
    problems = [
        f"step {s.launch.step} {s.launch.label}: {p}"
        for s in scales
        if (p := _wire_target_problem(ct, s)) is not None
    ]
    if not problems and any(s.alpha is None or s.before is None or s.after is None for s in scales):
        return CaptureVerdict(
            code, UNDECIDED, f"the capture has no snapshots around {SCALE_KERNEL}"
        )
    wanted = [s for s in scales if s.alpha is not None and (s.alpha == 0) == closed]
    steps = {s.launch.step for s in wanted}
    for s in wanted:
        where = f"step {s.launch.step} {s.launch.label}"
        if s.before is None or s.after is None:
            continue
        nonzero = int((bits(s.after) != 0).sum())
        if closed and nonzero:
            problems.append(f"{where}: ISV[393] = 0 but {nonzero} wire rows are not +0.0")
        elif not closed and (bits(s.after) != bits(np.float32(s.alpha) * s.before)).any():
            problems.append(f"{where}: the wire is not fl(alpha * g) bitwise")
        elif s.body_same is False:
            problems.append(f"{where}: columns other than the wire changed")
    problems += [
        f"step {m.step} @{m.name}: no {SCALE_KERNEL} launch" for m in missing if m.step in steps
    ]
    evidence = {"scale_launches": len(wanted), "steps": sorted(steps), "problems": problems[:20]}
    if problems:
        return failed(code, problems, evidence)
    if not wanted:
        mode = "ISV[393] = 0 (sentinel)" if closed else "ISV[393] in (0, 1] (live)"
        return CaptureVerdict(code, UNDECIDED, f"no scale launch ran with {mode}")
    what = "the wire column is exactly +0.0" if closed else "the wire column is fl(alpha * g)"
    return CaptureVerdict(
        code, PASS, f"{len(wanted)} scale launches: {what}, the other columns untouched", evidence
    )


def check_egf003(ct: CaptureTrace) -> CaptureVerdict:
    return _gate_check(ct, "EGF003", closed=True)


def check_egf004(ct: CaptureTrace) -> CaptureVerdict:
    return _gate_check(ct, "EGF004", closed=False)


def check_egf012(ct: CaptureTrace) -> CaptureVerdict:
    alphas = [s.alpha for s in _scales(ct) if s.alpha is not None]
    if not alphas:
        return CaptureVerdict("EGF012", UNDECIDED, "no snapshot of ISV[393] at a scale launch")
    bad = [float(a) for a in alphas if not (np.isfinite(a) and 0.0 <= a <= 1.0)]
    evidence = {"alphas": [float(a) for a in alphas[:20]]}
    if bad:
        return CaptureVerdict(
            "EGF012", FAIL, f"the scale read ISV[393] = {bad[0]}, outside [0, 1]", evidence
        )
    return CaptureVerdict(
        "EGF012",
        PASS,
        f"every one of {len(alphas)} scale launches read a finite gate in [0, 1]",
        evidence,
    )
