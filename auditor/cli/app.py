"""The `egf-audit` command line: thin typer commands (run_cli.py, other_cli.py) over the plain
functions in commands.py and other_commands.py.

Results go to stdout (the verdict table, the kill matrix, JSON or JUnit with
`--output-format`, GitHub annotations); progress, logs and errors go to stderr. An error is
one line on stderr and an exit code, never a traceback unless --debug asks for it; a usage
error typer finds (an unknown option, a missing value) is one line too.

This module imports no torch, numpy or pipeline code, so `egf-audit --help` is fast; each
command imports what it needs when it runs.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from egf_audit import __version__
from egf_audit.cli import capture_cli, other_cli, run_cli
from egf_audit.cli.options import EXIT_CODES, handle_termination_signals, report_error
from egf_audit.errors import one_line

try:  # typer vendors click from 0.20 on
    from click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - depends on the installed typer
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

app = typer.Typer(
    name="egf-audit",
    help=(
        "Audit the hand-wired SP14 DQN trainer: rerun its pipeline with every launch recorded, "
        "prove the wiring invariants, and write the audit document.\n\n" + EXIT_CODES
    ),
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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


app.command("run")(run_cli.run)
app.command("mutants")(other_cli.mutants)
app.command("invariants")(other_cli.list_invariants)
app.command("explain")(other_cli.explain)
app.command("config")(other_cli.config)
app.command("bench")(other_cli.bench)
app.command("capture", context_settings=capture_cli.CONTEXT)(capture_cli.capture)


def run_app(argv: list[str]) -> int:
    """Run the command line on `argv`; returns the exit code. Usage errors are one line."""
    try:
        code = app(args=argv, prog_name="egf-audit", standalone_mode=False)
    except NoArgsIsHelpError as exc:
        typer.echo(exc.format_message())  # the help itself, whole
        return 2
    except ClickException as exc:
        where = exc.ctx.command_path if getattr(exc, "ctx", None) else "egf-audit"
        report_error(f"{one_line(exc.format_message())} (see `{where} --help`)", exc.exit_code)
        return exc.exit_code
    return code if isinstance(code, int) else 0


def main() -> None:
    handle_termination_signals()
    sys.exit(run_app(sys.argv[1:]))
