"""EGF001 and EGF011 on a capture: every GEMM's extents against the tensors its pointers land
in, and the K = SH2 signature."""

from __future__ import annotations

from typing import Any

from egf_audit.invariants.egf001_gemm_k_matches_lda import span_problem
from egf_audit.runtime.contract import CONCAT_KERNEL
from egf_audit.runtime.recorder import gemm_operand_boxes
from egf_audit.runtime.trace import Binding, Launch

from .convert import CaptureTrace
from .verdict import (
    FAIL,
    PASS,
    UNDECIDED,
    CaptureVerdict,
    sh2_of,
)


def _extent_problem(b: Binding) -> str | None:
    """Why a resolved operand does not span its tensor's full logical extent, or None."""
    r = b.region
    if r is None:
        return None
    if not b.in_bounds:
        return f"reaches past the end of {r.buffer}"
    if b.tensor_shape is None:
        return None  # a placeholder (whole flat buffer): bounds only
    return span_problem(b)


def _k_sh2_signature(x: Launch, sh2: int | None) -> str | None:
    """The seed's bug without any layout: SH2 columns read or written with row stride SH2 + 1."""
    if sh2 is None:
        return None
    for role, (rows, width, ld) in _boxes(x).items():
        if rows > 1 and ld == sh2 + 1 and width == sh2:
            return f"operand {role} spans {sh2} columns with row stride {sh2 + 1} (K = SH2)"
    return None


def _boxes(x: Launch) -> dict[str, tuple[int, int, int]]:
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
    sh2 = sh2_of(ct)
    gemms = [x for x in ct.trace.sgemms()]
    if not gemms:
        return CaptureVerdict("EGF001", FAIL, "the process recorded no cuBLAS GEMM at all")
    bad, unresolved, resolved, operands = [], [], 0, 0
    for x in gemms:
        if not x.bindings:
            unresolved.append(x.index)
            continue
        problems = [f"operand {b.role} {p}" for b in x.bindings if (p := _extent_problem(b))]
        problem = _k_sh2_signature(x, sh2) or (problems[0] if problems else None)
        if problem:
            bad.append(_gemm_facts(x, problem))
        operands += sum(b.region is not None for b in x.bindings)
        if all(b.region is not None for b in x.bindings):
            resolved += 1
        else:
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
    sh2 = sh2_of(ct)
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
            f"{len(hits)} GEMMs take the legacy K = SH2 path on w_b0fc or the concat (first: "
            f"{hits[0]['label']}, launch {hits[0]['launch']})",
            {"gemms": hits[:20]},
        )
    return CaptureVerdict("EGF011", PASS, "no GEMM takes the K = SH2 path on w_b0fc or the concat")
