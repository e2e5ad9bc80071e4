"""The SP14 training step written the way a torch user would write it, for `egf-audit bench`.

Same network, losses and update as the pipeline (kernels/CONTRACT.md, section 2): trunk, aux head,
the wire `p[up] - p[down]` concatenated to branch 0 through a gate (a custom autograd Function),
four dueling branches on a value stream, Huber TD against a target net run under `no_grad`, the CQL
term and the aux CE. Unlike the pipeline, which backpropagates its two call sites one after the
other (two trunk backward passes), torch runs ONE backward of the total loss: that is what a torch
trainer would do, and what the benchmark compares against. Then `torch.optim.Adam` (its default
implementation), the spectral-norm projection of the branch-0 FC weight and Polyak, in torch ops
with no host synchronisation.

Weights come from a pipeline's buffers, so both start from the same state, and a test can check
that the two compute the same gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from egf_audit.oracle.model import WireGate
from egf_audit.pipeline.config import Dims, Hyper
from egf_audit.runtime.memory import Layout
from egf_audit.trace.contract import AUX_DOWN_INDEX, AUX_UP_INDEX, BRANCHES, param_shapes


@dataclass
class TorchBatch:
    obs: torch.Tensor
    next_obs: torch.Tensor
    actions: torch.Tensor  # int64 [B, 4]: gather needs int64 indices
    reward: torch.Tensor  # [B]
    done: torch.Tensor  # [B], 0/1
    aux_label: torch.Tensor  # int64 [B]
    ctx: list[torch.Tensor]  # context columns of branches 1..3
    next_ctx: list[torch.Tensor]


def torch_batch(batch: dict[str, np.ndarray], device: torch.device) -> TorchBatch:
    """A pipeline batch (`SP14Pipeline.make_batch`) as device tensors, made once, untimed."""

    def t(name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(batch[name]).to(device=device, dtype=dtype)

    nb = len(BRANCHES)
    return TorchBatch(
        obs=t("obs"),
        next_obs=t("next_obs"),
        actions=t("actions", torch.int64),
        reward=t("reward").reshape(-1),
        done=t("done").reshape(-1),
        aux_label=t("aux_label", torch.int64).reshape(-1),
        ctx=[t(f"ctx_b{d}") for d in range(1, nb)],
        next_ctx=[t(f"next_ctx_b{d}") for d in range(1, nb)],
    )


def _linear(layer: nn.Module) -> nn.Linear:
    """A layer of an nn.ModuleList, which torch types as any module."""
    assert isinstance(layer, nn.Linear)
    return layer


class SP14Net(nn.Module):
    """The online (or target) network: nn.Linear layers with the pipeline's [out, in] weights."""

    def __init__(self, dims: Dims):
        super().__init__()
        nb = len(BRANCHES)
        self.s1 = nn.Linear(dims.OBS, dims.SH1)
        self.s2 = nn.Linear(dims.SH1, dims.SH2)
        self.aux = nn.Linear(dims.SH2, dims.AUXK)
        self.fc = nn.ModuleList(nn.Linear(dims.branch_in(d), dims.ADV) for d in range(nb))
        self.out = nn.ModuleList(nn.Linear(dims.ADV, dims.A[d]) for d in range(nb))
        self.v0 = nn.Linear(dims.SH2, dims.VALH)
        self.v1 = nn.Linear(dims.VALH, 1)

    def by_flat_name(self) -> dict[str, torch.Tensor]:
        """Each parameter under its name in the pipeline's flat `params` buffer."""
        out: dict[str, torch.Tensor] = {}
        for name, layer in (("s1", self.s1), ("s2", self.s2), ("aux", self.aux)):
            out[f"w_{name}"], out[f"b_{name}"] = layer.weight, layer.bias
        for d in range(len(BRANCHES)):
            fc, head = _linear(self.fc[d]), _linear(self.out[d])
            out[f"w_b{d}fc"], out[f"b_b{d}fc"] = fc.weight, fc.bias
            out[f"w_b{d}out"], out[f"b_b{d}out"] = head.weight, head.bias
        out["w_v0"], out["b_v0"] = self.v0.weight, self.v0.bias
        out["w_v1"], out["b_v1"] = self.v1.weight, self.v1.bias
        return out

    def forward(
        self, obs: torch.Tensor, ctx: list[torch.Tensor], alpha: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(Q_d for every branch, aux logits). `alpha` gates the wire; None: no gate (target)."""
        h2 = F.relu(self.s2(F.relu(self.s1(obs))))
        logits = self.aux(h2)
        p = torch.softmax(logits, dim=1)
        wire = p[:, AUX_UP_INDEX] - p[:, AUX_DOWN_INDEX]
        if alpha is not None:
            wire = WireGate.apply(wire, alpha)
        xs = [torch.cat([h2, wire[:, None]], dim=1)] + [torch.cat([h2, c], dim=1) for c in ctx]
        value = self.v1(F.relu(self.v0(h2)))  # [B, 1]
        qs = []
        for d, x in enumerate(xs):
            adv = self.out[d](F.relu(self.fc[d](x)))
            qs.append(value + adv - adv.mean(dim=1, keepdim=True))
        return qs, logits


class TorchSP14:
    """One trainer: online and target nets, Adam, the spectral-norm vector u of w_b0fc."""

    def __init__(self, dims: Dims, hyper: Hyper, device: torch.device):
        self.dims, self.hyper, self.device = dims, hyper, device
        self.net = SP14Net(dims).to(device)
        self.target = SP14Net(dims).to(device).requires_grad_(False)
        self.sn_u = torch.zeros(dims.ADV, device=device)
        # sentinel mode: nothing writes ISV[393], so the gate stays exactly 0
        self.alpha = torch.zeros((), device=device)
        self.opt = torch.optim.Adam(
            self.net.parameters(), lr=hyper.lr, betas=(hyper.beta1, hyper.beta2), eps=hyper.eps
        )
        self._online: list[torch.Tensor] = list(self.net.parameters())
        self._target: list[torch.Tensor] = list(self.target.parameters())

    @classmethod
    def from_buffers(
        cls,
        dims: Dims,
        hyper: Hyper,
        layout: Layout,
        buffers: dict[str, np.ndarray],
        device: torch.device,
    ) -> TorchSP14:
        """Weights from host copies of a pipeline's `params`, `target_params` and `sn_state`."""
        model = cls(dims, hyper, device)
        spec = layout.buffer("params")
        with torch.no_grad():
            for net, buffer in ((model.net, "params"), (model.target, "target_params")):
                flat = buffers[buffer]
                params = net.by_flat_name()
                for name, rows, cols in param_shapes(dims):
                    t = spec.tensor(name)
                    values = flat[t.offset : t.offset + rows * cols]
                    target = params[name]
                    target.copy_(torch.from_numpy(values.copy()).reshape(target.shape))
            u = layout.buffer("sn_state").tensor("u_b0fc")
            model.sn_u.copy_(torch.from_numpy(buffers["sn_state"][u.offset : u.end].copy()))
        return model

    def loss(self, batch: TorchBatch) -> torch.Tensor:
        """Sum over branches of Huber TD and CQL, plus the aux CE (the pipeline's total loss)."""
        h = self.hyper
        qs, logits = self.net(batch.obs, batch.ctx, self.alpha)
        with torch.no_grad():
            q_next, _ = self.target(batch.next_obs, batch.next_ctx, None)
        total = h.lambda_aux * F.cross_entropy(logits, batch.aux_label)
        for d, q in enumerate(qs):
            y = batch.reward + h.gamma * (1.0 - batch.done) * q_next[d].max(dim=1).values
            q_sa = q.gather(1, batch.actions[:, d : d + 1]).squeeze(1)
            td = F.huber_loss(q_sa, y, delta=h.huber_kappa)
            cql = h.lambda_cql * (torch.logsumexp(q, dim=1) - q_sa).mean()
            total = total + td + cql
        return total

    def step(self, batch: TorchBatch) -> torch.Tensor:
        """One training step; returns the loss, detached, without a host synchronisation."""
        self.opt.zero_grad(set_to_none=True)
        total = self.loss(batch)
        total.backward()
        self.opt.step()
        with torch.no_grad():
            self._project_spectral_norm()
            # target <- tau * online + (1 - tau) * target, one fused launch per dtype group
            torch._foreach_lerp_(self._target, self._online, self.hyper.tau)
        return total.detach()

    def _project_spectral_norm(self) -> None:
        """One power iteration from u, then W *= sigma_max / sigma where sigma > sigma_max.
        The branch is a clamp, not a Python `if`, so it never waits for the device."""
        w = _linear(self.net.fc[0]).weight
        v = w.t() @ self.sn_u
        v = v / v.norm().clamp_min(1e-15)
        wv = w @ v
        sigma = wv.norm()
        self.sn_u.copy_(wv / sigma.clamp_min(1e-15))
        w.mul_((self.hyper.sigma_max / sigma).clamp(max=1.0))

    def grads_by_flat_name(self) -> dict[str, np.ndarray]:
        """The last step's gradients, flattened, under the pipeline's names (for tests)."""
        return {
            name: p.grad.detach().cpu().numpy().ravel()
            for name, p in self.net.by_flat_name().items()
            if p.grad is not None
        }
