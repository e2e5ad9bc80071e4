"""EGF007's second fact: d_h_s2 at a call site's trunk entry against a float64 recomputation of
its three inflows (value-FC dX, the first SH2 columns of every branch's concat dX, aux dX),
within a proved bound on the error of any fp32 evaluation order of that sum."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np
import torch

from egf_audit.invariants.common import json_float
from egf_audit.oracle.inputs import StepSnapshots, device
from egf_audit.trace.contract import BRANCHES, DIR_DX, STEP_START, TRUNK_ENTRY, site_checkpoint
from egf_audit.trace.model import Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Trace

UNIT_ROUNDOFF = 2.0**-24  # fp32
FP32_TINY = float(np.finfo(np.float32).tiny)


def concat_dx_buffer(d: int) -> str:
    return DIR_DX if d == 0 else f"sp14_d_b{d}_concat"


class TrunkEntry(TypedDict):
    """d_h_s2 at one site's trunk entry against its float64 recomputation."""

    step: int
    site: str
    elements_over: int  # elements whose error exceeds the bound
    max_abs_err: float
    max_abs_ref: float
    max_err_over_bound: float


def recompute(run: AuditRun, trace: Trace, step: int, site: str) -> torch.Tensor:
    """|d_h_s2 - ref| against the bound gamma_N * M, elementwise, where M sums the magnitudes of
    every term and N is twice the number of terms an element sums (VALH products, one column
    per branch, AUXK products). gamma_N = N u / (1 - N u) bounds the error of ANY fp32
    evaluation order of such a sum (Higham, Accuracy and Stability, ch. 3), so the tolerance
    holds for cuBLAS and the CPU alike with no tuned constant. In float64 on the oracle's
    device: on the GPU the snapshots are read where they were copied. Returns [elements over,
    max|err|, max|ref|, max err/bound] on that device, read back with every other site-step's
    (trunk_entry)."""
    dims = run.config.dims
    s2 = dims.SH2
    point = site_checkpoint(site, TRUNK_ENTRY)
    snaps = StepSnapshots(trace, step, device())
    w_v0 = snaps.array(STEP_START, "params", "w_v0").double()
    w_aux = snaps.array(STEP_START, "params", "w_aux").double()
    d_v_hid = snaps.array(point, "d_v_hid").double()
    d_aux = snaps.array(point, "d_aux_logits").double()
    concat = [
        snaps.array(point, concat_dx_buffer(d)).double()[:, :s2] for d in range(len(BRANCHES))
    ]
    got = snaps.array(point, "d_h_s2").double()
    shapes = {
        "d_v_hid": (d_v_hid.shape, (dims.B, dims.VALH)),
        "w_v0": (w_v0.shape, (dims.VALH, s2)),
        "d_aux_logits": (d_aux.shape, (dims.B, dims.AUXK)),
        "w_aux": (w_aux.shape, (dims.AUXK, s2)),
        "d_h_s2": (got.shape, (dims.B, s2)),
        **{concat_dx_buffer(d): (c.shape, (dims.B, s2)) for d, c in enumerate(concat)},
    }
    for name, (shape, expected) in shapes.items():
        if tuple(shape) != expected:
            raise Missing(f"{name} at {point} (step {step}) is {list(shape)}, not {list(expected)}")

    ref = d_v_hid @ w_v0 + sum(concat) + d_aux @ w_aux
    magnitude = d_v_hid.abs() @ w_v0.abs() + sum(c.abs() for c in concat)
    magnitude = magnitude + d_aux.abs() @ w_aux.abs()
    terms = 2 * (dims.VALH + len(BRANCHES) + dims.AUXK)
    gamma = terms * UNIT_ROUNDOFF / (1.0 - terms * UNIT_ROUNDOFF)
    bound = gamma * magnitude + terms * FP32_TINY  # the floor covers subnormal flushing
    err = (got - ref).abs()
    err = torch.where(err.isnan(), torch.inf, err)  # a NaN never passes
    over = (~(err <= bound)).sum().double()  # a NaN bound fails too
    return torch.stack([over, err.max(), ref.abs().max(), (err / bound).max()])


def trunk_entry(step: int, site: str, measured: list[float]) -> TrunkEntry:
    """A recompute read back."""
    return {
        "step": step,
        "site": site,
        "elements_over": int(measured[0]),
        "max_abs_err": measured[1],
        "max_abs_ref": measured[2],
        "max_err_over_bound": measured[3],
    }


Measured = Literal["max_err_over_bound", "max_abs_err", "max_abs_ref"]
MEASURED: tuple[Measured, ...] = ("max_err_over_bound", "max_abs_err", "max_abs_ref")


def entry_json(result: TrunkEntry) -> dict[str, object]:
    """The entry as evidence: its measured floats strict JSON (NaN and Inf by name)."""
    out: dict[str, object] = dict(result)
    for k in MEASURED:
        out[k] = json_float(result[k])
    return out
