"""The plain function behind `egf-audit run`. The CLI parses options, calls `run_audit`, and
turns the domain errors it raises into exit codes; nothing here prints.

Exit codes: 0 every invariant holds (a warning counts as holding); 1 an invariant failed, the
cuBLAS witness disagrees, or `--check` found the document stale; 2 bad usage or config
(UsageError); 3 the environment or egf-audit itself failed (AuditEnvironmentError,
CheckCrashed, any other exception).
"""

from __future__ import annotations

import importlib.util
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from egf_audit import __version__
from egf_audit.cli import sanitize
from egf_audit.cli import witness as witness_run
from egf_audit.cli.beside import Beside
from egf_audit.cli.changed_lines import base_ref, changed_hunks
from egf_audit.cli.outputs import check_distinct, gate_outputs
from egf_audit.cli.paths import command_line, document_base, shown
from egf_audit.cli.progress import NullProgress, Progress
from egf_audit.cli.validate import check_device, check_launch_timeout, check_steps, parse_modes
from egf_audit.errors import AuditEnvironmentError, about_option
from egf_audit.invariant_text import invariant_modules
from egf_audit.pipeline.config import Config, check_run_memory, load_config
from egf_audit.runtime.backends import cuda_usable, select_backend
from egf_audit.runtime.backends.base import Backend
from egf_audit.runtime.kernel_sources import KernelSet, load_kernel_set
from egf_audit.scenarios.audit import Auditor, mode_scenarios
from egf_audit.trace.audit_run import AuditRun

if TYPE_CHECKING:
    from egf_audit.cli.delivery import RunOutcome
    from egf_audit.reports.model import AuditReport, Gate, RunInfo

# What the invariants phase and the outputs need, torch among it: imported beside the backend
# and the scenarios (cli/beside.py), never before them
JUDGING = ("egf_audit.invariants", "egf_audit.cli.delivery", "egf_audit.oracle.warmup")
DEFAULT_OUT = Path("docs/dqn-wire-up-audit.md")
DEFAULT_STEPS = 2
CUPY_EXTRAS = "pip install 'egf-audit[cuda13]' (CUDA 13) or 'egf-audit[cuda12]' (CUDA 12)"


@dataclass(frozen=True)
class RunRequest:
    """`egf-audit run`'s options. `preset`/`seed` None: the config file's, else ci / 0.
    An output path of `-` is stdout."""

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
    output_format: str = "text"  # what stdout carries
    launch_timeout_s: float | None = None  # the kernel worker's per-launch watchdog (None: default)
    sanitize: bool = False  # the audit again under compute-sanitizer (CUDA only)
    # a settings file names the kernels folder: every kernel must come from it, none bundled
    kernels_only: bool = False
    root: Path | None = None  # what the document's paths are relative to (None: see paths.py)
    from_settings: frozenset[str] = frozenset()  # options the settings file supplied
    base_ref: str | None = None  # --base: annotate the lines changed since it (GitHub)

    @property
    def base(self) -> Path:
        return self.root or document_base(Path(self.out))

    def outputs(self) -> dict[str, Path | str | None]:
        """Every path the run writes (or, with --check, reads), by option."""
        return gate_outputs(
            self.out, self.json_out, self.junit_out, self.trace_out, self.output_format
        )


def shaping_options(req: RunRequest, config: Config) -> dict[str, object]:
    """Every option that changes the document (never the device: the document outside its
    environment block is the same on every backend)."""
    return {
        "--config": req.config_path,
        "--kernels": req.kernels_dir,
        "--preset": config.preset,
        "--seed": config.seed,
        "--steps": req.steps,
        "--mode": req.mode,
        "--out": req.out,
    }


PATH_OPTIONS = ("--config", "--kernels", "--out")


def reproduce_command(req: RunRequest, config: Config) -> str:
    """The document's own command: paths relative to the project root, run from there. It
    spells every shaping option, wherever it came from (the command line or the settings
    file), so the document does not depend on how the options were given."""
    return command_line(
        shaping_options(req, config), PATH_OPTIONS, lambda p: shown(p, req.base), DEFAULT_OUT
    )


def typed_command(req: RunRequest, config: Config) -> str:
    """The same options with the paths as this invocation typed them, for the stale message:
    following it from where the user stands makes the same document. What the settings file
    supplied is left out: the same command finds it again."""
    options = shaping_options(req, config)
    for key in req.from_settings:
        options.pop("--" + key, None)
    return command_line(options, PATH_OPTIONS, lambda p: Path(p).as_posix(), DEFAULT_OUT)


VERSIONED: tuple[Literal["torch", "cupy"], ...] = ("torch", "cupy")  # named when loaded


def run_info(backend: Backend, picked: str, timings: dict[str, float]) -> RunInfo:
    """Where and how fast this run went: host, versions, timings. Never in the document (it
    would change on every run); stdout, JSON and the step summary carry it."""
    info: RunInfo = {
        "backend": backend.name,
        "picked": picked,
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
    }
    for module in VERSIONED:
        if module in sys.modules:
            info[module] = getattr(sys.modules[module], "__version__", "unknown")
    info["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    return info


def evaluate_all(run: AuditRun, progress: Progress) -> tuple[list, dict[str, float]]:
    """Every invariant of the registry for every mode, one invariant at a time so progress and
    per-invariant timings can be shown. CheckCrashed propagates (exit 3)."""
    from egf_audit import invariants

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


def pick_backend(
    device: str, kernels: KernelSet, launch_timeout_s: float | None = None
) -> tuple[Backend, str]:
    """The backend and how it was picked, said in words for the progress and the JSON."""
    try:
        backend = select_backend(device, kernels, launch_timeout_s)
    except AuditEnvironmentError as exc:
        if device == "cuda" and importlib.util.find_spec("cupy") is None:
            advice = f"; install CuPy: {CUPY_EXTRAS}"
            raise about_option(
                AuditEnvironmentError(f"{exc}{advice}"), "device", f"{exc.problem or exc}{advice}"
            ) from None
        raise
    if device != "auto":
        return backend, f"{backend.name} (--device {device})"
    if backend.name == "cuda":
        return backend, "cuda (picked by --device auto: a GPU and CuPy work)"
    return backend, f"cpu (picked by --device auto: no usable GPU: {cuda_usable()[1]})"


def _displayed(kernels: KernelSet, base: Path) -> KernelSet:
    """The kernel set as the document names it: a trainer's file by its repository path."""
    sources = tuple(
        replace(s, path=shown(s.path, base)) if s.origin == "kernels-dir" else s
        for s in kernels.sources
    )
    return replace(kernels, sources=sources)


def run_audit(req: RunRequest, progress: Progress | None = None) -> RunOutcome:
    """`egf-audit run`: audit, render, then write (or --check) the document and CI outputs.

    A run whose invariants fail still writes the document (it is the report) and exits 1.
    Every output is written after everything has been computed, all together, so an error
    leaves the existing files untouched."""
    progress = progress or NullProgress()
    modes = parse_modes(req.mode)
    check_steps(req.steps)
    check_device(req.device)
    check_distinct(req.outputs())
    check_launch_timeout(req.launch_timeout_s)
    if req.sanitize:
        sanitize.check_request(req.device)
    beside = Beside(JUDGING)
    try:
        beside.start()
        return _audit(req, progress, modes, beside)
    finally:
        beside.join(raising=False)  # at once where the invariants phase joined it already


def _warm_up(config: Config) -> Callable[[], None]:
    """torch's CUDA start-up (oracle/warmup.py), run by the thread that imported torch."""

    def work() -> None:
        from egf_audit.oracle import warmup

        warmup.warm_up(config, warmup.Warmup())

    return work


def _audit(
    req: RunRequest, progress: Progress, modes: tuple[str, ...], beside: Beside
) -> RunOutcome:
    n_scenarios = sum(len(mode_scenarios(m)) for m in modes) + 2  # + wrapper and gate probes
    progress.plan(4 + n_scenarios + len(invariant_modules()) + 1)
    timer = _Timer()
    base = req.base

    progress.step("config")
    config = timer("config", lambda: load_config(req.config_path, req.preset, req.seed))
    check_run_memory(config.dims, req.steps)
    progress.step("kernel sources")
    kernels = timer("kernels", lambda: load_kernel_set(req.kernels_dir, only=req.kernels_only))
    witness_log = witness_run.start(req.device) if req.cublas_log else None
    progress.step(f"backend (--device {req.device}): compiling kernels")
    if req.device == "cpu" or (req.device == "auto" and not cuda_usable()[0]):
        beside.imported()  # the CPU backend imports torch: never two threads at once
    backend, picked = timer(
        "backend", lambda: pick_backend(req.device, kernels, req.launch_timeout_s)
    )
    progress.step(f"backend: {picked}")
    if witness_log is not None:
        witness_run.listen(witness_log, backend)
    auditor = Auditor(config, backend, steps=req.steps, progress=progress.step)
    # torch's CUDA start-up runs beside the scenarios too (CUDA backend only), in the thread
    # that imported torch, once it has; "torch" times what is left of both when they end
    beside.then(_warm_up(config) if backend.name == "cuda" else None)
    run = timer("scenarios", lambda: auditor.run(modes))
    witness = witness_run.finish(witness_log, backend, run) if witness_log is not None else None
    timer("torch", beside.join)
    from egf_audit import invariants
    from egf_audit.cli.delivery import WHITESPACE_ONLY, RunOutcome, annotating
    from egf_audit.reports.document import render_document
    from egf_audit.reports.model import AuditReport

    results, seconds = timer("invariants", lambda: evaluate_all(run, progress))
    environment: dict[str, Any] = {"device": backend.name, "backend": dict(backend.info())}
    sanitizer_failures: list[str] = []
    if req.sanitize:
        progress.step("compute-sanitizer (memcheck, initcheck)")
        found, sanitizer_failures = sanitize.sanitize(req, config, backend.name)
        environment["compute_sanitizer"] = found

    progress.step("document")
    report = AuditReport(
        config=config,
        modes=modes,
        steps=req.steps,
        invariants=tuple(invariants.INVARIANTS),
        results=tuple(results),
        kernels=_displayed(kernels, base),
        command=reproduce_command(req, config),
        version=__version__,
        environment=environment,
        run_info=run_info(backend, picked, timer.timings),
        run=run,
        witness=witness.as_dict() if witness is not None else None,
    )
    document = render_document(report)
    # the sanitizer's findings are in the document; the gate, and every output, fails on them
    gate = replace(_gate(req, report, document, base), sanitizer_failures=tuple(sanitizer_failures))
    outcome = RunOutcome(gate, document, exit_code=0 if gate.ok else 1)
    outcome.notes += sanitizer_failures
    outcome.typed_out = Path(req.out).as_posix()
    if req.kernels_dir is not None:  # only a --kernels folder holds files to ignore
        for name in kernels.ignored:
            outcome.notes.append(
                f"--kernels {Path(req.kernels_dir).as_posix()}: ignored {name}: no kernel of "
                "that name"
            )
    if gate.stale:
        outcome.advice = f"run `{typed_command(req, config)}` and commit it"
        if WHITESPACE_ONLY in gate.stale_reason:
            outcome.advice = f"it {gate.stale_reason}; the sources are the same: {outcome.advice}"
        elif gate.stale_reason.startswith("was made from other sources"):
            outcome.advice = f"it {gate.stale_reason}. " + (
                'If the trainer\'s kernels are meant, pass --kernels DIR or set kernels = "DIR" '
                "in the [tool.egf-audit] table of pyproject.toml (docs/ci-gate.md); if these "
                f"sources are meant, {outcome.advice}"
            )
    # the changed lines place the annotations, and the text's blame lines where --base asks
    wanted = annotating(req.output_format) or req.base_ref is not None
    changed = _changed_lines(req, report, outcome) if wanted else {}
    _write_outputs(req, outcome, run, seconds, changed)
    return outcome


def _changed_lines(
    req: RunRequest, report: AuditReport, outcome: RunOutcome
) -> dict[str, list[tuple[int, int]]]:
    """The lines the pull request changed in each of the trainer's kernel files, by the path
    the document shows (relative to the project root)."""
    trainer = [s for s in report.kernels.sources if s.origin == "kernels-dir"]
    files = {s.path: (req.base / s.path).resolve() for s in trainer}
    hunks, note = changed_hunks(files.values(), base_ref(req.base_ref))
    if note:
        outcome.notes.append(note)
    return {shown_path: hunks.get(path, []) for shown_path, path in files.items()}


def _gate(req: RunRequest, report: AuditReport, document: str, base: Path) -> Gate:
    from egf_audit.cli.delivery import document_gate

    return document_gate(report, document, Path(req.out), req.check, base)


def _write_outputs(
    req: RunRequest,
    outcome: RunOutcome,
    run: AuditRun,
    seconds: dict,
    changed: dict[str, list[tuple[int, int]]],
) -> None:
    from egf_audit.cli.delivery import Deliveries, deliver
    from egf_audit.reports import github

    deliver(
        outcome,
        Deliveries(req.out, req.check, req.json_out, req.junit_out, req.trace_out),
        lambda: [line for trace in run.traces.values() for line in trace.to_jsonl()],
        req.output_format,
        github.step_summary,
        seconds,
        changed,
    )
