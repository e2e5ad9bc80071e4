"""The trainer's hyper-parameters (kernels/CONTRACT.md, section 2), with their defaults. The
rebuild's config (egf_audit.pipeline.config) overrides them from a TOML file; a capture is judged
with them as they are, since the capture recorded the trainer, not a config."""

from __future__ import annotations

from dataclasses import dataclass

from egf_audit.trace.contract import POLYAK_TAU


@dataclass(frozen=True)
class Hyper:
    gamma: float = 0.99
    huber_kappa: float = 1.0
    lambda_cql: float = 0.1
    lambda_aux: float = 0.5
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    tau: float = POLYAK_TAU
    sigma_max: float = 1.0
    gate_ema: float = 0.9  # EMA decay of the smoothed gate written to ISV[393]
