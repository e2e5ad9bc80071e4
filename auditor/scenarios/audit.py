"""Runs the scenarios an audit needs and hands the finished traces to the invariants.

Per mode (sentinel, live): the production run (`steps` steps from the seeded initial state),
then replays of step 0 from the same saved state with the gate forced to 0.37 and to 1, with the
scale launch skipped, and with NaN/+-Inf injected into the upstream wire dX (gate 0). Once per
audit: a diagnostic call of the legacy wrapper, and the gate-producer probes. A fault changes
the wiring of every scenario; the invariants only ever see traces, snapshots and the config.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from egf_audit.pipeline.backward import backward_full
from egf_audit.pipeline.config import Config
from egf_audit.pipeline.instance import Probes
from egf_audit.pipeline.step import SP14Pipeline
from egf_audit.pipeline.update import gate_producer
from egf_audit.pipeline.wiring import PRODUCTION, ScaleTarget, Wiring
from egf_audit.runtime.backends.base import Backend
from egf_audit.trace.audit_run import AuditRun, Scenario
from egf_audit.trace.contract import (
    ALPHA_GRAD_SMOOTHED_INDEX,
    AUX_DOWN_INDEX,
    AUX_UP_INDEX,
    DW_DIR_LABELS,
    WRAPPER_AFTER,
    WRAPPER_BEFORE,
    WRAPPER_FULL,
)

REPLAY_ALPHAS = (0.37, 1.0)


def mode_scenarios(mode: str) -> list[Scenario]:
    out = [Scenario(mode, mode, "production")]
    out += [Scenario(f"{mode}/alpha={a:g}", mode, "replay", force_alpha=a) for a in REPLAY_ALPHAS]
    out.append(Scenario(f"{mode}/skip-scale", mode, "replay", skip_scale=True))
    # EGF003 needs ISV[393] == 0.0: sentinel leaves it so; live forces it after the producer
    out.append(
        Scenario(
            f"{mode}/nonfinite",
            mode,
            "replay",
            inject_nonfinite=True,
            force_alpha=0.0 if mode == "live" else None,
        )
    )
    return out


# The gate-producer probes: (name, previous ISV[393], what the true-label probabilities are)
GATE_PROBES: tuple[tuple[str, float, str], ...] = (
    ("below-chance", 0.0, "zero"),  # accuracy 0: raw gate -1/2, must clamp to 0
    ("perfect", 0.0, "one"),  # accuracy 1: raw gate 1
    ("nan-input", 0.0, "nan"),
    ("inf-input", 0.0, "inf"),
    ("nan-previous", float("nan"), "one"),
)


def _probe_softmax(kind: str, labels: np.ndarray, auxk: int) -> np.ndarray:
    p = np.zeros((labels.size, auxk), np.float32)
    rows = np.arange(labels.size)
    if kind == "zero":
        p[rows, (labels + 1) % auxk] = 1.0
    else:
        p[rows, labels] = {"one": 1.0, "nan": np.nan, "inf": np.inf}[kind]
    return p


class Auditor:
    """Builds pipelines on one backend with one wiring and runs the scenarios."""

    def __init__(
        self,
        config: Config,
        backend: Backend,
        wiring: Wiring = PRODUCTION,
        steps: int = 2,
        progress: Callable[[str], None] | None = None,
    ):
        self.config = config
        self.backend = backend
        self.wiring = wiring
        self.steps = steps
        self.progress = progress or (lambda _msg: None)

    def _pipeline(self, scenario: str, wiring: Wiring | None = None) -> SP14Pipeline:
        return SP14Pipeline(
            self.config,
            self.backend,
            wiring or self.wiring,
            instrumented=True,
            scenario=scenario,
            capture_inputs_of=DW_DIR_LABELS,
        )

    def run(self, modes: tuple[str, ...] = ("sentinel", "live")) -> AuditRun:
        run = AuditRun(self.config, modes, self.steps)
        self.backend.failed_kernels.clear()  # a kernel that failed in another audit runs again
        for mode in modes:
            initial = None
            for sc in mode_scenarios(mode):
                self.progress(f"scenario {sc.name}")
                wiring = (
                    self.wiring.but(scale_target=ScaleTarget.NONE) if sc.skip_scale else self.wiring
                )
                pipe = self._pipeline(sc.name, wiring)
                if sc.kind == "production":
                    pipe.initialize()
                    initial = pipe.save_state()
                    for _ in range(self.steps):
                        pipe.step(mode)
                else:
                    assert initial is not None  # mode_scenarios puts the production run first
                    pipe.load_state(initial)
                    pipe.step(
                        mode,
                        Probes(
                            force_alpha=sc.force_alpha, inject_wire_nonfinite=sc.inject_nonfinite
                        ),
                    )
                self._store(run, sc, pipe)
        self.progress("scenario diagnostic/wrapper")
        self._store(run, Scenario("diagnostic/wrapper", None, "diagnostic"), self._wrapper_probe())
        self.progress("scenario probe/gate")
        self._store(run, Scenario("probe/gate", None, "probe"), self._gate_probe())
        return run

    def _store(self, run: AuditRun, sc: Scenario, pipe: SP14Pipeline) -> None:
        pipe.backend.synchronize()
        run.scenarios[sc.name] = sc
        run.traces[sc.name] = pipe.rec.trace
        pipe.release()

    def _wrapper_probe(self) -> SP14Pipeline:
        """A sentinel step, then the legacy wrapper called directly on the main site's dQ with
        grad_buf and d_h_s2 zeroed: what would a caller of the wrapper get?"""
        pipe = self._pipeline("diagnostic/wrapper")
        pipe.initialize()
        pipe.step("sentinel")
        rec = pipe.rec
        rec.step = 0
        for name in ("grad_buf", "d_h_s2"):
            rec.memset_zero(
                f"diagnostic:zero_{name}", pipe.ptr(name), pipe.layout.buffer(name).size
            )
        rec.kernel(
            "diagnostic:rebuild_online_concat",
            "sp14_dir_concat_qaux",
            concat=pipe.ptr("sp14_dir_qaux_concat_scratch"),
            h_s2=pipe.ptr("save_h_s2"),
            aux_softmax=pipe.ptr("aux_nb_softmax_buf"),
            rows=pipe.dims.B,
            sh2=pipe.dims.SH2,
            auxk=pipe.dims.AUXK,
            up_idx=AUX_UP_INDEX,
            down_idx=AUX_DOWN_INDEX,
        )
        rec.checkpoint(WRAPPER_BEFORE, ["grad_buf", "sp14_dir_qaux_concat_scratch", "save_h_s2"])
        backward_full(pipe, "wrapper", "dq_main", 0, 0)
        rec.checkpoint(WRAPPER_AFTER, ["grad_buf", "d_h_s2"])
        rec.memset_zero(
            "diagnostic:zero_grad_buf_full",
            pipe.ptr("grad_buf"),
            pipe.layout.buffer("grad_buf").size,
        )
        backward_full(
            pipe,
            "full",
            "dq_main",
            pipe.ptr("sp14_dir_qaux_concat_scratch"),
            pipe.ptr("sp14_d_dir_qaux_concat"),
        )
        rec.checkpoint(WRAPPER_FULL, ["grad_buf", "sp14_d_dir_qaux_concat"])
        return pipe

    def _gate_probe(self) -> SP14Pipeline:
        """The live producer on crafted inputs; each probe resets ISV[393] first."""
        pipe = self._pipeline("probe/gate")
        pipe.initialize()
        rec, d = pipe.rec, pipe.dims
        rec.step = 0
        labels = pipe.make_batch(0)["aux_label"]
        rec.upload("probe:labels", pipe.ptr("aux_label"), labels)
        alpha_ptr = pipe.ptr("isv_signals", element=ALPHA_GRAD_SMOOTHED_INDEX)
        rec.checkpoint("gate_probe:start", ["isv_signals"])
        for name, previous, kind in GATE_PROBES:
            rec.upload(f"probe:{name}:previous_alpha", alpha_ptr, np.array([previous], np.float32))
            rec.upload(
                f"probe:{name}:softmax",
                pipe.ptr("aux_nb_softmax_buf"),
                _probe_softmax(kind, labels, d.AUXK),
            )
            gate_producer(pipe, label=f"probe:{name}")
            rec.checkpoint(f"gate_probe:{name}", ["isv_signals"], previous=previous, input=kind)
        return pipe
