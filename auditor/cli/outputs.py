"""Where a command's outputs go, checked before anything runs.

`-` means stdout. Two outputs on one path (`--json` equal to `--out`, a symlink and its target,
`--json -` with `--output-format json`) would have one replace the other: that is bad usage,
exit 2, before any work. Files are written together through `OutputBatch`; what goes to stdout
is printed after they were written, in the order the options name them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError, UsageError, about_option
from egf_audit.outputs.atomic import OutputBatch

STDOUT = "-"


def is_stdout(path: Path | str | None) -> bool:
    return path is not None and str(path) == STDOUT


def _identity(path: Path | str) -> str:
    """What two spellings of one file share: stdout, or the path with every symlink followed."""
    return STDOUT if is_stdout(path) else os.path.realpath(path)


def gate_outputs(
    out: Path,
    json_out: Path | None,
    junit_out: Path | None,
    trace_out: Path | None,
    output_format: str,
) -> dict[str, Path | str | None]:
    """Every path a gate run writes (or, with --check, reads), by option; what
    --output-format puts on stdout counts as the path `-`."""
    stdout_format = None if output_format in ("text", "github") else STDOUT
    return {
        "--out": out,
        "--json": json_out,
        "--junit": junit_out,
        "--trace": trace_out,
        f"--output-format {output_format}": stdout_format,
    }


def check_distinct(outputs: dict[str, Path | str | None]) -> None:
    """`outputs` maps an option name to its path (None: not asked for). Raises UsageError when
    two of them name one file."""
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = _identity(path)
        if key in seen:
            where = "stdout" if key == STDOUT else str(path)
            raise UsageError(f"{seen[key]} and {option} both write {where}: give each its own path")
        seen[key] = option


@dataclass
class Outputs:
    """Texts for files (staged and replaced together) and for stdout (printed after)."""

    files: list[tuple[Path, str, str | None]] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)

    def add(self, path: Path | str | None, text: str, option: str | None = None) -> None:
        """`option`: the option that named the path, so an error writing it is about that
        option's value (a settings file's `out`)."""
        if path is None:
            return
        if is_stdout(path):
            self.stdout.append(text)
        else:
            self.files.append((Path(path), text, option))

    def write(self) -> list[Path]:
        with OutputBatch() as batch:
            for path, text, option in self.files:
                try:
                    batch.add(path, text)
                except AuditEnvironmentError as exc:
                    if option is not None:
                        about_option(exc, option)
                    raise
            return batch.commit()
