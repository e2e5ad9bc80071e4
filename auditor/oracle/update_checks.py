"""EGF010's third part: float64 Adam, the spectral-norm projection and Polyak applied to the
pipeline's own gradients and pre-step state, against its post-step params, Adam m/v, sn vectors
and target (kernels/CONTRACT.md's EGF010 note: a near-zero gradient whose sign differs between
fp32 and float64 would otherwise flip an Adam step by 2 lr)."""

from __future__ import annotations

import torch

from egf_audit.oracle import model
from egf_audit.oracle.inputs import StepInputs, StepSnapshots, _f64, read_table
from egf_audit.oracle.tensor_checks import (
    Compared,
    Joined,
    TensorCheck,
    compare_many,
    joined,
    split,
)
from egf_audit.trace.config_view import DimsView, HyperView
from egf_audit.trace.contract import (
    AFTER_BACKWARD,
    BEFORE_POLYAK,
    STEP_END,
    STEP_START,
    param_shapes,
)
from egf_audit.trace.model import Missing


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
        parts = split(stepped_flat, [(r, c) for _, r, c in shapes])
        stepped = dict(zip(names, parts, strict=True))
    if after_table is not None:
        online = _f64(after_table)
    else:
        afters = {name: snaps.optional(BEFORE_POLYAK, "params", name) for name in names}
        online = joined(
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
        targets = split(target, [(r, c) for _, r, c in shapes])
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
    return joined([state_like_params(snaps, STEP_START, buffer, n, p) for n, p in params.items()])


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
    refs = split(ref, [(r, c) for _, r, c in shapes])
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
