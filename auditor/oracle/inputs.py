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
from egf_audit.runtime.config_view import DimsView
from egf_audit.runtime.contract import (
    AFTER_FORWARD,
    AFTER_LOSSES,
    ALPHA_GRAD_SMOOTHED_INDEX,
    AUX_DOWN_INDEX,
    AUX_UP_INDEX,
    BRANCHES,
    STEP_START,
    param_shapes,
)
from egf_audit.runtime.trace import Missing, Snapshot, Trace

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


def _indices(values: torch.Tensor, limit: int, what: str) -> torch.Tensor:
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= limit):
        raise Missing(f"{what} holds an index outside [0, {limit})")
    return values.to(torch.int64)


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


def read_params(snaps: StepSnapshots, checkpoint: str, buffer: str, dims: DimsView) -> model.Params:
    """Every parameter tensor of a snapshot in float64: the buffer converted once, each tensor
    a view of it."""
    flat = _f64(snaps.flat(checkpoint, buffer))
    return {
        name: snaps.array(checkpoint, buffer, name, (rows, cols), flat=flat)
        for name, rows, cols in param_shapes(dims)
    }


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
    for b in range(nb):
        _indices(actions[:, b], d.A[b], f"actions[:, {b}]")
    labels = snaps.array(STEP_START, "aux_label", shape=(d.B, 1))[:, 0]
    batch = model.StepBatch(
        actions=_indices(actions, max(d.A), "actions"),
        reward=_f64(snaps.array(STEP_START, "reward", shape=(d.B, 1))[:, 0]),
        done=_f64(snaps.array(STEP_START, "done", shape=(d.B, 1))[:, 0]),
        aux_label=_indices(labels, d.AUXK, "aux_label"),
    )
    isv = snaps.array(AFTER_LOSSES, "isv_signals").reshape(-1)
    if isv.numel() <= ALPHA_GRAD_SMOOTHED_INDEX:
        raise Missing("isv_signals at after_losses is shorter than ISV[393]")
    return StepInputs(
        params=read_params(snaps, STEP_START, "params", dims),
        target_params=read_params(snaps, STEP_START, "target_params", dims),
        obs=obs,
        context=context,
        activations=activations,
        aux_softmax=aux_softmax,
        target_q=[
            snaps.array(AFTER_FORWARD, f"tgt_q_b{b}", shape=(d.B, d.A[b])) for b in range(nb)
        ],
        td_argmax=snaps.array(AFTER_LOSSES, "td_argmax", shape=(d.B, nb)).to(torch.int64),
        batch=batch,
        alpha=float(isv[ALPHA_GRAD_SMOOTHED_INDEX]),  # an fp32 value, exact as a float
    )


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
