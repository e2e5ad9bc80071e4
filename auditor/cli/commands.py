"""The plain functions behind the command line. The CLI parses options, calls one of these, and
turns the domain errors they raise into exit codes; nothing here prints.

Exit codes: 0 every invariant holds (a warning counts as holding); 1 an invariant failed, a
fault survived, or `--check` found the document stale; 2 bad usage or config (UsageError);
3 the environment or egf-audit itself failed (AuditEnvironmentError, CheckCrashed, any other
exception).
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from egf_audit import __version__, invariants
from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.pipeline.config import Config, load_config
from egf_audit.reports import github
from egf_audit.reports.atomic import OutputBatch, write_atomic
from egf_audit.reports.document import render_document, stale_diff
from egf_audit.reports.json_report import render_json
from egf_audit.reports.junit import render_junit
from egf_audit.reports.model import AuditReport
from egf_audit.runtime import cublas_witness
from egf_audit.runtime.audit_run import AuditRun
from egf_audit.runtime.backends import check_device, select_backend
from egf_audit.runtime.backends.base import Backend
from egf_audit.runtime.kernel_sources import load_kernel_set
from egf_audit.scenarios import mutants
from egf_audit.scenarios.audit import Auditor, mode_scenarios
from egf_audit.scenarios.faults import FAULTS

DEFAULT_OUT = Path("docs/dqn-wire-up-audit.md")
MODE_CHOICES = {"sentinel": ("sentinel",), "live": ("live",), "both": ("sentinel", "live")}
DEFAULT_STEPS = 2


class Progress(Protocol):
    def plan(self, total: int) -> None: ...

    def step(self, message: str) -> None: ...


class _Silent:
    def plan(self, total: int) -> None:
        pass

    def step(self, message: str) -> None:
        pass


@dataclass(frozen=True)
class RunRequest:
    """`egf-audit run`'s options. `preset`/`seed` None: the config file's, else ci / 0."""

    device: str = "auto"
    preset: str | None = None
    config_path: Path | None = None
    seed: int | None = None
    steps: int = DEFAULT_STEPS
    mode: str = "both"
    out: Path = DEFAULT_OUT
    check: bool = False
    json_out: Path | None = None
    junit_out: Path | None = None
    trace_out: Path | None = None
    kernels_dir: Path | None = None
    cublas_log: bool = False  # the cuBLAS witness (CUDA only)


@dataclass
class RunOutcome:
    report: AuditReport
    document: str
    exit_code: int
    stale: bool = False  # only with --check
    diff: list[str] = field(default_factory=list)  # the stale part, with --check
    written: list[Path] = field(default_factory=list)
    annotations: list[str] = field(default_factory=list)  # GitHub workflow commands, for stdout
    notes: list[str] = field(default_factory=list)  # one-line warnings that change no exit code


# ---- validation shared by the commands ----
def parse_modes(mode: str) -> tuple[str, ...]:
    if mode not in MODE_CHOICES:
        raise UsageError(f"unknown mode {mode!r} (choose from {', '.join(MODE_CHOICES)})")
    return MODE_CHOICES[mode]


def check_steps(steps: int) -> int:
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    return steps


def reproduce_command(req: RunRequest, config: Config) -> str:
    """The command that makes the same document. It never names the device: the document
    outside the environment block is the same on every backend."""
    parts = ["egf-audit", "run"]
    if req.config_path is not None:
        parts += ["--config", Path(req.config_path).as_posix()]
    parts += ["--preset", config.preset, "--seed", str(config.seed)]
    parts += ["--steps", str(req.steps), "--mode", req.mode]
    if req.kernels_dir is not None:
        parts += ["--kernels", Path(req.kernels_dir).as_posix()]
    if Path(req.out) != DEFAULT_OUT:
        parts += ["--out", Path(req.out).as_posix()]
    return shlex.join(parts)


def environment(backend: Backend, timings: dict[str, float]) -> dict[str, Any]:
    """Everything device- or machine-dependent; the document keeps it inside the env block."""
    env: dict[str, Any] = {
        "device": backend.name,
        "backend": dict(backend.info()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
    }
    for module in ("torch", "cupy"):
        if module in sys.modules:
            env[module] = getattr(sys.modules[module], "__version__", "unknown")
    env["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    return env


def evaluate_all(run: AuditRun, progress: Progress) -> tuple[list, dict[str, float]]:
    """Every invariant of the registry for every mode, one invariant at a time so progress and
    per-invariant timings can be shown. CheckCrashed propagates (exit 3)."""
    results: list = []
    seconds: dict[str, float] = {}
    for inv in invariants.INVARIANTS:
        progress.step(f"invariant {inv.code} {inv.slug}")
        start = time.perf_counter()
        results += invariants.evaluate(run, codes=(inv.code,))
        seconds[inv.code] = time.perf_counter() - start
    return results, seconds


class _Timer:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.timings[name] = time.perf_counter() - start


def _read_committed(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditEnvironmentError(f"cannot read {path}: {exc}") from None


def run_audit(req: RunRequest, progress: Progress | None = None) -> RunOutcome:
    """`egf-audit run`: audit, render, then write (or --check) the document and CI outputs.

    A run whose invariants fail still writes the document (it is the report) and exits 1.
    Every output is written atomically after everything has been computed, so an error
    leaves the existing files untouched."""
    progress = progress or _Silent()
    modes = parse_modes(req.mode)
    check_steps(req.steps)
    check_device(req.device)
    n_scenarios = sum(len(mode_scenarios(m)) for m in modes) + 2  # + wrapper and gate probes
    progress.plan(3 + n_scenarios + len(invariants.INVARIANTS) + 1)
    timer = _Timer()

    progress.step("config")
    config = timer("config", lambda: load_config(req.config_path, req.preset, req.seed))
    progress.step("kernel sources")
    kernels = timer("kernels", lambda: load_kernel_set(req.kernels_dir))
    witness_log = _start_witness(req) if req.cublas_log else None
    progress.step(f"backend ({req.device}): compiling kernels")
    backend = timer("backend", lambda: select_backend(req.device, kernels))
    if witness_log is not None and backend.name != "cuda":
        raise AuditEnvironmentError("--cublas-log needs the CUDA backend, and none is usable here")
    auditor = Auditor(config, backend, steps=req.steps, progress=progress.step)
    run = timer("scenarios", lambda: auditor.run(modes))
    witness = _finish_witness(witness_log, backend, run) if witness_log is not None else None
    results, seconds = timer("invariants", lambda: evaluate_all(run, progress))

    progress.step("document")
    report = AuditReport(
        config=config,
        modes=modes,
        steps=req.steps,
        invariants=tuple(invariants.INVARIANTS),
        results=tuple(results),
        kernels=kernels,
        command=reproduce_command(req, config),
        version=__version__,
        environment=environment(backend, timer.timings),
        run=run,
        witness=witness.as_dict() if witness is not None else None,
    )
    document = render_document(report)
    outcome = RunOutcome(report, document, exit_code=0 if report.ok else 1)
    for name in kernels.ignored:
        outcome.notes.append(
            f"--kernels {Path(req.kernels_dir).as_posix()}: ignored {name}: no kernel of that name"
        )
    if witness is not None and not witness.ok:
        outcome.exit_code = 1

    if req.check:
        committed = _read_committed(Path(req.out))
        if committed is None:
            outcome.stale = True
            outcome.diff = [f"{req.out} does not exist\n"]
        else:
            outcome.diff = stale_diff(committed, document, Path(req.out).as_posix())
            outcome.stale = bool(outcome.diff)
        if outcome.stale:
            outcome.exit_code = 1
    _write_outputs(req, outcome, run, seconds)
    return outcome


def _start_witness(req: RunRequest) -> Path:
    """The log file cuBLAS's API logger writes. The `egf-audit` command switches the logger on
    at process start (auditor/entry.py); called in a process that has loaded cuBLAS already,
    the logger could no longer be switched on, and that is said rather than a silent miss."""
    if req.device == "cpu":
        raise UsageError("--cublas-log needs --device cuda or auto: the CPU backend has no cuBLAS")
    if os.environ.get(cublas_witness.CHILD_MARKER):
        return Path(os.environ[cublas_witness.CHILD_MARKER])
    if cublas_witness.cublas_loaded():
        raise AuditEnvironmentError(
            "--cublas-log: cuBLAS is already loaded in this process, so its logger can no longer "
            "be switched on; run `egf-audit run --cublas-log` as a command of its own"
        )
    log = Path(tempfile.mkdtemp(prefix=cublas_witness.LOG_PREFIX)) / "cublas_api.log"
    cublas_witness.enable(log)
    return log


def _finish_witness(log: Path, backend: Backend, run: AuditRun) -> cublas_witness.WitnessResult:
    """Parse what cuBLAS logged and match it with every recorded SGEMM, in execution order
    (the scenarios ran one after another, in the order the run keeps them)."""
    backend.synchronize()
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise AuditEnvironmentError(f"--cublas-log: cuBLAS wrote no log ({exc})") from None
    finally:
        if log.parent.name.startswith(cublas_witness.LOG_PREFIX):
            shutil.rmtree(log.parent, ignore_errors=True)
    launches = [x for trace in run.traces.values() for x in trace.launches]
    return cublas_witness.match(cublas_witness.parse_log(text), launches)


def _write_outputs(req: RunRequest, outcome: RunOutcome, run: AuditRun, seconds: dict) -> None:
    """Every output is staged before any is replaced: one that cannot be written (exit 3)
    leaves all existing files as they were."""
    report = outcome.report
    out = Path(req.out)
    with OutputBatch() as batch:
        if not req.check:
            batch.add(out, outcome.document)
        if req.json_out is not None:
            document_info = {"path": out.as_posix(), "checked": req.check, "stale": outcome.stale}
            batch.add(req.json_out, render_json(report, outcome.exit_code, document_info))
        if req.junit_out is not None:
            batch.add(req.junit_out, render_junit(report, seconds))
        if req.trace_out is not None:
            lines = [line for trace in run.traces.values() for line in trace.to_jsonl()]
            batch.add(req.trace_out, "\n".join(lines) + "\n")
        outcome.written = batch.commit()
    if github.in_github_actions():
        stale_path = out.as_posix() if outcome.stale else None
        outcome.annotations = github.annotations(report, stale_path)
        try:
            github.append_step_summary(github.step_summary(report, stale_path))
        except OSError as exc:
            # the summary is a courtesy to the reader of the job; it never changes the verdict
            outcome.notes.append(f"could not append to GITHUB_STEP_SUMMARY: {exc}")


# ---- mutants ----
@dataclass
class MutantsOutcome:
    result: mutants.MutantsResult
    all_faults: bool
    exit_code: int


def run_mutants(
    device: str = "auto",
    preset: str | None = None,
    config_path: Path | None = None,
    seed: int | None = None,
    steps: int = DEFAULT_STEPS,
    only: list[str] | None = None,
    kernels_dir: Path | None = None,
    json_out: Path | None = None,
    progress: Progress | None = None,
) -> MutantsOutcome:
    """`egf-audit mutants`: the audit once per fault. Exit 1 when a fault survives or, when
    every fault ran, an invariant caught none."""
    progress = progress or _Silent()
    check_device(device)
    check_steps(steps)
    faults = mutants.select_faults(only)  # an unknown name is a UsageError before any work
    config = load_config(config_path, preset, seed)
    kernels = load_kernel_set(kernels_dir)
    progress.plan(len(faults))
    result = mutants.run_mutants(
        config, device, kernels, faults, steps=steps, progress=progress.step
    )
    all_faults = {f.name for f in faults} == {f.name for f in FAULTS}
    outcome = MutantsOutcome(result, all_faults, 0 if result.ok(all_faults) else 1)
    if json_out is not None:
        data = {**result.as_dict(), "all_faults_ran": all_faults, "ok": outcome.exit_code == 0}
        write_atomic(json_out, json.dumps(data, indent=2) + "\n")
    return outcome


# ---- invariants, explain ----
def invariant_list() -> tuple:
    return tuple(invariants.INVARIANTS)


def explain(code: str) -> str:
    """The invariant's whole text (What / Why / How / Bug / Example)."""
    wanted = code.strip().upper()
    for inv in invariants.INVARIANTS:
        if inv.code == wanted:
            return inv.doc()
    known = ", ".join(inv.code for inv in invariants.INVARIANTS)
    raise UsageError(f"unknown invariant code {code!r} (known: {known})")


# ---- bench ----
def bench(
    device: str = "auto",
    batch_sizes: list[int] | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    json_out: Path | None = None,
    markdown_out: Path | None = None,
    kernels_dir: Path | None = None,
    profile: bool = False,
) -> int:
    """`egf-audit bench`, delegated to egf_audit.bench, which validates its own options and
    returns the exit code. Imported only when asked for. None = let the bench choose."""
    try:
        module = importlib.import_module("egf_audit.bench.run")
    except ModuleNotFoundError as exc:
        if exc.name != "egf_audit.bench.run":
            raise  # something the bench imports is missing: an unexpected error, exit 3
        raise AuditEnvironmentError(
            "egf-audit bench is not available: this installation has no egf_audit.bench.run module"
        ) from None
    code = module.bench_command(
        device=device,
        batch_sizes=list(batch_sizes) if batch_sizes else None,
        repeats=repeats,
        warmup=warmup,
        json_out=json_out,
        markdown_out=markdown_out,
        kernels_dir=kernels_dir,
        profile=profile,
    )
    return int(code)


__all__ = [
    "DEFAULT_OUT",
    "MutantsOutcome",
    "RunOutcome",
    "RunRequest",
    "bench",
    "explain",
    "invariant_list",
    "run_audit",
    "run_mutants",
]
