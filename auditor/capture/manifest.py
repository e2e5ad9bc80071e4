"""A capture folder's `manifest.json`: the command `egf-audit capture` ran, how it ended, and the
capture's table of contents (every recorded process: its pid, what it recorded, its notes).

`manifest_document` writes it (capture/command.py), `read_manifest` reads it back as strictly as
the events: a manifest that is not what `capture` writes (not JSON, nested or numbered out of
bounds, not an object, a key it does not write, a command that is no list of strings, an exit
code that is no integer, a process entry with a count that is no count, two entries of one pid,
not exactly one audited process) is refused with one UsageError naming it; a folder without one
reads as None, and the audit calls the capture incomplete. capture/folder.py holds the folder to
what the manifest lists. `"format": "egf-audit-capture/1"` marks a manifest egf-audit wrote;
captures made before the mark was written carry none and read the same.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from egf_audit.errors import UsageError
from egf_audit.trace.process import ProcessCapture

from .files import open_capture_file, parse_json
from .kernel_params import ABI_KERNELS
from .layout import LAYOUT_FILE

MANIFEST_FILE = "manifest.json"
CAPTURE_FORMAT = "egf-audit-capture/1"
MAX_MANIFEST_BYTES = 16 << 20  # a command, counts and notes per process: kilobytes
COUNTS = ("kernels", "gemms", "memsets", "copies", "snapshots")  # what each process recorded
_KEYS = {"format", "command", "exit_code", "wall_s", "layout", "snapshot_kernels", "deep"}
_PLATFORMS = ("cpu",)  # capture --cpu's mark; a GPU capture writes no "platform"
# a process entry's key, true where `capture` dropped the process's values file (values_dropped)
VALUES_DROPPED = "values_dropped"
_PROCESS_KEYS = {"pid", "audited", *COUNTS, "notes", VALUES_DROPPED}


@dataclass(frozen=True)
class Listed:
    """One process the manifest lists: what `capture` counted when it read the process."""

    pid: int
    audited: bool
    counts: dict[str, int]
    notes: list[str]
    values_dropped: bool = False  # `capture` dropped its values file (values_dropped)


@dataclass(frozen=True)
class Manifest:
    command: list[str]
    exit_code: int  # as subprocess gives it: -N when signal N ended the command
    layout: str | None  # the layout file's name in the folder, when `--layout` was given
    deep: bool = False  # `--deep` was asked for: every audited process must be recorded deep
    processes: tuple[Listed, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ended(self) -> str:
        """How the command ended, in a shell's words: `exited 0`, `died of signal 11 (SIGSEGV)`."""
        return exit_words(self.exit_code)

    def listed(self, pid: int) -> Listed | None:
        return next((p for p in self.processes if p.pid == pid), None)


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


def audited_process(procs: list[ProcessCapture]) -> ProcessCapture:
    """The process that ran the trainer step: the most ABI kernel launches, then the most
    records (a launcher script and its trainer child are both recorded)."""
    return max(
        procs, key=lambda p: (sum(r.name in ABI_KERNELS for r in p.kernels()), len(p.records))
    )


def process_counts(proc: ProcessCapture) -> dict[str, int]:
    """What a process recorded, as the manifest counts it (and the folder's check recounts it)."""
    return {
        "kernels": len(proc.kernels()),
        "gemms": sum(r.kind in ("sgemm", "gemm") for r in proc.records),
        "memsets": sum(r.kind == "memset" for r in proc.records),
        "copies": sum(r.kind == "copy" for r in proc.records),
        "snapshots": len(proc.snapshots),
    }


def values_dropped(proc: ProcessCapture) -> bool:
    """Whether `capture` drops this process's values file once the command has ended: it
    recorded values (`--deep`) and launched no ABI kernel. Only the invariants about the SP14
    wiring read a deep capture's values (EGF010's oracle, the wire column's history before a
    launch), and on a process that launched no ABI kernel they are not applicable; what judges
    it (EGF001's spans, EGF013's containment) reads which bytes each call changed, which the
    events file keeps, never the bytes. llm.c's two steps wrote 541 MB of values that nothing
    read."""
    return proc.values and not any(r.name in ABI_KERNELS for r in proc.kernels())


def process_entries(procs: list[ProcessCapture], audited: ProcessCapture) -> list[dict[str, Any]]:
    return [
        {
            "pid": p.pid,
            "audited": p is audited,
            **process_counts(p),
            "notes": p.notes,
            **({VALUES_DROPPED: True} if values_dropped(p) else {}),
        }
        for p in procs
    ]


def manifest_document(
    command: list[str],
    exit_code: int,
    wall_s: float,
    layout: bool,
    snapshot: tuple[str, ...],
    deep: bool,
    processes: list[dict[str, Any]],
    platform: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest `capture` writes (processes: `process_entries`; platform: what `capture
    --cpu` adds, `{"platform": "cpu", "kernels": DIR or null}`)."""
    return {
        "format": CAPTURE_FORMAT,
        "command": command,
        "exit_code": exit_code,
        "wall_s": round(wall_s, 3),
        "layout": LAYOUT_FILE if layout else None,
        "snapshot_kernels": list(snapshot),
        "deep": deep,
        "processes": processes,
        **(platform or {}),
    }


def _refuse(problem: str) -> NoReturn:
    raise UsageError(f"{MANIFEST_FILE}: {problem}")


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= 1 << 40


def _listed(i: int, entry: Any) -> Listed:
    where = f'"processes"[{i}]'
    if type(entry) is not dict:
        _refuse(f"{where} must be an object")
    if unknown := sorted(set(entry) - _PROCESS_KEYS):
        _refuse(f"{where} holds {unknown[0]!r:.80}, a key egf-audit capture does not write")
    pid = entry.get("pid")
    if type(pid) is not int or not 0 <= pid < 2**31:
        _refuse(f'{where}: "pid" must be an integer from 0 to 2**31 - 1')
    if type(entry.get("audited")) is not bool:
        _refuse(f'{where}: "audited" must be true or false')
    for key in COUNTS:
        if not _count(entry.get(key)):
            _refuse(f'{where}: "{key}" must be a count (an integer from 0 to 2**40)')
    notes = entry.get("notes")
    if type(notes) is not list or not all(type(n) is str for n in notes):
        _refuse(f'{where}: "notes" must be a list of strings')
    if entry.get(VALUES_DROPPED, True) is not True:  # written only where true
        _refuse(f'{where}: "{VALUES_DROPPED}" is written only as true')
    counts = {k: entry[k] for k in COUNTS}
    return Listed(pid, entry["audited"], counts, notes, VALUES_DROPPED in entry)


def _processes(raw: Any) -> tuple[Listed, ...]:
    if type(raw) is not list:
        _refuse('"processes" must be a list of the recorded processes')
    listed = tuple(_listed(i, entry) for i, entry in enumerate(raw))
    pids = [p.pid for p in listed]
    if len(set(pids)) != len(pids):
        twice = next(pid for pid in pids if pids.count(pid) > 1)
        _refuse(f'"processes" lists pid {twice} twice')
    if listed and sum(p.audited for p in listed) != 1:
        _refuse(f'"processes" marks {sum(p.audited for p in listed)} processes audited, not one')
    return listed


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
        raw = parse_json(data)
    except UnicodeDecodeError as exc:
        _refuse(f"not UTF-8 (byte {exc.start + 1})")
    except ValueError as exc:
        _refuse(f"not JSON ({getattr(exc, 'msg', None) or exc})")
    if type(raw) is not dict:
        _refuse(f"not a JSON object (a JSON {type(raw).__name__})")
    return _manifest(raw)


def _manifest(raw: dict[str, Any]) -> Manifest:
    command, exit_code, layout = raw.get("command"), raw.get("exit_code"), raw.get("layout")
    if type(command) is not list or not all(type(a) is str for a in command):
        _refuse('"command" must be a list of strings')
    if type(exit_code) is not int:  # a JSON true is no exit code
        _refuse('"exit_code" must be an integer')
    if layout is not None and type(layout) is not str:
        _refuse('"layout" must be a string or null')
    if layout is not None and layout != LAYOUT_FILE:
        _refuse(f'"layout" is {layout!r:.80}: capture names the layout file {LAYOUT_FILE}')
    deep = raw.get("deep", False)
    if type(deep) is not bool:
        _refuse('"deep" must be true or false')
    if raw.get("format", CAPTURE_FORMAT) != CAPTURE_FORMAT:
        _refuse(f'"format" is {raw["format"]!r:.80}, not "{CAPTURE_FORMAT}": another tool\'s')
    wall = raw.get("wall_s", 0.0)
    if type(wall) not in (int, float) or wall < 0:
        _refuse('"wall_s" must be a number of seconds')
    kernels = raw.get("snapshot_kernels", [])
    if type(kernels) is not list or not all(type(k) is str for k in kernels):
        _refuse('"snapshot_kernels" must be a list of kernel names')
    if "platform" in raw and raw["platform"] not in _PLATFORMS:
        _refuse(f'"platform" is {raw["platform"]!r:.80}: capture --cpu writes "cpu"')
    if "kernels" in raw and raw["kernels"] is not None and type(raw["kernels"]) is not str:
        _refuse('"kernels" must be a string or null')
    if unknown := sorted(set(raw) - _KEYS - {"processes", "platform", "kernels"}):
        _refuse(f"holds {unknown[0]!r:.80}, a key egf-audit capture does not write")
    processes = _processes(raw.get("processes"))
    return Manifest(command, exit_code, layout, deep, processes, raw)
