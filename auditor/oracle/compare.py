"""EGF010's oracle: one recorded step of the pipeline against the float64 model.

`compare_step(trace, step, config)` reads the step's inputs from the trace's snapshots only
(step_start: state and batch; after_forward: the activations, i.e. the ReLU decisions;
after_losses: the gate and the TD argmax; after_backward: grad_buf; before_polyak and step_end:
the updated state) and checks, as SPEC section 4's EGF010 note asks:

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
    StepInputs,
    StepSnapshots,
    _f64,
    device,
    load_inputs,
    pipeline_relu_inputs,
    read_params,
)
from egf_audit.runtime.config_view import ConfigView, DimsView, HyperView
from egf_audit.runtime.contract import (
    AFTER_BACKWARD,
    BEFORE_POLYAK,
    BRANCHES,
    STEP_END,
    STEP_START,
    param_shapes,
)
from egf_audit.runtime.trace import Missing, Trace

ABS_TOL = 1e-6
REL_TOL = 1e-4


def tolerance(max_ref: float, kind: str = "grad") -> float:
    """ABS_TOL + REL_TOL * max|ref|. Adam's v holds squared gradients, so its absolute floor is
    ABS_TOL squared: the same tolerance in v's units (1e-6 would exceed every v entry and make
    the comparison empty)."""
    floor = ABS_TOL**2 if kind == "adam_v" else ABS_TOL
    return floor + REL_TOL * max_ref


@dataclass(frozen=True)
class TensorCheck:
    name: str  # the parameter tensor ("w_b0fc"), or "u_b0fc" / "v_b0fc"
    kind: str  # "grad", "param", "adam_m", "adam_v", "sn", "target"
    max_err: float
    tol: float
    max_ref: float
    ok: bool
    note: str = ""  # why a comparison could not be made in full (shape, missing)


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


def relu_decisions(
    layer: str, z: torch.Tensor, band: torch.Tensor, pipeline_act: torch.Tensor
) -> DecisionCheck:
    """The pipeline's mask (activation > 0) against the float64 pre-activation z > 0."""
    pipeline_on = pipeline_act.to(z.device) > 0
    flips = pipeline_on != (z > 0)
    near = z.abs() <= band
    return DecisionCheck(layer, int(z.numel()), *_counts(near, flips & near, flips & ~near))


def argmax_decisions(
    name: str, q: torch.Tensor, band: torch.Tensor, pipeline_argmax: torch.Tensor
) -> DecisionCheck:
    """The pipeline's TD argmax against the float64 one (first index on ties). A flip is a
    near-tie when the float64 Q values of the two actions are closer than their two bands; a row
    is counted as a near-tie when its two best float64 Q values are (or when it flipped so)."""
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
    return DecisionCheck(name, int(q.shape[0]), *_counts(near, flips & in_band, flips & ~in_band))


# ---- 2. and 3. values ----


def compare(
    name: str, kind: str, ref: torch.Tensor, got: torch.Tensor | None, note: str = ""
) -> TensorCheck:
    """One tensor against its float64 reference, where both are. A missing or differently
    shaped pipeline tensor fails, with what exists (the common flat prefix) still measured."""
    ref = ref.detach()
    max_ref = float(ref.abs().max()) if ref.numel() else 0.0
    tol = tolerance(max_ref, kind)
    if got is None:
        return TensorCheck(name, kind, float("nan"), tol, max_ref, False, note or "missing")
    if tuple(got.shape) != tuple(ref.shape):
        note = note or f"shape {list(got.shape)}, reference {list(ref.shape)}"
        n = min(got.numel(), ref.numel())
        ref, got = ref.reshape(-1)[:n], got.reshape(-1)[:n]
    max_err = 0.0
    if got.numel():
        err = (got.to(ref.device, torch.float64) - ref).abs()
        nan, largest = torch.stack([err.isnan().any().to(err.dtype), err.max()]).tolist()
        max_err = float("nan") if nan else largest
    ok = not note and bool(max_err <= tol)  # NaN compares False: it fails
    return TensorCheck(name, kind, max_err, tol, max_ref, ok, note)


Compared = tuple[str, str, torch.Tensor, torch.Tensor | None]  # name, kind, ref, got


def compare_many(items: list[Compared]) -> list[TensorCheck]:
    """compare() of each item, in order: those whose tensors have one shape in one pass over
    them all and one read-back, the others (missing, reshaped, empty) one by one. The maxima
    are the same numbers compare() takes (a maximum does not depend on the order)."""
    out: list[TensorCheck | None] = [None] * len(items)
    whole = []
    for i, (name, kind, ref, got) in enumerate(items):
        if got is not None and ref.numel() and tuple(got.shape) == tuple(ref.shape):
            whole.append(i)
        else:
            out[i] = compare(name, kind, ref, got)
    if whole:
        refs = torch.cat([items[i][2].detach().reshape(-1) for i in whole])
        gots = torch.cat(
            [items[i][3].reshape(-1).to(refs.device, torch.float64) for i in whole]  # type: ignore[union-attr]
        )
        sizes = torch.tensor([items[i][2].numel() for i in whole], device=refs.device)
        segment = torch.repeat_interleave(torch.arange(len(whole), device=refs.device), sizes)

        def largest(values: torch.Tensor) -> torch.Tensor:
            """Per item: the largest value, NaN where one is NaN (as numpy's max)."""
            nan = values.isnan()
            top = torch.zeros(len(whole), dtype=torch.float64, device=values.device)
            top = top.scatter_reduce(0, segment, values.masked_fill(nan, 0.0), "amax")
            hit = torch.zeros_like(top).scatter_reduce(0, segment, nan.double(), "amax")
            return top.masked_fill(hit > 0, torch.nan)

        max_ref, max_err = torch.stack([largest(refs.abs()), largest((gots - refs).abs())]).tolist()
        for j, i in enumerate(whole):
            name, kind = items[i][0], items[i][1]
            tol = tolerance(max_ref[j], kind)
            ok = bool(max_err[j] <= tol)  # NaN compares False: it fails
            out[i] = TensorCheck(name, kind, max_err[j], tol, max_ref[j], ok)
    return [c for c in out if c is not None]


def state_like_params(
    snaps: StepSnapshots, checkpoint: str, buffer: str, name: str, like: torch.Tensor
) -> torch.Tensor:
    """The pre-step Adam state of one tensor shaped like the parameter; a table of another
    shape (a fault) contributes its flat prefix, the rest is zero."""
    got = snaps.optional(checkpoint, buffer, name)
    if got is None:
        raise Missing(f"no {buffer}.{name} at {checkpoint} (step {snaps.step})")
    if tuple(got.shape) == tuple(like.shape):
        return _f64(got)
    flat = torch.zeros(like.numel(), dtype=torch.float64, device=like.device)
    n = min(got.numel(), like.numel())
    flat[:n] = _f64(got.reshape(-1)[:n])
    return flat.reshape(like.shape)


def update_checks(
    snaps: StepSnapshots, inputs: StepInputs, dims: DimsView, hyper: HyperView
) -> list[TensorCheck]:
    """Adam, the projection and Polyak from the pipeline's own gradients and pre-step state."""
    rows: list[Compared] = []
    t = snaps.checkpoint_meta(BEFORE_POLYAK).get("adam_t")
    if not isinstance(t, int) or t < 1:
        raise Missing(f"before_polyak records no valid adam_t (got {t!r})")
    grads = read_params(snaps, AFTER_BACKWARD, "grad_buf", dims)
    names = list(inputs.params)
    m0 = [state_like_params(snaps, STEP_START, "adam_m", n, inputs.params[n]) for n in names]
    v0 = [state_like_params(snaps, STEP_START, "adam_v", n, inputs.params[n]) for n in names]
    # Adam is elementwise: one step over every tensor laid end to end is each tensor's step
    shapes = [inputs.params[n].shape for n in names]
    joined = model.adam(
        _joined([inputs.params[n] for n in names]), _joined([grads[n] for n in names]),
        _joined(m0), _joined(v0), t, hyper,
    )  # fmt: skip
    stepped_all, m1, v1 = (_split(x, shapes) for x in joined)
    stepped = dict(zip(names, stepped_all, strict=True))
    for i, name in enumerate(names):
        for kind, ref in (("adam_m", m1[i]), ("adam_v", v1[i])):
            rows.append((name, kind, ref, snaps.optional(BEFORE_POLYAK, kind, name)))

    u0 = _f64(snaps.array(STEP_START, "sn_state", "u_b0fc", (1, dims.ADV)))
    stepped["w_b0fc"], sn_u1, sn_v1 = model.spectral_norm(stepped["w_b0fc"], u0, hyper.sigma_max)
    for name, ref in (("u_b0fc", sn_u1), ("v_b0fc", sn_v1)):
        rows.append((name, "sn", ref, snaps.optional(BEFORE_POLYAK, "sn_state", name)))

    afters = {name: snaps.optional(BEFORE_POLYAK, "params", name) for name in names}
    # Polyak from the pipeline's own post-step params (the reference's where they are missing)
    # and the pre-step target, elementwise like Adam: once over every tensor end to end
    online = [
        _f64(a) if (a := afters[n]) is not None and a.shape == stepped[n].shape else stepped[n]
        for n in names
    ]
    shapes = [stepped[n].shape for n in names]
    targets = _split(
        model.polyak(_joined([inputs.target_params[n] for n in names]), _joined(online), hyper.tau),
        shapes,
    )
    for name, target in zip(names, targets, strict=True):
        rows.append((name, "param", stepped[name], afters[name]))
        rows.append((name, "target", target, snaps.optional(STEP_END, "target_params", name)))
    return compare_many(rows)


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([x.reshape(-1) for x in tensors])


def _split(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """`flat` cut back into tensors of `shapes`, in order (views)."""
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    return [part.reshape(s) for part, s in zip(flat.split(sizes), shapes, strict=True)]


# ---- the step ----


def as_the_kernels_take_it(hyper: HyperView) -> HyperView:
    """The hyper-parameters rounded to fp32, as every kernel receives them: near 1 a beta's
    rounding changes 1 - beta by up to 20 % (0.9999999 -> 1 - 1.19e-7), and the model must run
    the trainer's numbers, not the config file's."""
    rounded = {f.name: float(np.float32(getattr(hyper, f.name))) for f in dataclasses.fields(hyper)}
    return dataclasses.replace(hyper, **rounded)


def compare_step(trace: Trace, step: int, config: ConfigView) -> OracleReport:
    """Decisions, gradients and update of one recorded step against the float64 model."""
    dims, hyper = config.dims, as_the_kernels_take_it(config.hyper)
    report = OracleReport(trace.scenario, step)
    snaps = StepSnapshots(trace, step, device())
    try:
        inputs = load_inputs(snaps, dims)
        grads_got = {
            name: snaps.array(AFTER_BACKWARD, "grad_buf", name, (rows, cols))
            for name, rows, cols in param_shapes(dims)
        }
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
        leaves, inputs.obs["obs"], inputs.context["ctx"], masks["online"], alpha=inputs.alpha
    )

    # 1. decisions
    for net, passed, params in (
        ("online", online_net, inputs.params),
        ("target", target_net, inputs.target_params),
    ):
        x32 = pipeline_relu_inputs(inputs, net)
        for layer in model.RELU_LAYERS:
            z = passed.pre[layer].detach()
            band = model.relu_band(params, layer, z, x32[layer])
            report.decisions.append(
                relu_decisions(f"{net}.{layer}", z, band, inputs.activations[net][layer])
            )
    for b in range(len(BRANCHES)):
        q64 = target_net.q_values[b]
        band = (_f64(inputs.target_q[b]) - q64).abs()
        report.decisions.append(
            argmax_decisions(f"td_argmax.b{b}", q64, band, inputs.td_argmax[:, b])
        )

    # 2. gradients, with the pipeline's decisions (its masks above, its argmax here; an
    # out-of-range argmax already failed as a decision and is clamped only to stay computable)
    argmax = inputs.td_argmax.clone()
    for b in range(len(BRANCHES)):
        argmax[:, b] = argmax[:, b].clamp(0, dims.A[b] - 1)
    td_target = model.td_targets(target_net.q_values, argmax, inputs.batch, hyper)
    loss = model.total_loss(online_net, td_target, inputs.batch, hyper)
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    report.tensors += compare_many(
        [
            (
                name,
                "grad",
                grad if grad is not None else torch.zeros_like(leaves[name]),
                grads_got[name],
            )
            for name, grad in zip(names, grads, strict=True)
        ]
    )

    # 3. the update
    try:
        report.tensors += update_checks(snaps, inputs, dims, hyper)
    except Missing as exc:
        report.problems.append(str(exc))
    return report
