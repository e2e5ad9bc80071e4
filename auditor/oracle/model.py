"""The float64 model of one SP14 step that EGF010 compares the pipeline with.

It is written from kernels/CONTRACT.md (section 2) and the design decisions alone, in torch
autograd: nothing here calls the pipeline's forward/backward code or a kernel, so a wiring bug in
those cannot be copied into the reference. The model takes the pipeline's discrete decisions as
inputs (ReLU masks, TD argmax) and gives, for every ReLU input, a proven bound on how far the fp32
pipeline's value may lie from the float64 one (see `relu_band`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from egf_audit.trace.config_view import HyperView
from egf_audit.trace.contract import AUX_DOWN_INDEX, AUX_UP_INDEX, BRANCHES

Params = dict[str, torch.Tensor]  # name -> [rows, cols] float64 (biases are [1, cols])
Masks = dict[str, torch.Tensor]  # ReLU layer -> float64 0/1 of the pipeline's decisions

# The ReLU layers of one network, named as the activation buffers after their prefix
# (save_h_s1 / tgt_h_s1, ...).
RELU_LAYERS = ("h_s1", "h_s2", *(f"b{d}_hid" for d in range(len(BRANCHES))), "v_hid")

FP32_UNIT_ROUNDOFF = 2.0**-24
# Multiplies the fp32 rounding bound of a layer. The bound is rigorous already (a factor of 1
# would do); 2 leaves room for the float64 evaluation of the band itself at no real cost in
# sensitivity (the band stays ~1e-4 of the layer's |x| |W|^T at K = 1024).
BOUND_SAFETY = 2.0


class WireGate(torch.autograd.Function):
    """The SP14 wire gate: identity forward; backward multiplies the wire gradient by alpha, and
    alpha == 0 gives exactly +0.0 whatever the incoming gradient (NaN and Inf included), as
    sp14_scale_wire_col does. `alpha` is a float or a 0-d tensor (a tensor keeps a captured CUDA
    graph free of host reads: the bench's torch reference uses it so)."""

    @staticmethod
    def forward(ctx, wire: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(torch.as_tensor(alpha, dtype=wire.dtype, device=wire.device))
        return wire.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (alpha,) = ctx.saved_tensors
        return torch.where(alpha == 0, torch.zeros_like(grad), grad * alpha), None


@dataclass
class NetPass:
    """One network's forward pass in float64: what the checks and the loss read."""

    pre: dict[str, torch.Tensor]  # ReLU layer -> pre-activation z (before its mask)
    aux_logits: torch.Tensor
    q_values: list[torch.Tensor]  # per branch [B, A_d]


def linear(x: torch.Tensor, params: Params, w: str, b: str) -> torch.Tensor:
    return x @ params[w].T + params[b]


def forward(
    params: Params,
    obs: torch.Tensor,
    context: list[torch.Tensor | None],
    masks: Masks,
    alpha: float | torch.Tensor | None = None,
) -> NetPass:
    """The network of kernels/CONTRACT.md section 2, Forward, with the ReLUs replaced by the given
    masks. `context[d]` is branch d's extra columns (d >= 1; context[0] is unused: the wire). With
    `alpha` set, the wire's gradient is gated on its way back to the aux head."""
    pre = {}

    def relu_layer(name: str, z: torch.Tensor) -> torch.Tensor:
        pre[name] = z
        return z * masks[name]

    h_s1 = relu_layer("h_s1", linear(obs, params, "w_s1", "b_s1"))
    h_s2 = relu_layer("h_s2", linear(h_s1, params, "w_s2", "b_s2"))
    aux_logits = linear(h_s2, params, "w_aux", "b_aux")
    aux_softmax = torch.softmax(aux_logits, dim=1)
    wire = aux_softmax[:, AUX_UP_INDEX] - aux_softmax[:, AUX_DOWN_INDEX]
    gated_wire = WireGate.apply(wire, alpha) if alpha is not None else wire

    adv = []
    for d in range(len(BRANCHES)):
        extra = gated_wire[:, None] if d == 0 else context[d]
        assert extra is not None  # every branch but the direction one has its context
        x = torch.cat([h_s2, extra], dim=1)
        hid = relu_layer(f"b{d}_hid", linear(x, params, f"w_b{d}fc", f"b_b{d}fc"))
        adv.append(linear(hid, params, f"w_b{d}out", f"b_b{d}out"))

    v_hid = relu_layer("v_hid", linear(h_s2, params, "w_v0", "b_v0"))
    value = linear(v_hid, params, "w_v1", "b_v1")
    q_values = [value + a - a.mean(dim=1, keepdim=True) for a in adv]
    return NetPass(pre, aux_logits, q_values)


@dataclass
class StepBatch:
    actions: torch.Tensor  # [B, branches] int64
    reward: torch.Tensor  # [B]
    done: torch.Tensor  # [B], 0/1
    aux_label: torch.Tensor  # [B] int64


def huber(x: torch.Tensor, kappa: float) -> torch.Tensor:
    small = x.abs() <= kappa
    return torch.where(small, 0.5 * x * x, kappa * (x.abs() - 0.5 * kappa))


def td_targets(
    target_q: list[torch.Tensor], td_argmax: torch.Tensor, batch: StepBatch, hyper: HyperView
) -> list[torch.Tensor]:
    """y_d = r + gamma (1 - done) Q'_d[argmax], at the given argmax; a constant (no gradient)."""
    keep = hyper.gamma * (1.0 - batch.done)
    out = []
    for d, q_next in enumerate(target_q):
        best = q_next.detach().gather(1, td_argmax[:, d : d + 1])[:, 0]
        out.append(batch.reward + keep * best)
    return out


def total_loss(
    online: NetPass, td_target: list[torch.Tensor], batch: StepBatch, hyper: HyperView
) -> torch.Tensor:
    """sum_d L_td,d + sum_d L_cql,d + L_aux (design.md, Total loss)."""
    loss = online.q_values[0].new_zeros(())
    for d, q in enumerate(online.q_values):
        q_taken = q.gather(1, batch.actions[:, d : d + 1])[:, 0]
        loss = loss + huber(q_taken - td_target[d], hyper.huber_kappa).mean()
        cql = torch.logsumexp(q, dim=1) - q_taken
        loss = loss + hyper.lambda_cql * cql.mean()
    logits = online.aux_logits
    log_p_label = logits.gather(1, batch.aux_label[:, None])[:, 0] - torch.logsumexp(logits, 1)
    return loss + hyper.lambda_aux * (-log_p_label).mean()


# ---- how far the fp32 pipeline may lie from the float64 model ----


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of n fp32 roundings in a row."""
    nu = n * FP32_UNIT_ROUNDOFF
    return nu / (1.0 - nu)


def relu_band(
    params: Params, layer: str, z: torch.Tensor, pipeline_input: torch.Tensor
) -> torch.Tensor:
    """How far the pipeline's fp32 pre-activation of `layer` can lie from the float64 one `z`.

    The pipeline computed fl32(x' W^T + b) from its own fp32 input x'. That differs from the
    exact x' W^T + b by at most gamma_{K+1} (|x'| |W|^T + |b|): K products and sums in any order
    (cuBLAS may reorder, FMA only helps) and the bias add. The exact x' W^T + b differs from z
    (the float64 model's input x) by (x' - x) W^T, which is computed exactly here instead of
    bounded, so the band does not grow with depth. Their sum bounds |z32 - z|: a pipeline
    decision that disagrees with z > 0 while |z| is outside the band is no rounding effect."""
    W, bias = params[RELU_WEIGHTS[layer][0]], params[RELU_WEIGHTS[layer][1]]
    with torch.no_grad():
        z_from_pipeline_input = pipeline_input @ W.T + bias
        rounding = gamma(W.shape[1] + 1) * (pipeline_input.abs() @ W.abs().T + bias.abs())
        return (z_from_pipeline_input - z.detach()).abs() + BOUND_SAFETY * rounding


RELU_WEIGHTS = {
    "h_s1": ("w_s1", "b_s1"),
    "h_s2": ("w_s2", "b_s2"),
    **{f"b{d}_hid": (f"w_b{d}fc", f"b_b{d}fc") for d in range(len(BRANCHES))},
    "v_hid": ("w_v0", "b_v0"),
}


# ---- the update (kernels/CONTRACT.md section 2, Update; design.md: Adam, Spectral norm) ----


def adam(
    param: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    t: int,
    hyper: HyperView,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Adam step with bias corrections 1 - beta^t: (param, m, v) after it."""
    m = hyper.beta1 * m + (1.0 - hyper.beta1) * grad
    v = hyper.beta2 * v + (1.0 - hyper.beta2) * grad * grad
    m_hat = m / (1.0 - hyper.beta1**t)
    v_hat = v / (1.0 - hyper.beta2**t)
    return param - hyper.lr * m_hat / (v_hat.sqrt() + hyper.eps), m, v


def spectral_norm(
    w: torch.Tensor, u: torch.Tensor, sigma_max: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One power iteration from the stored u [1, rows]: v = W^T u / |W^T u|, u = W v / |W v|,
    sigma = |W v|; then W *= sigma_max / sigma if sigma > sigma_max. Returns (W, u, v)."""
    v = u @ w
    v = v / v.norm().clamp_min(1e-15)  # the kernel's guard: sqrt(max(|.|^2, 1e-30))
    w_v = v @ w.T
    sigma = w_v.norm()
    u = w_v / sigma.clamp_min(1e-15)
    # chosen on the device (no host read of sigma): the same product where it projects
    w = torch.where(sigma > sigma_max, w * (sigma_max / sigma), w)
    return w, u, v


def polyak(target: torch.Tensor, online: torch.Tensor, tau: float) -> torch.Tensor:
    return tau * online + (1.0 - tau) * target
