"""Backward, per call site, in the seed's order (kernels/CONTRACT.md, section 2, Backward):

1. sp14_dir_concat_qaux(save_h_s2) rebuilds the ONLINE concat in the scratch
2. memset d_h_s2 = 0
3. backward_full(dQ, dir_qaux_concat_ptr, d_dir_qaux_concat_ptr)
4. sp14_scale_wire_col: d_dir_qaux_concat[:, SH2] *= ISV[393]
5. accumulate_d_h_s2_from_concat for every branch (the wire column stays put)
6. the gated wire gradient into the aux head, then the trunk backward from d_h_s2
"""

from __future__ import annotations

import numpy as np

from egf_audit.pipeline.backward import backward_full, trunk_backward
from egf_audit.pipeline.gemm import gemm_colsum, gemm_dw, gemm_dx
from egf_audit.pipeline.instance import Probes, TrainerInstance
from egf_audit.pipeline.wiring import BackwardEntry, ScaleTarget, Width
from egf_audit.trace.contract import (
    AFTER_ACCUMULATE,
    AFTER_BACKWARD_FULL,
    AFTER_INJECT,
    AFTER_SCALE,
    ALPHA_GRAD_SMOOTHED_INDEX,
    AUX_AFTER_WIRE,
    AUX_BEFORE_WIRE,
    AUX_DOWN_INDEX,
    AUX_UP_INDEX,
    BEFORE_BACKWARD_FULL,
    BRANCHES,
    NONFINITE_PATTERN,
    TRUNK_ENTRY,
    site_checkpoint,
)


def call_site(p: TrainerInstance, site: str, probes: Probes) -> None:
    d, rec, w = p.dims, p.rec, p.wiring
    B, S2 = d.B, d.SH2
    concat, d_concat = p.ptr("sp14_dir_qaux_concat_scratch"), p.ptr("sp14_d_dir_qaux_concat")

    # 1. the forward pass left the TARGET concat in the scratch: rebuild the online one
    if w.rebuild_online_concat:
        rec.kernel(
            f"rebuild_online_concat@{site}",
            "sp14_dir_concat_qaux",  # writes the scratch
            concat=concat,
            h_s2=p.ptr("save_h_s2"),
            aux_softmax=p.ptr("aux_nb_softmax_buf"),
            rows=B,
            sh2=S2,
            auxk=d.AUXK,
            up_idx=AUX_UP_INDEX,
            down_idx=AUX_DOWN_INDEX,
        )
    # 2. the value-FC dX accumulates into d_h_s2 with beta = 1: give it a zero baseline
    if w.zero_d_h_s2:
        rec.memset_zero(f"zero_d_h_s2@{site}", p.ptr("d_h_s2"), B * S2)
    rec.checkpoint(
        site_checkpoint(site, BEFORE_BACKWARD_FULL), ["sp14_dir_qaux_concat_scratch", "d_h_s2"]
    )

    # 3.
    if site == "main" and w.main_site_backward is BackwardEntry.WRAPPER:
        backward_full(p, site, f"dq_{site}", 0, 0)
    else:
        backward_full(p, site, f"dq_{site}", concat, d_concat)
    rec.checkpoint(
        site_checkpoint(site, AFTER_BACKWARD_FULL), ["sp14_d_dir_qaux_concat", "d_h_s2", "grad_buf"]
    )
    if probes.inject_wire_nonfinite:
        values = np.resize(np.array(NONFINITE_PATTERN, np.float32), B)
        rec.upload(
            f"audit:inject_nonfinite@{site}",
            p.ptr("sp14_d_dir_qaux_concat", element=S2),
            values,
            stride=S2 + 1,
        )
        rec.checkpoint(site_checkpoint(site, AFTER_INJECT), ["sp14_d_dir_qaux_concat"])

    # 4. ---- the wire gate: scale d_dir_qaux_concat[:, SH2] by ISV[393], after dW and dX ----
    if site in w.scale_sites and w.scale_target is not ScaleTarget.NONE:
        target, rows, ld = {
            ScaleTarget.D_CONCAT: (d_concat, B, S2 + 1),
            ScaleTarget.X_CONCAT: (concat, B, S2 + 1),
            ScaleTarget.DW_WIRE_COL: (p.goff("w_b0fc"), d.ADV, S2 + 1),
        }[w.scale_target]
        rec.kernel(
            f"sp14_scale_wire_col@{site}",
            "sp14_scale_wire_col",  # writes target[:, col]
            dx_concat=target,
            isv=p.ptr("isv_signals"),
            rows=rows,
            ld=ld,
            wire_col=S2 + w.scale_col_offset,
            isv_index=ALPHA_GRAD_SMOOTHED_INDEX,
        )
    rec.checkpoint(site_checkpoint(site, AFTER_SCALE), ["sp14_d_dir_qaux_concat", "grad_buf"])

    # 5. d_h_s2 += d_concat_d[:, :SH2] for every branch; the wire column stays in d_concat
    for b in range(len(BRANCHES)):
        src = d_concat if b == 0 else p.ptr(f"sp14_d_b{b}_concat")
        ld = d.branch_in(b)
        if b == 0 and w.accumulate_dir_ld is Width.SH2:
            ld = S2
        rec.kernel(
            f"accumulate_d_h_s2_from_concat[d={b}]@{site}",
            "accumulate_d_h_s2_from_concat",  # writes d_h_s2 (+=)
            d_h_s2=p.ptr("d_h_s2"),
            d_concat=src,
            rows=B,
            sh2=S2,
            ld_concat=ld,
        )
    rec.checkpoint(site_checkpoint(site, AFTER_ACCUMULATE), ["d_h_s2"])

    # 6. aux head: CE gradient (main site only), plus the gated wire gradient
    if site == "main":
        rec.kernel(
            f"aux_ce_grad@{site}",
            "aux_ce_grad",  # writes d_aux_logits
            d_logits=p.ptr("d_aux_logits"),
            p=p.ptr("aux_nb_softmax_buf"),
            labels=p.ptr("aux_label"),
            rows=B,
            auxk=d.AUXK,
            scale=p.hyper.lambda_aux / B,
        )
    else:
        rec.memset_zero(f"zero_d_aux_logits@{site}", p.ptr("d_aux_logits"), B * d.AUXK)
    rec.checkpoint(site_checkpoint(site, AUX_BEFORE_WIRE), ["d_aux_logits"])
    rec.kernel(
        f"aux_wire_backward@{site}",
        "aux_wire_backward",  # writes d_aux_logits (+=)
        d_logits=p.ptr("d_aux_logits"),
        p=p.ptr("aux_nb_softmax_buf"),
        d_concat=d_concat,
        rows=B,
        auxk=d.AUXK,
        ld=S2 + 1,
        wire_col=S2,
        up_idx=AUX_UP_INDEX,
        down_idx=AUX_DOWN_INDEX,
    )
    rec.checkpoint(site_checkpoint(site, AUX_AFTER_WIRE), ["d_aux_logits"])
    ones = p.ptr("ones_b")
    gemm_colsum(
        rec, f"backward_aux_db@{site}", p.goff("b_aux"), p.ptr("d_aux_logits"), ones, B, d.AUXK
    )
    gemm_dw(
        rec,
        f"backward_aux_dw@{site}",
        p.goff("w_aux"),
        p.ptr("d_aux_logits"),
        p.ptr("save_h_s2"),
        B,
        d.AUXK,
        S2,
        ld_x=S2,
        ld_dy=d.AUXK,
        ld_dw=S2,
    )
    gemm_dx(
        rec,
        f"backward_aux_dx@{site}",
        p.ptr("d_h_s2"),
        p.ptr("d_aux_logits"),
        p.poff("w_aux"),
        B,
        S2,
        d.AUXK,
        ld_w=S2,
        ld_dy=d.AUXK,
        ld_dx=S2,
        beta=1.0,
    )
    rec.checkpoint(
        site_checkpoint(site, TRUNK_ENTRY),
        [
            "d_h_s2",
            "d_v_hid",
            "d_aux_logits",
            "sp14_d_dir_qaux_concat",
            *[f"sp14_d_b{b}_concat" for b in range(1, len(BRANCHES))],
        ],
    )
    trunk_backward(p, site)
