"""Forward pass and losses (kernels/CONTRACT.md, section 2, Forward and Losses), one launch per
line."""

from __future__ import annotations

from egf_audit.pipeline.gemm import gemm_xwt
from egf_audit.pipeline.instance import TrainerInstance
from egf_audit.pipeline.wiring import Width
from egf_audit.trace.contract import AUX_DOWN_INDEX, AUX_UP_INDEX, BRANCHES


def _names(net: str) -> tuple[str, str, str]:
    """(parameter buffer, activation prefix, input buffer) of the online or target net."""
    return ("params", "save", "obs") if net == "online" else ("target_params", "tgt", "next_obs")


def forward(p: TrainerInstance, net: str) -> None:
    d, rec = p.dims, p.rec
    params, pre, obs = _names(net)
    W = lambda name: p.ptr(params, name)  # noqa: E731
    A = lambda name: p.ptr(f"{pre}_{name}")  # noqa: E731
    softmax = "aux_nb_softmax_buf" if net == "online" else "tgt_aux_softmax"
    B, S2 = d.B, d.SH2

    # 1. trunk: h_s1 = relu(obs W_s1^T + b_s1), h_s2 = relu(h_s1 W_s2^T + b_s2)
    gemm_xwt(
        rec,
        f"forward_s1@{net}",
        A("h_s1"),
        p.ptr(obs),
        W("w_s1"),
        B,
        d.SH1,
        d.OBS,
        ld_x=d.OBS,
        ld_w=d.OBS,
        ld_y=d.SH1,
    )
    rec.kernel(
        f"forward_s1_bias_relu@{net}",
        "bias_act",  # writes h_s1 in place
        y=A("h_s1"),
        bias=W("b_s1"),
        rows=B,
        cols=d.SH1,
        relu=1,
    )
    gemm_xwt(
        rec,
        f"forward_s2@{net}",
        A("h_s2"),
        A("h_s1"),
        W("w_s2"),
        B,
        S2,
        d.SH1,
        ld_x=d.SH1,
        ld_w=d.SH1,
        ld_y=S2,
    )
    rec.kernel(
        f"forward_s2_bias_relu@{net}",
        "bias_act",  # writes h_s2 in place
        y=A("h_s2"),
        bias=W("b_s2"),
        rows=B,
        cols=S2,
        relu=1,
    )

    # 2. aux head: p = softmax(h_s2 W_aux^T + b_aux)
    gemm_xwt(
        rec,
        f"forward_aux@{net}",
        A("aux_logits"),
        A("h_s2"),
        W("w_aux"),
        B,
        d.AUXK,
        S2,
        ld_x=S2,
        ld_w=S2,
        ld_y=d.AUXK,
    )
    rec.kernel(
        f"forward_aux_bias@{net}",
        "bias_act",  # writes aux_logits in place
        y=A("aux_logits"),
        bias=W("b_aux"),
        rows=B,
        cols=d.AUXK,
        relu=0,
    )
    rec.kernel(
        f"forward_aux_softmax@{net}",
        "softmax_rows",  # writes the softmax buffer
        p=p.ptr(softmax),
        logits=A("aux_logits"),
        rows=B,
        cols=d.AUXK,
    )

    # 3-4. the wire p[up] - p[down], concatenated: [h_s2 | wire] -> the SHARED concat scratch.
    # The target forward overwrites the online concat here, as the trainer does.
    rec.kernel(
        f"forward_dir_concat_qaux@{net}",
        "sp14_dir_concat_qaux",
        concat=p.ptr("sp14_dir_qaux_concat_scratch"),
        h_s2=A("h_s2"),
        aux_softmax=p.ptr(softmax),
        rows=B,
        sh2=S2,
        auxk=d.AUXK,
        up_idx=AUX_UP_INDEX,
        down_idx=AUX_DOWN_INDEX,
    )

    # 5. branches: hid_d = relu(x_d W_bdfc^T + b), adv_d = hid_d W_bdout^T + b
    ctx = "ctx" if net == "online" else "next_ctx"
    for b in range(len(BRANCHES)):
        width = d.branch_in(b)
        if b == 0:
            x = p.ptr("sp14_dir_qaux_concat_scratch")
        else:
            x = A(f"b{b}_concat")
            rec.kernel(
                f"forward_concat_context[d={b}]@{net}",
                "concat_context",  # writes x_d
                out=x,
                h=A("h_s2"),
                ctx=p.ptr(f"{ctx}_b{b}"),
                rows=B,
                h_cols=S2,
                ctx_cols=d.E[b],
            )
        # ---- K of the dir SGEMM: SH2 + 1 against LDA = SH2 + 1 (B.9) ----
        k = S2 if (b == 0 and p.wiring.fwd_dir_k is Width.SH2) else width
        gemm_xwt(
            rec,
            f"forward_branch_fc[d={b}]@{net}",
            A(f"b{b}_hid"),
            x,
            W(f"w_b{b}fc"),
            B,
            d.ADV,
            k,
            ld_x=width,
            ld_w=width,
            ld_y=d.ADV,
        )
        rec.kernel(
            f"forward_branch_fc_bias_relu[d={b}]@{net}",
            "bias_act",  # writes hid_d
            y=A(f"b{b}_hid"),
            bias=W(f"b_b{b}fc"),
            rows=B,
            cols=d.ADV,
            relu=1,
        )
        gemm_xwt(
            rec,
            f"forward_branch_out[d={b}]@{net}",
            A(f"b{b}_adv"),
            A(f"b{b}_hid"),
            W(f"w_b{b}out"),
            B,
            d.A[b],
            d.ADV,
            ld_x=d.ADV,
            ld_w=d.ADV,
            ld_y=d.A[b],
        )
        rec.kernel(
            f"forward_branch_out_bias[d={b}]@{net}",
            "bias_act",  # writes adv_d
            y=A(f"b{b}_adv"),
            bias=W(f"b_b{b}out"),
            rows=B,
            cols=d.A[b],
            relu=0,
        )

    # 6. value stream and dueling: Q_d = V + A_d - mean_a A_d
    gemm_xwt(
        rec,
        f"forward_value_fc@{net}",
        A("v_hid"),
        A("h_s2"),
        W("w_v0"),
        B,
        d.VALH,
        S2,
        ld_x=S2,
        ld_w=S2,
        ld_y=d.VALH,
    )
    rec.kernel(
        f"forward_value_fc_bias_relu@{net}",
        "bias_act",  # writes v_hid
        y=A("v_hid"),
        bias=W("b_v0"),
        rows=B,
        cols=d.VALH,
        relu=1,
    )
    gemm_xwt(
        rec,
        f"forward_value_out@{net}",
        A("value"),
        A("v_hid"),
        W("w_v1"),
        B,
        1,
        d.VALH,
        ld_x=d.VALH,
        ld_w=d.VALH,
        ld_y=1,
    )
    rec.kernel(
        f"forward_value_out_bias@{net}",
        "bias_act",  # writes value
        y=A("value"),
        bias=W("b_v1"),
        rows=B,
        cols=1,
        relu=0,
    )
    for b in range(len(BRANCHES)):
        rec.kernel(
            f"forward_dueling[d={b}]@{net}",
            "dueling_combine",  # writes q_b{d}
            q=A(f"q_b{b}"),
            value=A("value"),
            adv=A(f"b{b}_adv"),
            rows=B,
            nact=d.A[b],
        )


def saved_activations(p: TrainerInstance) -> list[str]:
    """What the oracle and the invariants read after the forward pass."""
    names = ["sp14_dir_qaux_concat_scratch", "aux_nb_softmax_buf", "tgt_aux_softmax"]
    for pre in ("save", "tgt"):
        names += [f"{pre}_h_s1", f"{pre}_h_s2", f"{pre}_aux_logits", f"{pre}_v_hid", f"{pre}_value"]
        for b in range(len(BRANCHES)):
            names += [f"{pre}_b{b}_hid", f"{pre}_b{b}_adv", f"{pre}_q_b{b}"]
            if b:
                names.append(f"{pre}_b{b}_concat")
    return names


def losses(p: TrainerInstance) -> None:
    """TD targets from the target net, then dQ of both call sites (main: Huber TD; CQL aux)."""
    d, h, rec = p.dims, p.hyper, p.rec
    nb = len(BRANCHES)
    for b in range(nb):
        rec.kernel(
            f"td_target[d={b}]",
            "td_target",  # writes td_target[:, b], td_argmax[:, b]
            y=p.ptr("td_target"),
            argmax=p.ptr("td_argmax"),
            q_next=p.ptr(f"tgt_q_b{b}"),
            reward=p.ptr("reward"),
            done=p.ptr("done"),
            rows=d.B,
            nact=d.A[b],
            ld_out=nb,
            col=b,
            gamma=h.gamma,
        )
        rec.kernel(
            f"td_huber_grad[d={b}]",
            "td_huber_grad",  # writes dq_main_b{d}
            dq=p.ptr(f"dq_main_b{b}"),
            q=p.ptr(f"save_q_b{b}"),
            y=p.ptr("td_target"),
            actions=p.ptr("actions"),
            rows=d.B,
            nact=d.A[b],
            ld_y=nb,
            col=b,
            kappa=h.huber_kappa,
            scale=1.0 / d.B,
        )
        rec.kernel(
            f"cql_grad[d={b}]",
            "cql_grad",  # writes dq_cql_b{d}
            dq=p.ptr(f"dq_cql_b{b}"),
            q=p.ptr(f"save_q_b{b}"),
            actions=p.ptr("actions"),
            rows=d.B,
            nact=d.A[b],
            ld_act=nb,
            col=b,
            scale=h.lambda_cql / d.B,
        )
