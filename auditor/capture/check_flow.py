"""EGF005 to EGF008 on a capture: the target net, and the order of launches at each
backward_full call site."""

from __future__ import annotations

import numpy as np

from egf_audit.runtime.contract import (
    CONCAT_KERNEL,
    DIR_CONCAT,
    DIR_DX,
    POLYAK_KERNEL,
    SCALE_KERNEL,
    TARGET,
)
from egf_audit.runtime.trace import Launch

from .convert import CaptureTrace
from .layout import contraction
from .verdict import (
    PASS,
    POLYAK_ULPS,
    UNDECIDED,
    CaptureVerdict,
    bits,
    failed,
    on_dir_dx,
    sh2_of,
    window,
    writes,
    zeroes,
)


# ---- EGF005: the target net ----
def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ia, ib = bits(a).astype(np.int64), bits(b).astype(np.int64)
    ia = np.where(ia & 0x80000000, 0x80000000 - ia, ia)
    ib = np.where(ib & 0x80000000, 0x80000000 - ib, ib)
    return np.abs(ia - ib)


def check_egf005(ct: CaptureTrace) -> CaptureVerdict:
    if TARGET not in ct.layout.buffers:
        return CaptureVerdict(
            "EGF005", UNDECIDED, f"no {POLYAK_KERNEL} launch and no layout: target_params unknown"
        )
    first_gemm = next((x.index for x in ct.trace.sgemms()), len(ct.trace.launches))
    writers = [
        {"launch": x.index, "step": x.step, "label": x.label, "kind": x.kind}
        for x in ct.trace.launches
        if x.name != POLYAK_KERNEL
        and writes(x, TARGET)
        and not (x.kind in ("copy", "memset") and x.index < first_gemm)  # initialisation
    ]
    problems = [
        f"{w['label']} (launch {w['launch']}, step {w['step']}) writes target_params"
        for w in writers
    ]
    polyaks = [
        (x, r)
        for x, r in zip(ct.trace.launches, ct.records, strict=True)
        if x.name == POLYAK_KERNEL
    ]
    starts = {s.launch: s for s in ct.process.snapshots if s.when == "step_start"}
    checked = 0
    for x, r in polyaks:
        before, after = ct.process.regions(r.seq, "before"), ct.process.regions(r.seq, "after")
        start = max(
            (s for seq, s in starts.items() if seq < r.seq), key=lambda s: s.launch, default=None
        )
        if start is not None and "target" in before and start.hash != before["target"].hash:
            problems.append(
                f"step {x.step}: target_params changed between the step's start and Polyak"
            )
        if {"target", "online"} <= before.keys() and "target" in after:
            n = min(
                before["target"].values.size,
                before["online"].values.size,
                after["target"].values.size,
            )
            tau = np.float32(x.args["tau"])
            expect = (
                tau * before["online"].values[:n]
                + (np.float32(1) - tau) * before["target"].values[:n]
            )
            worst = int(_ulps(after["target"].values[:n], expect).max(initial=0))
            checked += n
            if worst > POLYAK_ULPS:
                problems.append(
                    f"step {x.step}: Polyak result is {worst} ulp from tau*params + (1-tau)*target"
                )
    evidence = {"polyak_launches": len(polyaks), "values_checked": checked, "writers": writers[:20]}
    if not polyaks:
        problems.append(f"no {POLYAK_KERNEL} launch")
    if problems:
        return failed("EGF005", problems, evidence)
    return CaptureVerdict(
        "EGF005",
        PASS,
        f"only {POLYAK_KERNEL} writes target_params ({len(polyaks)} launches); unchanged within "
        f"each step; Polyak within {POLYAK_ULPS} ulp on {checked} values",
        evidence,
    )


# ---- EGF006 / EGF007 / EGF008: the call sites ----
def _no_sites(code: str) -> CaptureVerdict:
    return CaptureVerdict(
        code, UNDECIDED, "no accumulate_d_h_s2_from_concat launch: no call site found"
    )


def _scratch_use(x: Launch) -> str | None:
    """ "forward" or "dw" for a GEMM reading the concat scratch, else None."""
    b = next(
        (
            b
            for b in x.bindings
            if b.role in ("A", "B") and b.region and b.region.buffer == DIR_CONCAT
        ),
        None,
    )
    if b is None:
        return None
    over = contraction(b.role, x.args["transa"], x.args["transb"])
    return "forward" if over == "columns" else "dw"


def check_egf006(ct: CaptureTrace) -> CaptureVerdict:
    if not ct.sites:
        return _no_sites("EGF006")
    if DIR_CONCAT not in ct.layout.buffers or "save_h_s2" not in ct.layout.buffers:
        return CaptureVerdict(
            "EGF006", UNDECIDED, f"no {CONCAT_KERNEL} launch: the concat scratch is unknown"
        )
    online = ct.layout.buffers["save_h_s2"].base
    problems, launches = [], ct.trace.launches
    for site in ct.sites:
        where = f"step {site.step} @{site.name}"
        dw = [x for x in window(ct, site) if x.kind == "sgemm" and _scratch_use(x) == "dw"]
        if not dw:
            problems.append(f"{where}: no GEMM reads the concat scratch as the d = 0 dW's x")
            continue
        writer = next(
            (y for y in reversed(launches[: dw[-1].index]) if writes(y, DIR_CONCAT)), None
        )
        if writer is None or writer.name != CONCAT_KERNEL:
            problems.append(f"{where}: nothing rebuilt the concat scratch before the dW GEMM")
        elif writer.args.get("h_s2") != online:
            problems.append(
                f"{where}: the dW GEMM reads the concat built from another h_s2 (the target's), "
                f"not save_h_s2"
            )
    if problems:
        return failed("EGF006", problems, {"problems": problems})
    return CaptureVerdict(
        "EGF006",
        PASS,
        f"at all {len(ct.sites)} call sites the d = 0 dW GEMM reads the online rebuild",
    )


def check_egf007(ct: CaptureTrace) -> CaptureVerdict:
    if not ct.sites:
        return _no_sites("EGF007")
    sh2 = sh2_of(ct)
    d_h_s2 = ct.layout.buffers.get("d_h_s2")
    problems = []
    for site in ct.sites:
        where = f"step {site.step} @{site.name}"
        launches = window(ct, site)
        # backward_full starts with its first GEMM on the dir dX (or, without one, the
        # accumulate); the last zeroing of all of d_h_s2 must come before it
        start = next((x.index for x in launches if x.kind == "sgemm" and writes(x, DIR_DX)), None)
        start = site.first_accumulate if start is None else start
        zeroing = [
            x
            for x in launches
            if x.index < start
            and zeroes(x, d_h_s2.size if d_h_s2 else None)
            and writes(x, "d_h_s2")
        ]
        if not zeroing:
            problems.append(f"{where}: d_h_s2 is not zeroed before backward_full")
        for x in ct.trace.launches[site.first_accumulate : site.end + 1]:
            dx = next((b for b in x.bindings if b.role == "d_concat"), None)
            if x.args.get("sh2") != sh2:
                problems.append(
                    f"{where}: {x.label} adds {x.args.get('sh2')} columns, SH2 is {sh2}"
                )
            elif on_dir_dx(dx) and x.args.get("ld_concat") != sh2 + 1:
                ld = x.args.get("ld_concat")
                problems.append(f"{where}: {x.label} reads {DIR_DX} with row stride {ld}")
    problems += _accumulate_values(ct)
    if problems:
        return failed("EGF007", problems, {"problems": problems[:20]})
    return CaptureVerdict(
        "EGF007",
        PASS,
        f"at all {len(ct.sites)} call sites d_h_s2 is zeroed before backward_full and the "
        f"accumulates add SH2 columns only, bitwise on the values kept",
    )


def _accumulate_values(ct: CaptureTrace) -> list[str]:
    """after == before + d_concat[:, :sh2], bitwise, on the elements the snapshots kept."""
    problems = []
    for x, r in zip(ct.trace.launches, ct.records, strict=True):
        if x.kind != "kernel" or x.name != "accumulate_d_h_s2_from_concat" or "sh2" not in x.args:
            continue
        before, after = ct.process.regions(r.seq, "before"), ct.process.regions(r.seq, "after")
        if not ({"d_h_s2", "d_concat"} <= before.keys() and "d_h_s2" in after):
            continue
        sh2, ld = x.args["sh2"], x.args["ld_concat"]
        n = min(before["d_h_s2"].values.size, after["d_h_s2"].values.size)
        idx = np.arange(n)
        src = (idx // sh2) * ld + idx % sh2
        keep = src < before["d_concat"].values.size
        expect = before["d_h_s2"].values[:n][keep] + before["d_concat"].values[src[keep]]
        if (bits(after["d_h_s2"].values[:n][keep]) != bits(expect)).any():
            problems.append(
                f"step {x.step} {x.label}: d_h_s2 after is not before + d_concat[:, :SH2]"
            )
    return problems


def check_egf008(ct: CaptureTrace) -> CaptureVerdict:
    if not ct.sites:
        return _no_sites("EGF008")
    dx_buf = ct.layout.buffers.get(DIR_DX)
    problems = []
    for site in ct.sites:
        where = f"step {site.step} @{site.name}"
        launches = window(ct, site)
        dx = [x for x in launches if x.kind == "sgemm" and writes(x, DIR_DX)]
        if not dx:
            problems.append(f"{where}: no dX GEMM writes {DIR_DX}")
            continue
        after = launches[launches.index(dx[-1]) + 1 :]
        scaled = [
            x
            for x in after
            if x.name == SCALE_KERNEL
            and dx_buf is not None
            and x.args.get("dx_concat") == dx_buf.base
        ]
        if not scaled:
            problems.append(
                f"{where}: no {SCALE_KERNEL} on {DIR_DX} between its dX GEMM and its accumulate"
            )
    if problems:
        return failed("EGF008", problems, {"problems": problems})
    return CaptureVerdict(
        "EGF008",
        PASS,
        f"each of {len(ct.sites)} call sites scales its {DIR_DX} after its dX GEMM, "
        "before its accumulate",
    )
