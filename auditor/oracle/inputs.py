"""What the oracle reads of a recorded step: its snapshots as float64 tensors through the trace's
layout (missing data raises the trace's `Missing`), the batch and the pipeline's own decisions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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
from egf_audit.runtime.trace import Missing, Trace

# net -> (activation prefix, softmax buffer, observation buffer, context prefix)
NETS = {
    "online": ("save", "aux_nb_softmax_buf", "obs", "ctx"),
    "target": ("tgt", "tgt_aux_softmax", "next_obs", "next_ctx"),
}


# ---- reading the trace ----


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class StepSnapshots:
    """The trace's snapshots of one step, read as [rows, cols] arrays through its layout."""

    def __init__(self, trace: Trace, step: int):
        self.trace, self.step = trace, step

    def array(
        self,
        checkpoint: str,
        buffer: str,
        tensor: str | None = None,
        shape: tuple[int, int] | None = None,
    ) -> np.ndarray:
        values = self.trace.snapshot(self.step, checkpoint, buffer, tensor)
        if shape is not None and values.shape != tuple(shape):
            where = f"{buffer}{'.' + tensor if tensor else ''} at {checkpoint} (step {self.step})"
            raise Missing(f"{where} is {list(values.shape)}; the config says {list(shape)}")
        return values

    def optional(self, checkpoint: str, buffer: str, tensor: str) -> np.ndarray | None:
        """A tensor through the pipeline's own table, whatever its shape, or None."""
        try:
            return self.array(checkpoint, buffer, tensor)
        except Missing:
            return None

    def checkpoint_meta(self, name: str) -> dict:
        return self.trace.checkpoint(self.step, name).args


def _f64(array: np.ndarray, dev: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.asarray(array, dtype=np.float64)).to(dev)


def _indices(values: np.ndarray, limit: int, what: str, dev: torch.device) -> torch.Tensor:
    if values.size and (values.min() < 0 or values.max() >= limit):
        raise Missing(f"{what} holds an index outside [0, {limit})")
    return torch.from_numpy(values.astype(np.int64)).to(dev)


@dataclass
class StepInputs:
    params: model.Params
    target_params: model.Params
    obs: dict[str, torch.Tensor]  # "obs" / "next_obs"
    context: dict[str, list[torch.Tensor | None]]  # "ctx" / "next_ctx" -> per branch (d >= 1)
    activations: dict[str, dict[str, np.ndarray]]  # net -> ReLU layer -> pipeline activation
    aux_softmax: dict[str, np.ndarray]  # net -> the pipeline's softmax (its wire's source)
    target_q: list[np.ndarray]  # the pipeline's Q'_d, which its TD argmax was taken on
    td_argmax: np.ndarray  # [B, branches], the pipeline's
    batch: model.StepBatch
    alpha: float  # ISV[393] as the backward read it


def read_params(
    snaps: StepSnapshots, checkpoint: str, buffer: str, dims: DimsView, dev: torch.device
) -> model.Params:
    return {
        name: _f64(snaps.array(checkpoint, buffer, name, (rows, cols)), dev)
        for name, rows, cols in param_shapes(dims)
    }


def load_inputs(snaps: StepSnapshots, dims: DimsView, dev: torch.device) -> StepInputs:
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
        obs[obs_name] = _f64(snaps.array(STEP_START, obs_name, shape=(d.B, d.OBS)), dev)
        context[ctx] = [None] + [
            _f64(snaps.array(STEP_START, f"{ctx}_b{b}", shape=(d.B, d.E[b])), dev)
            for b in range(1, nb)
        ]
    actions = snaps.array(STEP_START, "actions", shape=(d.B, nb))
    for b in range(nb):
        _indices(actions[:, b], d.A[b], f"actions[:, {b}]", dev)
    labels = snaps.array(STEP_START, "aux_label", shape=(d.B, 1))[:, 0]
    batch = model.StepBatch(
        actions=_indices(actions, max(d.A), "actions", dev),
        reward=_f64(snaps.array(STEP_START, "reward", shape=(d.B, 1))[:, 0], dev),
        done=_f64(snaps.array(STEP_START, "done", shape=(d.B, 1))[:, 0], dev),
        aux_label=_indices(labels, d.AUXK, "aux_label", dev),
    )
    isv = snaps.array(AFTER_LOSSES, "isv_signals").ravel()
    if isv.size <= ALPHA_GRAD_SMOOTHED_INDEX:
        raise Missing("isv_signals at after_losses is shorter than ISV[393]")
    return StepInputs(
        params=read_params(snaps, STEP_START, "params", dims, dev),
        target_params=read_params(snaps, STEP_START, "target_params", dims, dev),
        obs=obs,
        context=context,
        activations=activations,
        aux_softmax=aux_softmax,
        target_q=[
            snaps.array(AFTER_FORWARD, f"tgt_q_b{b}", shape=(d.B, d.A[b])) for b in range(nb)
        ],
        td_argmax=snaps.array(AFTER_LOSSES, "td_argmax", shape=(d.B, nb)).astype(np.int64),
        batch=batch,
        alpha=float(np.float32(isv[ALPHA_GRAD_SMOOTHED_INDEX])),
    )


def pipeline_relu_inputs(inputs: StepInputs, net: str, dev: torch.device) -> dict:
    """The fp32 input each ReLU layer's linear map had in the pipeline, from its saved
    activations: [h_s2 | wire] with the wire rounded as the concat kernel rounds it (one fp32
    subtraction), [h_s2 | context] for the other branches."""
    _, _, obs, ctx = NETS[net]
    act, p = inputs.activations[net], inputs.aux_softmax[net]
    wire = (p[:, AUX_UP_INDEX] - p[:, AUX_DOWN_INDEX])[:, None]  # float32 arithmetic
    h_s2 = _f64(act["h_s2"], dev)
    out = {"h_s1": inputs.obs[obs], "h_s2": _f64(act["h_s1"], dev), "v_hid": h_s2}
    out["b0_hid"] = torch.cat([h_s2, _f64(wire, dev)], dim=1)
    for b in range(1, len(BRANCHES)):
        context = inputs.context[ctx][b]
        assert context is not None  # every branch but the direction one has its context
        out[f"b{b}_hid"] = torch.cat([h_s2, context], dim=1)
    return out
