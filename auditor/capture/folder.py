"""A capture folder read as a whole, its manifest the table of contents.

What the manifest names is checked against what is there, and what is there against it, before
any verdict is given: every process it lists has its events and snapshots files (and a values
file exactly where its recorder kept values); every file in the folder is one of those, the
manifest, `trace.jsonl`, the layout file where the manifest names one, or the document
`run --capture` once wrote there; and each process's counts and notes are what its events hold.
A disagreement is refused in one line naming both sides (UsageError, exit 2): a capture with a
file deleted, cut short and closed again, or grown by a process nobody recorded is not the
capture that was made. A folder without a manifest is read as it is, and the audit calls it
incomplete.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from egf_audit.errors import UsageError, option_error
from egf_audit.trace.process import ProcessCapture

from .files import process_file, refuse, stat_file
from .layout import LAYOUT_FILE, layout_in
from .manifest import MANIFEST_FILE, Manifest, process_counts, read_manifest, values_dropped

TRACE_FILE = "trace.jsonl"  # the audited process as `--trace` writes it: capture writes it
OLD_DOCUMENT = "trainer-audit.md"  # `run --capture` wrote its document here once
PROCESS_FILE = re.compile(r"(?:events-(\d+)\.jsonl|(?:snapshots|values)-(\d+)\.bin)(?:\.gz)?")
LAYOUT_NAMES = (LAYOUT_FILE, f"{LAYOUT_FILE}.gz")


@dataclass(frozen=True)
class CaptureFolder:
    folder: Path
    manifest: Manifest | None
    processes: list[ProcessCapture]  # in pid order
    layout: Path | None  # the layout file the manifest names (without a manifest: one there)

    @property
    def audited_pid(self) -> int | None:
        """The process `capture` audited and wrote the layout file for, as the manifest says."""
        if self.manifest is None:
            return None
        return next((p.pid for p in self.manifest.processes if p.audited), None)


def _pids(manifest: Manifest) -> str:
    pids = [str(p.pid) for p in manifest.processes]
    return f"it lists pid{'s' if len(pids) != 1 else ''} {', '.join(pids) or 'none'}"


def pid_of(name: str) -> int | None:
    """The pid an events, snapshots or values file is named by, or None."""
    match = PROCESS_FILE.fullmatch(name)
    return None if match is None else int(match.group(1) or match.group(2))


def accounted(name: str, manifest: Manifest) -> str | None:
    """Why a file named `name` has no place in a capture folder with this manifest, or None."""
    if name in (MANIFEST_FILE, TRACE_FILE, OLD_DOCUMENT):
        return None
    if name in LAYOUT_NAMES:
        if manifest.layout is None:
            return f'a layout file, and {MANIFEST_FILE} names none (its "layout" is null)'
        return None
    pid = pid_of(name)
    if pid is None:
        return (
            f"no file of a capture ({MANIFEST_FILE} accounts for each process's events, "
            "snapshots and values files, trace.jsonl and the layout file)"
        )
    if manifest.listed(pid) is None:
        return f"a file of process {pid}, which {MANIFEST_FILE} does not list ({_pids(manifest)})"
    return None


def contents_problem(folder: Path, manifest: Manifest) -> str | None:
    """What makes the folder's files disagree with its manifest's table of contents, named
    from both sides, or None. Reads names and file types only, never a file's bytes."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        return f"--capture {folder}: cannot list it ({exc.strerror or exc})"
    names = {e.name for e in entries}
    for entry in entries:
        if entry.is_dir():
            return f"{entry.name}/: a folder inside a capture folder, which holds only files"
        if (why := accounted(entry.name, manifest)) is not None:
            return f"{entry.name}: {why}"
    for listed in manifest.processes:
        pid = listed.pid
        for stem, ext in (("events", "jsonl"), ("snapshots", "bin")):
            if not names & {f"{stem}-{pid}.{ext}", f"{stem}-{pid}.{ext}.gz"}:
                return (
                    f"{MANIFEST_FILE} lists process {pid}, and the folder holds no "
                    f"{stem}-{pid}.{ext} (the recorder writes one for every process)"
                )
    if manifest.layout is not None and not names & set(LAYOUT_NAMES):
        return f"{MANIFEST_FILE} names the layout file {manifest.layout}, and the folder holds none"
    if set(LAYOUT_NAMES) <= names:
        return f"{LAYOUT_NAMES[1]}: {LAYOUT_NAMES[0]} beside it: two layout files"
    return None


def _recorded_problem(folder: Path, manifest: Manifest, proc: ProcessCapture) -> str | None:
    """What makes a process's events disagree with what the manifest counted of it."""
    listed = manifest.listed(proc.pid)
    assert listed is not None  # contents_problem: every events file's pid is listed
    events = proc.events_file
    for key, found in process_counts(proc).items():
        if listed.counts[key] != found:
            return (
                f"{MANIFEST_FILE} counts {listed.counts[key]} {key} of process {proc.pid}; "
                f"{events} holds {found}"
            )
    if listed.notes != proc.notes:
        return f"{MANIFEST_FILE}'s notes of process {proc.pid} are not the notes {events} holds"
    values = process_file(folder, "values", proc.pid)
    if listed.values_dropped:
        return _dropped_problem(proc, values)
    if proc.values and values is None:
        return (
            f"{events} says its recorder kept values (its init event), and the folder holds no "
            f"values-{proc.pid}.bin"
        )
    if values is not None and not proc.values:
        return f"{values.name}: {events} says its recorder kept no values (its init event)"
    return None


def _dropped_problem(proc: ProcessCapture, values: Path | None) -> str | None:
    """What makes a process whose values file the manifest says `capture` dropped disagree with
    that: the file is there, its recorder kept no values, or it launched an ABI kernel (whose
    values the SP14 invariants read: `capture` never drops those, manifest.values_dropped)."""
    said = f"{MANIFEST_FILE} says capture dropped the values file of process {proc.pid}"
    if values is not None:
        return f"{values.name}: {said}"
    if not proc.values:
        return f"{said}, and {proc.events_file} says its recorder kept none (its init event)"
    if not values_dropped(proc):
        return (
            f"{said}, and it launched SP14 kernels, whose values the invariants read: capture "
            "never drops those"
        )
    return None


def read_folder(folder: Path) -> CaptureFolder:
    """Every process of a capture folder, checked against its manifest (module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        missing = "is a file, not a folder" if folder.exists() else "no such folder"
        raise option_error(UsageError, "capture", folder, missing)
    manifest = read_manifest(folder)
    if manifest is not None and (problem := contents_problem(folder, manifest)) is not None:
        raise UsageError(problem)
    from .events import read_capture  # the events reader (numpy) only where a folder is read

    procs = read_capture(folder)
    if not procs:
        empty = "no recorder events in it (events-<pid>.jsonl)"
        raise option_error(UsageError, "capture", folder, empty)
    if manifest is not None:
        for proc in procs:
            if (problem := _recorded_problem(folder, manifest, proc)) is not None:
                raise UsageError(problem)
    layout = layout_in(folder)
    if manifest is not None and manifest.layout is not None and layout is None:
        refuse(LAYOUT_FILE, f"named by {MANIFEST_FILE}, and no file of that name can be read there")
    if layout is not None:
        stat_file(layout)  # a FIFO or a device is refused, never opened
    return CaptureFolder(folder, manifest, procs, layout)
