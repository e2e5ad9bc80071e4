"""What the oracle reads of a recorded step: its snapshots as tensors on the oracle's device
through the trace's layout (missing data raises the trace's `Missing`), the batch and the
pipeline's own decisions.

On the GPU a snapshot is read where the backend copied it, through DLPack: the float64 checks
then run on data that never left the device. Elsewhere (the CPU backend, a capture) it is read
from its host copy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from egf_audit.oracle import model
from egf_audit.trace.config_view import DimsView
from egf_audit.trace.contract import (
    AFTER_FORWARD,
    AFTER_LOSSES,
    ALPHA_GRAD_SMOOTHED_INDEX,
    AUX_DOWN_INDEX,
    AUX_UP_INDEX,
    BRANCHES,
    STEP_START,
    param_shapes,
)
from egf_audit.trace.model import Missing, Snapshot, Trace

PARAM_NAMES_FIRST = "w_s1"  # param_shapes' first tensor: where a parameter table starts

# net -> (activation prefix, softmax buffer, observation buffer, context prefix)
NETS = {
    "online": ("save", "aux_nb_softmax_buf", "obs", "ctx"),
    "target": ("tgt", "tgt_aux_softmax", "next_obs", "next_ctx"),
}


# ---- reading the trace ----


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def flat_snapshot(
    trace: Trace, step: int, checkpoint: str, buffer: str, dev: torch.device
) -> torch.Tensor:
    """A whole flat buffer as snapshotted at a checkpoint, on `dev`, in its own dtype."""
    snap = trace.snapshots.get((step, checkpoint))
    if snap is None or buffer not in snap:
        trace.buffer_snapshot(step, checkpoint, buffer)  # raises its Missing
    assert snap is not None
    if dev.type == "cuda" and isinstance(snap, Snapshot):
        view = snap.device_array(buffer)
        if view is not None:
            return torch.from_dlpack(view)
    return torch.from_numpy(snap[buffer]).to(dev)


def tensor_view(trace: Trace, flat: torch.Tensor, buffer: str, tensor: str | None) -> torch.Tensor:
    """A [rows, cols] view of one tensor (by default the buffer's own) of a flat copy, through
    the trace's layout: Trace.tensor for tensors."""
    name = tensor or buffer
    try:
        offset, rows, cols = trace.layout[buffer]["tensors"][name]
    except KeyError:
        raise Missing(f"the layout of {trace.scenario} has no tensor {name} in {buffer}") from None
    if flat.numel() < offset + rows * cols:
        raise Missing(f"a snapshot of {buffer} in {trace.scenario} is shorter than {name}")
    return flat[offset : offset + rows * cols].reshape(rows, cols)


class StepSnapshots:
    """The trace's snapshots of one step, read as [rows, cols] tensors on `dev` through its
    layout."""

    def __init__(self, trace: Trace, step: int, dev: torch.device):
        self.trace, self.step, self.dev = trace, step, dev
        self._flats: dict[tuple[str, str], torch.Tensor] = {}  # each buffer read once

    def flat(self, checkpoint: str, buffer: str) -> torch.Tensor:
        key = (checkpoint, buffer)
        if key not in self._flats:
            self._flats[key] = flat_snapshot(self.trace, self.step, checkpoint, buffer, self.dev)
        return self._flats[key]

    def array(
        self,
        checkpoint: str,
        buffer: str,
        tensor: str | None = None,
        shape: tuple[int, int] | None = None,
        flat: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One tensor of a snapshot, held to `shape` when given; out of `flat` (the buffer's
        snapshot already converted, say) when given."""
        flat = self.flat(checkpoint, buffer) if flat is None else flat
        values = tensor_view(self.trace, flat, buffer, tensor)
        if shape is not None and tuple(values.shape) != tuple(shape):
            where = f"{buffer}{'.' + tensor if tensor else ''} at {checkpoint} (step {self.step})"
            raise Missing(f"{where} is {list(values.shape)}; the config says {list(shape)}")
        return values

    def table(self, checkpoint: str, buffer: str, dims: DimsView) -> torch.Tensor | None:
        """Every parameter tensor of `buffer`'s snapshot end to end, as one flat slice of it (no
        copy), where the layout lays them so: in param_shapes order, each where the one before
        ends, shaped as the config says. None otherwise (a missing buffer, a table of another
        shape): the caller then reads tensor by tensor, which says what is wrong. One slice
        stands for many views, and a step's elementwise work and comparisons run over it."""
        try:
            tensors = self.trace.layout[buffer]["tensors"]
            start = at = int(tensors[PARAM_NAMES_FIRST][0])
            for name, rows, cols in param_shapes(dims):
                if tuple(tensors[name]) != (at, rows, cols):
                    return None
                at += rows * cols
            flat = self.flat(checkpoint, buffer)
        except (KeyError, Missing):
            return None
        return flat[start:at] if flat.numel() >= at else None

    def optional(self, checkpoint: str, buffer: str, tensor: str) -> torch.Tensor | None:
        """A tensor through the pipeline's own table, whatever its shape, or None."""
        try:
            return self.array(checkpoint, buffer, tensor)
        except Missing:
            return None

    def checkpoint_meta(self, name: str) -> dict:
        return self.trace.checkpoint(self.step, name).args


def _f64(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float64)


def _check_indices(low: float, high: float, limit: int, what: str) -> None:
    """`low` and `high` are an index tensor's least and largest values, read back."""
    if low < 0 or high >= limit:
        raise Missing(f"{what} holds an index outside [0, {limit})")


@dataclass
class StepInputs:
    params: model.Params
    target_params: model.Params
    obs: dict[str, torch.Tensor]  # "obs" / "next_obs"
    context: dict[str, list[torch.Tensor | None]]  # "ctx" / "next_ctx" -> per branch (d >= 1)
    activations: dict[str, dict[str, torch.Tensor]]  # net -> ReLU layer -> fp32 activation
    aux_softmax: dict[str, torch.Tensor]  # net -> the pipeline's fp32 softmax (the wire's)
    target_q: list[torch.Tensor]  # the pipeline's fp32 Q'_d, which its TD argmax was taken on
    td_argmax: torch.Tensor  # [B, branches] int64, the pipeline's
    batch: model.StepBatch
    alpha: float  # ISV[393] as the backward read it
    alpha_on_device: torch.Tensor  # the same value, 0-d float64 on the oracle's device
    params_flat: torch.Tensor  # params, every tensor end to end (param_shapes order), float64
    target_params_flat: torch.Tensor  # target_params likewise


def read_params(snaps: StepSnapshots, checkpoint: str, buffer: str, dims: DimsView) -> model.Params:
    """Every parameter tensor of a snapshot in float64: the buffer converted once, each tensor
    a view of it."""
    return read_table(snaps, checkpoint, buffer, dims)[1]


def read_table(
    snaps: StepSnapshots, checkpoint: str, buffer: str, dims: DimsView
) -> tuple[torch.Tensor, model.Params]:
    """Every parameter tensor of a snapshot in float64, end to end and each as a [rows, cols]
    view: one conversion and one split where the layout lays them end to end in order (see
    StepSnapshots.table), else the buffer converted once and read tensor by tensor (what is
    missing or misshapen raises its Missing), the flat copy then joined from the views."""
    shapes = param_shapes(dims)
    table = snaps.table(checkpoint, buffer, dims)
    if table is not None:
        flat = _f64(table)
        parts = flat.split([rows * cols for _, rows, cols in shapes])
        return flat, {
            name: part.view(rows, cols)
            for part, (name, rows, cols) in zip(parts, shapes, strict=True)
        }
    whole = _f64(snaps.flat(checkpoint, buffer))
    views = {
        name: snaps.array(checkpoint, buffer, name, (rows, cols), flat=whole)
        for name, rows, cols in shapes
    }
    return torch.cat([v.reshape(-1) for v in views.values()]), views


def load_inputs(snaps: StepSnapshots, dims: DimsView) -> StepInputs:
    d, nb = dims, len(BRANCHES)
    widths = {"h_s1": d.SH1, "h_s2": d.SH2, "v_hid": d.VALH}
    widths.update({f"b{b}_hid": d.ADV for b in range(nb)})
    activations, aux_softmax, obs, context = {}, {}, {}, {}
    for net, (pre, softmax, obs_name, ctx) in NETS.items():
        activations[net] = {
            layer: snaps.array(AFTER_FORWARD, f"{pre}_{layer}", shape=(d.B, widths[layer]))
            for layer in model.RELU_LAYERS
        }
        aux_softmax[net] = snaps.array(AFTER_FORWARD, softmax, shape=(d.B, d.AUXK))
        obs[obs_name] = _f64(snaps.array(STEP_START, obs_name, shape=(d.B, d.OBS)))
        context[ctx] = [None] + [
            _f64(snaps.array(STEP_START, f"{ctx}_b{b}", shape=(d.B, d.E[b]))) for b in range(1, nb)
        ]
    actions = snaps.array(STEP_START, "actions", shape=(d.B, nb))
    # the index checks and the gate read back at once, then judged in their order
    try:
        labels: torch.Tensor | Missing = snaps.array(STEP_START, "aux_label", shape=(d.B, 1))[:, 0]
    except Missing as exc:
        labels = exc
    try:
        isv: torch.Tensor | Missing = snaps.array(AFTER_LOSSES, "isv_signals").reshape(-1)
    except Missing as exc:
        isv = exc
    alpha_at = (
        isv[ALPHA_GRAD_SMOOTHED_INDEX].double()
        if isinstance(isv, torch.Tensor) and _longer(isv)
        else None
    )
    low_high = [torch.aminmax(actions, dim=0)] if actions.numel() else []
    if isinstance(labels, torch.Tensor) and labels.numel():
        low_high.append(torch.aminmax(labels))
    read = [torch.stack([low.double(), high.double()]).reshape(2, -1) for low, high in low_high]
    read += [alpha_at.reshape(1, 1).expand(2, 1)] if alpha_at is not None else []
    values = torch.cat(read, dim=1).tolist() if read else [[], []]
    low, high = values[0], values[1]
    if actions.numel():
        for b in range(nb):
            _check_indices(low[b], high[b], d.A[b], f"actions[:, {b}]")
    if isinstance(labels, Missing):
        raise labels
    if actions.numel():
        _check_indices(min(low[:nb]), max(high[:nb]), max(d.A), "actions")
    batch = model.StepBatch(
        actions=actions.to(torch.int64),
        reward=_f64(snaps.array(STEP_START, "reward", shape=(d.B, 1))[:, 0]),
        done=_f64(snaps.array(STEP_START, "done", shape=(d.B, 1))[:, 0]),
        aux_label=labels.to(torch.int64),
    )
    if labels.numel():
        at = nb if actions.numel() else 0
        _check_indices(low[at], high[at], d.AUXK, "aux_label")
    if isinstance(isv, Missing):
        raise isv
    if alpha_at is None:
        raise Missing("isv_signals at after_losses is shorter than ISV[393]")
    params_flat, params = read_table(snaps, STEP_START, "params", dims)
    target_flat, target_params = read_table(snaps, STEP_START, "target_params", dims)
    return StepInputs(
        params=params,
        target_params=target_params,
        obs=obs,
        context=context,
        activations=activations,
        aux_softmax=aux_softmax,
        target_q=[
            snaps.array(AFTER_FORWARD, f"tgt_q_b{b}", shape=(d.B, d.A[b])) for b in range(nb)
        ],
        td_argmax=snaps.array(AFTER_LOSSES, "td_argmax", shape=(d.B, nb)).to(torch.int64),
        batch=batch,
        alpha=values[0][-1],  # an fp32 value, exact as a float
        alpha_on_device=alpha_at,
        params_flat=params_flat,
        target_params_flat=target_flat,
    )


def _longer(isv: torch.Tensor | Missing) -> bool:
    return isinstance(isv, torch.Tensor) and isv.numel() > ALPHA_GRAD_SMOOTHED_INDEX


def pipeline_relu_inputs(inputs: StepInputs, net: str) -> dict:
    """The fp32 input each ReLU layer's linear map had in the pipeline, from its saved
    activations: [h_s2 | wire] with the wire rounded as the concat kernel rounds it (one fp32
    subtraction), [h_s2 | context] for the other branches."""
    _, _, obs, ctx = NETS[net]
    act, p = inputs.activations[net], inputs.aux_softmax[net]
    wire = (p[:, AUX_UP_INDEX] - p[:, AUX_DOWN_INDEX])[:, None]  # float32 arithmetic
    h_s2 = _f64(act["h_s2"])
    out = {"h_s1": inputs.obs[obs], "h_s2": _f64(act["h_s1"]), "v_hid": h_s2}
    out["b0_hid"] = torch.cat([h_s2, _f64(wire)], dim=1)
    for b in range(1, len(BRANCHES)):
        context = inputs.context[ctx][b]
        assert context is not None  # every branch but the direction one has its context
        out[f"b{b}_hid"] = torch.cat([h_s2, context], dim=1)
    return out
