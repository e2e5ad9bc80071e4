"""The SP14 trainer step, rebuilt at the trainer's real shapes on flat buffers.

`SP14Pipeline.step()` runs the seed's orchestration on one trainer instance: forward (online on
obs, target on next_obs, both writing the shared dir concat scratch), the losses, both backward
call sites (CQL aux, then main online), the gate producer in live mode, Adam, the spectral-norm
projection of w_b0fc, and Polyak. Every launch goes through the recorder; forward, backward and
update live in their own modules and read like the seed.
"""

from __future__ import annotations

import numpy as np

from egf_audit.pipeline import forward, update
from egf_audit.pipeline.call_site import call_site
from egf_audit.pipeline.instance import NO_PROBES, Probes, TrainerInstance
from egf_audit.trace.contract import (
    AFTER_BACKWARD,
    AFTER_FORWARD,
    AFTER_LOSSES,
    ALPHA_GRAD_SMOOTHED_INDEX,
    BEFORE_POLYAK,
    BRANCHES,
    PERSISTENT,
    STEP_END,
    STEP_START,
    TARGET_FORWARD_BEGIN,
    TARGET_FORWARD_END,
)

MODES = ("sentinel", "live")


class SP14Pipeline(TrainerInstance):
    # ---- the step ----
    def step(
        self, mode: str = "sentinel", probes: Probes = NO_PROBES, upload_batch: bool = True
    ) -> None:
        """One training step, in the seed's order. `upload_batch=False` reuses the batch already
        on the device: a step captured into a CUDA graph may not copy pageable host memory."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode}")
        rec, t = self.rec, self.step_index
        rec.step = t
        if upload_batch:
            for name, values in self.make_batch(t).items():
                rec.upload(f"batch:{name}", self.ptr(name), values)
        rec.checkpoint(STEP_START, [*PERSISTENT, *self.make_batch_names()], adam_t=self.adam_t)

        forward.forward(self, "online")
        rec.checkpoint(TARGET_FORWARD_BEGIN, [])
        forward.forward(self, "target")
        rec.checkpoint(TARGET_FORWARD_END, [])
        rec.checkpoint(AFTER_FORWARD, forward.saved_activations(self))

        forward.losses(self)
        if mode == "live":
            # gate producer (B.4 / B.11): the smoothed gate into ISV[393], before backward
            update.gate_producer(self)
        if probes.force_alpha is not None:
            rec.upload(
                "audit:force_alpha",
                self.ptr("isv_signals", element=ALPHA_GRAD_SMOOTHED_INDEX),
                np.array([probes.force_alpha], np.float32),
            )
        rec.checkpoint(
            AFTER_LOSSES,
            [
                "isv_signals",
                "td_target",
                "td_argmax",
                *[f"dq_{s}_b{d}" for s in ("main", "cql") for d in range(len(BRANCHES))],
            ],
        )

        # grad_buf is zeroed once per step; every dW SGEMM accumulates into it (beta = 1)
        rec.memset_zero("zero_grad_buf", self.ptr("grad_buf"), self.layout.buffer("grad_buf").size)
        for site in ("cql", "main"):
            call_site(self, site, probes)
        rec.checkpoint(AFTER_BACKWARD, ["grad_buf"])

        self.adam_t += 1
        update.adam(self)
        update.spectral_norm(self)
        rec.checkpoint(BEFORE_POLYAK, list(PERSISTENT), adam_t=self.adam_t)
        update.polyak(self)
        rec.checkpoint(STEP_END, ["params", "target_params"])
        self.step_index += 1
