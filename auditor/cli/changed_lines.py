"""The lines a pull request changed in the trainer's kernel files, from `git diff` against the
base ref (`--base REF`, else GitHub's GITHUB_BASE_REF), so that a failure is annotated where the
reviewer looks. Anything git cannot answer (no git, no repository, a base that was not fetched)
gives no lines, and the annotation falls back to the kernel's entry line."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

GIT_TIMEOUT_S = 30
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")

Hunks = dict[Path, list[tuple[int, int]]]  # absolute file -> (first, last) new lines changed


def base_ref(given: str | None) -> str | None:
    return given or os.environ.get("GITHUB_BASE_REF") or None


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _base_commit(ref: str, cwd: Path) -> str | None:
    """The commit the pull request branched from: the merge base of HEAD and the base ref (a
    CI checkout names the base branch `origin/<ref>`)."""
    for candidate in (ref, f"origin/{ref}"):
        commit = _git(["rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}"], cwd)
        if commit:
            merge_base = _git(["merge-base", commit.strip(), "HEAD"], cwd)
            return (merge_base or commit).strip()
    return None


def parse_hunks(diff: str, top: Path) -> Hunks:
    """(first, last) lines of the new file per `+++ b/path` of a `git diff --unified=0`; a hunk
    that only deletes is kept as the line after the deletion (where the reviewer sees it)."""
    hunks: Hunks = {}
    current: Path | None = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:]
            current = (top / name[2:]).resolve() if name.startswith("b/") else None
        elif current is not None and (m := _HUNK.match(line)):
            start, count = int(m.group(1)), int(m.group(2) or 1)
            first = max(start, 1)
            hunks.setdefault(current, []).append((first, first + max(count, 1) - 1))
    return hunks


def changed_hunks(files: Iterable[Path], ref: str | None) -> tuple[Hunks, str | None]:
    """The changed lines of `files` since the base ref; and a note when there was a ref but git
    could not answer (so the user learns why the annotations sit on entry lines)."""
    paths = [Path(f).absolute() for f in files]
    if ref is None or not paths:
        return {}, None
    cwd = paths[0].parent
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    if top is None:
        return {}, f"--base {ref}: {cwd} is in no git repository; annotations on entry lines"
    commit = _base_commit(ref, cwd)
    if commit is None:
        return {}, f"--base {ref}: no such commit here (fetch it); annotations on entry lines"
    diff = _git(
        ["diff", "--no-color", "--no-ext-diff", "--unified=0", commit, "--", *map(str, paths)],
        cwd,
    )
    if diff is None:
        return {}, f"--base {ref}: git diff failed; annotations on entry lines"
    return parse_hunks(diff, Path(top.strip())), None
