"""Atomic file writes: temporary files in the targets' folders, then os.replace.

A reader (or a crash) sees the old file or the new one, never half of one. `OutputBatch` stages
every output of a run first and replaces them only when all were staged, so an output that
cannot be written leaves every existing file (the document above all) untouched, and no
temporary file is left behind.
"""

from __future__ import annotations

import os
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


class OutputBatch:
    """Stage outputs with `add`, then `commit`; leaving the `with` block by an exception
    removes whatever was staged."""

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []  # (temporary, target)

    def add(self, path: str | Path, text: str) -> None:
        """Write `text` (UTF-8, line endings as given) next to `path`; missing parent folders
        are created. Raises AuditEnvironmentError naming the path."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            mode = path.stat().st_mode & 0o7777 if path.exists() else _new_file_mode()
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        except OSError as exc:
            raise _cannot_write(path, exc) from None
        tmp = Path(name)
        self._staged.append((tmp, path))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
        except OSError as exc:
            raise _cannot_write(path, exc) from None

    def commit(self) -> list[Path]:
        done = []
        try:
            for tmp, path in self._staged:
                os.replace(tmp, path)
                done.append(path)
        except OSError as exc:
            raise _cannot_write(path, exc) from None
        finally:
            self.abort()
        return done

    def abort(self) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged.clear()

    def __enter__(self) -> OutputBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def write_atomic(path: str | Path, text: str) -> None:
    """One file, atomically."""
    with OutputBatch() as batch:
        batch.add(path, text)
        batch.commit()
