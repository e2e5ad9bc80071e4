"""Update (kernels/CONTRACT.md, section 2): the gate producer (live mode), Adam, the
spectral-norm projection of w_b0fc, and Polyak averaging of the target network."""

from __future__ import annotations

import numpy as np

from egf_audit.pipeline.gemm import gemm_dot, gemm_dx, gemm_xwt
from egf_audit.pipeline.instance import TrainerInstance
from egf_audit.pipeline.wiring import PolyakBlend
from egf_audit.trace.contract import ALPHA_GRAD_SMOOTHED_INDEX, param_shapes


def gate_producer(p: TrainerInstance, label: str = "gate") -> None:
    """alpha_grad_compute: the smoothed gate from the aux head's batch accuracy -> ISV[393]."""
    d, rec = p.dims, p.rec
    rec.kernel(
        f"{label}:aux_label_prob",
        "aux_label_prob",  # writes aux_label_prob
        prob=p.ptr("aux_label_prob"),
        p=p.ptr("aux_nb_softmax_buf"),
        labels=p.ptr("aux_label"),
        rows=d.B,
        auxk=d.AUXK,
    )
    gemm_dot(
        rec,
        f"{label}:prob_sum",
        p.ptr("gate_prob_sum"),
        p.ptr("aux_label_prob"),
        p.ptr("ones_b"),
        d.B,
    )
    rec.kernel(
        f"{label}:alpha_grad_compute",
        "alpha_grad_compute",  # writes ISV[393]
        isv=p.ptr("isv_signals"),
        prob_sum=p.ptr("gate_prob_sum"),
        rows=d.B,
        auxk=d.AUXK,
        isv_index=ALPHA_GRAD_SMOOTHED_INDEX,
        ema=p.hyper.gate_ema,
    )


def adam(p: TrainerInstance) -> None:
    """One launch per parameter tensor; m and v are addressed through their own offset table."""
    h, rec = p.hyper, p.rec
    # from the fp32 betas the kernel multiplies with: near 1, 1 - beta and 1 - beta^t cancel, and
    # a correction from the unrounded beta would not undo the kernel's (1 - fp32(beta)) factor
    bc1 = 1.0 - float(np.float32(h.beta1)) ** p.adam_t
    bc2 = 1.0 - float(np.float32(h.beta2)) ** p.adam_t
    state = p.layout.buffer("adam_m")
    for name, _, _ in param_shapes(p.dims):
        n = state.tensor(name).size  # the state table decides how many elements are updated
        rec.kernel(
            f"adam[{name}]",
            "adam_update",  # writes params, adam_m, adam_v slices
            param=p.poff(name),
            grad=p.goff(name),
            m=p.ptr("adam_m", name),
            v=p.ptr("adam_v", name),
            n=n,
            lr=h.lr,
            beta1=h.beta1,
            beta2=h.beta2,
            eps=h.eps,
            bc1=bc1,
            bc2=bc2,
        )


def spectral_norm(p: TrainerInstance) -> None:
    """One power iteration on (u, v) of w_b0fc [ADV, SH2 + 1]; if sigma > sigma_max, scale W by
    sigma_max / sigma."""
    d, rec = p.dims, p.rec
    w = p.poff("w_b0fc")
    width = d.branch_in(0)
    v_len = p.layout.buffer("sn_state").tensor("v_b0fc").cols  # SH2 + 1 once B.8 grew it
    u, v = p.ptr("sn_state", "u_b0fc"), p.ptr("sn_state", "v_b0fc")
    su, sv = p.ptr("sn_scratch_u"), p.ptr("sn_scratch_v")
    n2u, n2v = p.ptr("sn_norms", "norm2_u"), p.ptr("sn_norms", "norm2_v")
    # v = W^T u / |W^T u|
    gemm_dx(
        rec, "spectral_norm:wt_u", sv, u, w, 1, v_len, d.ADV, ld_w=width, ld_dy=d.ADV, ld_dx=v_len
    )
    gemm_dot(rec, "spectral_norm:norm2_v", n2v, sv, sv, v_len)
    rec.kernel(
        "spectral_norm:normalize_v",
        "sn_normalize",  # writes sn_state.v_b0fc
        out=v,
        **{"in": sv},
        norm2=n2v,
        n=v_len,
    )
    # u = W v / |W v|, sigma = |W v|
    gemm_xwt(
        rec, "spectral_norm:w_v", su, v, w, 1, d.ADV, v_len, ld_x=v_len, ld_w=width, ld_y=d.ADV
    )
    gemm_dot(rec, "spectral_norm:norm2_u", n2u, su, su, d.ADV)
    rec.kernel(
        "spectral_norm:normalize_u",
        "sn_normalize",  # writes sn_state.u_b0fc
        out=u,
        **{"in": su},
        norm2=n2u,
        n=d.ADV,
    )
    rec.kernel(
        "spectral_norm:project",
        "sn_scale",  # writes params.w_b0fc when sigma > max
        w=w,
        norm2=n2u,
        n=d.ADV * width,
        sigma_max=p.hyper.sigma_max,
    )


def polyak(p: TrainerInstance) -> None:
    """target <- tau * params + (1 - tau) * target, one launch over the whole flat buffer."""
    tau = {PolyakBlend.TAU: p.hyper.tau, PolyakBlend.ONE_MINUS_TAU: 1.0 - p.hyper.tau}[
        p.wiring.polyak_tau
    ]
    rec = p.rec
    rec.kernel(
        "polyak_ema",
        "polyak_ema",  # writes target_params
        target=p.ptr("target_params"),
        online=p.ptr("params"),
        tau=tau,
        n=p.layout.buffer("params").size,
    )
