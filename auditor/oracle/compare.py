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
import functools
from collections.abc import Sequence
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
    read_table,
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


@dataclass(frozen=True)
class Joined:
    """Tensors of one kind compared as compare() compares each: `ref` their float64 references
    laid end to end (`sizes` elements each, in the order of `names`), `got` the pipeline's
    laid likewise (any dtype; the whole parameter table of a snapshot, say)."""

    kind: str
    names: list[str]
    sizes: list[int]
    ref: torch.Tensor
    got: torch.Tensor


@functools.lru_cache(maxsize=8)
def _segments(sizes: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    """Each element's item number, items of `sizes` elements laid end to end: built on the
    host and copied to `dev` once per layout, not once per step."""
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return ids.to(dev)


class Measured:
    """compare() of many items (Compared or Joined), measured on the device: `values` holds
    every whole item's max|ref| and max|err| ([2, items], NaN where one is NaN, as numpy's max),
    to be read back with whatever else the caller reads; `checks(values)` then gives the rows
    compare() gives, in order. Items that are missing, reshaped or empty are compared one by
    one by compare() itself. The maxima are the same numbers compare() takes (a maximum does
    not depend on the order)."""

    def __init__(self, items: Sequence[Compared | Joined]):
        self._rows: list[TensorCheck | tuple[str, str]] = []  # a check, or (name, kind) measured
        refs: list[torch.Tensor] = []
        gots: list[torch.Tensor] = []
        sizes: list[int] = []
        for item in items:
            if isinstance(item, Joined):
                refs.append(item.ref.detach())
                gots.append(item.got)
                sizes += item.sizes
                self._rows += [(name, item.kind) for name in item.names]
                continue
            name, kind, ref, got = item
            if got is not None and ref.numel() and tuple(got.shape) == tuple(ref.shape):
                refs.append(ref.detach().reshape(-1))
                gots.append(got.reshape(-1))
                sizes.append(ref.numel())
                self._rows.append((name, kind))
            else:
                self._rows.append(compare(name, kind, ref, got))
        self.values: torch.Tensor | None = None
        if sizes:
            ref_all = torch.cat(refs) if len(refs) > 1 else refs[0]
            got_all = torch.cat([g.to(ref_all.device, torch.float64) for g in gots])
            parts = torch.stack([ref_all.abs(), (got_all - ref_all).abs()])
            nan = parts.isnan()
            segment = _segments(tuple(sizes), ref_all.device).expand(4, -1)
            found = torch.zeros(4, len(sizes), dtype=torch.float64, device=ref_all.device)
            found.scatter_reduce_(
                1, segment, torch.cat([parts.masked_fill(nan, 0.0), nan.double()]), "amax"
            )
            self.values = found[:2].masked_fill(found[2:] > 0, torch.nan)

    def checks(self, values: list[list[float]] | None) -> list[TensorCheck]:
        """The rows, from `values` read back (self.values as a list)."""
        out: list[TensorCheck] = []
        j = 0
        for row in self._rows:
            if isinstance(row, TensorCheck):
                out.append(row)
                continue
            assert values is not None
            name, kind = row
            max_ref, max_err = values[0][j], values[1][j]
            j += 1
            tol = tolerance(max_ref, kind)
            ok = bool(max_err <= tol)  # NaN compares False: it fails
            out.append(TensorCheck(name, kind, max_err, tol, max_ref, ok))
        return out


def compare_many(items: Sequence[Compared | Joined]) -> list[TensorCheck]:
    """compare() of each item, in order: the whole ones in one pass over them all and one
    read-back, the others (missing, reshaped, empty) one by one."""
    measured = Measured(items)
    return measured.checks(None if measured.values is None else measured.values.tolist())


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
    snaps: StepSnapshots,
    inputs: StepInputs,
    dims: DimsView,
    hyper: HyperView,
    grads_flat: torch.Tensor | None = None,
) -> list[TensorCheck]:
    """Adam, the projection and Polyak from the pipeline's own gradients and pre-step state."""
    names = [name for name, _, _ in param_shapes(dims)]
    return in_update_order(compare_many(update_rows(snaps, inputs, dims, hyper, grads_flat)), names)


def update_rows(
    snaps: StepSnapshots,
    inputs: StepInputs,
    dims: DimsView,
    hyper: HyperView,
    grads_flat: torch.Tensor | None = None,
) -> list[Compared | Joined]:
    """What update_checks compares, in its order: per tensor Adam m and v, the sn vectors,
    per tensor the param and the target. Adam and Polyak are elementwise: each runs once over
    every tensor laid end to end. A state or post-step table laid as the params are is
    compared whole (`Joined`); one of another shape (a fault) tensor by tensor, as before.
    `grads_flat`: grad_buf's parameter table in float64, when the caller has it."""
    t = snaps.checkpoint_meta(BEFORE_POLYAK).get("adam_t")
    if not isinstance(t, int) or t < 1:
        raise Missing(f"before_polyak records no valid adam_t (got {t!r})")
    shapes = param_shapes(dims)
    names = [name for name, _, _ in shapes]
    sizes = [rows * cols for _, rows, cols in shapes]
    if grads_flat is None:
        grads_flat = read_table(snaps, AFTER_BACKWARD, "grad_buf", dims)[0]
    m0, v0 = (_state_table(snaps, buffer, inputs.params, dims) for buffer in ("adam_m", "adam_v"))
    stepped_flat, m1, v1 = model.adam(inputs.params_flat, grads_flat, m0, v0, t, hyper)
    m_rows = _rows_of("adam_m", m1, snaps, BEFORE_POLYAK, "adam_m", dims)
    v_rows = _rows_of("adam_v", v1, snaps, BEFORE_POLYAK, "adam_v", dims)

    at = names.index("w_b0fc")
    start, (_, rows, cols) = sum(sizes[:at]), shapes[at]
    w_b0fc = stepped_flat[start : start + rows * cols].view(rows, cols)
    u0 = _f64(snaps.array(STEP_START, "sn_state", "u_b0fc", (1, dims.ADV)))
    projected, sn_u1, sn_v1 = model.spectral_norm(w_b0fc, u0, hyper.sigma_max)
    w_b0fc.copy_(projected)  # the params after the step: written in place
    sn_rows: list[Compared | Joined] = [
        (name, "sn", ref, snaps.optional(BEFORE_POLYAK, "sn_state", name))
        for name, ref in (("u_b0fc", sn_u1), ("v_b0fc", sn_v1))
    ]

    # Polyak from the pipeline's own post-step params (the reference's where they are missing)
    # and the pre-step target
    after_table = snaps.table(BEFORE_POLYAK, "params", dims)
    target_table = snaps.table(STEP_END, "target_params", dims)
    stepped: dict[str, torch.Tensor] = {}  # each tensor of the step's params, where needed
    if after_table is None or target_table is None:
        parts = _split(stepped_flat, [(r, c) for _, r, c in shapes])
        stepped = dict(zip(names, parts, strict=True))
    if after_table is not None:
        online = _f64(after_table)
    else:
        afters = {name: snaps.optional(BEFORE_POLYAK, "params", name) for name in names}
        online = _joined(
            [_f64(a) if (a := afters[n]) is not None and a.shape == stepped[n].shape
             else stepped[n] for n in names]
        )  # fmt: skip
    target = model.polyak(inputs.target_params_flat, online, hyper.tau)
    if after_table is not None and target_table is not None:
        tail: list[Compared | Joined] = [
            Joined("param", names, sizes, stepped_flat, after_table),
            Joined("target", names, sizes, target, target_table),
        ]
    else:
        targets = _split(target, [(r, c) for _, r, c in shapes])
        tail = [
            (name, "param", stepped[name], snaps.optional(BEFORE_POLYAK, "params", name))
            for name in names
        ]
        tail += [
            (name, "target", ref, snaps.optional(STEP_END, "target_params", name))
            for name, ref in zip(names, targets, strict=True)
        ]
    state = [*_listed(m_rows), *_listed(v_rows)]
    return state + sn_rows + tail


def _state_table(
    snaps: StepSnapshots, buffer: str, params: model.Params, dims: DimsView
) -> torch.Tensor:
    """The pre-step Adam state laid end to end in float64: the table whole where it is laid
    as the params are, else tensor by tensor (state_like_params)."""
    table = snaps.table(STEP_START, buffer, dims)
    if table is not None:
        return _f64(table)
    return _joined([state_like_params(snaps, STEP_START, buffer, n, p) for n, p in params.items()])


def _rows_of(
    kind: str, ref: torch.Tensor, snaps: StepSnapshots, checkpoint: str, buffer: str,
    dims: DimsView,
) -> Joined | list[Compared]:  # fmt: skip
    """`ref` (every tensor end to end) against `buffer` at `checkpoint`: whole where the table
    is laid as the params are, else tensor by tensor through the pipeline's own table."""
    shapes = param_shapes(dims)
    names = [name for name, _, _ in shapes]
    table = snaps.table(checkpoint, buffer, dims)
    if table is not None:
        return Joined(kind, names, [r * c for _, r, c in shapes], ref, table)
    refs = _split(ref, [(r, c) for _, r, c in shapes])
    return [
        (name, kind, part, snaps.optional(checkpoint, buffer, name))
        for name, part in zip(names, refs, strict=True)
    ]


def _listed(rows: Joined | list[Compared]) -> list[Compared | Joined]:
    return [rows] if isinstance(rows, Joined) else list(rows)


def in_update_order(checks: list[TensorCheck], names: list[str]) -> list[TensorCheck]:
    """The update's rows in the order they are reported: per tensor Adam m then v, the sn
    vectors, per tensor param then target (each kind and name is one row)."""
    place = {name: i for i, name in enumerate(names)}
    n = len(names)

    def position(c: TensorCheck) -> int:
        if c.kind in ("adam_m", "adam_v"):
            return 2 * place[c.name] + (c.kind == "adam_v")
        if c.kind == "sn":
            return 2 * n + (c.name != "u_b0fc")
        return 2 * n + 2 + 2 * place[c.name] + (c.kind == "target")

    return sorted(checks, key=position)


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([x.reshape(-1) for x in tensors])


def _split(flat: torch.Tensor, shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
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
        grad_rows = [
            Joined("grad", names, [r * c for _, r, c in shapes], _joined(refs), grads_flat)
        ]
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
