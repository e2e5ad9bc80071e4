"""The `egf-audit` command line: thin typer commands over the plain functions in runner.py.

Results go to stdout (the verdict table, the kill matrix, GitHub annotations); progress, logs
and errors go to stderr. A domain error is one line on stderr and an exit code, never a
traceback unless --debug asks for it.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TextIO

import typer
from rich.console import Console
from rich.text import Text

from egf_audit import __version__
from egf_audit.cli import commands as runner
from egf_audit.cli.progress import progress_for
from egf_audit.cli.tables import invariants_table, kill_matrix, verdict_table
from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.invariants import CheckCrashed
from egf_audit.reports.model import verdict_line
from egf_audit.scenarios.faults import FAULTS

CI_LOG_WIDTH = 120
EXIT_CODES = (
    "[bold]Exit codes[/bold]: "
    "[bold]0[/bold] every invariant holds (a warning counts as holding); "
    "[bold]1[/bold] an invariant failed, a fault survived, or --check found the document stale; "
    "[bold]2[/bold] bad usage or config; "
    "[bold]3[/bold] environment or internal error (no GPU for --device cuda, a kernel that "
    "does not compile, an output that cannot be written, a crashed check)."
)

app = typer.Typer(
    name="egf-audit",
    help=(
        "Audit the hand-wired SP14 DQN trainer: rerun its pipeline with every launch recorded, "
        "prove the wiring invariants EGF001-EGF012, and write the audit document.\n\n" + EXIT_CODES
    ),
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# ---- shared options ----
Device = Annotated[
    str,
    typer.Option(
        "--device",
        help="Backend: [bold]auto[/bold] (CUDA when a GPU and CuPy work, else CPU), cuda, cpu.",
        metavar="auto|cuda|cpu",
    ),
]
Preset = Annotated[
    str | None,
    typer.Option(
        help="Dimension preset: ci or prod (default: the config's, else ci).", metavar="NAME"
    ),
]
ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", help="TOML file overriding the preset's dims and hyper-parameters."),
]
Seed = Annotated[
    int | None,
    typer.Option(help="Seed of the weights and batches (default: the config's, else 0)."),
]
Steps = Annotated[int, typer.Option(help="Training steps of each production run.")]
KernelsDir = Annotated[
    Path | None,
    typer.Option(
        "--kernels",
        help="Folder of a trainer's own kernel sources; a file there replaces the bundled one "
        "of the same name.",
        metavar="DIR",
    ),
]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Print only errors and failures; same exit code.", metavar=""
    ),
]
Debug = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.", metavar="")]


def _help(*extra: str) -> Callable[[Callable], Callable]:
    """Use the docstring as help with each paragraph on one line: typer's rich mode keeps a
    docstring's line breaks, which would break the wrapping at the terminal's width."""

    def wrap(fn: Callable) -> Callable:
        paragraphs = [*inspect.cleandoc(fn.__doc__ or "").split("\n\n"), *extra]
        fn.__doc__ = "\n\n".join(" ".join(p.split()) for p in paragraphs)
        return fn

    return wrap


def _console(file: TextIO, stderr: bool = False) -> Console:
    # Not a terminal and no COLUMNS: rich would assume 80 columns and fold the verdict
    # summaries into tall, narrow cells in a CI log.
    terminal = getattr(file, "isatty", lambda: False)()
    width = None if terminal or os.environ.get("COLUMNS") else CI_LOG_WIDTH
    return Console(file=file, stderr=stderr, highlight=False, width=width)


def _consoles() -> tuple[Console, Console]:
    """Created per command, so they write to the streams of this call (tests swap them)."""
    return _console(sys.stdout), _console(sys.stderr, stderr=True)


def _one_line(message: object) -> str:
    parts = [part.strip() for part in str(message).splitlines() if part.strip()]
    return " | ".join(parts) or "(no message)"


def _fail(message: object, code: int, exc: BaseException, debug: bool) -> typer.Exit:
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    typer.echo(f"egf-audit: error: {_one_line(message)}", err=True)
    return typer.Exit(code)


@contextmanager
def _exit_codes(debug: bool) -> Iterator[None]:
    """Domain errors to exit codes: UsageError 2; environment, crashed checks and anything
    unexpected 3 (an unexpected exception is a bug in egf-audit, not a verdict)."""
    try:
        yield
    except typer.Exit:
        raise
    except UsageError as exc:
        raise _fail(exc, 2, exc, debug) from None
    except (AuditEnvironmentError, CheckCrashed) as exc:
        raise _fail(exc, 3, exc, debug) from None
    except KeyboardInterrupt as exc:
        raise _fail("interrupted", 130, exc, debug) from None
    except Exception as exc:
        hint = "" if debug else " (run with --debug for the traceback)"
        raise _fail(f"internal error: {type(exc).__name__}: {exc}{hint}", 3, exc, debug) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"egf-audit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version.", metavar=""
        ),
    ] = False,
) -> None:
    pass


@app.command()
@_help(EXIT_CODES)
def run(
    device: Device = "auto",
    preset: Preset = None,
    config: ConfigFile = None,
    seed: Seed = None,
    steps: Steps = runner.DEFAULT_STEPS,
    mode: Annotated[
        str,
        typer.Option(help="Gate modes to audit: sentinel, live or both.", metavar="MODE"),
    ] = "both",
    out: Annotated[Path, typer.Option(help="The audit document.")] = runner.DEFAULT_OUT,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Regenerate the document in memory and fail (exit 1, with a diff) when the "
            "file at --out differs outside its environment block. Writes no document.",
            metavar="",
        ),
    ] = False,
    json_out: JsonOut = None,
    junit: Annotated[
        Path | None,
        typer.Option(help="Write JUnit XML here: one testcase per invariant per mode."),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="Write every scenario's launches here as JSON lines."),
    ] = None,
    kernels: KernelsDir = None,
    cublas_log: Annotated[
        bool,
        typer.Option(
            "--cublas-log",
            help="Also log every GEMM with cuBLAS's own API logger and match the log one-to-one "
            "with the recorded SGEMMs (CUDA only); a mismatch fails the run.",
            metavar="",
        ),
    ] = False,
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """Run the audit and write the audit document (the main job and the PR gate).

    Rebuilds the SP14 pipeline at the preset's shapes, runs every scenario with each launch
    recorded, proves every invariant in each mode, and writes --out. A run whose invariants
    fail still writes the document and exits 1. With GITHUB_ACTIONS=true it also prints
    workflow annotations and appends a summary to GITHUB_STEP_SUMMARY.
    """
    request = runner.RunRequest(
        device=device,
        preset=preset,
        config_path=config,
        seed=seed,
        steps=steps,
        mode=mode,
        out=out,
        check=check,
        json_out=json_out,
        junit_out=junit,
        trace_out=trace,
        kernels_dir=kernels,
        cublas_log=cublas_log,
    )
    stdout, stderr = _consoles()
    with _exit_codes(debug), progress_for(stderr, quiet) as progress:
        outcome = runner.run_audit(request, progress)
    for line in outcome.annotations:
        typer.echo(line)
    _print_run(outcome, request, stdout, stderr, quiet)
    raise typer.Exit(outcome.exit_code)


def _print_run(
    outcome: runner.RunOutcome,
    request: runner.RunRequest,
    stdout: Console,
    stderr: Console,
    quiet: bool,
) -> None:
    report = outcome.report
    for note in outcome.notes:
        stderr.print(Text(f"egf-audit: warning: {note}"), soft_wrap=True)
    if quiet:
        for r in report.failures:
            stderr.print(Text(f"{r.code}[{r.mode}] failed: {r.verdict.summary}"), soft_wrap=True)
    else:
        stdout.print(verdict_table(report))
        stdout.print(Text(verdict_line(report)), soft_wrap=True)
        for path in outcome.written:
            stderr.print(Text(f"egf-audit: wrote {path}"), soft_wrap=True)
    if report.witness is not None:
        w = report.witness
        line = (
            f"cuBLAS witness: {w['matched']} of {w['recorded']} GEMMs match ({w['logged']} logged)"
        )
        (stdout if report.witness_ok else stderr).print(
            Text(line if report.witness_ok else f"egf-audit: {line}: FAIL"), soft_wrap=True
        )
    if request.check:
        where = Path(request.out).as_posix()
        if outcome.stale:
            stderr.print(
                Text(f"egf-audit: {where} is stale: run `{report.command}` and commit it"),
                soft_wrap=True,
            )
            if not quiet:
                stderr.file.write("".join(outcome.diff))
        elif not quiet:
            stderr.print(Text(f"egf-audit: {where} is up to date"), soft_wrap=True)


@app.command()
@_help()
def mutants(
    device: Device = "auto",
    preset: Preset = None,
    config: ConfigFile = None,
    seed: Seed = None,
    steps: Steps = runner.DEFAULT_STEPS,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Run only this fault (repeatable). Faults: " + ", ".join(f.name for f in FAULTS),
            metavar="NAME",
        ),
    ] = None,
    json_out: JsonOut = None,
    kernels: KernelsDir = None,
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """Prove every invariant can fail: the audit once per fault, and the kill matrix.

    Exits 1 when a fault survives (no invariant fails on it) or, when every fault ran, when
    an invariant caught no fault.
    """
    stdout, stderr = _consoles()
    with _exit_codes(debug), progress_for(stderr, quiet) as progress:
        outcome = runner.run_mutants(
            device=device,
            preset=preset,
            config_path=config,
            seed=seed,
            steps=steps,
            only=only,
            kernels_dir=kernels,
            json_out=json_out,
            progress=progress,
        )
    result = outcome.result
    if not quiet:
        stdout.print(kill_matrix(result))
    problems = [f"fault {name} survived: no invariant failed on it" for name in result.survivors]
    if outcome.all_faults:
        problems += [f"{code} caught no fault" for code in result.idle_invariants]
    problems += [
        f"fault {name}: {', '.join(codes)} expected to catch it but did not"
        for name, codes in result.missed.items()
    ]
    for problem in problems:
        stderr.print(Text(f"egf-audit: {problem}"), soft_wrap=True)
    if not quiet and not problems:
        ran = [f for f in result.faults if f.applicable]
        line = f"every one of {len(ran)} faults was caught"
        skipped = [f.name for f in result.faults if not f.applicable]
        if skipped:
            line += f"; not applicable to these kernel sources: {', '.join(skipped)}"
        stdout.print(Text(line), soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


@app.command("invariants")
@_help()
def list_invariants() -> None:
    """List the invariants: code, slug and one-line message."""
    stdout, _ = _consoles()
    stdout.print(invariants_table(runner.invariant_list()))


@app.command()
@_help()
def explain(
    code: Annotated[str, typer.Argument(help="An invariant code, e.g. EGF001.", metavar="CODE")],
) -> None:
    """Print an invariant's full text: what it proves, why, how it is measured, the bug."""
    with _exit_codes(debug=False):
        text = runner.explain(code)
    typer.echo(text, nl=False)


@app.command()
@_help()
def bench(
    device: Device = "auto",
    batch: Annotated[
        list[int] | None,
        typer.Option(
            help="Batch size to time (repeatable; default 256 1024 4096 16384 65536 on cuda, "
            "smaller on cpu).",
            metavar="B",
        ),
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(help="Timed repeats per batch size (default: the bench's).")
    ] = None,
    warmup: Annotated[
        int | None, typer.Option(help="Untimed warm-up runs (default: the bench's).")
    ] = None,
    json_out: JsonOut = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Write the results as a markdown table here.")
    ] = None,
    kernels: KernelsDir = None,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Also show where the plain step's GPU time goes, kernel by kernel (cuda only).",
        ),
    ] = False,
    debug: Debug = False,
) -> None:
    """Time the plain (unrecorded) pipeline step at several batch sizes."""
    with _exit_codes(debug):
        code = runner.bench(
            device=device,
            batch_sizes=batch,
            repeats=repeats,
            warmup=warmup,
            json_out=json_out,
            markdown_out=markdown,
            kernels_dir=kernels,
            profile=profile,
        )
    raise typer.Exit(code)


def main() -> None:
    app(prog_name="egf-audit")
