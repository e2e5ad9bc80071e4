"""The trainer repository's own settings: a `[tool.egf-audit]` table, read once for every command.

    [tool.egf-audit]          # pyproject.toml; egf-audit.toml has the same keys at top level
    kernels = "cuda/kernels"  # relative to the file that says it
    config = "egf-audit-dims.toml"
    preset = "prod"
    out = "docs/dqn-wire-up-audit.md"
    device = "cpu"
    capture = "captures/trainer"
    trainer = "generic"       # run --capture: a program that is no SP14 trainer by design
    allow-undecided = ["EGF002"]  # run --capture: codes that may stay undecided

Found as ruff and black find theirs: from the working folder upwards, the first folder with an
`egf-audit.toml`, or a `pyproject.toml` that has the table, wins; the search stops at the
repository's root (the first folder holding `.git`), so a checkout never picks up a file of the
folder it was cloned into. A folder with both (`egf-audit.toml` beside a `pyproject.toml` that
has the table) is refused, naming both: whichever one silently won, the user may be editing the
other. The folder of that file is the project root; without one, the repository root; outside a
repository, the working folder. Default outputs are relative to the project root, so the gate
finds the committed document from any subfolder.

Command-line options override the table; `--isolated` ignores it. An error about a value the
table gave names the key and the file (`kernels = "k" ([tool.egf-audit] in pyproject.toml): no
such directory`), never the option the user did not type (`ProjectSettings.naming`). Reading
imports nothing heavy (`egf-audit --help` and `explain` stay quick).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import typer

from egf_audit.errors import AuditEnvironmentError, Error, UsageError, at_file
from egf_audit.small_files import MAX_BYTES, read_small_text

TABLE = "tool.egf-audit"
OWN_FILE = "egf-audit.toml"
MAX_SETTINGS_BYTES = MAX_BYTES  # refused unread beyond it, as a FIFO or a device is
PATH_KEYS = ("kernels", "config", "out", "capture")
# what egf-audit writes where the table says: a pull request can change the table, so these
# must stay inside the repository (symlinks followed); --out on the command line is the user's
OUTPUT_KEYS = ("out", "capture")
TEXT_KEYS = ("preset", "device")
DEVICES = ("auto", "cuda", "cpu")
# what a capture audit cannot use: naming them beside `capture` would be ignored by a bare run
REBUILD_KEYS = ("kernels", "config", "preset", "device")
# what shapes a capture audit's gate (cli/gate_options.py); the rebuild decides every invariant
# of the SP14 step it runs, so it reads neither
GATE_KEYS = ("trainer", "allow-undecided")


@dataclass(frozen=True)
class ProjectSettings:
    """What the table says, paths made absolute against the file's folder. `file` None: no
    settings file was found (or --isolated), and every value is None."""

    root: Path
    file: Path | None = None
    kernels: Path | None = None
    config: Path | None = None
    preset: str | None = None
    out: Path | None = None
    device: str | None = None
    capture: Path | None = None
    trainer: str | None = None
    allow_undecided: frozenset[str] | None = None  # the table's `allow-undecided`
    text: str = field(default="", repr=False, compare=False)  # the file's text, for key lines

    @property
    def source(self) -> str:
        """The file and table, as a message names them (the file as the working folder reaches
        it)."""
        if self.file is None:
            return "no settings file"
        return _where(self.file, near(self.file).as_posix())

    def spelled(self, key: str) -> str:
        """`key` as the user wrote it, for a message: `capture = "c" (egf-audit.toml)`."""
        value = getattr(self, key)
        if isinstance(value, Path) and self.file is not None:
            value = Path(os.path.relpath(value, self.file.parent)).as_posix()
        return f'{key} = "{value}" ({self.source})'

    @contextmanager
    def naming(
        self, keys: Iterable[str], option_key: dict[str, str] | None = None
    ) -> Iterator[None]:
        """An error about the value of an option the table gave (`keys`: the table's keys that
        supplied a value) names the key and this file instead of the option
        (`errors.about_option`); same kind of error, same exit code. `option_key`: an option
        whose value comes from a key of another name (`capture --out` from `capture`)."""
        given = {key for key in keys if getattr(self, key) is not None}
        try:
            yield
        except UsageError as exc:
            raise self._renamed(exc, given, option_key) from None
        except AuditEnvironmentError as exc:
            raise self._renamed(exc, given, option_key) from None

    def _renamed(self, exc: Error, given: set[str], option_key: dict[str, str] | None) -> Error:
        key = (option_key or {}).get(exc.option or "", exc.option)
        if self.file is None or key is None or key not in given:
            return exc
        return self.at(type(exc)(f"{self.spelled(key)}: {exc.problem}"), key)

    def at(self, error: Error, key: str | None = None) -> Error:
        """`error`, marked as being about this file's line that sets `key` (errors.at_file)."""
        if self.file is None:
            return error
        return at_file(error, self.file, key_line(self.file, self.text, key))


@overload
def near(path: Path) -> Path: ...
@overload
def near(path: None) -> None: ...
def near(path: Path | None) -> Path | None:
    """An absolute path as the working folder reaches it (`../kernels`), so that messages and the
    command a stale document asks for read as if the user had typed the settings' paths."""
    return None if path is None else Path(os.path.relpath(path))


def repository_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds `.git` (a folder in a clone, a file in
    a worktree or a submodule)."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def find_settings(start: Path | None = None, isolated: bool = False) -> ProjectSettings:
    """The settings that apply in `start` (default: the working folder)."""
    here = (start or Path.cwd()).absolute()
    repo = repository_root(here)
    if isolated:
        return ProjectSettings(root=repo or here)
    for folder in (here, *here.parents):
        own = folder / OWN_FILE
        pyproject = folder / "pyproject.toml"
        text, data = _read_toml(pyproject) if pyproject.exists() else ("", {})
        tool = data.get("tool")
        table = tool.get("egf-audit") if isinstance(tool, dict) else None
        if own.exists() and table is not None:
            raise at_file(
                UsageError(
                    f"two settings files: {near(own).as_posix()} and the [{TABLE}] table of "
                    f"{near(pyproject).as_posix()}; keep one (egf-audit reads one settings "
                    "file, docs/ci-gate.md)"
                ),
                own.absolute(),
            )
        if own.exists():
            return _settings(own, *_read_toml(own), bound=repo)
        if table is not None:
            return _settings(pyproject, text, table, bound=repo)
        if folder == repo:
            break
    return ProjectSettings(root=repo or here)


def _read_toml(path: Path) -> tuple[str, dict[str, Any]]:
    """The text of a settings file and its TOML; an error names the file (and TOML's line)."""
    try:
        text = read_small_text(path, "settings file", limit=MAX_SETTINGS_BYTES)
    except UsageError as exc:
        raise at_file(exc, path.absolute()) from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"at line (\d+)", str(exc))
        raise at_file(
            UsageError(f"{path}: not valid TOML: {exc}"),
            path.absolute(),
            int(line.group(1)) if line else None,
        ) from None


def key_line(file: Path, text: str, key: str | None) -> int | None:
    """The line (1-based) of the settings file that sets `key`, or (None, or a key it does not
    set) that opens the table; None where neither is found (a dotted or inline table)."""
    own = file.name == OWN_FILE  # its keys sit at the top level, before any [table]
    inside, header = own, 1 if own else None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            inside = _TABLE_HEADER.match(stripped) is not None
            header = number if inside and header is None else header
        elif inside and key is not None and re.match(_KEY % re.escape(key), stripped):
            return number
    return header


_TABLE_HEADER = re.compile(r"\[\s*tool\s*\.\s*(egf-audit|\"egf-audit\"|'egf-audit')\s*\]")
_KEY = r"""["']?%s["']?\s*="""  # `key = ...`, the key bare or quoted


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _where(file: Path, spelled: str) -> str:
    """A settings file as a message names it: egf-audit.toml as `spelled` (its path as the
    working folder reaches it), a pyproject.toml by its table and `spelled`."""
    return spelled if file.name == OWN_FILE else f"[{TABLE}] in {spelled}"


def _settings(file: Path, text: str, table: object, bound: Path | None) -> ProjectSettings:
    """`bound`: the repository root (None outside one: the file's own folder), which the
    table's output paths must stay inside."""
    where = _where(file, near(file.absolute()).as_posix())

    def refuse(message: str, key: str | None = None) -> UsageError:
        return at_file(
            UsageError(f"{where}: {message}"), file.absolute(), key_line(file, text, key)
        )

    if not isinstance(table, dict):
        raise refuse("must be a table of settings")
    known = (*PATH_KEYS, *TEXT_KEYS, *GATE_KEYS)
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise refuse(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})", unknown[0])
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in GATE_KEYS:
            values[key.replace("-", "_")] = _gate_value(key, value, refuse)
            continue
        if not isinstance(value, str) or not value.strip():
            raise refuse(f"{key} must be a non-empty string, got {value!r}", key)
        values[key] = (file.parent / value).absolute() if key in PATH_KEYS else value
    inside = os.path.realpath(bound or file.parent)
    for key in OUTPUT_KEYS:
        if key in values and not _within(os.path.realpath(values[key]), inside):
            elsewhere = "--out" if key == "out" else "--out of `egf-audit capture`"
            raise at_file(
                UsageError(
                    f'{key} = "{table[key]}" ({where}): lies outside the repository {inside}: '
                    "a path the settings file has egf-audit write must stay inside it (a pull "
                    f"request can change the file); to write elsewhere, pass {elsewhere}"
                ),
                file.absolute(),
                key_line(file, text, key),
            )
    if values.get("device", "auto") not in DEVICES:
        raise refuse(
            f"device must be one of {', '.join(DEVICES)}, got {values['device']!r}", "device"
        )
    if "capture" in values:
        clash = [key for key in REBUILD_KEYS if key in values]
        if clash:
            raise refuse(
                f"capture makes `egf-audit run` audit the capture, which {', '.join(clash)} "
                "cannot shape: keep one way of gating per settings file",
                "capture",
            )
    return ProjectSettings(root=file.parent.absolute(), file=file.absolute(), text=text, **values)


def _gate_value(key: str, value: object, refuse: Any) -> object:
    """`trainer` or `allow-undecided`, checked as the command line's option is."""
    from egf_audit.cli.gate_options import codes_problem, shown_value, trainer_problem

    if key == "trainer":
        if problem := trainer_problem(value):
            raise refuse(f"trainer: {problem}", key)
        return value
    if not isinstance(value, list):
        raise refuse(
            f'allow-undecided must be a list of codes (["EGF010"]), got {shown_value(value)}', key
        )
    codes, problem = codes_problem(value)
    if problem:
        raise refuse(f"allow-undecided: {problem}", key)
    return codes


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line gave the option `name` (not its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def setting(ctx: typer.Context, settings: ProjectSettings, name: str, value: Any) -> Any:
    """An option's value: as given on the command line, else the table's (a path as the working
    folder reaches it), else the option's default."""
    if given(ctx, name):
        return value
    found = getattr(settings, name)
    if found is None:
        return value
    return near(found) if isinstance(found, Path) else found
