"""The SP14 trainer step, rebuilt at the trainer's real shapes on flat buffers.

One `SP14Pipeline` owns the buffers of one trainer instance. `step()` runs the seed's
orchestration: forward (online on obs, target on next_obs, both writing the shared dir concat
scratch), the losses, both backward call sites (CQL aux, then main online), the gate producer in
live mode, Adam, the spectral-norm projection of w_b0fc, and Polyak. Every launch goes through
the recorder; forward/backward/update live in their own modules and read like the seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import backward, forward, update
from .backends.base import Backend
from .config import ALPHA_GRAD_SMOOTHED_INDEX, BRANCHES, Config
from .memory import AddressMap, Layout, build_layout, param_shapes
from .recorder import Recorder
from .wiring import PRODUCTION, Wiring

MODES = ("sentinel", "live")
PERSISTENT = ("params", "target_params", "adam_m", "adam_v", "sn_state", "isv_signals")


@dataclass(frozen=True)
class Probes:
    """What the audit may do to a step beyond the trainer's own code."""

    force_alpha: float | None = None  # write ISV[393] = this before backward
    inject_wire_nonfinite: bool = False  # NaN/+Inf/-Inf into the upstream wire dX, both sites


@dataclass
class State:
    """Everything a step depends on, for a bit-exact replay."""

    buffers: dict[str, np.ndarray]
    adam_t: int
    step: int = 0
    meta: dict = field(default_factory=dict)


def layout_for(config: Config, wiring: Wiring) -> Layout:
    dims = config.dims
    adam_shapes = None
    if wiring.adam_state_w_b0fc == "sh2":  # the pre-B.8 Adam state of w_b0fc: [ADV, SH2]
        adam_shapes = [(n, r, c - 1 if n == "w_b0fc" else c) for n, r, c in param_shapes(dims)]
    sn_v_len = dims.SH2 if wiring.sn_v_len == "sh2" else None
    return build_layout(dims, adam_state_shapes=adam_shapes, sn_v_len=sn_v_len)


class SP14Pipeline:
    def __init__(
        self,
        config: Config,
        backend: Backend,
        wiring: Wiring = PRODUCTION,
        instrumented: bool = True,
        scenario: str = "plain",
        capture_inputs_of: frozenset[str] = frozenset(),
    ):
        self.config = config
        self.dims = config.dims
        self.hyper = config.hyper
        self.backend = backend
        self.wiring = wiring
        self.layout = layout_for(config, wiring)
        self.amap = AddressMap(self.layout)
        for spec in self.layout.buffers:
            self.amap.register(spec.name, backend.alloc(spec))
        self.rec = Recorder(
            backend, self.amap, self.layout, instrumented, scenario, capture_inputs_of
        )
        self.adam_t = 0
        self.step_index = 0
        self.rec.trace.meta.update(config=config.as_dict(), wiring_sites=list(wiring.scale_sites))

    # ---- pointers, named as the trainer names them ----
    def ptr(self, buffer: str, tensor: str | None = None, element: int = 0) -> int:
        return self.amap.ptr(buffer, tensor, element)

    def poff(self, name: str) -> int:
        """params + poff_<name>"""
        return self.ptr("params", name)

    def goff(self, name: str) -> int:
        """grad_buf + goff_<name>"""
        return self.ptr("grad_buf", name)

    # ---- initial state ----
    def initialize(self) -> None:
        """Seeded weights; the target starts as a copy; Adam state and ISV zero."""
        rng = np.random.default_rng(self.config.seed)
        self.rec.step = -1
        for name, rows, cols in param_shapes(self.dims):
            if name.startswith("w_"):
                values = rng.standard_normal((rows, cols)) / np.sqrt(cols)
            else:
                values = 0.1 * rng.standard_normal((rows, cols))
            values = values.astype(np.float32)
            self.rec.upload(f"init:{name}", self.poff(name), values)
            self.rec.upload(f"init:target:{name}", self.ptr("target_params", name), values)
        for vec in ("u_b0fc", "v_b0fc"):
            t = self.layout.buffer("sn_state").tensor(vec)
            x = rng.standard_normal(t.cols)
            self.rec.upload(
                f"init:{vec}", self.ptr("sn_state", vec), (x / np.linalg.norm(x)).astype(np.float32)
            )
        self._write_constants("init")
        self.adam_t = 0

    def _write_constants(self, label: str) -> None:
        """ones_b is no state but a constant every bias-gradient SGEMM and the gate producer's sum
        reduce against: a fresh pipeline, initialised or replayed, must write it."""
        self.rec.upload(f"{label}:ones_b", self.ptr("ones_b"), np.ones(self.dims.B, np.float32))

    def make_batch(self, step: int) -> dict[str, np.ndarray]:
        """The step's batch, from a generator seeded by (seed, step)."""
        d = self.dims
        rng = np.random.default_rng([self.config.seed, step])
        batch = {
            "obs": rng.standard_normal((d.B, d.OBS)),
            "next_obs": rng.standard_normal((d.B, d.OBS)),
            "actions": np.stack([rng.integers(0, a, d.B) for a in d.A], axis=1),
            "reward": rng.standard_normal(d.B),
            "done": (rng.random(d.B) < 0.1).astype(np.float64),
            "aux_label": rng.integers(0, d.AUXK, d.B),
        }
        for b in range(1, len(BRANCHES)):
            batch[f"ctx_b{b}"] = rng.standard_normal((d.B, d.E[b]))
            batch[f"next_ctx_b{b}"] = rng.standard_normal((d.B, d.E[b]))
        return {
            k: v.astype(np.int32 if k in ("actions", "aux_label") else np.float32)
            for k, v in batch.items()
        }

    def save_state(self) -> State:
        self.backend.synchronize()
        return State({b: self.rec.read(b) for b in PERSISTENT}, self.adam_t, self.step_index)

    def release(self) -> None:
        """Free every allocation; the trace and its snapshots stay."""
        self.backend.synchronize()
        for base in self.amap.bases.values():
            self.backend.free(base)
        self.amap.bases.clear()

    def load_state(self, state: State) -> None:
        self.rec.step = state.step
        for name, values in state.buffers.items():
            self.rec.upload(f"replay:load_state:{name}", self.ptr(name), values)
        self._write_constants("replay:load_state")
        self.adam_t = state.adam_t
        self.step_index = state.step

    # ---- the step ----
    def step(
        self, mode: str = "sentinel", probes: Probes = Probes(), upload_batch: bool = True
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
        rec.checkpoint("step_start", [*PERSISTENT, *self.make_batch_names()], adam_t=self.adam_t)

        forward.forward(self, "online")
        rec.checkpoint("forward_target:begin", [])
        forward.forward(self, "target")
        rec.checkpoint("forward_target:end", [])
        rec.checkpoint("after_forward", forward.saved_activations(self))

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
            "after_losses",
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
            backward.call_site(self, site, probes)
        rec.checkpoint("after_backward", ["grad_buf"])

        self.adam_t += 1
        update.adam(self)
        update.spectral_norm(self)
        rec.checkpoint("before_polyak", list(PERSISTENT), adam_t=self.adam_t)
        update.polyak(self)
        rec.checkpoint("step_end", ["params", "target_params"])
        self.step_index += 1

    def make_batch_names(self) -> list[str]:
        names = ["obs", "next_obs", "actions", "reward", "done", "aux_label"]
        for b in range(1, len(BRANCHES)):
            names += [f"ctx_b{b}", f"next_ctx_b{b}"]
        return names
