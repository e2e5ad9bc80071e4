"""Reading a small file the user names (a `--config`, a settings file, a capture's layout file)
without ever blocking or filling the memory: a FIFO would hold the gate forever, a device such
as /dev/zero would fill the memory. One home for the rule, used by pipeline/config.py,
cli/project.py and capture/layout.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from egf_audit.errors import UsageError

MAX_BYTES = 1 << 20  # a config or settings file is a few lines

_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_small_text(
    path: Path, what: str, error: type[UsageError] = UsageError, limit: int = MAX_BYTES
) -> str:
    """The UTF-8 text of `path` (`what` names it in messages: "config file"), refused with
    `error` unless it is a regular file of at most `limit` bytes (read_small_bytes)."""
    data = read_small_bytes(path, what, error, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text: {exc.reason}") from None


def read_small_bytes(
    path: Path, what: str, error: type[UsageError] = UsageError, limit: int = MAX_BYTES
) -> bytes:
    """The bytes of `path`, refused with `error` unless it is a regular file of at most `limit`
    bytes. The type is checked before the open and again on the open file (the path may have
    changed in between), and the open does not block."""
    try:
        _check_regular(path, os.stat(path), what, error, limit)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as file:
            _check_regular(path, os.fstat(file.fileno()), what, error, limit)
            data = file.read(limit + 1)
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror}") from None
    if len(data) > limit:  # it grew after the check
        raise error(_too_large(path, len(data), what, limit))
    return data


def not_regular(mode: int) -> str | None:
    """What a file of this mode is when it is no regular file ("a FIFO (named pipe)"), else
    None. Every reader of a user-named file (this module, the capture folder's reader) words it
    the same way."""
    if stat.S_ISREG(mode):
        return None
    return next((words for test, words in _NOT_REGULAR if test(mode)), "a special file")


def _check_regular(
    path: Path, status: os.stat_result, what: str, error: type[UsageError], limit: int
) -> None:
    kind = not_regular(status.st_mode)
    if kind is not None:
        raise error(f"{what} {path} is {kind}, not a regular file")
    if status.st_size > limit:
        raise error(_too_large(path, status.st_size, what, limit))


def _too_large(path: Path, size: int, what: str, limit: int) -> str:
    return (
        f"{what} {path} holds {size} bytes or more; a {what} may hold at most "
        f"{limit} bytes ({limit >> 20} MiB)"
    )
