"""One trainer instance: its layout, its buffers on a backend, the pointers into them (named as the
trainer names them: `poff_w_b0fc`, `goff_w_b0fc`), its seeded initial state and batches, and a
saved state for bit-exact replays. Every write goes through the recorder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from egf_audit.pipeline.config import Config
from egf_audit.pipeline.layout import build_layout
from egf_audit.pipeline.wiring import PRODUCTION, Width, Wiring
from egf_audit.runtime.backends.base import Backend
from egf_audit.runtime.memory import AddressMap, Layout
from egf_audit.runtime.recorder import Recorder
from egf_audit.trace.contract import BRANCHES, PERSISTENT, param_shapes


@dataclass(frozen=True)
class Probes:
    """What the audit may do to a step beyond the trainer's own code."""

    force_alpha: float | None = None  # write ISV[393] = this before backward
    inject_wire_nonfinite: bool = False  # NaN/+Inf/-Inf into the upstream wire dX, both sites


NO_PROBES = Probes()  # the trainer's own step


@dataclass
class State:
    """Everything a step depends on, for a bit-exact replay."""

    buffers: dict[str, np.ndarray]
    adam_t: int
    step: int = 0


def layout_for(config: Config, wiring: Wiring) -> Layout:
    dims = config.dims
    adam_shapes = None
    if wiring.adam_state_w_b0fc is Width.SH2:  # the pre-B.8 Adam state of w_b0fc: [ADV, SH2]
        adam_shapes = [(n, r, c - 1 if n == "w_b0fc" else c) for n, r, c in param_shapes(dims)]
    sn_v_len = dims.SH2 if wiring.sn_v_len is Width.SH2 else None
    return build_layout(dims, adam_state_shapes=adam_shapes, sn_v_len=sn_v_len)


class TrainerInstance:
    """The buffers and pointers of one trainer instance: what forward, backward and update work
    on. `SP14Pipeline` (pipeline/step.py) adds the step that runs them in the seed's order."""

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
        self.rec.trace.meta.update(config=config.as_dict())

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

    def make_batch_names(self) -> list[str]:
        names = ["obs", "next_obs", "actions", "reward", "done", "aux_label"]
        for b in range(1, len(BRANCHES)):
            names += [f"ctx_b{b}", f"next_ctx_b{b}"]
        return names
