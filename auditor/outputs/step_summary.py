"""The GitHub job's step summary: the text `reports.github.step_summary` renders, appended to the
file $GITHUB_STEP_SUMMARY names."""

from __future__ import annotations

import os
from pathlib import Path

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub's limit for one step's summary, in bytes


def append_step_summary(text: str, path: str | None = None) -> None:
    """Append to $GITHUB_STEP_SUMMARY, cut to what GitHub accepts. Raises OSError."""
    target = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    file = Path(target)
    # earlier steps of the job may already have filled part of the file; the limit is the file's
    room = STEP_SUMMARY_LIMIT - (file.stat().st_size if file.exists() else 0) - 1
    data = text.encode("utf-8")[: max(room, 0)].decode("utf-8", "ignore").encode("utf-8")
    with file.open("ab") as f:
        f.write(data + b"\n")
