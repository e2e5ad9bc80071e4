"""The bench's measurements: the plain, instrumented, CUDA-graph and torch-eager steps of one
batch size, and the raw SGEMM reference, each timed side by side in one session."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from egf_audit.bench.report import (
    Row,
    SgemmReference,
    Timing,
    Unavailable,
)
from egf_audit.bench.timing import Session, time_steps
from egf_audit.bench.torch_reference import TorchSP14, torch_batch
from egf_audit.errors import exception_line
from egf_audit.pipeline.config import Config
from egf_audit.pipeline.step import SP14Pipeline
from egf_audit.runtime.backends.base import runs_on_streams
from egf_audit.runtime.memory import BufferSpec, Layout, Tensor
from egf_audit.trace.model import Snapshot, Trace

MODE = "sentinel"
STATE_BUFFERS = ("params", "target_params", "sn_state")  # what the torch model starts from


# ---- FLOPs ----


def _phase(label: str) -> str:
    site = label.rsplit("@", 1)[1] if "@" in label else ""
    if label.startswith("forward_"):
        return f"forward_{site}"
    if label.startswith(("backward_", "relu_backward", "aux_")) and site:
        return f"backward_{site}"
    return label.split(":", 1)[0] if ":" in label else "other"


def step_flops(trace: Trace, step: int | None = None) -> tuple[int, dict[str, int]]:
    """2*m*n*k summed over the SGEMMs of one step (all recorded ones when step is None), in
    total and by phase (forward_online, forward_target, backward_cql, backward_main,
    spectral_norm, ...). Kernels count 0: they are a few FLOPs per element, noise here."""
    phases: dict[str, int] = {}
    for x in trace.sgemms():
        if step is not None and x.step != step:
            continue
        flops = 2 * x.args["m"] * x.args["n"] * x.args["k"]
        phases[_phase(x.label)] = phases.get(_phase(x.label), 0) + flops
    return sum(phases.values()), dict(sorted(phases.items()))


# ---- the measurements ----


def _finite(pipe: SP14Pipeline) -> bool:
    return all(bool(np.isfinite(pipe.rec.read(b)).all()) for b in ("params", "target_params"))


def measure_plain(session: Session, pipe: SP14Pipeline, warmup: int, repeats: int) -> Timing:
    pipe.step(MODE)  # priming: uploads batch 0, which every later step reuses
    timing = time_steps(lambda: pipe.step(MODE, upload_batch=False), session.clock, warmup, repeats)
    timing.finite = _finite(pipe)
    return timing


def _capture(pipe: SP14Pipeline, stream: Any) -> Any:
    """The plain step, captured once. Nothing in it waits for or copies from the host."""
    stream.begin_capture()
    try:
        pipe.step(MODE, upload_batch=False)
    except BaseException:
        with contextlib.suppress(Exception):  # leave capture mode, whatever the step did
            stream.end_capture()
        raise
    return stream.end_capture()


def measure_graph(
    session: Session, pipe: SP14Pipeline, warmup: int, repeats: int
) -> Timing | Unavailable:
    """Capture the (already warm) plain step and time its replays. Any failure becomes
    `Unavailable` with the reason: the graph is a figure of merit, not the product."""
    stream = session.stream
    try:
        backend = pipe.backend
        assert runs_on_streams(backend)  # a session has a stream on the CUDA backend only
        # Re-bind cuBLAS to the stream in case anything moved it. Binding resets cuBLAS's
        # workspace, so it comes before the eager step below, which allocates it again: no
        # allocation may be left for the capture to do.
        backend.use_stream(stream)
        backend.prepare_capture()  # cuBLAS through ctypes with a fixed workspace
        state = pipe.save_state()
        pipe.step(MODE, upload_batch=False)  # the eager step the replay must reproduce
        eager = {b: pipe.rec.read(b) for b in ("params", "target_params")}
        pipe.load_state(state)
        graph = _capture(pipe, stream)
        pipe.load_state(state)  # capture ran nothing on the device; reset the host counters
        graph.launch(stream)
        replay = {b: pipe.rec.read(b) for b in ("params", "target_params")}
        diff = max(float(np.max(np.abs(eager[b] - replay[b]))) for b in eager)
        same = all(np.array_equal(eager[b], replay[b]) for b in eager)
        check = "bitwise equal to the eager step" if same else f"max |Δ| {diff:.3g} vs eager"
        timing = time_steps(lambda: graph.launch(stream), session.clock, warmup, repeats)
        timing.finite = _finite(pipe)
        timing.extra = {
            "check": check,
            "frozen_adam_t": state.adam_t + 1,  # bias corrections baked in at capture
        }
        return timing
    except Exception as exc:
        session.sync()
        return Unavailable(exception_line(exc), traceback.format_exc())


def measure_instrumented(
    session: Session, config: Config, warmup: int, repeats: int
) -> tuple[Timing, int, dict[str, int]]:
    """The recorder on. Its trace and snapshots grow every step, so they are cleared after each
    one, outside the timed region; the snapshot copies and the observation of every launch,
    its findings read back, are timed (they are part of what instrumentation costs)."""
    pipe = SP14Pipeline(config, session.backend, instrumented=True, scenario="bench")
    try:
        pipe.initialize()
        trace = pipe.rec.trace
        trace.launches.clear()
        trace.snapshots.clear()
        pipe.step(MODE)  # priming: uploads the batch; its trace gives the step's FLOPs
        flops, phases = step_flops(trace)
        stats: dict[str, Any] = {}

        def clear() -> None:
            stats["launches_per_step"] = sum(1 for x in trace.launches if x.kind != "checkpoint")
            stats["checkpoints_per_step"] = len(trace.snapshots)
            # the recorder's snapshots, whose copies stay where the backend made them
            nbytes = sum(s.nbytes for s in trace.snapshots.values() if isinstance(s, Snapshot))
            stats["snapshot_mb_per_step"] = round(nbytes / 1e6, 3)
            trace.launches.clear()
            trace.snapshots.clear()

        clear()

        def step() -> None:
            pipe.step(MODE, upload_batch=False)
            pipe.rec.settle()  # what every launch did reaches the host: part of the cost

        timing = time_steps(step, session.clock, warmup, repeats, between=clear)
        timing.finite = _finite(pipe)
        timing.extra = stats
        return timing, flops, phases
    finally:
        pipe.release()


def measure_torch(
    session: Session,
    config: Config,
    layout: Layout,
    state: dict[str, np.ndarray],
    batch: dict[str, np.ndarray],
    warmup: int,
    repeats: int,
) -> Timing | Unavailable:
    """The torch-eager step from the pipeline's initial state, on the same batch, made on the
    device before timing. A failure becomes `Unavailable`: torch is the yardstick here."""
    if session.torch_device is None:
        return Unavailable(session.torch_unavailable)
    device = session.torch_device
    try:
        model = TorchSP14.from_buffers(config.dims, config.hyper, layout, state, device)
        tb = torch_batch(batch, device)
        model.step(tb)  # priming: Adam state, cuBLAS handle, allocator
        losses: list[torch.Tensor] = []
        timing = time_steps(
            lambda: losses.append(model.step(tb)), session.torch_clock, warmup, repeats
        )
        with torch.no_grad():
            timing.finite = all(bool(torch.isfinite(p).all()) for p in model.net.parameters())
        timing.extra = {"last_loss": float(losses[-1])}
        return timing
    except Exception as exc:
        session.sync()
        return Unavailable(exception_line(exc), traceback.format_exc())


def measure_row(
    session: Session, config: Config, warmup: int, repeats: int, log: Callable[[str], None]
) -> Row:
    B = config.dims.B
    pipe = SP14Pipeline(config, session.backend, instrumented=False, scenario="bench")
    try:
        pipe.initialize()
        state = {b: pipe.rec.read(b) for b in STATE_BUFFERS}
        batch = pipe.make_batch(0)
        plain = measure_plain(session, pipe, warmup, repeats)
        log(f"B={B}: plain {plain.median_ms:.3f} ms")
        graph = None
        if session.stream is not None:
            graph = measure_graph(session, pipe, warmup, repeats)
            shown = f"{graph.median_ms:.3f} ms" if isinstance(graph, Timing) else graph.reason
            log(f"B={B}: graph {shown}")
    finally:
        pipe.release()
    session.sync()
    instrumented, flops, phases = measure_instrumented(session, config, warmup, repeats)
    log(f"B={B}: instrumented {instrumented.median_ms:.3f} ms")
    session.sync()
    eager = measure_torch(session, config, pipe.layout, state, batch, warmup, repeats)
    shown = f"{eager.median_ms:.3f} ms" if isinstance(eager, Timing) else eager.reason
    log(f"B={B}: torch eager {shown}")
    session.free_caches()
    return Row(B, plain, instrumented, eager, graph, flops, phases)


def measure_sgemm(session: Session, n: int, warmup: int, repeats: int) -> SgemmReference:
    """An n x n x n fp32 SGEMM through the backend's own sgemm (cuBLAS on CUDA, the same call
    the pipeline makes), on random operands: zeros would draw less power than real data."""
    backend = session.backend
    ptrs = [
        backend.alloc(BufferSpec(f"sgemm_ref_{x}", "f32", (Tensor(x, 0, n, n),))) for x in "abc"
    ]
    try:
        rng = np.random.default_rng(0)
        for p in ptrs[:2]:
            backend.upload(p, rng.standard_normal(n * n, dtype=np.float32))
        a, b, c = ptrs

        def run() -> None:
            backend.sgemm("N", "N", n, n, n, 1.0, a, n, b, n, 0.0, c, n)

        run()  # priming: cuBLAS heuristics and workspace
        return SgemmReference(n, n, n, time_steps(run, session.clock, warmup, repeats))
    finally:
        for p in ptrs:
            backend.free(p)
