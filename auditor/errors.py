"""The two error kinds a run can end with, and their exit codes (README.md, Exit codes), how an
error names the option whose value it is about, and how a message is put on the one line an
error or a reason is printed in."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar


class UsageError(ValueError):
    """Bad usage or configuration: exit code 2."""

    option: str | None = None  # the option whose value this is about: "kernels" (about_option)
    problem: str = ""  # what is wrong with that value, without naming the option
    at: tuple[Path, int | None] | None = None  # the file (and line) it is about (at_file)


class AuditEnvironmentError(RuntimeError):
    """The environment cannot run the audit (no GPU, a kernel that does not compile, an output
    that cannot be written): exit code 3."""

    option: str | None = None
    problem: str = ""
    at: tuple[Path, int | None] | None = None


Error = TypeVar("Error", UsageError, AuditEnvironmentError)


def about_option(error: Error, option: str, problem: str | None = None) -> Error:
    """`error`, marked as being about the value of `--option`. Its message names the option as
    typed; where a settings file gave the value, the command names the key and the file
    instead (cli/project.py, `ProjectSettings.naming`). `problem`: the message without the
    option's name (default: the whole message)."""
    error.option = option
    error.problem = str(error) if problem is None else problem
    return error


def at_file(error: Error, file: Path, line: int | None = None) -> Error:
    """`error`, marked as being about `file` (a settings file) and, where known, its `line`:
    under GitHub Actions its annotation goes there (cli/options.py)."""
    error.at = (file, line)
    return error


def option_error(kind: type[Error], option: str, value: object, problem: str) -> Error:
    """`--option VALUE: problem`, marked as being about that option's value."""
    return about_option(kind(f"--{option} {value}: {problem}"), option, problem)


def message_lines(message: object) -> list[str]:
    """The non-blank lines of a message, each stripped."""
    return [line.strip() for line in str(message).splitlines() if line.strip()]


def one_line(message: object) -> str:
    """A message as the one line `egf-audit: error: ...` prints: all of its lines, joined."""
    return " | ".join(message_lines(message)) or "(no message)"


def exception_line(exc: BaseException) -> str:
    """An exception as its type and its message's first line (`RuntimeError: CUDA error: ...`),
    for a reason printed in a table's cell, where a long traceback-like message would not fit
    (the bench's unavailable figures)."""
    lines = message_lines(exc)
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip().rstrip(":")
