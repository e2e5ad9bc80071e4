"""Reading a capture folder's files: every path checked to be a regular file from its stat before
it is opened (a FIFO is never opened: opening one for reading waits for a writer), opened
non-blocking and checked again from the open file; event lines one at a time, each at most
MAX_LINE_BYTES; a plain binary file mapped read-only, never read whole; a gzipped one (the
committed fixtures keep their files gzipped) decompressed. Every problem is one UsageError (exit
2) naming the file by its name in the folder and, for lines, the 1-based line.
"""

from __future__ import annotations

import gzip
import json
import mmap
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from egf_audit.errors import UsageError
from egf_audit.small_files import not_regular

MAX_LINE_BYTES = 1 << 20  # the recorder's longest line is a few KiB (64 parameters, a log line)
MAX_GUNZIPPED_BYTES = 1 << 30
_DECODER = json.JSONDecoder()


def refuse(where: str, problem: str) -> NoReturn:
    raise UsageError(f"{where}: {problem}")


def _not_regular(mode: int) -> str | None:
    kind = not_regular(mode)
    return None if kind is None else f"{kind}, not a regular file"


def stat_file(path: Path) -> os.stat_result | None:
    """The file's stat, None when there is no such file; refused when it is no regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        refuse(path.name, f"cannot read it ({exc.strerror or exc})")
    if (problem := _not_regular(st.st_mode)) is not None:
        refuse(path.name, problem)
    return st


@contextmanager
def open_capture_file(path: Path) -> Iterator[BinaryIO]:
    """A capture file opened for reading in binary, once its stat says it is a regular file (a
    FIFO is never opened: opening one for reading waits for a writer). Opened non-blocking and
    checked again from the open file, so a path swapped in between cannot block either."""
    if stat_file(path) is None:
        refuse(path.name, "no such file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        refuse(path.name, f"cannot read it ({exc.strerror or exc})")
    try:
        problem = _not_regular(os.fstat(fd).st_mode)
        if problem is not None:
            refuse(path.name, problem)
        f = os.fdopen(fd, "rb", buffering=1 << 20)
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


@contextmanager
def text_lines(path: Path) -> Iterator[Iterator[tuple[int, bytes]]]:
    """(line number, raw line) of a plain or gzipped file, each line at most MAX_LINE_BYTES."""
    with open_capture_file(path) as raw:
        stream: gzip.GzipFile | BinaryIO = (
            gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw
        )

        def lines() -> Iterator[tuple[int, bytes]]:
            number = 0
            while True:
                try:
                    line = stream.readline(MAX_LINE_BYTES + 1)
                except EOFError:
                    refuse(f"{path.name} line {number + 1}", "the gzip stream is cut off")
                except (OSError, zlib.error) as exc:
                    refuse(f"{path.name} line {number + 1}", f"cannot read it ({exc})")
                if not line:
                    return
                number += 1
                if len(line) > MAX_LINE_BYTES:
                    refuse(f"{path.name} line {number}", f"longer than {MAX_LINE_BYTES} bytes")
                yield number, line

        yield lines()


class CutOff(Exception):
    """The file's last line ends without its newline and is no whole event: the process died
    while the recorder wrote it. What came before is a faithful record of a process that did
    not end: the audit calls it incomplete (a failed gate), never refuses it."""


def parse_line(where: str, line: bytes) -> dict[str, Any]:
    """One event line as a JSON object. A line without its newline is the file's last (the
    process died mid-write) and is cut off unless it parses whole."""
    cut = not line.endswith(b"\n")
    try:
        text = line.decode("utf-8")
        event, end = _DECODER.raw_decode(text)
        if end != len(text) and not text[end:].isspace():
            raise json.JSONDecodeError("Extra data", text, end)
    except UnicodeDecodeError as exc:
        if cut:
            raise CutOff(where) from None
        refuse(where, f"not UTF-8 (byte {exc.start + 1} of the line)")
    except (ValueError, RecursionError) as exc:
        if cut:
            raise CutOff(where) from None
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or "too deep"
        refuse(where, f"not a JSON object ({reason})")
    if type(event) is not dict:
        if cut:
            raise CutOff(where)
        refuse(where, f"not a JSON object (a JSON {type(event).__name__})")
    return event


def _gunzip(name: str, f: BinaryIO, need: int) -> bytearray:
    """The first `need` bytes of a gzipped snapshots file (a committed fixture; the recorder
    writes plain files, which are mapped instead), fewer when it is shorter."""
    if need > MAX_GUNZIPPED_BYTES:
        refuse(
            name,
            f"its events read {need} bytes of it: more than a gzipped snapshots file is "
            f"decompressed into memory ({MAX_GUNZIPPED_BYTES}); gunzip it (a plain one is mapped)",
        )
    data = bytearray()
    try:
        with gzip.GzipFile(fileobj=f, mode="rb") as z:
            while len(data) < need and (chunk := z.read(min(1 << 24, need - len(data)))):
                data += chunk
    except EOFError:
        refuse(name, "the gzip stream is cut off")
    except (OSError, zlib.error) as exc:
        refuse(name, f"cannot read it ({exc})")
    return data


def file_bytes(path: Path, need: int) -> Any:
    """A capture's binary file as bytes: a plain file mapped (never read whole), a gzipped one
    (a committed fixture) decompressed up to its first `need` bytes, fewer when it is shorter."""
    with open_capture_file(path) as f:
        if path.suffix == ".gz":
            return _gunzip(path.name, f, need)
        size = os.fstat(f.fileno()).st_size
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""


def process_file(folder: Path, stem: str, pid: int) -> Path | None:
    """`<stem>-<pid>.bin` as the recorder writes it, or `.bin.gz` as a fixture keeps it."""
    found = [
        p
        for p in (folder / f"{stem}-{pid}.bin", folder / f"{stem}-{pid}.bin.gz")
        if stat_file(p) is not None
    ]
    if len(found) > 1:
        refuse(found[0].name, f"{found[1].name} beside it: two {stem} files of one process")
    return found[0] if found else None
