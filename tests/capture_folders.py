"""What a test that edits a capture's events needs so the folder stays a capture `egf-audit
capture` could have written: its manifest's table of contents rewritten for the events as they
now are (the processes, their counts and notes, as capture/manifest.py's `process_entries`
writes them after reading the recorder's files), and the layout file named where there is one.

Only for tests whose point is not the manifest: a folder edited this way is one where the
recorder, not the manifest, wrote what the test changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from egf_audit.capture.events import read_capture
from egf_audit.capture.layout import LAYOUT_FILE, layout_in
from egf_audit.capture.manifest import (
    MANIFEST_FILE,
    audited_process,
    manifest_document,
    process_entries,
)
from egf_audit.errors import UsageError


def write_manifest(folder: Path, **given: Any) -> Path:
    """The folder's manifest as capture writes it for the recorded files there: `given`
    (command, exit_code, deep, ...) over what the manifest already says, the processes and
    counts read from the events, the layout file named when there is one. Events the reader
    refuses leave the manifest as it was."""
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    old = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    try:
        procs = read_capture(folder)
    except UsageError:  # events the reader refuses (what the test is about): left as they are
        return folder
    doc = manifest_document(
        given.get("command", old.get("command", ["trainer"])),
        given.get("exit_code", old.get("exit_code", 0)),
        given.get("wall_s", old.get("wall_s", 1.0)),
        layout_in(folder) is not None,
        tuple(given.get("snapshot_kernels", old.get("snapshot_kernels", []))),
        given.get("deep", old.get("deep", False)),
        process_entries(procs, audited_process(procs)) if procs else [],
    )
    if "format" not in old and path.exists():
        doc.pop("format")  # as a capture made before the mark was written keeps it
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return folder


def without_layout(folder: Path) -> Path:
    """The same capture as `egf-audit capture` without --layout writes it."""
    for name in (LAYOUT_FILE, f"{LAYOUT_FILE}.gz"):
        (Path(folder) / name).unlink(missing_ok=True)
    path = Path(folder) / MANIFEST_FILE
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["layout"] = None
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return Path(folder)
