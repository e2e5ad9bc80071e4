"""`egf-audit bench`: the pipeline's cost, side by side, in one process on one device.

For each batch size B (at the `prod` widths): the plain pipeline step (recorder off), the
instrumented step (recorder on: every launch bound and recorded, snapshots at every
checkpoint), a torch-eager autograd step of the same network and losses, and, on CUDA, the plain
step captured once in a CUDA graph and replayed. Each is primed once, warmed up, then timed step
by step (CUDA events on the stream the work runs on; `time.perf_counter` on the CPU); the report
takes the median. The step's FLOPs are 2*m*n*k over every SGEMM of one step, read from an
instrumented step's trace; a large SGEMM through the same cuBLAS call gives the reference rate.

All variants run in sentinel mode (ISV[393] stays 0; no gate producer) and keep the batch
resident on the device, so no variant pays a host-to-device batch copy inside its timed steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import shlex
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.markup import escape

from egf_audit import __version__
from egf_audit.bench import profile as bench_profile
from egf_audit.bench.report import (
    BenchReport,
    Row,
    SgemmReference,
    Timing,
    Unavailable,
    rich_table,
    targets_table,
    to_json,
    to_markdown,
)
from egf_audit.bench.timing import Session, bench_session, time_steps
from egf_audit.bench.torch_reference import TorchSP14, torch_batch
from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.pipeline.config import Config, ConfigError, preset_config, validate_dims
from egf_audit.pipeline.step import SP14Pipeline
from egf_audit.reports.atomic import write_atomic
from egf_audit.runtime.backends import select_backend
from egf_audit.runtime.backends.base import Backend
from egf_audit.runtime.kernel_sources import load_kernel_set
from egf_audit.runtime.memory import BufferSpec, Layout, Tensor
from egf_audit.runtime.trace import Trace

MODE = "sentinel"
DEFAULT_BATCH_SIZES = {"cuda": (256, 1024, 4096, 16384, 65536), "cpu": (64, 256)}
DEFAULT_REPEATS = {"cuda": 20, "cpu": 3}
DEFAULT_WARMUP = {"cuda": 5, "cpu": 1}
# (n of the n x n x n reference SGEMM, warm-up, repeats)
SGEMM_REFERENCE = {"cuda": (8192, 3, 10), "cpu": (1024, 1, 3)}
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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


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
        # Re-bind cuBLAS to the stream in case anything moved it. Binding resets cuBLAS's
        # workspace, so it comes before the eager step below, which allocates it again: no
        # allocation may be left for the capture to do.
        pipe.backend.use_stream(stream)
        pipe.backend.prepare_capture()  # cuBLAS through ctypes with a fixed workspace
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
        return Unavailable(_one_line(exc), traceback.format_exc())


def measure_instrumented(
    session: Session, config: Config, warmup: int, repeats: int
) -> tuple[Timing, int, dict[str, int]]:
    """The recorder on. Its trace and snapshots grow every step, so they are cleared after each
    one, outside the timed region; the snapshot copies themselves are timed (they are part of
    what instrumentation costs)."""
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
            nbytes = sum(snap.nbytes for snap in trace.snapshots.values())
            stats["snapshot_mb_per_step"] = round(nbytes / 1e6, 3)
            trace.launches.clear()
            trace.snapshots.clear()

        clear()
        step = lambda: pipe.step(MODE, upload_batch=False)  # noqa: E731
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
        return Unavailable(_one_line(exc), traceback.format_exc())


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


# ---- inputs, environment, outputs ----


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"--{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_batch_sizes(sizes: object) -> tuple[int, ...]:
    """Positive batch sizes the `prod` widths allow, in the given order, duplicates dropped.
    A string "256,1024" is accepted too, for callers that pass the option through as typed."""
    if isinstance(sizes, str):
        try:
            sizes = [int(x) for x in sizes.replace(",", " ").split()]
        except ValueError:
            raise UsageError(f"--batch-sizes must be integers, got {sizes!r}") from None
    if isinstance(sizes, bytes) or not hasattr(sizes, "__iter__"):
        raise UsageError(f"--batch-sizes must be a list of integers, got {sizes!r}")
    out: list[int] = []
    prod = preset_config("prod").dims
    for b in sizes:
        _count("batch-sizes", b, 1)
        try:
            validate_dims(dataclasses.replace(prod, B=b))
        except ConfigError as exc:
            raise UsageError(f"--batch-sizes: B={b} is not allowed: {exc}") from None
        if b not in out:
            out.append(b)
    if not out:
        raise UsageError("--batch-sizes must name at least one batch size")
    return tuple(out)


def config_for(batch: int, widths: str = "prod") -> Config:
    base = preset_config(widths)
    return dataclasses.replace(base, dims=dataclasses.replace(base.dims, B=batch))


def environment(session: Session) -> dict[str, Any]:
    env: dict[str, Any] = dict(session.backend.info())
    env.update(
        python=platform.python_version(),
        numpy=np.__version__,
        torch=torch.__version__,
        egf_audit=__version__,
    )
    if session.torch_device is not None and session.torch_device.type == "cuda":
        env["torch_cuda"] = str(torch.version.cuda)
        env["torch_device"] = torch.cuda.get_device_name(session.torch_device)
    return env


def command_line(**kwargs: Any) -> str:
    """The command that made this report: the real command line when run as `egf-audit`, else
    the equivalent Python call (always valid, whatever the CLI's option names)."""
    argv = sys.argv
    if argv and Path(argv[0]).name.startswith("egf-audit") and "bench" in argv[1:]:
        return shlex.join(["egf-audit", *argv[1:]])
    # JSON literals are Python literals here, and their double quotes nest in shell quoting
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in kwargs.items() if v is not None)
    return shlex.join(
        ["python", "-c", f"from egf_audit.bench.run import bench_command; bench_command({args})"]
    )


def settings(
    session: Session,
    sizes: tuple[int, ...],
    repeats: int,
    warmup: int,
    sgemm: tuple,
    widths: str,
) -> dict[str, Any]:
    dims = dataclasses.asdict(preset_config(widths).dims)
    dims.pop("B")
    notes = [
        f"Widths of the `{widths}` preset; B varied. Every variant runs in {MODE} mode (ISV[393] "
        "stays 0; no gate producer) and keeps its batch resident on the device.",
        f"Each variant: one priming step, {warmup} warm-up step(s), then the median of "
        f"{repeats} timed step(s). Pipeline timer: {session.clock.name}.",
        "plain: `SP14Pipeline(instrumented=False)`, `step(upload_batch=False)`.",
        "instrumented: the recorder on (every launch bound and recorded, a device-side copy of "
        "every snapshot at every checkpoint, both part of its cost; the copies reach the host "
        "only when an invariant reads them, outside the step); the trace is cleared after each "
        "step, "
        "outside the timed region, so memory stays bounded.",
        "torch eager: the same network, losses and update in torch, ONE backward of the total "
        "loss (the pipeline backpropagates its two call sites separately), torch.optim.Adam "
        "(default implementation), fp32 with TF32 off, batch made on the device beforehand.",
        "FLOPs: 2·m·n·k summed over every SGEMM of one pipeline step (from an instrumented "
        "step's trace); kernels count 0.",
        f"Reference: one {sgemm[0]}³ fp32 SGEMM through the same backend call, median of "
        f"{sgemm[2]} after {sgemm[1]} warm-up.",
    ]
    if session.stream is not None:
        notes.insert(
            4,
            "graph: the plain step captured once in a CUDA graph on a non-blocking stream and "
            "replayed; Adam's bias corrections are host floats passed as kernel arguments, so "
            "they are frozen at the capture step (fine for timing); the first replay is checked "
            "against an eager step from the same state.",
        )
    return {
        "widths": widths,
        "dims": dims,
        "mode": MODE,
        "batch_sizes": list(sizes),
        "repeats": repeats,
        "warmup": warmup,
        "priming_steps": 1,
        "timer": session.clock.name,
        "torch_timer": session.torch_clock.name if session.torch_clock else None,
        "torch_allow_tf32": False,
        "sgemm_reference": {"n": sgemm[0], "warmup": sgemm[1], "repeats": sgemm[2]},
        "notes": notes,
    }


def _check_writable(path: str | os.PathLike | None) -> Path | None:
    """Fail before a long run, not after it, when an output cannot be written."""
    if path is None:
        return None
    out = Path(path)
    if out.is_dir():
        raise AuditEnvironmentError(f"cannot write {out}: it is a directory")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AuditEnvironmentError(f"cannot write {out}: {exc.strerror or exc}") from None
    if not os.access(parent, os.W_OK):
        raise AuditEnvironmentError(f"cannot write {out}: {parent} is not writable")
    return out


def run_bench(
    backend: Backend,
    sizes: tuple[int, ...],
    repeats: int,
    warmup: int,
    command: str,
    log: Callable[[str], None] = lambda _: None,
    reference: tuple[int, int, int] | None = None,
    widths: str = "prod",
    profile: bool = False,
) -> BenchReport:
    """Every measurement, in one session. `reference` overrides the (n, warm-up, repeats) of the
    reference SGEMM and `widths` the preset whose widths are used (tests use small ones).
    `profile` adds the per-kernel GPU time of the plain step, after every timed figure, so the
    profiler cannot perturb them."""
    with bench_session(backend) as session:
        n, ref_warmup, ref_repeats = reference or SGEMM_REFERENCE[backend.name]
        sgemm = measure_sgemm(session, n, ref_warmup, ref_repeats)
        log(f"reference SGEMM {n}³: {sgemm.tflops:.2f} TFLOP/s")
        rows = [measure_row(session, config_for(b, widths), warmup, repeats, log) for b in sizes]
        profiles = [profile_row(session, config_for(b, widths), log) for b in sizes if profile]
        env = environment(session)
        return BenchReport(
            device=backend.name,
            device_name=str(env.get("device", "")),
            command=command,
            settings=settings(
                session, sizes, repeats, warmup, (n, ref_warmup, ref_repeats), widths
            ),
            environment=env,
            sgemm=sgemm,
            rows=rows,
            profiles=profiles,
        )


def profile_row(session: Session, config: Config, log: Callable[[str], None]) -> Any:
    pipe = SP14Pipeline(config, session.backend, instrumented=False, scenario="bench")
    try:
        pipe.initialize()
        try:
            result = bench_profile.profile_plain_step(session, pipe, MODE)
        except Exception as exc:  # a figure of merit, like the graph: say why it is missing
            session.sync()
            result = Unavailable(_one_line(exc), traceback.format_exc())
    finally:
        pipe.release()
    session.free_caches()
    shown = result.reason if isinstance(result, Unavailable) else f"{result.busy_ms:.3f} ms busy"
    log(f"B={config.dims.B}: profile {shown}")
    return result


def bench_command(
    device: str = "auto",
    batch_sizes: list[int] | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    json_out: str | os.PathLike | None = None,
    markdown_out: str | os.PathLike | None = None,
    kernels_dir: str | os.PathLike | None = None,
    profile: bool = False,
) -> int:
    """Run the benchmark, print the table to stdout, write the optional JSON / Markdown.
    Returns 0; bad input raises UsageError (exit 2), a bad environment AuditEnvironmentError
    (exit 3). Progress goes to stderr, so stdout carries only the tables."""
    command = command_line(
        device=device,
        batch_sizes=batch_sizes,
        repeats=repeats,
        warmup=warmup,
        json_out=None if json_out is None else str(json_out),
        markdown_out=None if markdown_out is None else str(markdown_out),
        kernels_dir=None if kernels_dir is None else str(kernels_dir),
        profile=profile or None,
    )
    sizes = check_batch_sizes(batch_sizes) if batch_sizes is not None else None
    if repeats is not None:
        _count("repeats", repeats, 1)
    if warmup is not None:
        _count("warmup", warmup, 0)
    json_path, md_path = _check_writable(json_out), _check_writable(markdown_out)

    backend = select_backend(device, load_kernel_set(kernels_dir))
    name = backend.name
    if profile and name != "cuda":
        raise UsageError(
            f"--profile needs the cuda backend (it reads CUPTI's record of GPU kernels); "
            f"this run uses {name}"
        )
    err = Console(stderr=True)
    report = run_bench(
        backend,
        sizes or DEFAULT_BATCH_SIZES[name],
        DEFAULT_REPEATS[name] if repeats is None else repeats,
        DEFAULT_WARMUP[name] if warmup is None else warmup,
        command,
        log=lambda msg: err.print(f"[dim]bench:[/dim] {escape(msg)}", highlight=False),
        profile=profile,
    )
    out = Console()
    if not out.is_terminal:  # a log or a pipe: do not squeeze eleven columns into 80
        out = Console(width=max(out.width, 150))
    out.print(rich_table(report))
    out.print(targets_table(report))
    for table in bench_profile.rich_tables(report.profiles):
        out.print(table)
    if json_path:
        write_atomic(json_path, json.dumps(to_json(report), indent=2) + "\n")
    if md_path:
        write_atomic(md_path, to_markdown(report) + bench_profile.markdown(report.profiles))
    return 0
