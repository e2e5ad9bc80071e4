"""`backward_full` (branch heads and value stream, with the legacy wrapper path when both new
pointers are 0) and the trunk backward from d_h_s2: what a call site (pipeline/call_site.py)
runs at its steps 3 and 6."""

from __future__ import annotations

from egf_audit.pipeline.gemm import gemm_colsum, gemm_dw, gemm_dx
from egf_audit.pipeline.instance import TrainerInstance
from egf_audit.pipeline.wiring import DwInput, Width
from egf_audit.trace.contract import (
    BRANCHES,
    WRAPPER_PREFIX,
)


def backward_full(
    p: TrainerInstance, site: str, dq: str, dir_qaux_concat_ptr: int, d_dir_qaux_concat_ptr: int
) -> None:
    """Branch heads and value stream. With both trailing pointers 0 this is the legacy wrapper
    path: the d = 0 branch falls back to K = SH2 on (save_h_s2, d_h_s2), dropping the wire."""
    d, rec, w = p.dims, p.rec, p.wiring
    B, S2 = d.B, d.SH2
    wrapper = dir_qaux_concat_ptr == 0 and d_dir_qaux_concat_ptr == 0
    pre = WRAPPER_PREFIX if wrapper else ""
    ones = p.ptr("ones_b")
    rec.memset_zero(f"{pre}zero_d_value@{site}", p.ptr("d_value"), B)
    for b in range(len(BRANCHES)):
        tag = f"[d={b}]@{site}"
        d_adv, d_hid, hid = p.ptr(f"d_b{b}_adv"), p.ptr(f"d_b{b}_hid"), p.ptr(f"save_b{b}_hid")
        rec.kernel(
            f"{pre}dueling_backward{tag}",
            "dueling_backward",  # writes d_adv, d_value +=
            d_adv=d_adv,
            d_value=p.ptr("d_value"),
            dq=p.ptr(f"{dq}_b{b}"),
            rows=B,
            nact=d.A[b],
        )
        gemm_colsum(
            rec, f"{pre}backward_branch_out_db{tag}", p.goff(f"b_b{b}out"), d_adv, ones, B, d.A[b]
        )
        gemm_dw(
            rec,
            f"{pre}backward_branch_out_dw{tag}",
            p.goff(f"w_b{b}out"),
            d_adv,
            hid,
            B,
            d.A[b],
            d.ADV,
            ld_x=d.ADV,
            ld_dy=d.A[b],
            ld_dw=d.ADV,
        )
        gemm_dx(
            rec,
            f"{pre}backward_branch_out_dx{tag}",
            d_hid,
            d_adv,
            p.poff(f"w_b{b}out"),
            B,
            d.ADV,
            d.A[b],
            ld_w=d.ADV,
            ld_dy=d.A[b],
            ld_dx=d.ADV,
        )
        rec.kernel(
            f"{pre}relu_backward_branch{tag}",
            "relu_backward",  # writes d_hid
            dy=d_hid,
            act=hid,
            n=B * d.ADV,
        )
        gemm_colsum(
            rec, f"{pre}backward_branch_db{tag}", p.goff(f"b_b{b}fc"), d_hid, ones, B, d.ADV
        )
        width = d.branch_in(b)
        if b > 0:
            x, dx, k_dw, k_dx, ld_x, ld_dx, beta = (
                p.ptr(f"save_b{b}_concat"),
                p.ptr(f"sp14_d_b{b}_concat"),
                width,
                width,
                width,
                width,
                0.0,
            )
        elif wrapper:  # legacy: K = SH2 against LDA = SH2 + 1; dX straight into d_h_s2 (beta 0)
            x, dx, k_dw, k_dx, ld_x, ld_dx, beta = (
                p.ptr("save_h_s2"),
                p.ptr("d_h_s2"),
                S2,
                S2,
                S2,
                S2,
                0.0,
            )
        else:
            # ---- B.10: dW from (dir_qaux_concat_ptr, SH2 + 1); dX into d_dir_qaux_concat ----
            x, ld_x, k_dw = dir_qaux_concat_ptr, width, width
            if w.dw_dir_x is DwInput.H_S2:  # the pre-B.10 dW: (save_h_s2, SH2)
                x, ld_x, k_dw = p.ptr("save_h_s2"), S2, S2
            dx, ld_dx, beta = d_dir_qaux_concat_ptr, width, 0.0
            k_dx = S2 if w.dx_dir_k is Width.SH2 else width
        gemm_dw(
            rec,
            f"{pre}backward_branch_dw{tag}",
            p.goff(f"w_b{b}fc"),
            d_hid,
            x,
            B,
            d.ADV,
            k_dw,
            ld_x=ld_x,
            ld_dy=d.ADV,
            ld_dw=width,
        )
        gemm_dx(
            rec,
            f"{pre}backward_branch_dx{tag}",
            dx,
            d_hid,
            p.poff(f"w_b{b}fc"),
            B,
            k_dx,
            d.ADV,
            ld_w=width,
            ld_dy=d.ADV,
            ld_dx=ld_dx,
            beta=beta,
        )

    # value stream; its FC dX accumulates into d_h_s2 (beta = 1)
    vtag = f"@{site}"
    gemm_colsum(
        rec, f"{pre}backward_value_out_db{vtag}", p.goff("b_v1"), p.ptr("d_value"), ones, B, 1
    )
    value_dw_base = str(w.value_dw_base)  # the buffer's name
    gemm_dw(
        rec,
        f"{pre}backward_value_out_dw{vtag}",
        p.ptr(value_dw_base, "w_v1"),
        p.ptr("d_value"),
        p.ptr("save_v_hid"),
        B,
        1,
        d.VALH,
        ld_x=d.VALH,
        ld_dy=1,
        ld_dw=d.VALH,
    )
    gemm_dx(
        rec,
        f"{pre}backward_value_out_dx{vtag}",
        p.ptr("d_v_hid"),
        p.ptr("d_value"),
        p.poff("w_v1"),
        B,
        d.VALH,
        1,
        ld_w=d.VALH,
        ld_dy=1,
        ld_dx=d.VALH,
    )
    rec.kernel(
        f"{pre}relu_backward_value{vtag}",
        "relu_backward",  # writes d_v_hid
        dy=p.ptr("d_v_hid"),
        act=p.ptr("save_v_hid"),
        n=B * d.VALH,
    )
    gemm_colsum(
        rec, f"{pre}backward_value_fc_db{vtag}", p.goff("b_v0"), p.ptr("d_v_hid"), ones, B, d.VALH
    )
    gemm_dw(
        rec,
        f"{pre}backward_value_fc_dw{vtag}",
        p.goff("w_v0"),
        p.ptr("d_v_hid"),
        p.ptr("save_h_s2"),
        B,
        d.VALH,
        S2,
        ld_x=S2,
        ld_dy=d.VALH,
        ld_dw=S2,
    )
    gemm_dx(
        rec,
        f"{pre}backward_value_fc_dx{vtag}",
        p.ptr("d_h_s2"),
        p.ptr("d_v_hid"),
        p.poff("w_v0"),
        B,
        S2,
        d.VALH,
        ld_w=S2,
        ld_dy=d.VALH,
        ld_dx=S2,
        beta=1.0,
    )


def trunk_backward(p: TrainerInstance, site: str) -> None:
    d, rec = p.dims, p.rec
    B, S2, ones = d.B, d.SH2, p.ptr("ones_b")
    rec.kernel(
        f"relu_backward_s2@{site}",
        "relu_backward",  # writes d_h_s2
        dy=p.ptr("d_h_s2"),
        act=p.ptr("save_h_s2"),
        n=B * S2,
    )
    gemm_colsum(rec, f"backward_s2_db@{site}", p.goff("b_s2"), p.ptr("d_h_s2"), ones, B, S2)
    gemm_dw(
        rec,
        f"backward_s2_dw@{site}",
        p.goff("w_s2"),
        p.ptr("d_h_s2"),
        p.ptr("save_h_s1"),
        B,
        S2,
        d.SH1,
        ld_x=d.SH1,
        ld_dy=S2,
        ld_dw=d.SH1,
    )
    gemm_dx(
        rec,
        f"backward_s2_dx@{site}",
        p.ptr("d_h_s1"),
        p.ptr("d_h_s2"),
        p.poff("w_s2"),
        B,
        d.SH1,
        S2,
        ld_w=d.SH1,
        ld_dy=S2,
        ld_dx=d.SH1,
    )
    rec.kernel(
        f"relu_backward_s1@{site}",
        "relu_backward",  # writes d_h_s1
        dy=p.ptr("d_h_s1"),
        act=p.ptr("save_h_s1"),
        n=B * d.SH1,
    )
    gemm_colsum(rec, f"backward_s1_db@{site}", p.goff("b_s1"), p.ptr("d_h_s1"), ones, B, d.SH1)
    gemm_dw(
        rec,
        f"backward_s1_dw@{site}",
        p.goff("w_s1"),
        p.ptr("d_h_s1"),
        p.ptr("obs"),
        B,
        d.SH1,
        d.OBS,
        ld_x=d.OBS,
        ld_dy=d.SH1,
        ld_dw=d.OBS,
    )
