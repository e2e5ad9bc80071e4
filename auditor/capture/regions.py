"""A process's snapshot regions and its values file: what the events say the recorder kept, read
from `snapshots-<pid>.bin` (every region a read-only view into it) and, for a deep capture with
values, `values-<pid>.bin` (read when first asked for). A region pointing past the end of its
file, or values without their file, is refused, naming the event's line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from egf_audit.trace.process import SnapshotRegion

from .files import file_bytes, process_file, refuse

_NO_VALUES = np.empty(0, np.float32)
_NO_VALUES.flags.writeable = False


@dataclass
class Snapshot:
    """A snapshot event read, its values not yet taken from the snapshots file."""

    line: int
    event: dict[str, Any]
    launch: int

    @property
    def end(self) -> int:
        return self.event["offset"] + 4 * self.event["count"]


def _snapshot_values(events_name: str, snap_path: Path | None, snaps: list[Snapshot]) -> np.ndarray:
    """The snapshots file as float32 values, read-only: a plain file mapped (never read whole),
    a gzipped one decompressed up to the last byte an event points at. Refused when an event
    points past its end."""
    need = max((s.end for s in snaps), default=0)
    if snap_path is None:
        if need:
            first = next(s for s in snaps if s.event["count"])
            refuse(
                f"{events_name} line {first.line}",
                f"snapshot values at bytes {first.event['offset']} to {first.end}, but there "
                "is no snapshots file of this process",
            )
        return _NO_VALUES
    data = file_bytes(snap_path, need)
    size = len(data)
    if need > size:
        short = next(s for s in snaps if s.end > size)
        refuse(
            snap_path.name,
            f"{size} bytes, but {events_name} line {short.line} reads its bytes "
            f"{short.event['offset']} to {short.end} (the file is cut off)",
        )
    usable = size - size % 4
    if not usable:
        return _NO_VALUES
    values = np.frombuffer(data, dtype="<f4", count=usable // 4)
    values.flags.writeable = False  # every region is a view: none may change the capture
    return values


def snapshot_regions(
    folder: Path, events_name: str, pid: int, snaps: list[Snapshot], hash_kind: str
) -> list[SnapshotRegion]:
    """Every snapshot region of a process, its kept values a view into its snapshots file."""
    values = _snapshot_values(events_name, process_file(folder, "snapshots", pid), snaps)
    regions = []
    for s in snaps:
        e = s.event
        start = e["offset"] // 4
        regions.append(
            SnapshotRegion(
                s.launch,
                e["when"],
                e["region"],
                e["ptr"],
                e["elements"],
                e["hash"],
                values[start : start + e["count"]] if e["count"] else _NO_VALUES,
                e["rows"],
                e["ld"],
                e["skip_col"],
                hash_kind,
            )
        )
    return regions


def values_reader(folder: Path, pid: int, need: int) -> Callable[[], np.ndarray]:
    """values-<pid>.bin, read when first asked for (only EGF010 reads it) and then kept: its
    first `need` bytes, fewer where it is shorter (the history then knows memory only up to the
    first change whose bytes are missing), as read-only bytes. A capture without the file
    reads as empty. Refused (exit 2) where it cannot be read at all."""
    path = process_file(folder, "values", pid)
    kept: list[np.ndarray] = []

    def read() -> np.ndarray:
        if kept:
            return kept[0]
        data = file_bytes(path, need) if path is not None and need else b""
        values = np.frombuffer(data, dtype=np.uint8, count=min(len(data), need))
        values.flags.writeable = False
        kept.append(values)
        return values

    return read
