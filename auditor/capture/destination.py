"""Where `egf-audit capture` puts a capture, and how it writes there without losing the user's
files or following a link the traced command planted.

- `--out DIR` must be absent, empty, or an earlier capture: a `manifest.json` that says it is an
  egf-audit capture (capture/manifest.py reads it whole and strictly) and only the files it
  accounts for (capture/folder.py), each a regular file, never a link. Anything else is refused
  before the command runs, and nothing of it is deleted: DIR is replaced as a whole.
- The recorder writes into a hidden folder beside DIR (`.DIR.egf-capture-tmp-*`, mode 0700), whose
  name the command is told (EGF_CAPTURE_DIR). When the command has ended, the capture is
  completed in a second folder (`.DIR.egf-capture-new-*`) made only then, whose name it never
  learns: the recorder's files (events, snapshots and values files of a pid, regular files, not
  links) are moved there, and anything else the command left in its folder refuses the capture.
  `trace.jsonl`, `layout.json` and `manifest.json` are created there through a descriptor of that
  folder, exclusively and without following a link (O_CREAT | O_EXCL | O_NOFOLLOW): a file
  already there, whoever put it, refuses the capture instead of being written through.
- DIR is replaced only by that folder, checked again to be the one made (its inode), and only
  when DIR still holds the earlier capture it held when the command started.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError, UsageError, about_option
from egf_audit.outputs.atomic import write_exclusive

from .folder import LAYOUT_NAMES, OLD_DOCUMENT, TRACE_FILE, contents_problem, pid_of
from .layout import LAYOUT_FILE
from .manifest import MANIFEST_FILE, read_manifest

RECORDED = re.compile(r"(?:events-\d+\.jsonl|(?:snapshots|values)-\d+\.bin)")  # what it writes
TMP_MARK = "egf-capture-tmp"  # in the name of the folder a capture is recorded into
NEW_MARK = "egf-capture-new"  # in the name of the folder it is completed in


def _is_capture_file(name: str) -> bool:
    return name in (MANIFEST_FILE, TRACE_FILE, OLD_DOCUMENT, *LAYOUT_NAMES) or bool(pid_of(name))


def _out_error(out: Path, said: str) -> UsageError:
    """`--out OUT<said>`, about the value of --out (a settings file's `capture` names it)."""
    return about_option(UsageError(f"--out {out}{said}"), "out", said.removeprefix(": ").lstrip())


def _refuse_out(out: Path, problem: str) -> UsageError:
    return _out_error(
        out,
        f" {problem}: it is no egf-audit capture folder, and a capture replaces its folder as a "
        "whole (nothing in it is deleted): name a new or empty folder",
    )


def _earlier_capture_problem(folder: Path, entries: list[os.DirEntry[str]]) -> str | None:
    """Why a folder that holds files is no earlier capture that may be replaced, or None."""
    foreign = [
        e.name + ("/" if e.is_dir() else "")
        for e in entries
        if e.is_dir() or not _is_capture_file(e.name)
    ]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        return f"holds {', '.join(foreign[:3])}{more}"
    kinds = [e.name for e in entries if e.is_symlink() or not e.is_file(follow_symlinks=False)]
    if kinds:
        return f"holds {kinds[0]}, which is no regular file"
    try:
        manifest = read_manifest(folder)
    except UsageError as exc:
        return f"holds a manifest.json that is no egf-audit capture's ({exc})"
    if manifest is None:
        return "holds no manifest.json (an egf-audit capture's manifest says it is one)"
    problem = contents_problem(folder, manifest)
    return None if problem is None else f"holds what its manifest.json does not list ({problem})"


def capture_target(out: Path) -> Path:
    """The folder a capture of `--out` replaces, after checking that it may: absent, empty, or
    an earlier capture holding nothing else. Raises UsageError naming the path and why.

    A symlink is followed, and the folder it points at is judged and replaced by the same rule
    (the link stays and points at the new capture), as reports are written through a symlink
    (egf_audit.outputs.atomic): replacing the link by a folder would quietly cut off what it was
    set up to point at, and refusing it would refuse `capture -> /scratch/capture` made on
    purpose. A dangling link names the folder to create."""
    target = Path(os.path.realpath(out))
    if target.parent == target:
        raise _out_error(out, ": a capture cannot replace the root folder")
    cwd = Path(os.path.realpath(os.curdir))
    if target == cwd or target in cwd.parents:
        raise _out_error(
            out,
            " holds the current folder, where the command runs; a capture replaces that folder "
            "as a whole: name a folder beside or below it",
        )
    try:
        mode = target.stat().st_mode
        if not stat.S_ISDIR(mode):
            raise _out_error(
                out,
                " is not a folder but a file; a capture writes a folder there: name a new "
                "folder, an empty one, or an earlier capture",
            )
        with os.scandir(target) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise _out_error(out, f": {exc.strerror or exc}") from None
    if entries and (problem := _earlier_capture_problem(target, entries)) is not None:
        raise _refuse_out(out, problem)
    return target


def check_layout_path(layout: Path, out: Path, target: Path) -> None:
    where = Path(os.path.realpath(layout.parent)) / layout.name  # the link itself, if one
    if where == target or target in where.parents:
        raise UsageError(
            f"--layout {layout} is inside --out {out}, which a capture replaces as a whole (the "
            f"layout file goes in as {LAYOUT_FILE}): let the command write it outside"
        )
    if where.is_dir():
        raise UsageError(f"--layout {layout} is a folder; name the file the command writes")


def _new_folder_mode(target: Path) -> int:
    """The old capture folder's mode, or what mkdir gives under the umask (mkdtemp gives 0700)."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def hidden_folder(target: Path, out: Path, mark: str) -> Path:
    """A new folder beside `target` (same file system), mode 0700, its name unguessable."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}.{mark}-", dir=target.parent))
    except OSError as exc:
        raise AuditEnvironmentError(f"cannot write {out}: {exc.strerror or exc}") from None


class Completed:
    """The folder a capture is completed in: made after the command ended, written only through
    a descriptor of it, exclusively and without following links."""

    def __init__(self, target: Path, out: Path):
        self.path = hidden_folder(target, out, NEW_MARK)
        self.out = out
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._inode = os.fstat(self.fd)[stat.ST_INO], os.fstat(self.fd)[stat.ST_DEV]

    def close(self) -> None:
        os.close(self.fd)

    def remove(self) -> None:
        """A capture that was not completed: the folder goes, whatever it holds."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def take_recorded(self, recording: Path) -> None:
        """Move the recorder's files here: regular files of the names it writes. Anything else
        the command left in its capture folder (a link, a folder, a FIFO, a file of another
        name) refuses the capture: it is not what the recorder wrote."""
        try:
            src = os.open(recording, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise UsageError(
                f"the folder the recorder wrote into ({recording.name}) is no folder now: the "
                f"command moved it or put a link in its place; nothing is replaced at {self.out}"
            ) from None
        try:
            with os.scandir(src) as listing:
                entries = sorted(listing, key=lambda e: e.name)
            for entry in entries:
                if not RECORDED.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
                    kind = "a link" if entry.is_symlink() else "a file the recorder does not write"
                    raise UsageError(
                        f"the command left {entry.name} in its capture folder ({kind}): the "
                        "recorder writes only events, snapshots and values files there; nothing "
                        f"is replaced at {self.out}"
                    )
                os.rename(entry.name, entry.name, src_dir_fd=src, dst_dir_fd=self.fd)
                if not stat.S_ISREG(
                    os.stat(entry.name, dir_fd=self.fd, follow_symlinks=False).st_mode
                ):
                    raise UsageError(f"{entry.name} changed into no regular file as it was moved")
        except OSError as exc:
            raise AuditEnvironmentError(f"cannot write {self.out}: {exc.strerror or exc}") from None
        finally:
            os.close(src)

    def write_new(self, name: str, data: bytes) -> None:
        """Create `name` here and write `data`: never through a link, never over a file."""
        try:
            write_exclusive(self.fd, name, data)
        except FileExistsError:
            raise UsageError(
                f"{name} is already in the folder the capture is completed in, put there by "
                f"another process: nothing is replaced at {self.out}"
            ) from None
        except OSError as exc:
            raise AuditEnvironmentError(f"cannot write {self.out}: {exc.strerror or exc}") from None

    def drop(self, name: str) -> None:
        """Delete the recorder's file `name` here (a values file nothing reads), if it is here."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise AuditEnvironmentError(f"cannot write {self.out}: {exc.strerror or exc}") from None

    def is_unmoved(self) -> bool:
        """The path is still the folder made (not renamed away, nor a link put in its place)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and (st.st_ino, st.st_dev) == self._inode


@contextmanager
def staged(target: Path, out: Path) -> Iterator[Path]:
    """The folder the recorder writes into, removed on leaving (whatever it then holds)."""
    folder = hidden_folder(target, out, TMP_MARK)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def swap(done: Completed, target: Path, out: Path) -> Path | None:
    """Put the complete capture at `target`; returns the old folder, renamed aside, to delete.
    If the new one cannot be renamed into place the old one is put back."""
    try:  # again: the command may have written into DIR, or moved the link, while it ran
        if capture_target(out) != target:
            raise UsageError(f"--out {out} points elsewhere since the command started")
    except UsageError as exc:
        raise UsageError(f"after the command ran: {exc}") from None
    if not done.is_unmoved():
        raise UsageError(
            f"the folder the capture was completed in was moved: nothing replaced {out}"
        )
    os.chmod(done.fd, _new_folder_mode(target))
    old = None
    try:
        if os.path.lexists(target):
            old = target.with_name(
                f".{target.name}.egf-capture-old-{os.getpid()}-{secrets.token_hex(4)}"
            )
            os.rename(target, old)
        try:
            os.rename(done.path, target)
        except BaseException:
            if old is not None:
                os.rename(old, target)
            raise
    except OSError as exc:
        raise AuditEnvironmentError(f"cannot replace {out}: {exc.strerror or exc}") from None
    return old
