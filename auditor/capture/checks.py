"""What a capture of the trainer's own process can decide, invariant by invariant.

Each check reads only the converted trace (launches, bindings, steps, call sites), the layout
and the recorder's snapshots. It never learns what process ran or which fault, if any, it has.
An invariant a capture cannot decide says why (UNDECIDED) instead of passing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from egf_audit.runtime.contract import (
    ALPHA_GRAD_SMOOTHED_INDEX,
    CONCAT_KERNEL,
    DIR_CONCAT,
    DIR_DX,
    POLYAK_KERNEL,
    SCALE_KERNEL,
    TARGET,
)
from egf_audit.runtime.trace import Launch

from .convert import CaptureTrace, Site
from .layout import contraction

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
POLYAK_ULPS = 2


@dataclass(frozen=True)
class CaptureVerdict:
    code: str
    status: str  # PASS, FAIL or UNDECIDED
    summary: str  # one line
    evidence: dict[str, Any] = field(default_factory=dict)


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def _sh2(ct: CaptureTrace) -> int | None:
    return ct.layout.dims.get("SH2")


def _writes(x: Launch, buffer: str) -> bool:
    return any(b.writes and b.region is not None and b.region.buffer == buffer for b in x.bindings)


def _zeroes(x: Launch, elements: int | None) -> bool:
    """A memset to 0 of at least `elements` elements."""
    if x.kind == "memset":
        return (
            x.args.get("value") == 0
            and elements is not None
            and x.args.get("bytes", 0) >= 4 * elements
        )
    return False


def on_dir_dx(b) -> bool:
    return b is not None and b.region is not None and b.region.buffer == DIR_DX


def _window(ct: CaptureTrace, site: Site) -> list[Launch]:
    return ct.trace.launches[site.begin : site.first_accumulate]


# ---- EGF001 / EGF011: GEMM extents ----
def _extent_problem(b, sh2: int | None) -> str | None:
    r = b.region
    if r is None:
        return None
    if not b.in_bounds:
        return f"reaches past the end of {r.buffer}"
    if b.tensor_shape is None:
        return None  # a placeholder (whole flat buffer): bounds only
    t_offset, t_rows, t_cols = b.tensor_shape
    if r.offset != t_offset:
        return f"starts {r.offset - t_offset} elements into {b.tensor}"
    if r.width != t_cols:
        return f"spans {r.width} of {t_cols} columns of {b.tensor}"
    if r.rows != t_rows:
        return f"spans {r.rows} of {t_rows} rows of {b.tensor}"
    if r.rows > 1 and r.ld != t_cols:
        return f"walks {b.tensor} with row stride {r.ld}, its row stride is {t_cols}"
    return None


def _k_sh2_signature(x: Launch, sh2: int | None) -> str | None:
    """The seed's bug without any layout: SH2 columns read or written with row stride SH2 + 1."""
    if sh2 is None:
        return None
    for role, (rows, width, ld) in _boxes(x).items():
        if rows > 1 and ld == sh2 + 1 and width == sh2:
            return f"operand {role} spans {sh2} columns with row stride {sh2 + 1} (K = SH2)"
    return None


def _boxes(x: Launch) -> dict[str, tuple[int, int, int]]:
    from egf_audit.runtime.recorder import gemm_operand_boxes

    a = x.args
    return gemm_operand_boxes(
        a["transa"], a["transb"], a["m"], a["n"], a["k"], a["lda"], a["ldb"], a["ldc"]
    )


def _gemm_facts(x: Launch, problem: str) -> dict[str, Any]:
    keys = ("transa", "transb", "m", "n", "k", "lda", "ldb", "ldc")
    return {"launch": x.index, "step": x.step, "label": x.label, "problem": problem} | {
        k: x.args.get(k) for k in keys
    }


def check_egf001(ct: CaptureTrace) -> CaptureVerdict:
    sh2 = _sh2(ct)
    gemms = [x for x in ct.trace.sgemms()]
    if not gemms:
        return CaptureVerdict("EGF001", FAIL, "the process recorded no cuBLAS GEMM at all")
    bad, unresolved, resolved, operands = [], [], 0, 0
    for x in gemms:
        if not x.bindings:
            unresolved.append(x.index)
            continue
        problem = _k_sh2_signature(x, sh2)
        for b in x.bindings:
            problem = problem or (
                _extent_problem(b, sh2) and f"operand {b.role} {_extent_problem(b, sh2)}"
            )
        if problem:
            bad.append(_gemm_facts(x, problem))
        operands += sum(b.region is not None for b in x.bindings)
        if all(b.region is not None for b in x.bindings):
            resolved += 1
        elif any(b.region is None for b in x.bindings):
            unresolved.append(x.index)
    kernels_bad = [
        {"launch": x.index, "label": x.label, "operand": b.role, "problem": "out of bounds"}
        for x in ct.trace.launches
        if x.kind == "kernel"
        for b in x.bindings
        if b.region is not None and not b.in_bounds
    ]
    evidence = {
        "gemms": len(gemms),
        "fully_resolved": resolved,
        "operands_resolved": operands,
        "with_unresolved_operands": len(unresolved),
        "unresolved_first": unresolved[:10],
    }
    if bad or kernels_bad:
        first = (bad or kernels_bad)[0]
        return CaptureVerdict(
            "EGF001",
            FAIL,
            f"{first['label']} (launch {first['launch']}): {first['problem']} "
            f"({len(bad)} GEMMs, {len(kernels_bad)} kernels offend)",
            evidence | {"first": first, "offending_gemms": bad[:20], "kernels": kernels_bad[:20]},
        )
    if operands == 0:
        return CaptureVerdict(
            "EGF001",
            UNDECIDED,
            f"no operand of {len(gemms)} GEMMs resolved to a named buffer",
            evidence,
        )
    return CaptureVerdict(
        "EGF001",
        PASS,
        f"{len(gemms)} GEMMs: {operands} resolved operands span their tensors ({resolved} GEMMs "
        f"fully resolved), none reads SH2 columns of a row stride SH2 + 1",
        evidence,
    )


def check_egf011(ct: CaptureTrace) -> CaptureVerdict:
    sh2 = _sh2(ct)
    if sh2 is None:
        return CaptureVerdict(
            "EGF011", UNDECIDED, f"no {CONCAT_KERNEL} launch and no layout: SH2 unknown"
        )
    hits = []
    for x in ct.trace.sgemms():
        if not x.bindings:
            continue
        signature = _k_sh2_signature(x, sh2)
        on_w = [
            b.role
            for b in x.bindings
            if b.tensor == "w_b0fc" or (b.region is not None and b.region.buffer == "goff_w_b0fc")
        ]
        if signature and (on_w or ct.layout.from_file is False):
            hits.append(_gemm_facts(x, signature))
    if hits:
        return CaptureVerdict(
            "EGF011",
            FAIL,
            f"{len(hits)} GEMMs take the K = SH2 path (first: {hits[0]['label']}, launch "
            f"{hits[0]['launch']}): a production call site reaches the legacy wrapper path",
            {"gemms": hits[:20]},
        )
    return CaptureVerdict("EGF011", PASS, "no GEMM takes the K = SH2 path on w_b0fc or the concat")


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


def _site_scales(ct: CaptureTrace) -> tuple[list[_Scale], list[str]]:
    """The scale launches, and the call sites that ran none (by `step@site`)."""
    scales = _scales(ct)
    missing = []
    for site in ct.sites:
        between = ct.trace.launches[site.begin : site.first_accumulate]
        if not any(x.kind == "kernel" and x.name == SCALE_KERNEL for x in between):
            missing.append(f"step {site.step} @{site.name}")
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
        nonzero = int((_bits(s.after) != 0).sum())
        if closed and nonzero:
            problems.append(f"{where}: ISV[393] = 0 but {nonzero} wire rows are not +0.0")
        elif not closed and (_bits(s.after) != _bits(np.float32(s.alpha) * s.before)).any():
            problems.append(f"{where}: the wire is not fl(alpha * g) bitwise")
        elif s.body_same is False:
            problems.append(f"{where}: columns other than the wire changed")
    problems += [f"{m}: no {SCALE_KERNEL} launch" for m in missing if int(m.split()[1]) in steps]
    evidence = {"scale_launches": len(wanted), "steps": sorted(steps), "problems": problems[:20]}
    if problems:
        return CaptureVerdict(code, FAIL, f"{problems[0]} ({len(problems)} findings)", evidence)
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


# ---- EGF005: the target net ----
def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ia, ib = _bits(a).astype(np.int64), _bits(b).astype(np.int64)
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
        and _writes(x, TARGET)
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
        return CaptureVerdict("EGF005", FAIL, f"{problems[0]} ({len(problems)} findings)", evidence)
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
        dw = [x for x in _window(ct, site) if x.kind == "sgemm" and _scratch_use(x) == "dw"]
        if not dw:
            problems.append(f"{where}: no GEMM reads the concat scratch as the d = 0 dW's x")
            continue
        writer = next(
            (y for y in reversed(launches[: dw[-1].index]) if _writes(y, DIR_CONCAT)), None
        )
        if writer is None or writer.name != CONCAT_KERNEL:
            problems.append(f"{where}: nothing rebuilt the concat scratch before the dW GEMM")
        elif writer.args.get("h_s2") != online:
            problems.append(
                f"{where}: the dW GEMM reads the concat built from another h_s2 (the target's), "
                f"not save_h_s2"
            )
    if problems:
        return CaptureVerdict(
            "EGF006", FAIL, f"{problems[0]} ({len(problems)} findings)", {"problems": problems}
        )
    return CaptureVerdict(
        "EGF006",
        PASS,
        f"at all {len(ct.sites)} call sites the d = 0 dW GEMM reads the online rebuild",
    )


def check_egf007(ct: CaptureTrace) -> CaptureVerdict:
    if not ct.sites:
        return _no_sites("EGF007")
    sh2 = _sh2(ct)
    d_h_s2 = ct.layout.buffers.get("d_h_s2")
    problems = []
    for site in ct.sites:
        where = f"step {site.step} @{site.name}"
        window = _window(ct, site)
        # backward_full starts with its first GEMM on the dir dX (or, without one, the
        # accumulate); the last zeroing of all of d_h_s2 must come before it
        start = next((x.index for x in window if x.kind == "sgemm" and _writes(x, DIR_DX)), None)
        start = site.first_accumulate if start is None else start
        zeroing = [
            x
            for x in window
            if x.index < start
            and _zeroes(x, d_h_s2.size if d_h_s2 else None)
            and _writes(x, "d_h_s2")
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
        return CaptureVerdict(
            "EGF007", FAIL, f"{problems[0]} ({len(problems)} findings)", {"problems": problems[:20]}
        )
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
        if (_bits(after["d_h_s2"].values[:n][keep]) != _bits(expect)).any():
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
        window = _window(ct, site)
        dx = [x for x in window if x.kind == "sgemm" and _writes(x, DIR_DX)]
        if not dx:
            problems.append(f"{where}: no dX GEMM writes {DIR_DX}")
            continue
        after = window[window.index(dx[-1]) + 1 :]
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
        return CaptureVerdict(
            "EGF008", FAIL, f"{problems[0]} ({len(problems)} findings)", {"problems": problems}
        )
    return CaptureVerdict(
        "EGF008",
        PASS,
        f"each of {len(ct.sites)} call sites scales its {DIR_DX} after its dX GEMM, "
        "before its accumulate",
    )


CHECKS: dict[str, Callable[[CaptureTrace], CaptureVerdict]] = {
    "EGF001": check_egf001,
    "EGF003": check_egf003,
    "EGF004": check_egf004,
    "EGF005": check_egf005,
    "EGF006": check_egf006,
    "EGF007": check_egf007,
    "EGF008": check_egf008,
    "EGF011": check_egf011,
    "EGF012": check_egf012,
}

# why a capture of one process cannot decide the others
UNDECIDABLE = {
    "EGF002": "needs the same step replayed with alpha in {0, 0.37, 1} and with the scale skipped; "
    "a capture records the trainer's one run and changes nothing",
    "EGF009": "Adam's m/v slices and the spectral-norm vectors are indexed inside the trainer's "
    "optimizer code; no launch argument the capture sees carries their shapes",
    "EGF010": "needs the trainer's weights, batch and gradients in full for an independent fp64 "
    "model; the capture keeps chosen regions only",
    "EGF013": "needs every buffer snapshotted around every launch; the capture snapshots the "
    "ABI kernels' regions only",
}


def decide(ct: CaptureTrace, codes: list[str]) -> list[CaptureVerdict]:
    out = []
    for code in codes:
        if code in CHECKS:
            out.append(CHECKS[code](ct))
        else:
            reason = UNDECIDABLE.get(code, "no capture-side check exists for it")
            out.append(CaptureVerdict(code, UNDECIDED, reason))
    return out
