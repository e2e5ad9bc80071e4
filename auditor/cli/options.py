"""What the typer commands share: option types, the help text, consoles, and the mapping from
domain errors to one line on stderr and an exit code.

Import-light on purpose: `egf-audit --help` loads this module, so nothing here imports torch,
numpy or the pipeline; each command imports what it needs when it runs.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TextIO

import typer
from rich.console import Console
from rich.markup import escape

from egf_audit.errors import AuditEnvironmentError, UsageError, one_line
from egf_audit.outputs.step_summary import append_step_summary
from egf_audit.reports.workflow import command, in_github_actions

# Help texts are rich markup (the app's rich_markup_mode): a literal `[tool.egf-audit]` would be
# read as a style tag and vanish from --help, so every help text that means brackets is escaped
SETTINGS_TABLE = escape("[tool.egf-audit]")
CI_LOG_WIDTH = 120  # a CI log is no terminal and has no COLUMNS: use a width that reads well
NARROW = 80  # below this the verdicts are printed as lines, not a table
OUTPUT_FORMATS = ("text", "json", "junit", "github")
EXIT_CODES = (
    "[bold]Exit codes[/bold]: "
    "[bold]0[/bold] every invariant holds (a warning counts as holding); "
    "[bold]1[/bold] an invariant failed, a fault survived, or --check found the document stale; "
    "[bold]2[/bold] bad usage or config; "
    "[bold]3[/bold] environment or internal error (no GPU for --device cuda, a kernel that "
    "does not compile, an output that cannot be written, a crashed check). "
    "Interrupted: 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP)."
)

# ---- options several commands take ----
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
        "--preset",
        help="Dimension preset: ci or prod (default: the config's, else ci).",
        metavar="NAME",
    ),
]
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="TOML file overriding the preset's dims and hyper-parameters "
        "(`egf-audit config --example` prints one).",
    ),
]
Seed = Annotated[
    int | None,
    typer.Option("--seed", help="Seed of the weights and batches (default: the config's, else 0)."),
]
Steps = Annotated[
    int,
    typer.Option(
        "--steps",
        help="Training steps of each production run (1 to 100; docs/config.md says why).",
    ),
]
KernelsDir = Annotated[
    Path | None,
    typer.Option(
        "--kernels",
        help="Folder of a trainer's own kernel sources; a file there replaces the bundled one "
        "of the same name.",
        metavar="DIR",
    ),
]
JsonOut = Annotated[
    Path | None,
    typer.Option("--json", help="Write the results as JSON to this file, or - for stdout."),
]
JunitOut = Annotated[
    Path | None,
    typer.Option("--junit", help="Write JUnit XML to this file, or - for stdout."),
]
OutputFormat = Annotated[
    str,
    typer.Option(
        "--output-format",
        help="What stdout carries: text (the verdict table), json, junit or github "
        "(workflow annotations).",
        metavar="text|json|junit|github",
    ),
]
LaunchTimeout = Annotated[
    float | None,
    typer.Option(
        "--launch-timeout",
        help="Seconds one launch of a kernel egf-audit does not ship may run before its worker "
        "process is killed and the launch fails EGF013 (default 120; CPU and GPU).",
        metavar="SECONDS",
    ),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="Print only errors, failures and the verdict line; same exit code.",
        metavar="",
    ),
]
Isolated = Annotated[
    bool,
    typer.Option(
        "--isolated",
        help=f"Ignore the {SETTINGS_TABLE} table of pyproject.toml (or egf-audit.toml).",
        metavar="",
    ),
]
Debug = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.", metavar="")]


def with_help(*extra: str) -> Callable[[Callable], Callable]:
    """Use the docstring as help with each paragraph on one line: typer's rich mode keeps a
    docstring's line breaks, which would break the wrapping at the terminal's width. A
    docstring is plain text, escaped for rich (its `[tool.egf-audit]` is no style tag); `extra`
    is markup (EXIT_CODES)."""

    def wrap(fn: Callable) -> Callable:
        docstring = inspect.cleandoc(fn.__doc__ or "")
        paragraphs = [*escape(docstring).split("\n\n"), *extra]
        fn.__doc__ = "\n\n".join(" ".join(p.split()) for p in paragraphs)
        return fn

    return wrap


def check_output_format(value: str) -> str:
    if value not in OUTPUT_FORMATS:
        raise UsageError(
            f"--output-format: unknown format {value!r} (choose from {', '.join(OUTPUT_FORMATS)})"
        )
    return value


# ---- consoles ----
def terminal_width(file: TextIO) -> int | None:
    """The width to render at: COLUMNS when it is a usable number, the terminal's own on a
    terminal, else CI_LOG_WIDTH. COLUMNS=0 or garbage (some CI runners export it) is ignored:
    rich would render a zero-width table as nothing at all."""
    raw = os.environ.get("COLUMNS", "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    if getattr(file, "isatty", lambda: False)():
        return None
    return CI_LOG_WIDTH


def console(file: TextIO, stderr: bool = False) -> Console:
    width = terminal_width(file)
    with _columns_hidden():
        return Console(file=file, stderr=stderr, highlight=False, width=width)


@contextmanager
def _columns_hidden() -> Iterator[None]:
    # rich reads COLUMNS itself and would take "0" as a width of 0
    saved = os.environ.pop("COLUMNS", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["COLUMNS"] = saved


def consoles() -> tuple[Console, Console]:
    """Created per command, so they write to the streams of this call (tests swap them)."""
    return console(sys.stdout), console(sys.stderr, stderr=True)


# ---- errors and signals ----
class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what a CI runner sends on cancel), raised where the program is so
    that every `finally` and `with` runs: staged outputs and build folders are removed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def handle_termination_signals() -> None:
    """SIGTERM and SIGHUP end the run the way Ctrl-C does (exit 128 + the signal)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupted)


def interrupted_exit(exc: KeyboardInterrupt) -> tuple[str, int]:
    signum = getattr(exc, "signum", signal.SIGINT)
    return f"interrupted ({SIGNAL_NAMES.get(signum, str(signum))})", 128 + signum


def error_exit(message: object, code: int, exc: BaseException | None, debug: bool) -> typer.Exit:
    if debug and exc is not None:
        traceback.print_exception(exc, file=sys.stderr)
    report_error(message, code, getattr(exc, "at", None))
    return typer.Exit(code)


def report_error(message: object, code: int, at: tuple[Path, int | None] | None = None) -> None:
    """The one line of an error on stderr. Under GitHub Actions also an `::error` annotation,
    on the settings file (and line) the error is about where it is known, and a step summary
    that says no audit ran: a gate that stops before its verdict still tells the pull request
    why."""
    line = one_line(message)
    typer.echo(f"egf-audit: error: {line}", err=True)
    if not in_github_actions() or code not in (2, 3):
        return
    file, number = at if at is not None else (None, None)
    shown = None if file is None else _from_repository_root(file)
    title = f"egf-audit (exit {code})"
    typer.echo(command("error", line, title=title, file=shown, line=number if shown else None))
    summary = f"## egf-audit: ERROR (exit {code}), no audit ran\n\n"
    summary += f"```text\negf-audit: error: {line}\n```\n"
    # the summary is a courtesy to the reader of the job: the error line and exit code stand
    with contextlib.suppress(OSError):
        append_step_summary(summary)


def _from_repository_root(file: Path) -> str:
    """A file as an annotation names it: relative to the repository root (GitHub's workspace)."""
    from egf_audit.cli.project import repository_root

    root = repository_root(file.parent) or Path.cwd()
    return Path(os.path.relpath(file, root)).as_posix()


def _crashed_check(exc: Exception) -> bool:
    """A CheckCrashed can only come from a loaded egf_audit.invariants, so the registry is not
    imported here just to name the class."""
    registry = sys.modules.get("egf_audit.invariants")
    return registry is not None and isinstance(exc, registry.CheckCrashed)


@contextmanager
def exit_codes(debug: bool) -> Iterator[None]:
    """Domain errors to exit codes: UsageError 2; environment, crashed checks and anything
    unexpected 3 (an unexpected exception is a bug in egf-audit, not a verdict); a signal
    128 + its number. Heavy modules are imported inside this block, so a Ctrl-C while torch
    loads is one line too."""
    try:
        yield
    except typer.Exit:
        raise
    except UsageError as exc:
        raise error_exit(exc, 2, exc, debug) from None
    except AuditEnvironmentError as exc:
        raise error_exit(exc, 3, exc, debug) from None
    except KeyboardInterrupt as exc:
        message, code = interrupted_exit(exc)
        raise error_exit(message, code, exc, debug) from None
    except Exception as exc:
        if _crashed_check(exc):
            raise error_exit(exc, 3, exc, debug) from None
        hint = "" if debug else " (run with --debug for the traceback)"
        raise error_exit(
            f"internal error: {type(exc).__name__}: {exc}{hint}", 3, exc, debug
        ) from None
