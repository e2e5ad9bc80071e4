"""Atomic file writes: temporary files in the targets' folders, then os.replace.

A reader (or a crash) sees the old file or the new one, never half of one. `OutputBatch` stages
every output of a run first and replaces them only when all were staged; a replace that still
fails puts back every file already replaced. So an output that cannot be written leaves every
existing file (the document above all) as it was, and no temporary file is left behind.

What a path points at is never replaced: a symlink is written through (its target is replaced,
the link stays), and a device node or FIFO (`/dev/null`, a pipe) is written in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError


def _new_file_mode() -> int:
    """What open() would give a new file under the current umask (mkstemp gives 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _cannot_write(path: Path, exc: OSError) -> AuditEnvironmentError:
    return AuditEnvironmentError(f"cannot write {path}: {exc.strerror or exc}")


def _is_written_in_place(target: Path) -> bool:
    """A device node, FIFO or socket: replacing it would break what it connects to."""
    try:
        mode = target.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


class OutputBatch:
    """Stage outputs with `add`, then `commit`; leaving the `with` block by an exception
    (a signal included) removes whatever was staged."""

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path, Path]] = []  # (temporary, target, as named)
        self._in_place: list[tuple[Path, bytes]] = []

    def add(self, path: str | Path, text: str) -> None:
        """Stage `text` (UTF-8, line endings as given) for `path`; missing parent folders are
        created. Raises AuditEnvironmentError naming the path."""
        named = Path(path)
        data = text.encode("utf-8")
        if _is_written_in_place(named):  # /dev/stdout too: a link to a pipe or terminal
            self._in_place.append((named, data))
            return
        target = Path(os.path.realpath(named))  # through any symlink: the link itself stays
        if target.is_dir():
            raise AuditEnvironmentError(f"cannot write {named}: it is a directory")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            mode = target.stat().st_mode & 0o7777 if target.exists() else _new_file_mode()
            fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        except OSError as exc:
            raise _cannot_write(named, exc) from None
        tmp = Path(name)
        self._staged.append((tmp, target, named))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
        except OSError as exc:
            raise _cannot_write(named, exc) from None

    def commit(self) -> list[Path]:
        """Write the in-place outputs, then replace the staged files; returns the paths as
        named. On a failure every replaced file is put back before the error is raised."""
        done: list[Path] = []
        backups: list[tuple[Path, Path | None]] = []  # (target, its old content or None)
        try:
            for target, data in self._in_place:
                try:
                    with open(target, "wb") as f:
                        f.write(data)
                except OSError as exc:
                    raise _cannot_write(target, exc) from None
                done.append(target)
            for tmp, target, named in self._staged:
                backup = None
                try:
                    backup = self._backup(target)
                    os.replace(tmp, target)
                except BaseException as exc:  # an OSError, or a signal (Ctrl-C, SIGTERM)
                    if backup is not None:
                        backup.unlink(missing_ok=True)  # its target was not replaced
                    self._restore(backups)
                    if isinstance(exc, OSError):
                        raise _cannot_write(named, exc) from None
                    raise
                backups.append((target, backup))
                done.append(named)
            for _, backup in backups:
                if backup is not None:
                    backup.unlink(missing_ok=True)
        finally:
            self.abort()
        return done

    @staticmethod
    def _backup(target: Path) -> Path | None:
        """A hard link to the file about to be replaced, so it can be put back."""
        if not target.exists():
            return None
        backup = target.with_name(f".{target.name}.{os.getpid()}.bak")
        backup.unlink(missing_ok=True)
        try:
            os.link(target, backup)
        except OSError:  # a file system without hard links
            shutil.copy2(target, backup)
        return backup

    @staticmethod
    def _restore(backups: list[tuple[Path, Path | None]]) -> None:
        for target, backup in reversed(backups):
            with contextlib.suppress(OSError):
                if backup is None:
                    target.unlink(missing_ok=True)
                else:
                    os.replace(backup, target)

    def abort(self) -> None:
        for tmp, _, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged.clear()
        self._in_place.clear()

    def __enter__(self) -> OutputBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def write_atomic(path: str | Path, text: str) -> None:
    """One file, atomically."""
    with OutputBatch() as batch:
        batch.add(path, text)
        batch.commit()


def write_exclusive(folder_fd: int, name: str, data: bytes) -> None:
    """Create `name` in the folder open as `folder_fd` and write `data`: never through a link
    and never over a file already there (O_CREAT | O_EXCL | O_NOFOLLOW), so a file someone
    else put there, whatever it points at, is never written. Raises FileExistsError for a name
    already taken, OSError for what the system refuses."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o666, dir_fd=folder_fd)  # the umask applies, as for open()
    with open(fd, "wb") as f:
        f.write(data)
