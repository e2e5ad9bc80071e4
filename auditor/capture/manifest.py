"""A capture folder's `manifest.json`: the command `egf-audit capture` ran and how it ended.

Read as strictly as the events: a manifest that exists but is not what `capture` writes (not
JSON, not an object, a command that is no list of strings, an exit code that is no integer) is
refused with one UsageError naming it; a folder without one reads as None, and the audit calls
the capture incomplete.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from egf_audit.errors import UsageError

from .files import open_capture_file

MANIFEST_FILE = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20  # a command, counts and notes per process: kilobytes


@dataclass(frozen=True)
class Manifest:
    command: list[str]
    exit_code: int  # as subprocess gives it: -N when signal N ended the command
    layout: str | None  # the layout file's name in the folder, when `--layout` was given
    deep: bool = False  # `--deep` was asked for: every audited process must be recorded deep
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ended(self) -> str:
        """How the command ended, in a shell's words: `exited 0`, `died of signal 11 (SIGSEGV)`."""
        return exit_words(self.exit_code)


def exit_words(code: int) -> str:
    """A command's exit code as a shell words it. Two conventions name a death by signal N:
    subprocess (Popen.returncode, what `capture` records) gives -N; a shell's `$?`, and a
    wrapper that passes it on, gives 128 + N. Both read as the signal."""
    number = -code if code < 0 else code - 128 if code > 128 else 0
    if number <= 0 or number > signal.SIGRTMAX:
        return f"exited {code}"
    try:
        name = signal.Signals(number).name
    except ValueError:  # a real-time signal: no name of its own
        name = f"SIGRTMIN+{number - signal.SIGRTMIN}"
    return f"died of signal {number} ({name})"


def _refuse(problem: str) -> NoReturn:
    raise UsageError(f"{MANIFEST_FILE}: {problem}")


def read_manifest(folder: Path) -> Manifest | None:
    """The folder's manifest, None when it has none; UsageError when it has one that is not
    valid (or is no regular file, or cannot be read)."""
    path = Path(folder) / MANIFEST_FILE
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _refuse(f"cannot read it ({exc.strerror or exc})")
    with open_capture_file(path) as f:
        try:
            data = f.read(MAX_MANIFEST_BYTES + 1)
        except OSError as exc:
            _refuse(f"cannot read it ({exc.strerror or exc})")
    if len(data) > MAX_MANIFEST_BYTES:
        _refuse(f"larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        _refuse(f"not UTF-8 (byte {exc.start + 1})")
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or "too deep"
        _refuse(f"not JSON ({reason})")
    if type(raw) is not dict:
        _refuse(f"not a JSON object (a JSON {type(raw).__name__})")
    command, exit_code, layout = raw.get("command"), raw.get("exit_code"), raw.get("layout")
    if type(command) is not list or not all(type(a) is str for a in command):
        _refuse('"command" must be a list of strings')
    if type(exit_code) is not int:  # a JSON true is no exit code
        _refuse('"exit_code" must be an integer')
    if layout is not None and type(layout) is not str:
        _refuse('"layout" must be a string or null')
    deep = raw.get("deep", False)
    if type(deep) is not bool:
        _refuse('"deep" must be true or false')
    return Manifest(command, exit_code, layout, deep, raw)
