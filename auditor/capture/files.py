"""Reading a capture folder's files: every path checked to be a regular file from its stat before
it is opened (a FIFO is never opened: opening one for reading waits for a writer), opened
non-blocking and checked again from the open file; event lines one at a time, each at most
MAX_LINE_BYTES; a plain binary file mapped read-only, never read whole; a gzipped one (the
committed fixtures keep their files gzipped) decompressed to its end, so that every member's
CRC and length are checked before a verdict rests on any of its bytes, and never past
MAX_GUNZIPPED_BYTES (a gzip bomb is refused, not expanded). A small JSON file (a manifest, a
layout file) is parsed with its nesting and its numbers bounded (`parse_json`). Every problem
is one UsageError (exit 2) naming the file by its name in the folder and, for lines, the
1-based line.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import mmap
import os
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from egf_audit.errors import UsageError
from egf_audit.small_files import not_regular

MAX_LINE_BYTES = 1 << 20  # the recorder's longest line is a few KiB (64 parameters, a log line)
MAX_GUNZIPPED_BYTES = 1 << 30  # what a gzipped capture file may expand to
GUNZIP_CHUNK = 1 << 24  # decompressed at a time, kept or dropped
MAX_JSON_DEPTH = 32  # a manifest or layout file nests 4 deep
MAX_JSON_DIGITS = 20  # an integer of a manifest or layout file fits in 64 bits
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
            number = total = 0
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
                total += len(line)
                if total > MAX_GUNZIPPED_BYTES:
                    refuse(path.name, _expands(path.name))
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


def _expands(name: str) -> str:
    return (
        f"it expands to more than {MAX_GUNZIPPED_BYTES} bytes, more than a gzipped capture file "
        "is decompressed; gunzip it (a plain snapshots or values file is mapped)"
    )


def _gunzip(name: str, f: BinaryIO, need: int) -> bytearray:
    """The first `need` bytes of a gzipped binary file (a committed fixture; the recorder writes
    plain files, which are mapped instead), fewer when it is shorter. The whole file is
    decompressed, and what lies past `need` dropped as it comes, so that its CRC and length
    are checked whatever part of it the events read."""
    if need > MAX_GUNZIPPED_BYTES:
        refuse(
            name,
            f"its events read {need} bytes of it: more than a gzipped snapshots file is "
            f"decompressed into memory ({MAX_GUNZIPPED_BYTES}); gunzip it (a plain one is mapped)",
        )
    data = bytearray()
    total = 0
    try:
        with gzip.GzipFile(fileobj=f, mode="rb") as z:
            while chunk := z.read(GUNZIP_CHUNK):
                total += len(chunk)
                if total > MAX_GUNZIPPED_BYTES:
                    refuse(name, _expands(name))
                if len(data) < need:
                    data += chunk[: need - len(data)]
    except EOFError:
        refuse(name, "the gzip stream is cut off")
    except (OSError, zlib.error) as exc:
        refuse(name, f"cannot read it ({exc})")
    return data


def gunzip_small(data: bytes, limit: int) -> bytes:
    """A gzipped small file's bytes, at most `limit` of them (a bomb is refused before it
    expands), its CRC and length checked. ValueError says what is wrong."""
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as z:
            while chunk := z.read(1 << 20):
                out += chunk
                if len(out) > limit:
                    raise ValueError(f"it expands to more than {limit} bytes")
    except EOFError:
        raise ValueError("the gzip stream is cut off") from None
    except (OSError, zlib.error) as exc:
        raise ValueError(f"it is no whole gzip file ({exc})") from None
    return bytes(out)


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _nesting(data: bytes) -> int:
    """How deep `data`'s arrays and objects nest, strings left out (counted without recursing,
    so a 100,000-deep array costs a pass over its bytes)."""
    import numpy as np  # imported on first use: `egf-audit capture` starts the command first

    code = np.frombuffer(_STRING.sub(b'""', data), dtype=np.uint8)
    step = np.isin(code, (ord("["), ord("{"))).astype(np.int64)
    step -= np.isin(code, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range")
    return value


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is no JSON number")


_SMALL = json.JSONDecoder(parse_int=_integer, parse_float=_number, parse_constant=_constant)


def parse_json(data: bytes) -> Any:
    """A small JSON file (a manifest, a layout file), as UTF-8 JSON nested at most
    MAX_JSON_DEPTH deep, each integer at most MAX_JSON_DIGITS digits, each number finite (no
    NaN, no Infinity). ValueError (UnicodeDecodeError, json.JSONDecodeError among them) says
    what is wrong; nothing it reads recurses or overflows."""
    if (depth := _nesting(data)) > MAX_JSON_DEPTH:
        raise ValueError(f"nested {depth} deep (at most {MAX_JSON_DEPTH})")
    text = data.decode("utf-8")
    value, end = _SMALL.raw_decode(text, _skip_space(text))
    if text[end:].strip():
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def _skip_space(text: str) -> int:
    return len(text) - len(text.lstrip())


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
