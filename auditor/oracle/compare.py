"""EGF010's oracle: one recorded step of the pipeline against the float64 model.

`compare_step(trace, step, config)` reads the step's inputs from the trace's snapshots only
(step_start: state and batch; after_forward: the activations, i.e. the ReLU decisions;
after_losses: the gate and the TD argmax; after_backward: grad_buf; before_polyak and step_end:
the updated state) and checks, as kernels/CONTRACT.md's EGF010 note (section 4) asks:

1. decisions: every ReLU mask (online and target net) and every TD argmax of the pipeline equals
   the float64 model's, except near-ties: where the float64 value lies closer to the kink or the
   tie than the fp32 value can lie from it. For a ReLU input that distance is the exactly
   computed effect of the layer's input difference plus a proven bound of the layer's own fp32
   rounding (model.relu_band); for a Q value it is |Q32 - Q64|, measured. Near-ties are
   counted, never failed.
2. values: the float64 model run with the pipeline's decisions gives every gradient in grad_buf
   within ABS_TOL + REL_TOL * max|ref| per tensor.
3. update: float64 Adam, the spectral-norm projection and Polyak applied to the pipeline's own
   gradients and pre-step state give its post-step params, Adam m/v, sn vectors and target, within
   the same tolerance.

Missing or malformed data (`Missing`, the trace's one convention) never escapes: it becomes a
problem of the report, which then fails.
The float64 math runs on the GPU when torch sees one, else on the CPU; on the GPU the snapshots
are read where the CUDA backend copied them, and only the measured figures reach the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from egf_audit.oracle import model
from egf_audit.oracle.inputs import (
    NETS,
    StepSnapshots,
    _f64,
    device,
    load_inputs,
    pipeline_relu_inputs,
)
from egf_audit.oracle.tensor_checks import Compared, Joined, Measured, TensorCheck, joined
from egf_audit.oracle.update_checks import in_update_order, update_rows
from egf_audit.trace.config_view import ConfigView, HyperView
from egf_audit.trace.contract import AFTER_BACKWARD, BRANCHES, param_shapes
from egf_audit.trace.model import Missing, Trace


@dataclass(frozen=True)
class DecisionCheck:
    layer: str  # "online.h_s1", ..., "td_argmax.b0"
    total: int
    near_ties: int  # float64 value within the band of the kink or tie: exempt
    flips_in_band: int  # near-ties the pipeline decided the other way (allowed)
    mismatches: int  # decided the other way outside the band: a failure


@dataclass
class OracleReport:
    scenario: str
    step: int
    tensors: list[TensorCheck] = field(default_factory=list)
    decisions: list[DecisionCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # missing or malformed inputs

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and all(t.ok for t in self.tensors)
            and not any(d.mismatches for d in self.decisions)
        )

    @property
    def failing_tensors(self) -> list[TensorCheck]:
        return [t for t in self.tensors if not t.ok]

    @property
    def mismatched_layers(self) -> list[DecisionCheck]:
        return [d for d in self.decisions if d.mismatches]

    def total(self, attribute: str) -> int:
        return sum(getattr(d, attribute) for d in self.decisions)

    def worst(self) -> TensorCheck | None:
        """The fully compared row closest to (or furthest past) its tolerance."""
        rows = [t for t in self.tensors if not t.note]
        return max(rows, key=lambda t: t.max_err / t.tol if t.tol > 0 else np.inf, default=None)


# ---- 1. decisions ----


def _counts(*flags: torch.Tensor) -> list[int]:
    """How many of each boolean tensor are set, read back together."""
    return [int(v) for v in torch.stack([f.sum() for f in flags]).tolist()]


def relu_flags(z: torch.Tensor, band: torch.Tensor, pipeline_act: torch.Tensor) -> torch.Tensor:
    """[near-ties, flips in the band, flips outside it] of one ReLU layer, on the device."""
    pipeline_on = pipeline_act.to(z.device) > 0
    flips = pipeline_on != (z > 0)
    near = z.abs() <= band
    return torch.stack([near.sum(), (flips & near).sum(), (flips & ~near).sum()])


def relu_decisions(
    layer: str, z: torch.Tensor, band: torch.Tensor, pipeline_act: torch.Tensor
) -> DecisionCheck:
    """The pipeline's mask (activation > 0) against the float64 pre-activation z > 0."""
    counts = relu_flags(z, band, pipeline_act).tolist()
    return DecisionCheck(layer, int(z.numel()), *(int(c) for c in counts))


def argmax_flags(
    q: torch.Tensor, band: torch.Tensor, pipeline_argmax: torch.Tensor
) -> torch.Tensor:
    """[near-ties, flips in the band, flips outside it] of one TD argmax, on the device."""
    rows = torch.arange(q.shape[0], device=q.device)
    picked = pipeline_argmax.to(q.device, torch.int64)
    valid = (picked >= 0) & (picked < q.shape[1])
    picked = picked.clamp(0, q.shape[1] - 1)
    best = q.argmax(dim=1)
    flips = (picked != best) | ~valid
    in_band = valid & (q[rows, best] - q[rows, picked] <= band[rows, best] + band[rows, picked])
    near = flips & in_band
    if q.shape[1] > 1:
        top2 = q.topk(2, dim=1)
        near |= top2.values[:, 0] - top2.values[:, 1] <= band.gather(1, top2.indices).sum(dim=1)
    return torch.stack([near.sum(), (flips & in_band).sum(), (flips & ~in_band).sum()])


def argmax_decisions(
    name: str, q: torch.Tensor, band: torch.Tensor, pipeline_argmax: torch.Tensor
) -> DecisionCheck:
    """The pipeline's TD argmax against the float64 one (first index on ties). A flip is a
    near-tie when the float64 Q values of the two actions are closer than their two bands; a row
    is counted as a near-tie when its two best float64 Q values are (or when it flipped so)."""
    counts = argmax_flags(q, band, pipeline_argmax).tolist()
    return DecisionCheck(name, int(q.shape[0]), *(int(c) for c in counts))


# ---- the step ----


def as_the_kernels_take_it(hyper: HyperView) -> HyperView:
    """The hyper-parameters rounded to fp32, as every kernel receives them: near 1 a beta's
    rounding changes 1 - beta by up to 20 % (0.9999999 -> 1 - 1.19e-7), and the model must run
    the trainer's numbers, not the config file's."""
    rounded = {f.name: float(np.float32(getattr(hyper, f.name))) for f in dataclasses.fields(hyper)}
    return dataclasses.replace(hyper, **rounded)


def compare_step(trace: Trace, step: int, config: ConfigView) -> OracleReport:
    """Decisions, gradients and update of one recorded step against the float64 model. Every
    count and maximum is measured on the oracle's device and read back once, at the end."""
    dims, hyper = config.dims, as_the_kernels_take_it(config.hyper)
    report = OracleReport(trace.scenario, step)
    snaps = StepSnapshots(trace, step, device())
    shapes = param_shapes(dims)
    names = [name for name, _, _ in shapes]
    try:
        inputs = load_inputs(snaps, dims)
        grads_table = snaps.table(AFTER_BACKWARD, "grad_buf", dims)
        grads_got = (
            None
            if grads_table is not None
            else {
                name: snaps.array(AFTER_BACKWARD, "grad_buf", name, (rows, cols))
                for name, rows, cols in shapes
            }
        )
    except Missing as exc:
        report.problems.append(str(exc))
        return report

    masks = {
        net: {layer: _f64(a > 0) for layer, a in inputs.activations[net].items()} for net in NETS
    }
    with torch.no_grad():
        target_net = model.forward(
            inputs.target_params,
            inputs.obs["next_obs"],
            inputs.context["next_ctx"],
            masks["target"],
        )
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.params.items()}
    online_net = model.forward(
        leaves,
        inputs.obs["obs"],
        inputs.context["ctx"],
        masks["online"],
        alpha=inputs.alpha_on_device,
    )

    # 1. decisions
    layers: list[tuple[str, int]] = []  # name, total
    flags: list[torch.Tensor] = []
    for net, passed, params in (
        ("online", online_net, inputs.params),
        ("target", target_net, inputs.target_params),
    ):
        x32 = pipeline_relu_inputs(inputs, net)
        for layer in model.RELU_LAYERS:
            z = passed.pre[layer].detach()
            band = model.relu_band(params, layer, z, x32[layer])
            layers.append((f"{net}.{layer}", int(z.numel())))
            flags.append(relu_flags(z, band, inputs.activations[net][layer]))
    for b in range(len(BRANCHES)):
        q64 = target_net.q_values[b]
        band = (_f64(inputs.target_q[b]) - q64).abs()
        layers.append((f"td_argmax.b{b}", int(q64.shape[0])))
        flags.append(argmax_flags(q64, band, inputs.td_argmax[:, b]))

    # 2. gradients, with the pipeline's decisions (its masks above, its argmax here; an
    # out-of-range argmax already failed as a decision and is clamped only to stay computable)
    argmax = inputs.td_argmax.clone()
    for b in range(len(BRANCHES)):
        argmax[:, b] = argmax[:, b].clamp(0, dims.A[b] - 1)
    td_target = model.td_targets(target_net.q_values, argmax, inputs.batch, hyper)
    loss = model.total_loss(online_net, td_target, inputs.batch, hyper)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    refs = [
        g if g is not None else torch.zeros_like(leaves[n])
        for n, g in zip(names, grads, strict=True)
    ]
    grad_rows: list[Compared | Joined]
    grads_flat = None
    if grads_table is not None:
        grads_flat = _f64(grads_table)
        grad_rows = [Joined("grad", names, [r * c for _, r, c in shapes], joined(refs), grads_flat)]
    else:
        assert grads_got is not None
        grad_rows = [
            (name, "grad", ref, grads_got[name]) for name, ref in zip(names, refs, strict=True)
        ]

    # 3. the update
    update: list[Compared | Joined] = []
    try:
        update = update_rows(snaps, inputs, dims, hyper, grads_flat)
    except Missing as exc:
        report.problems.append(str(exc))

    # one read-back: every decision count and every compared maximum
    measured = [Measured(grad_rows), Measured(update)]
    counts = torch.stack(flags).to(torch.float64)  # [layers, 3]: exact below 2**53
    read = [counts.reshape(-1)] + [m.values.reshape(-1) for m in measured if m.values is not None]
    values = torch.cat(read).tolist()
    at = counts.numel()
    for (layer, total), i in zip(layers, range(0, at, 3), strict=True):
        near, in_band, outside = (int(c) for c in values[i : i + 3])
        report.decisions.append(DecisionCheck(layer, total, near, in_band, outside))
    for m, kind in zip(measured, ("grad", "update"), strict=True):
        pairs = None
        if m.values is not None:
            k = m.values.shape[1]
            pairs = [values[at : at + k], values[at + k : at + 2 * k]]
            at += 2 * k
        checks = m.checks(pairs)
        report.tensors += checks if kind == "grad" else in_update_order(checks, names)
    return report
