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
from egf_audit.bench import audit_profile
from egf_audit.bench import profile as bench_profile
from egf_audit.bench.measure import (
    MODE,
    measure_row,
    measure_sgemm,
)
from egf_audit.bench.render import rich_table, targets_table, to_json, to_markdown
from egf_audit.bench.report import BenchReport, Unavailable
from egf_audit.bench.timing import Session, bench_session
from egf_audit.errors import AuditEnvironmentError, UsageError, exception_line
from egf_audit.outputs.atomic import write_atomic
from egf_audit.pipeline.config import Config, ConfigError, preset_config, validate_dims
from egf_audit.pipeline.step import SP14Pipeline
from egf_audit.runtime.backends import select_backend
from egf_audit.runtime.backends.base import Backend
from egf_audit.runtime.kernel_sources import load_kernel_set

DEFAULT_BATCH_SIZES = {"cuda": (256, 1024, 4096, 16384, 65536), "cpu": (64, 256)}
DEFAULT_REPEATS = {"cuda": 20, "cpu": 3}
DEFAULT_WARMUP = {"cuda": 5, "cpu": 1}
# (n of the n x n x n reference SGEMM, warm-up, repeats)
SGEMM_REFERENCE = {"cuda": (8192, 3, 10), "cpu": (1024, 1, 3)}


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
            raise UsageError(f"--batch must be integers, got {sizes!r}") from None
    if isinstance(sizes, bytes) or not hasattr(sizes, "__iter__"):
        raise UsageError(f"--batch must be a list of integers, got {sizes!r}")
    out: list[int] = []
    prod = preset_config("prod").dims
    for b in sizes:
        _count("batch", b, 1)
        try:
            validate_dims(dataclasses.replace(prod, B=b))
        except ConfigError as exc:
            raise UsageError(f"--batch: B={b} is not allowed: {exc}") from None
        if b not in out:
            out.append(b)
    if not out:
        raise UsageError("--batch must name at least one batch size")
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
        "instrumented: the recorder on (every launch bound, recorded and observed: the "
        "buffers it can reach compared with their shadows outside its declared writes, the "
        "guard zones scanned after every kernel, the findings read back at the end of the "
        "step; a device-side copy of every snapshot at every checkpoint; all part of its cost; "
        "the copies reach the host only when an invariant reads them, outside the step); the "
        "trace is cleared after each step, outside the timed region, so memory stays bounded.",
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
    audit_runs: int = 0,
    kernels_dir: str | os.PathLike | None = None,
) -> BenchReport:
    """Every measurement, in one session. `reference` overrides the (n, warm-up, repeats) of the
    reference SGEMM and `widths` the preset whose widths are used (tests use small ones).
    After every timed figure, so that nothing perturbs them: `profile` adds the per-kernel GPU
    time of the plain step (CUDA), `audit_runs` > 0 where an audit's time goes (that many plain
    runs of the whole command, then a profiled one: bench/audit_profile.py)."""
    with bench_session(backend) as session:
        n, ref_warmup, ref_repeats = reference or SGEMM_REFERENCE[backend.name]
        sgemm = measure_sgemm(session, n, ref_warmup, ref_repeats)
        log(f"reference SGEMM {n}³: {sgemm.tflops:.2f} TFLOP/s")
        rows = [measure_row(session, config_for(b, widths), warmup, repeats, log) for b in sizes]
        profiles = []
        if profile and session.stream is not None:  # CUPTI traces GPU kernels only
            profiles = [profile_row(session, config_for(b, widths), log) for b in sizes]
        env = environment(session)
        session.free_caches()  # the audits below run in processes of their own
    report = BenchReport(
        device=backend.name,
        device_name=str(env.get("device", "")),
        command=command,
        settings=settings(session, sizes, repeats, warmup, (n, ref_warmup, ref_repeats), widths),
        environment=env,
        sgemm=sgemm,
        rows=rows,
        profiles=profiles,
    )
    if audit_runs > 0:
        audit = report.audit = audit_profile.profile_audit(backend.name, audit_runs, kernels_dir)
        shown = audit.reason if isinstance(audit, Unavailable) else f"{audit.median_s:.2f} s"
        log(f"audit ({audit_profile.AUDIT_PRESET[backend.name]}): whole command {shown}")
    return report


def profile_row(session: Session, config: Config, log: Callable[[str], None]) -> Any:
    pipe = SP14Pipeline(config, session.backend, instrumented=False, scenario="bench")
    try:
        pipe.initialize()
        try:
            result = bench_profile.profile_plain_step(session, pipe, MODE)
        except Exception as exc:  # a figure of merit, like the graph: say why it is missing
            session.sync()
            result = Unavailable(exception_line(exc), traceback.format_exc())
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
    audit_runs: int = audit_profile.AUDIT_RUNS,
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
    err = Console(stderr=True)
    report = run_bench(
        backend,
        sizes or DEFAULT_BATCH_SIZES[name],
        DEFAULT_REPEATS[name] if repeats is None else repeats,
        DEFAULT_WARMUP[name] if warmup is None else warmup,
        command,
        log=lambda msg: err.print(f"[dim]bench:[/dim] {escape(msg)}", highlight=False),
        profile=profile,
        audit_runs=audit_runs if profile else 0,
        kernels_dir=kernels_dir,
    )
    out = Console()
    if not out.is_terminal:  # a log or a pipe: do not squeeze eleven columns into 80
        out = Console(width=max(out.width, 150))
    out.print(rich_table(report))
    out.print(targets_table(report))
    for table in [
        *bench_profile.rich_tables(report.profiles),
        *audit_profile.rich_tables(report.audit),
    ]:
        out.print(table)
    if json_path:
        write_atomic(json_path, json.dumps(to_json(report), indent=2) + "\n")
    if md_path:
        text = to_markdown(report) + bench_profile.markdown(report.profiles)
        write_atomic(md_path, text + audit_profile.markdown(report.audit))
    return 0
