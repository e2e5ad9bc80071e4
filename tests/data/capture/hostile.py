"""Hostile capture folders: each one a committed fixture of this folder (or, for `egf-audit
capture`, a folder around it) edited as an attacker, a broken disk or a misbehaving command
would leave it, with the outcome the documented contract gives it. lies.py makes captures that
lie about the trainer's wiring and must fail their invariants; these attack the reader itself:
its files, its manifest, its values' domains, its bounds and the folder it writes.

`CASES` is a flat list of `Case` entries in the seven classes of issue 34:

1. silent fallbacks: the manifest names a layout, snapshots, processes, counts that the folder
   no longer holds (deleted, dangling, another trainer's, cut and closed again, added);
2. unverified bytes: a gzipped file with a flipped deflate byte, a bad CRC or length, cut off;
3. impossible values: addresses and sizes outside the address space, overlapping live
   allocations, pointers that are no pointers, a layout's tensors overlapping or out of range;
4. incompleteness of processes that are not audited: a launcher without its exit line;
5. control and bidi characters in names, which every output must show escaped;
6. unbounded work: devices, FIFOs, sparse files, gzip bombs, deep JSON, huge numbers, rows of
   2**31 - 1, 30,000 (or 100,000) allocations and memsets;
7. the user's files: `capture --out` over a folder that is no egf-audit capture, and a traced
   command that plants links or files in its capture folder.

Each case says what it expects: REFUSED (exit 2, one line, nothing else) or FAILED (exit 1: an
incomplete capture, or an invariant failing on the fixture it was made from). `build(case,
where)` writes its folder (and any file outside it the case aims at) under `where`.
tests/test_capture_hostile.py runs them through the real `run --capture` (and `capture`)
entries, each within 60 s and 2 GB, every file that existed before unchanged.

    python tests/data/capture/hostile.py           # how many cases, by class and outcome
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import shutil
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent
REFUSED, FAILED = 2, 1
FIXTURES = sorted(p.parent.relative_to(DATA).as_posix() for p in DATA.rglob("manifest.json"))
PASSING = frozenset(
    {
        "clean",
        "deep/clean",
        "two-processes",
        *(
            f"runtime/recorded/rt-{n}"
            for n in (
                "clean",
                "clean-mangled",
                "clean-shared-cudart",
                "deep-clean",
                "gemm-ex",
                "gemm-lt",
                "gemm-lt-device",
            )
        ),
    }
)
FAILING = [f for f in FIXTURES if f not in PASSING]


def _family(fixture: str) -> str:
    """Which program recorded a fixture: its addresses are that run's own."""
    name = fixture.rsplit("/", 1)[-1]
    for family in ("rt-", "probe", "llmc"):
        if name.startswith(family):
            return family
    return "standin"


@dataclass(frozen=True)
class Case:
    name: str
    klass: int  # issue 34's class, 1 to 7
    base: str  # the fixture it is made from (tests/data/capture/...)
    edit: Callable[[Folder], None] = field(repr=False, compare=False)
    expected: int  # REFUSED or FAILED
    what: str  # what the case does, in a line
    command: bool = False  # class 7: `egf-audit capture`, not `run --capture`
    names: bool = False  # class 5: every output must show its names escaped
    plant: str = ""  # class 7: what the traced command leaves behind (COMMAND says how)


# ---- a capture folder to edit ----
class Folder:
    """A copy of a fixture in `root/capture`, its files read and written as the fixture keeps
    them (gzipped or not); `root` holds what a case aims at outside the folder."""

    def __init__(self, root: Path, base: str):
        self.root = root
        self.path = root / "capture"
        if base:
            shutil.copytree(DATA / base, self.path, symlinks=True)
        else:
            self.path.mkdir(parents=True)

    def file(self, stem: str) -> Path:
        """The file named `stem` (`events-470.jsonl`), with its `.gz` where it has one."""
        for name in (stem, f"{stem}.gz"):
            if os.path.lexists(self.path / name):
                return self.path / name
        return self.path / stem

    def read(self, stem: str) -> bytes:
        path = self.file(stem)
        data = path.read_bytes()
        return gzip.decompress(data) if path.suffix == ".gz" else data

    def write(self, stem: str, data: bytes) -> None:
        path = self.file(stem)
        path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.path / "manifest.json").read_text(encoding="utf-8"))

    def set_manifest(self, doc: Any) -> None:
        (self.path / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")

    def pids(self) -> list[int]:
        return [p["pid"] for p in self.manifest()["processes"]]

    def audited(self) -> int:
        return next(p["pid"] for p in self.manifest()["processes"] if p["audited"])

    def events(self, pid: int | None = None) -> list[dict[str, Any]]:
        text = self.read(f"events-{pid or self.audited()}.jsonl").decode("utf-8")
        return [json.loads(line) for line in text.splitlines()]

    def set_events(self, events: list[Any], pid: int | None = None, tail: bytes = b"") -> None:
        lines = [e if isinstance(e, str) else json.dumps(e, separators=(",", ":")) for e in events]
        data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass") + tail
        self.write(f"events-{pid or self.audited()}.jsonl", data)

    def count(self, pid: int, **deltas: int) -> None:
        """Move the manifest's counts of `pid` by what the edit added to its events."""
        doc = self.manifest()
        entry = next(p for p in doc["processes"] if p["pid"] == pid)
        for key, delta in deltas.items():
            entry[key] += delta
        self.set_manifest(doc)

    def layout(self) -> dict[str, Any]:
        return json.loads(self.read("layout.json"))

    def set_layout(self, doc: Any) -> None:
        self.write("layout.json", json.dumps(doc).encode("utf-8"))

    def replace(self, stem: str, how: Callable[[Path], None]) -> None:
        """Put something else where the file `stem` is (a link, a FIFO, a sparse file)."""
        path = self.file(stem)
        path.unlink(missing_ok=True)
        how(path)


def _first(events: list[dict[str, Any]], **match: Any) -> int:
    return next(i for i, e in enumerate(events) if all(e.get(k) == v for k, v in match.items()))


def _insert(events: list[dict[str, Any]], at: int, new: list[dict[str, Any]]) -> None:
    """Insert events before position `at`, every later seq (and the launches and allocations
    named by seq) moved up to make room, as a recorder that wrote them would have numbered."""
    room = len(new)
    threshold = events[at]["seq"]
    for e in events[at:]:
        e["seq"] += room
    for e in events:
        for key in ("launch", "alloc"):
            if isinstance(e.get(key), int) and e[key] >= threshold and e["ev"] != "memset":
                e[key] += room
    for i, e in enumerate(new):
        e["seq"] = threshold + i
        e.setdefault("tid", events[max(at - 1, 0)]["tid"])
    events[at:at] = new


# ---- class 1: silent fallbacks ----
WITH_LAYOUT = [f for f in FIXTURES if (DATA / f / "layout.json.gz").exists()]


def _partner(base: str) -> str:
    """A fixture of another program, whose layout names none of `base`'s pointers."""
    return "runtime/recorded/rt-clean" if _family(base) == "standin" else "clean"


def _layout_deleted(f: Folder) -> None:
    f.file("layout.json").unlink()


def _layout_dangling(f: Folder) -> None:
    f.replace("layout.json", lambda p: p.symlink_to(f.root / "nowhere" / "layout.json"))


def _layout_foreign(partner: str) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        f.file("layout.json").write_bytes((DATA / partner / "layout.json.gz").read_bytes())

    return edit


def _layout_unnamed(f: Folder) -> None:
    doc = f.manifest()
    doc["layout"] = None
    f.set_manifest(doc)


def _snapshots_deleted(with_file: bool) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        for pid in f.pids():
            f.set_events([e for e in f.events(pid) if e["ev"] != "snapshot"], pid)
            if with_file:
                f.file(f"snapshots-{pid}.bin").unlink()

    return edit


def _events_deleted(pid_index: int) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        f.file(f"events-{f.pids()[pid_index]}.jsonl").unlink()

    return edit


def _process_added(f: Folder) -> None:
    """A copy of the audited process under the next pid, which the manifest does not list."""
    pid = f.audited()
    new = max(f.pids()) + 1
    events = [dict(e, pid=new) if e["ev"] in ("init", "exit") else e for e in f.events(pid)]
    snapshots = f.file(f"snapshots-{pid}.bin")
    shutil.copy(snapshots, snapshots.with_name(snapshots.name.replace(f"-{pid}.", f"-{new}.")))
    src = f.file(f"events-{pid}.jsonl")
    dst = src.with_name(src.name.replace(f"-{pid}.", f"-{new}."))
    data = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events).encode()
    dst.write_bytes(gzip.compress(data, mtime=0) if src.suffix == ".gz" else data)


def _cut_and_closed(at: Callable[[list[dict[str, Any]]], int]) -> Callable[[Folder], None]:
    """The audited process's events cut at a line, then an exit event appended: a capture cut
    short and made to look whole, its manifest still counting what it held before."""

    def edit(f: Folder) -> None:
        events = f.events()
        kept = events[: at(events)]
        last = kept[-1]
        kept.append({"ev": "exit", "seq": last["seq"] + 1, "tid": last["tid"], "pid": f.audited()})
        f.set_events(kept)

    return edit


def _after_first_polyak(events: list[dict[str, Any]]) -> int:
    return next(i for i, e in enumerate(events) if "polyak_ema" in e.get("name", "")) + 1


def _snapshots_of(base: str) -> int:
    doc = json.loads((DATA / base / "manifest.json").read_text())
    return sum(p["snapshots"] for p in doc["processes"])


def _count_off(key: str, delta: int) -> Callable[[Folder], None]:
    """The audited process's count moved by `delta` (by +1 where -1 would go below 0)."""

    def edit(f: Folder) -> None:
        doc = f.manifest()
        entry = next(p for p in doc["processes"] if p["audited"])
        entry[key] += delta if entry[key] + delta >= 0 else 1
        f.set_manifest(doc)

    return edit


def _manifest_edit(change: Callable[[dict[str, Any]], Any]) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        doc = f.manifest()
        changed = change(doc)
        f.set_manifest(doc if changed is None else changed)

    return edit


def _stray(name: str, data: bytes | None = b"mine\n") -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        path = f.path / name.replace("PID", str(f.audited()))
        if data is None:
            path.mkdir()
        else:
            path.write_bytes(data)

    return edit


def _plain_beside(f: Folder) -> None:
    """The events file of the audited process twice: gzipped as committed, and plain."""
    stem = f"events-{f.audited()}.jsonl"
    (f.path / stem).write_bytes(f.read(stem))


def _manifest_deleted(f: Folder) -> None:
    (f.path / "manifest.json").unlink()


def _values_deleted(f: Folder) -> None:
    f.file(f"values-{f.audited()}.bin").unlink()


def _values_added(f: Folder) -> None:
    (f.path / f"values-{f.audited()}.bin").write_bytes(b"\0" * 64)


def _class1() -> Iterator[Case]:
    for base in WITH_LAYOUT:
        partner = _partner(base)
        yield Case(
            f"1-layout-deleted/{base}",
            1,
            base,
            _layout_deleted,
            REFUSED,
            "layout.json deleted, the manifest naming it",
        )
        yield Case(
            f"1-layout-dangling/{base}",
            1,
            base,
            _layout_dangling,
            REFUSED,
            "layout.json a link to nothing",
        )
        yield Case(
            f"1-layout-foreign/{base}",
            1,
            base,
            _layout_foreign(partner),
            REFUSED,
            f"layout.json of another trainer ({partner})",
        )
        yield Case(
            f"1-layout-unnamed/{base}",
            1,
            base,
            _layout_unnamed,
            REFUSED,
            "the manifest names no layout, one is there",
        )
    for base in FIXTURES:
        yield Case(
            f"1-snapshots-deleted/{base}",
            1,
            base,
            _snapshots_deleted(True),
            REFUSED,
            "every snapshot event and the snapshots file deleted",
        )
        if _snapshots_of(base):  # deleting none would leave the capture as it was
            yield Case(
                f"1-snapshot-events-deleted/{base}",
                1,
                base,
                _snapshots_deleted(False),
                REFUSED,
                "every snapshot event deleted, the counts kept",
            )
        yield Case(
            f"1-events-deleted/{base}",
            1,
            base,
            _events_deleted(0),
            REFUSED,
            "the first listed process's events file deleted",
        )
        yield Case(
            f"1-process-added/{base}",
            1,
            base,
            _process_added,
            REFUSED,
            "a process the manifest does not list added",
        )
        for third in (1, 2):
            yield Case(
                f"1-cut-{third}of3-closed/{base}",
                1,
                base,
                _cut_and_closed(lambda es, t=third: len(es) * t // 3),
                REFUSED,
                f"events cut at {third}/3 and an exit line appended",
            )
    yield Case(
        "1-events-deleted/two-processes/trainer",
        1,
        "two-processes",
        _events_deleted(1),
        REFUSED,
        "the trainer's events file deleted",
    )
    for base in FIXTURES:
        if _family(base) in ("standin", "rt-") and _snapshots_of(base) and base != "killed":
            yield Case(
                f"1-cut-after-step-0-closed/{base}",
                1,
                base,
                _cut_and_closed(_after_first_polyak),
                REFUSED,
                "cut after step 0, an exit line appended",
            )
    for base in (
        "clean",
        "two-processes",
        "runtime/recorded/rt-clean",
        "llmc/recorded/llmc",
        "deep/clean",
        "dw-k-sh2",
    ):
        for key in ("kernels", "gemms", "memsets", "copies", "snapshots"):
            for delta in (1, -1):
                yield Case(
                    f"1-count-{key}{delta:+d}/{base}",
                    1,
                    base,
                    _count_off(key, delta),
                    REFUSED,
                    f"the manifest's {key} moved by {delta}",
                )
        yield Case(
            f"1-notes-changed/{base}",
            1,
            base,
            _manifest_edit(lambda d: d["processes"][0]["notes"].append("a note never written")),
            REFUSED,
            "a note the events do not hold",
        )
        yield Case(
            f"1-pid-changed/{base}",
            1,
            base,
            _manifest_edit(lambda d: d["processes"][0].update(pid=d["processes"][0]["pid"] + 1000)),
            REFUSED,
            "the manifest lists another pid",
        )
        yield Case(
            f"1-none-audited/{base}",
            1,
            base,
            _manifest_edit(lambda d: [p.update(audited=False) for p in d["processes"]]),
            REFUSED,
            "no process marked audited",
        )
        yield Case(
            f"1-layout-renamed/{base}",
            1,
            base,
            _manifest_edit(lambda d: d.update(layout="../../../etc/passwd")),
            REFUSED,
            "the manifest names another layout path",
        )
        yield Case(
            f"1-manifest-key/{base}",
            1,
            base,
            _manifest_edit(lambda d: d.update(tool="another")),
            REFUSED,
            "a key egf-audit does not write",
        )
        yield Case(
            f"1-manifest-deleted/{base}",
            1,
            base,
            _manifest_deleted,
            FAILED,
            "no manifest: incomplete",
        )
    yield Case(
        "1-process-dropped/two-processes",
        1,
        "two-processes",
        _manifest_edit(lambda d: d["processes"].pop(0)),
        REFUSED,
        "the launcher's entry dropped",
    )
    yield Case(
        "1-two-audited/two-processes",
        1,
        "two-processes",
        _manifest_edit(lambda d: [p.update(audited=True) for p in d["processes"]]),
        REFUSED,
        "two processes marked audited",
    )
    strays = [
        ("README.txt", b"notes\n"),
        ("values-2024.binary-report.xlsx", b"PK\x03\x04"),
        ("snapshots-old.bin.bak", b"\0" * 16),
        ("events-PID.jsonl.orig", b"{}\n"),
        ("layout.json.bak", b"{}"),
        (".DS_Store", b"\0"),
        ("sub", None),
        ("trace.jsonl.d", None),
    ]
    for base in ("clean", "two-processes", "runtime/recorded/rt-clean"):
        for name, data in strays:
            yield Case(
                f"1-stray-{name.replace('PID', 'pid')}/{base}",
                1,
                base,
                _stray(name, data),
                REFUSED,
                f"{name} in the folder",
            )
        yield Case(
            f"1-events-twice/{base}",
            1,
            base,
            _plain_beside,
            REFUSED,
            "the events file plain beside its .gz",
        )
    for base in ("runtime/recorded/rt-deep-clean", "runtime/recorded/rt-deep-dw-k-sh2"):
        yield Case(
            f"1-values-deleted/{base}",
            1,
            base,
            _values_deleted,
            REFUSED,
            "the values file of a process that kept values deleted",
        )
    for base in ("clean", "deep/clean"):
        yield Case(
            f"1-values-added/{base}",
            1,
            base,
            _values_added,
            REFUSED,
            "a values file for a process that kept none",
        )


# ---- class 2: unverified bytes ----
def _gzip_body(data: bytes) -> tuple[int, int]:
    """[start, end) of a gzip member's deflate stream (the header parsed, the trailer off)."""
    flags, at = data[3], 10
    if flags & 4:
        at += 2 + int.from_bytes(data[at : at + 2], "little")
    for bit in (8, 16):
        if flags & bit:
            at = data.index(b"\0", at) + 1
    if flags & 2:
        at += 2
    return at, len(data) - 8


def _corrupt(stem: str, how: str, where: float = 0.5) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        path = f.file(stem.replace("PID", str(f.audited())))
        data = bytearray(path.read_bytes())
        start, end = _gzip_body(bytes(data))
        if how == "flip":
            data[start + int((end - start - 2) * where)] ^= 0xFF
        elif how == "crc":
            data[end] ^= 0x01
        elif how == "length":
            data[end + 4] ^= 0x01
        elif how == "cut":
            data = data[: int(len(data) * where)]
        elif how == "trailing":
            data += b"garbage after the gzip member"
        path.write_bytes(bytes(data))

    return edit


def _gzipped(base: str, stem: str) -> bool:
    pid = json.loads((DATA / base / "manifest.json").read_text())["processes"]
    audited = next(p["pid"] for p in pid if p["audited"])
    path = DATA / base / f"{stem.replace('PID', str(audited))}.gz"
    if not path.exists():
        return False
    start, end = _gzip_body(path.read_bytes())
    return end - start > 64


def _class2() -> Iterator[Case]:
    for base in FIXTURES:
        for stem in ("snapshots-PID.bin", "events-PID.jsonl", "layout.json", "values-PID.bin"):
            if not _gzipped(base, stem):
                continue
            kind = stem.split("-")[0].split(".")[0]
            for how in ("crc", "length"):
                yield Case(
                    f"2-{kind}-{how}/{base}",
                    2,
                    base,
                    _corrupt(stem, how),
                    REFUSED,
                    f"{stem}.gz with its {how} changed",
                )
            for where in (0.25, 0.5, 0.9):
                yield Case(
                    f"2-{kind}-flip-{where}/{base}",
                    2,
                    base,
                    _corrupt(stem, "flip", where),
                    REFUSED,
                    f"a byte of {stem}.gz's deflate stream flipped at {where}",
                )
            yield Case(
                f"2-{kind}-cut/{base}",
                2,
                base,
                _corrupt(stem, "cut", 0.5),
                REFUSED,
                f"{stem}.gz cut in half",
            )
            if kind in ("snapshots", "values"):
                yield Case(
                    f"2-{kind}-trailer-cut/{base}",
                    2,
                    base,
                    _corrupt(stem, "cut", 0.999),
                    REFUSED,
                    f"{stem}.gz without the end of its trailer",
                )
                yield Case(
                    f"2-{kind}-trailing/{base}",
                    2,
                    base,
                    _corrupt(stem, "trailing"),
                    REFUSED,
                    f"{stem}.gz with bytes after its member",
                )


# ---- class 3: impossible values ----
def _event_edit(
    ev: str, change: Callable[[dict[str, Any]], Any], nth: int = 0, **match: Any
) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        events = f.events()
        found = [
            i
            for i, e in enumerate(events)
            if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())
        ]
        e = events[found[nth]]
        changed = change(e)
        events[found[nth]] = e if changed is None else changed
        f.set_events(events)

    return edit


def _alloc_inserted(dst: int, size: int, overlap: bool = False) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        events = f.events()
        at = _first(events, ev="alloc")
        first = events[at]
        address = first["dst"] + 16 if overlap else dst
        new = dict(first, dst=address, bytes=size if not overlap else first["bytes"])
        _insert(events, at + 1, [new])
        f.set_events(events)

    return edit


def _cublas_arg(arg: str, value: str, function: str = "cublasSgemm_v2") -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        events = f.events()
        header = next(
            i for i, e in enumerate(events) if e["ev"] == "cublas" and function in e["msg"]
        )
        line = next(
            i
            for i in range(header + 1, len(events))
            if events[i]["ev"] == "cublas" and f"i!  {arg}:" in events[i]["msg"]
        )
        msg = events[line]["msg"]
        events[line]["msg"] = re.sub(r"val=.*", f"val={value}", msg.rstrip("\n")) + "\n"
        f.set_events(events)

    return edit


def _lt(field_: str, index: int | None, value: int) -> Callable[[Folder], None]:
    def change(e: dict[str, Any]) -> None:
        if index is None:
            e[field_] = value
        else:
            e[field_][index] = value

    return _event_edit("ltmatmul", change)


def _two_batches_back(e: dict[str, Any]) -> None:
    """Two batches, the second 2**62 elements before the first: below address 0."""
    for key in ("adesc", "bdesc", "cdesc", "ddesc"):
        e[key][5], e[key][6] = 2, -(1 << 62)


def _layout_edit(change: Callable[[dict[str, Any]], Any]) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        doc = f.layout()
        changed = change(doc)
        f.set_layout(doc if changed is None else changed)

    return edit


def _layout_text(text: Callable[[str], str]) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        f.write("layout.json", text(f.read("layout.json").decode()).encode())

    return edit


def _buffer(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return doc["buffers"][name]


def _class3() -> Iterator[Case]:
    bases = ("clean", "runtime/recorded/rt-clean", "two-processes", "deep/clean")
    allocs = {
        "at-0": (0, 1 << 40),
        "at-4096": (4096, 1 << 40),
        "past-2-48": ((1 << 48) - 4096, 8192),
        "at-2-48": (1 << 48, 16),
        "at-2-64": (2**64 - 8, 8),
    }
    for base in bases:
        for what, (dst, size) in allocs.items():
            yield Case(
                f"3-alloc-{what}/{base}",
                3,
                base,
                _alloc_inserted(dst, size),
                REFUSED,
                f"a live allocation of {size} bytes at {dst}",
            )
        yield Case(
            f"3-alloc-overlapping/{base}",
            3,
            base,
            _alloc_inserted(0, 0, overlap=True),
            REFUSED,
            "a live allocation overlapping another",
        )
        yield Case(
            f"3-copy-to-2-64/{base}",
            3,
            base,
            _event_edit("copy", lambda e: e.update(dst=2**64 - 8, bytes=1 << 40)),
            REFUSED,
            "a copy to 2**64 - 8 of 2**40 bytes",
        )
        yield Case(
            f"3-copy-from-2-50/{base}",
            3,
            base,
            _event_edit("copy", lambda e: e.update(src=1 << 50)),
            REFUSED,
            "a copy from 2**50",
        )
        yield Case(
            f"3-memset-at-2-48/{base}",
            3,
            base,
            _event_edit("memset", lambda e: e.update(dst=1 << 48)),
            REFUSED,
            "a memset at 2**48",
        )
        yield Case(
            f"3-memset-at-16/{base}",
            3,
            base,
            _event_edit("memset", lambda e: e.update(dst=16)),
            REFUSED,
            "a memset at address 16",
        )
    for base in ("clean", "runtime/recorded/rt-clean", "deep/clean"):
        yield Case(
            f"3-snapshot-ptr-0/{base}",
            3,
            base,
            _event_edit("snapshot", lambda e: e.update(ptr=0)),
            REFUSED,
            "a snapshot region at address 0",
        )
        yield Case(
            f"3-snapshot-ptr-2-48/{base}",
            3,
            base,
            _event_edit("snapshot", lambda e: e.update(ptr=1 << 48)),
            REFUSED,
            "a snapshot region at 2**48",
        )
        yield Case(
            f"3-snapshot-elements-2-32/{base}",
            3,
            base,
            _event_edit("snapshot", lambda e: e.update(elements=1 << 32), region="wire"),
            REFUSED,
            "a wire region of 2**32 elements",
        )
        yield Case(
            f"3-snapshot-past-allocation/{base}",
            3,
            base,
            _event_edit("snapshot", lambda e: e.update(elements=2**31 - 1), region="wire"),
            REFUSED,
            "a wire region far past its allocation",
        )
        for what, value in (
            ("0x0xzz", "POINTER (IN HEX:0x0xzz)"),
            ("empty", "POINTER (IN HEX:0x0x)"),
            ("0x0x1g", "POINTER (IN HEX:0x0x7f1g)"),
            ("17-digits", "POINTER (IN HEX:0x0x10000000000000000)"),
            ("address-16", "POINTER (IN HEX:0x0x10)"),
            ("kernel-space", "POINTER (IN HEX:0x0xffff800000000000)"),
            ("trailing", "POINTER (IN HEX:0x0x7f0000001000) junk"),
        ):
            yield Case(
                f"3-cublas-A-{what}/{base}",
                3,
                base,
                _cublas_arg("A", value),
                REFUSED,
                f"a cuBLAS pointer logged as {value}",
            )
        yield Case(
            f"3-cublas-m-64abc/{base}",
            3,
            base,
            _cublas_arg("m", "64abc"),
            REFUSED,
            "a GEMM size logged as 64abc",
        )
    probe = "runtime/recorded/probe"
    for what, (arg, value) in {
        "batch-2-31": ("batchCount", str(2**31)),
        "batch-negative": ("batchCount", "-1"),
        "stride-2-61": ("strideA", str(2**61)),
        "stride-negative": ("strideC", str(-(2**46))),
    }.items():
        yield Case(
            f"3-strided-{what}/{probe}",
            3,
            probe,
            _cublas_arg(arg, value, "cublasSgemmStridedBatched"),
            REFUSED,
            f"a strided-batched GEMM's {arg} of {value}",
        )
    for base in ("runtime/recorded/rt-gemm-lt", "runtime/recorded/rt-gemm-lt-device"):
        yield Case(
            f"3-lt-batch-2-62/{base}",
            3,
            base,
            _lt("adesc", 5, 1 << 62),
            REFUSED,
            "a cuBLASLt batch count of 2**62",
        )
        yield Case(
            f"3-lt-stride-neg-2-62/{base}",
            3,
            base,
            _event_edit("ltmatmul", _two_batches_back),
            REFUSED,
            "a cuBLASLt batch stride of -2**62",
        )
        yield Case(
            f"3-lt-rows-2-62/{base}",
            3,
            base,
            _lt("ddesc", 2, 1 << 62),
            REFUSED,
            "cuBLASLt rows of 2**62",
        )
        yield Case(
            f"3-lt-ld-negative/{base}",
            3,
            base,
            _lt("adesc", 4, -5),
            REFUSED,
            "a cuBLASLt leading dimension of -5",
        )
        yield Case(
            f"3-lt-pointer-2-60/{base}",
            3,
            base,
            _lt("a", None, 1 << 60),
            REFUSED,
            "a cuBLASLt pointer at 2**60",
        )
    for base in ("deep/clean", "runtime/recorded/rt-deep-clean"):
        yield Case(
            f"3-effect-outside/{base}",
            3,
            base,
            _event_edit("effect", lambda e: e.update(changed=[[1 << 40, 4]]), nth=3),
            REFUSED,
            "an effect's changed bytes outside every allocation",
        )
        yield Case(
            f"3-effect-at-2-48/{base}",
            3,
            base,
            _event_edit("effect", lambda e: e.update(changed=[[(1 << 48) - 4, 8]]), nth=3),
            REFUSED,
            "an effect's changed bytes past 2**48",
        )
    layout_edits: dict[str, Callable[[dict[str, Any]], Any]] = {
        "address-2-48": lambda d: _buffer(d, "d_h_s2").update(address=1 << 48),
        "address-0": lambda d: _buffer(d, "d_h_s2").update(address=0),
        "address-4096": lambda d: _buffer(d, "d_h_s2").update(address=4096),
        "bytes-2-41": lambda d: _buffer(d, "d_h_s2").update(bytes=1 << 41),
        "bytes-negative": lambda d: _buffer(d, "d_h_s2").update(bytes=-4),
        "address-a-string": lambda d: _buffer(d, "d_h_s2").update(address="0x7f00"),
        "tensors-overlap": lambda d: _buffer(d, "sn_state")["tensors"].update(v_b0fc=[0, 1, 49]),
        "tensor-past-buffer": lambda d: _buffer(d, "sn_state")["tensors"].update(
            v_b0fc=[32, 1, 4900]
        ),
        "param-offsets-overlap": lambda d: d["param_offsets"].update(
            w_b0out=d["param_offsets"]["w_b0fc"]
        ),
        "param-offset-negative": lambda d: d["param_offsets"]["w_b0fc"].__setitem__(0, -1),
        "view-past-buffer": lambda d: _buffer(d, "sn_state").update(views={"all": [0, 1, 10**6]}),
        "dims-B-0": lambda d: d["dims"].update(B=0),
        "dims-B-negative": lambda d: d["dims"].update(B=-64),
        "dims-B-2-31": lambda d: d["dims"].update(B=2**31),
        "dims-B-true": lambda d: d["dims"].update(B=True),
        "dims-B-float": lambda d: d["dims"].update(B=64.5),
        "dims-B-string": lambda d: d["dims"].update(B="64"),
        "dims-A-long": lambda d: d["dims"].update(A=[3] * 1000),
        "tau-0": lambda d: d["dims"].update(tau=0),
        "tau-1": lambda d: d["dims"].update(tau=1.0),
        "tau-negative": lambda d: d["dims"].update(tau=-0.5),
        "tau-2": lambda d: d["dims"].update(tau=2),
        "tau-string": lambda d: d["dims"].update(tau="0.005"),
        "name-empty": lambda d: (
            d["buffers"].update({"": d["buffers"]["d_h_s2"]}) or d["buffers"].pop("d_h_s2")
        ),
        "name-long": lambda d: d["buffers"].update({"x" * 1000: {"address": 1 << 46, "bytes": 4}}),
        "format": lambda d: d.update(format="egf-audit-layout/9"),
    }
    for base in ("clean", "runtime/recorded/rt-clean"):
        for what, change in layout_edits.items():
            yield Case(
                f"3-layout-{what}/{base}",
                3,
                base,
                _layout_edit(change),
                REFUSED,
                f"the layout file's {what}",
            )
        for what, text in {
            "tau-nan": '"tau": NaN',
            "tau-infinity": '"tau": Infinity',
            "tau-1e999": '"tau": 1e999',
        }.items():
            yield Case(
                f"3-layout-{what}/{base}",
                3,
                base,
                _layout_text(lambda s, t=text: re.sub(r'"tau": [0-9.e-]+', t, s)),
                REFUSED,
                f"the layout file's {text}",
            )
    llmc = "llmc/recorded/llmc"
    yield Case(
        f"3-layout-allocation-index-negative/{llmc}",
        3,
        llmc,
        _layout_edit(lambda d: next(iter(d["buffers"].values()))["allocation"].update(index=-1)),
        REFUSED,
        "a buffer named by allocation index -1",
    )
    yield Case(
        f"3-layout-allocation-bytes-2-41/{llmc}",
        3,
        llmc,
        _layout_edit(
            lambda d: next(iter(d["buffers"].values()))["allocation"].update(bytes=1 << 41)
        ),
        REFUSED,
        "a buffer named by an allocation of 2**41 bytes",
    )

    def qkvr(value: list[Any]) -> Callable[[dict[str, Any]], Any]:
        """llm.c's qkvr, declared [L, 3, B, NH, T, HS], declared otherwise."""
        return lambda d: _buffer(d, "acts_memory")["tensors"].update(qkvr=value)

    def shape_only(buffer: str, shape: list[Any]) -> Callable[[dict[str, Any]], Any]:
        """One of llm.c's buffers given as one tensor of `shape` (its tensors dropped)."""

        def change(d: dict[str, Any]) -> None:
            _buffer(d, buffer).pop("tensors", None)
            _buffer(d, buffer)["shape"] = shape

        return change

    stacked: dict[str, Callable[[dict[str, Any]], Any]] = {
        "tensor-9-axes": qkvr([0, 1, 1, 1, 1, 1, 1, 1, 32, 32]),
        "tensor-axes-product-2-41": qkvr([0, 1 << 21, 1 << 20, 1, 1]),
        "tensor-axis-negative": qkvr([0, 2, -3, 4, 4, 32, 32]),
        "tensor-axis-float": qkvr([0, 2, 3.0, 4, 4, 32, 32]),
        "tensor-axis-true": qkvr([0, 2, True, 4, 4, 32, 32]),
        "tensor-axis-a-list": qkvr([0, [2, 3], 4, 4, 32, 32]),
        "tensor-stacked-past-buffer": qkvr([7_000_000, 2, 3, 4, 4, 32, 33]),
        "shape-1-axis": shape_only("m_memory", [7]),
        "shape-9-axes": shape_only("m_memory", [1] * 9),
        "shape-axes-product-2-41": shape_only("m_memory", [1 << 14, 1 << 14, 1 << 14]),
        "shape-stacked-past-buffer": shape_only("m_memory", [2, 1 << 20, 1 << 10]),
    }
    for what, change in stacked.items():
        yield Case(
            f"3-layout-{what}/{llmc}",
            3,
            llmc,
            _layout_edit(change),
            REFUSED,
            f"the layout file's {what}",
        )
    manifest_edits: dict[str, Callable[[dict[str, Any]], Any]] = {
        "exit-code-string": lambda d: d.update(exit_code="0"),
        "wall-negative": lambda d: d.update(wall_s=-1),
        "pid-negative": lambda d: d["processes"][0].update(pid=-1),
        "count-negative": lambda d: d["processes"][0].update(kernels=-1),
        "count-2-41": lambda d: d["processes"][0].update(kernels=1 << 41),
        "notes-a-number": lambda d: d["processes"][0].update(notes=5),
        "deep-yes": lambda d: d.update(deep="yes"),
        "format-other": lambda d: d.update(format="other-tool/1"),
        "processes-an-object": lambda d: d.update(processes={}),
        "processes-empty": lambda d: d.update(processes=[]),
        "pid-twice": lambda d: d["processes"].append(dict(d["processes"][0], audited=False)),
        "command-a-string": lambda d: d.update(command="python trainer.py"),
    }
    for base in ("clean", "two-processes"):
        for what, change in manifest_edits.items():
            yield Case(
                f"3-manifest-{what}/{base}",
                3,
                base,
                _manifest_edit(change),
                REFUSED,
                f"the manifest's {what}",
            )


# ---- class 4: the incompleteness of processes that are not audited ----
def _launcher(ending: str) -> Callable[[Folder], None]:
    """A launcher process (it used CUDA, launched no ABI kernel and no GEMM) listed in the
    manifest beside the trainer, its events ending as `ending` says."""

    def edit(f: Folder) -> None:
        pid = min(f.pids()) - 1
        tid = 4242
        events: list[Any] = [
            {
                "ev": "init",
                "seq": 0,
                "tid": tid,
                "pid": pid,
                "ppid": 1,
                "cupti_version": 130001,
                "subscribe": 0,
                "param_info": True,
            },
            {
                "ev": "alloc",
                "seq": 1,
                "tid": tid,
                "api": "cuMemAlloc_v2",
                "dst": 0x7E00_0000_0000,
                "src": 0,
                "bytes": 512,
                "value": 0,
            },
            {
                "ev": "kernel",
                "seq": 2,
                "tid": tid,
                "api": "cuLaunchKernel",
                "name": "fill_kernel",
                "grid": [1, 1, 1],
                "block": [128, 1, 1],
                "params": [[8, 0x7E00_0000_0000]],
            },
            {
                "ev": "copy",
                "seq": 3,
                "tid": tid,
                "api": "cuMemcpyDtoHAsync_v2",
                "dst": 0,
                "src": 0x7E00_0000_0000,
                "bytes": 4,
                "value": 0,
            },
        ]
        tail = b""
        if ending == "exit":
            events.append({"ev": "exit", "seq": 4, "tid": tid, "pid": pid})
        elif ending == "exit-after-a-note":
            events += [
                {"ev": "exit", "seq": 4, "tid": tid, "pid": pid},
                {"ev": "note", "seq": 5, "tid": tid, "msg": "after exit"},
            ]
        elif ending == "cut-mid-line":
            tail = json.dumps({"ev": "exit", "seq": 4, "tid": tid, "pid": pid}).encode()[:17]
        (f.path / f"events-{pid}.jsonl").write_bytes(b"")
        (f.path / f"snapshots-{pid}.bin").write_bytes(b"")
        f.set_events(events, pid, tail)
        doc = f.manifest()
        entry = {
            "pid": pid,
            "audited": False,
            "kernels": 1,
            "gemms": 0,
            "memsets": 0,
            "copies": 1,
            "snapshots": 0,
            "notes": [e["msg"] for e in events if e["ev"] == "note"],
        }
        doc["processes"].insert(0, entry)
        f.set_manifest(doc)

    return edit


def _two_processes_launcher(ending: str) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        pid = min(f.pids())
        events = f.events(pid)
        assert events[-1]["ev"] == "exit"
        last = json.dumps(events.pop(), separators=(",", ":")).encode()
        f.set_events(events, pid, last[: len(last) // 2] if ending == "cut-mid-line" else b"")

    return edit


def _deep_asked(f: Folder) -> None:
    doc = f.manifest()
    doc["deep"] = True
    f.set_manifest(doc)


def _class4() -> Iterator[Case]:
    for base in sorted(PASSING):
        for ending in ("no-exit", "cut-mid-line", "exit-after-a-note"):
            yield Case(
                f"4-launcher-{ending}/{base}",
                4,
                base,
                _launcher(ending),
                FAILED,
                f"an unaudited launcher whose events end {ending}",
            )
        if "deep" not in base:
            yield Case(
                f"4-deep-asked/{base}",
                4,
                base,
                _deep_asked,
                FAILED,
                "--deep asked for, no process recorded deep",
            )
    for ending in ("no-exit", "cut-mid-line"):
        yield Case(
            f"4-two-processes-launcher-{ending}/two-processes",
            4,
            "two-processes",
            _two_processes_launcher(ending),
            FAILED,
            f"the launcher of two-processes: {ending}",
        )
    yield Case(
        "4-launcher-of-a-deep-capture/deep/clean",
        4,
        "deep/clean",
        _launcher("exit"),
        FAILED,
        "a launcher recorded without --deep in a deep capture",
    )


# ---- class 5: names ----
HOSTILE_CHARACTERS = {
    "esc-sgr": "\x1b[31m",
    "esc-clear": "\x1b[2J\x1b[H",
    "osc8-link": "\x1b]8;;https://example.invalid\x07link\x1b]8;;\x07",
    "bel": "\x07",
    "nul": "\x00",
    "del": "\x7f",
    "cr": "\r",
    "lf": "\n",
    "vt": "\x0b",
    "c1-nel": "\x85",
    "c1-csi": "\x9b31m",
    "rlo": "\u202e",
    "lri": "\u2066",
    "zwsp": "\u200b",
    "zwj": "\u200d",
    "line-separator": "\u2028",
    "bom": "\ufeff",
    "surrogate": "\ud800",
    "tag": "\U000e0041",
}


def _renamed_buffer(chars: str) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        doc = f.layout()
        name = next(n for n in ("ctx_b1", "obs", "actions") if n in doc["buffers"])
        doc["buffers"][f"{name}{chars}evil"] = doc["buffers"].pop(name)
        f.write("layout.json", json.dumps(doc).encode("utf-8", "surrogatepass"))

    return edit


def _class5() -> Iterator[Case]:
    for base in ("dw-k-sh2", "runtime/recorded/rt-dw-k-sh2", "polyak-tau-swap"):
        for what, chars in HOSTILE_CHARACTERS.items():
            yield Case(
                f"5-buffer-name-{what}/{base}",
                5,
                base,
                _renamed_buffer(chars),
                FAILED,
                f"a buffer named with {what}",
                names=True,
            )


# ---- class 6: unbounded work ----
def _link_to(target: str) -> Callable[[Path], None]:
    return lambda path: path.symlink_to(target)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _sparse(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(2 << 30)


@functools.cache
def _bomb(chunks: int = 128) -> bytes:
    """A whole gzip member of `chunks` times 16 MiB of zero bytes (2 GiB: about 2 MB of it).
    Each chunk is compressed after a full flush, so every chunk's block is the same bytes:
    made once and repeated, with the member's true CRC and length at its end."""
    chunk = bytes(1 << 24)
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)
    block = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(chunks):
        crc = zlib.crc32(chunk, crc)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # the last, empty, block
    size = (chunks * len(chunk)) & 0xFFFFFFFF
    return (
        head + block * (chunks - 1) + end + crc.to_bytes(4, "little") + size.to_bytes(4, "little")
    )


def _bombed(stem: str) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        path = f.file(stem.replace("PID", str(f.audited())))
        path.write_bytes(_bomb())

    return edit


def _replaced(stem: str, how: Callable[[Path], None]) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        f.replace(stem.replace("PID", str(f.audited())), how)

    return edit


def _plain(stem: str, how: Callable[[Path], None]) -> Callable[[Folder], None]:
    """The gzipped file `stem` replaced by a plain file of that name made by `how`."""

    def edit(f: Folder) -> None:
        stem_ = stem.replace("PID", str(f.audited()))
        f.file(stem_).unlink()
        how(f.path / stem_)

    return edit


def _kernel_arg(kernel: str, index: int, size: int, value: int) -> Callable[[Folder], None]:
    def change(e: dict[str, Any]) -> None:
        e["params"][index] = [size, value]

    return _event_edit("kernel", change, name=kernel)


def _many(allocations: int, memsets: int) -> Callable[[Folder], None]:
    """`allocations` allocations and `memsets` memsets into them, made before the trainer's first
    kernel launch, far from its memory, the manifest counting the memsets."""

    def edit(f: Folder) -> None:
        events = f.events()
        at = _first(events, ev="kernel")
        tid = events[at]["tid"]
        base, step = 0x1000_0000_0000, 4096
        new: list[dict[str, Any]] = []
        for i in range(allocations):
            new.append(
                {
                    "ev": "alloc",
                    "tid": tid,
                    "api": "cuMemAlloc_v2",
                    "dst": base + i * step,
                    "src": 0,
                    "bytes": 256,
                    "value": 0,
                }
            )
        for i in range(memsets):
            new.append(
                {
                    "ev": "memset",
                    "tid": tid,
                    "api": "cuMemsetD8_v2",
                    "dst": base + (i % allocations) * step,
                    "src": 0,
                    "bytes": 256,
                    "value": 0,
                }
            )
        _insert(events, at, new)
        f.set_events(events)
        f.count(f.audited(), memsets=memsets)

    return edit


def _notes(n: int) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        events = f.events()
        at = _first(events, ev="kernel")
        _insert(events, at, [{"ev": "note", "msg": f"note {i}"} for i in range(n)])
        f.set_events(events)
        doc = f.manifest()
        next(p for p in doc["processes"] if p["audited"])["notes"] += [
            f"note {i}" for i in range(n)
        ]
        f.set_manifest(doc)

    return edit


def _long_cublas_call(f: Folder) -> None:
    events = f.events()
    header = next(
        i for i, e in enumerate(events) if e["ev"] == "cublas" and "cublasSgemm_v2" in e["msg"]
    )
    _insert(
        events,
        header + 1,
        [{"ev": "cublas", "msg": f"i!  x{i}: type=int; val={i}\n"} for i in range(2000)],
    )
    f.set_events(events)


def _deep_line(f: Folder) -> None:
    events: list[Any] = list(f.events())
    events[3] = "[" * 100_000 + "]" * 100_000
    f.set_events(events)


def _huge_seq(f: Folder) -> None:
    events: list[Any] = list(f.events())
    events[3] = json.dumps(events[3]).replace(f'"seq": {events[3]["seq"]}', '"seq": ' + "9" * 5000)
    f.set_events(events)


def _extra_buffers(n: int) -> Callable[[Folder], None]:
    def edit(f: Folder) -> None:
        doc = f.layout()
        for i in range(n):
            doc["buffers"][f"extra_{i:06d}"] = {"address": 0x2000_0000_0000 + 64 * i, "bytes": 64}
        f.set_layout(doc)

    return edit


def _class6() -> Iterator[Case]:
    for base in ("clean", "runtime/recorded/rt-clean"):
        for stem in ("layout.json", "events-PID.jsonl", "snapshots-PID.bin", "manifest.json"):
            kind = stem.split("-")[0].split(".")[0]
            yield Case(
                f"6-{kind}-dev-zero/{base}",
                6,
                base,
                _replaced(stem, _link_to("/dev/zero")),
                REFUSED,
                f"{stem} a link to /dev/zero",
            )
            yield Case(
                f"6-{kind}-fifo/{base}", 6, base, _replaced(stem, _fifo), REFUSED, f"{stem} a FIFO"
            )
            yield Case(
                f"6-{kind}-folder/{base}",
                6,
                base,
                _replaced(stem, lambda p: p.mkdir()),
                REFUSED,
                f"{stem} a folder",
            )
        yield Case(
            f"6-layout-sparse-2g/{base}",
            6,
            base,
            _plain("layout.json", _sparse),
            REFUSED,
            "layout.json a 2 GiB sparse file",
        )
        yield Case(
            f"6-events-sparse-2g/{base}",
            6,
            base,
            _plain("events-PID.jsonl", _sparse),
            REFUSED,
            "the events file a 2 GiB sparse file",
        )
        yield Case(
            f"6-manifest-sparse-2g/{base}",
            6,
            base,
            _replaced("manifest.json", _sparse),
            REFUSED,
            "manifest.json a 2 GiB sparse file",
        )
        yield Case(
            f"6-snapshots-sparse-2g/{base}",
            6,
            base,
            _plain("snapshots-PID.bin", _sparse),
            FAILED,
            "the snapshots file a 2 GiB sparse file (every value +0.0, every hash disagreeing)",
        )
        for stem in ("layout.json", "events-PID.jsonl", "snapshots-PID.bin"):
            kind = stem.split("-")[0].split(".")[0]
            yield Case(
                f"6-{kind}-gzip-bomb/{base}",
                6,
                base,
                _bombed(stem),
                REFUSED,
                f"{stem}.gz a gzip bomb of 2 GiB",
            )
        yield Case(
            f"6-layout-deep-json/{base}",
            6,
            base,
            _layout_text(lambda s: "[" * 100_000 + "]" * 100_000),
            REFUSED,
            "layout.json a 100,000-deep array",
        )
        yield Case(
            f"6-layout-tau-10-400/{base}",
            6,
            base,
            _layout_text(lambda s: re.sub(r'"tau": [0-9.e-]+', '"tau": 1' + "0" * 400, s)),
            REFUSED,
            "tau the integer 10**400",
        )
        yield Case(
            f"6-layout-5000-digits/{base}",
            6,
            base,
            _layout_text(lambda s: re.sub(r'"B": \d+', '"B": ' + "7" * 5000, s)),
            REFUSED,
            "B an integer of 5,000 digits",
        )
        yield Case(
            f"6-manifest-deep-json/{base}",
            6,
            base,
            lambda f: (f.path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000),
            REFUSED,
            "manifest.json a 100,000-deep array",
        )
        yield Case(
            f"6-manifest-exit-10-400/{base}",
            6,
            base,
            _manifest_edit(lambda d: d.update(exit_code=10**400)),
            REFUSED,
            "the exit code 10**400",
        )
        yield Case(
            f"6-manifest-17m/{base}",
            6,
            base,
            lambda f: (f.path / "manifest.json").write_bytes(
                json.dumps(f.manifest()).encode() + b" " * (17 << 20)
            ),
            REFUSED,
            "a 17 MiB manifest",
        )
        yield Case(
            f"6-events-deep-line/{base}", 6, base, _deep_line, REFUSED, "a 100,000-deep line"
        )
        yield Case(
            f"6-events-seq-5000-digits/{base}", 6, base, _huge_seq, REFUSED, "a seq of 5,000 digits"
        )
        yield Case(
            f"6-long-cublas-call/{base}",
            6,
            base,
            _long_cublas_call,
            REFUSED,
            "a cuBLAS call logged in 2,000 lines",
        )
        yield Case(
            f"6-notes-2000/{base}", 6, base, _notes(2000), REFUSED, "2,000 notes in one process"
        )
        yield Case(
            f"6-scale-rows-2-31/{base}",
            6,
            base,
            _kernel_arg("sp14_scale_wire_col", 2, 4, 2**31 - 1),
            FAILED,
            "a scale launch of 2**31 - 1 rows",
        )
        yield Case(
            f"6-accumulate-rows-2-31/{base}",
            6,
            base,
            _kernel_arg("accumulate_d_h_s2_from_concat", 2, 4, 2**31 - 1),
            FAILED,
            "an accumulate of 2**31 - 1 rows",
        )
        yield Case(
            f"6-polyak-n-2-62/{base}",
            6,
            base,
            _kernel_arg("polyak_ema", 3, 8, 1 << 62),
            FAILED,
            "a Polyak of 2**62 elements",
        )
        yield Case(
            f"6-concat-rows-2-31/{base}",
            6,
            base,
            _kernel_arg("sp14_dir_concat_qaux", 3, 4, 2**31 - 1),
            FAILED,
            "a concat of 2**31 - 1 rows",
        )
    for base in ("runtime/recorded/rt-deep-clean",):
        yield Case(
            f"6-values-dev-zero/{base}",
            6,
            base,
            _replaced("values-PID.bin", _link_to("/dev/zero")),
            REFUSED,
            "the values file a link to /dev/zero",
        )
        yield Case(
            f"6-values-fifo/{base}",
            6,
            base,
            _replaced("values-PID.bin", _fifo),
            REFUSED,
            "the values file a FIFO",
        )
        yield Case(
            f"6-values-gzip-bomb/{base}",
            6,
            base,
            _bombed("values-PID.bin"),
            REFUSED,
            "values-PID.bin.gz a gzip bomb of 2 GiB",
        )
    for base in ("dw-k-sh2", "runtime/recorded/rt-dw-k-sh2"):
        yield Case(
            f"6-30000-allocations-and-memsets/{base}",
            6,
            base,
            _many(30_000, 30_000),
            FAILED,
            "30,000 allocations and 30,000 memsets, on a failing fixture",
        )
        yield Case(
            f"6-50000-layout-buffers/{base}",
            6,
            base,
            _extra_buffers(50_000),
            FAILED,
            "50,000 more layout buffers, on a failing fixture",
        )
    yield Case(
        "6-100000-allocations-and-memsets/dw-k-sh2",
        6,
        "dw-k-sh2",
        _many(100_000, 100_000),
        FAILED,
        "100,000 allocations and 100,000 memsets, on a failing fixture",
    )


# ---- class 7: the user's files ----
VICTIM = b"the user's own file: it must stay as it is\n"
CLEAN = DATA / "clean"
# The traced command: records what the clean capture recorded where the recorder would, then
# leaves behind what --plant says (COMMAND_PLANTS), as a hostile or careless trainer might.
COMMAND = r"""
import gzip, os, pathlib, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
src, into = pathlib.Path(args["--data"]), pathlib.Path(os.environ["EGF_CAPTURE_DIR"])
root, plant, pid = pathlib.Path(args["--root"]), args["--plant"], args["--pid"]
(root / "ran").write_text("the command ran")
for stem in (f"events-{pid}.jsonl", f"snapshots-{pid}.bin"):
    (into / stem).write_bytes(gzip.decompress((src / f"{stem}.gz").read_bytes()))
layout = pathlib.Path(args["--layout-out"])
layout.write_bytes(gzip.decompress((src / "layout.json.gz").read_bytes()))
victim = root / "victim.txt"
if plant.startswith("link:"):
    (into / plant.removeprefix("link:")).symlink_to(victim)
elif plant == "subfolder":
    (into / "sub").mkdir()
elif plant == "fifo":
    os.mkfifo(into / "trace.jsonl")
elif plant == "hardlink":
    os.link(victim, into / "trace.jsonl")
elif plant == "folder-swapped-for-link":
    into.rename(root / "moved-capture")
    into.symlink_to(root / "victim-folder")
elif plant == "layout-dev-zero":
    layout.unlink()
    layout.symlink_to("/dev/zero")
elif plant == "layout-fifo":
    layout.unlink()
    os.mkfifo(layout)
elif plant == "layout-link-to-victim":
    layout.unlink()
    layout.symlink_to(victim)
"""
COMMAND_PLANTS = (
    *(
        f"link:{name}"
        for name in ("trace.jsonl", "manifest.json", "layout.json", "events-1.jsonl.orig")
    ),
    "subfolder",
    "fifo",
    "hardlink",
    "folder-swapped-for-link",
    "layout-dev-zero",
    "layout-fifo",
    "layout-link-to-victim",
)


def _victims(f: Folder) -> None:
    """What the user has beside the capture: a file, and a folder of files."""
    (f.root / "victim.txt").write_bytes(VICTIM)
    (f.root / "victim-folder").mkdir()
    (f.root / "victim-folder" / "results.csv").write_bytes(VICTIM)


def _out_holds(files: dict[str, bytes | None]) -> Callable[[Folder], None]:
    """The folder `capture --out` is given holds these files (None: a subfolder; b"LINK": a
    link to the victim file outside)."""

    def edit(f: Folder) -> None:
        _victims(f)
        for name, data in files.items():
            path = f.path / name
            if data is None:
                path.mkdir()
            elif data == b"LINK":
                path.symlink_to(f.root / "victim.txt")
            else:
                path.write_bytes(data)

    return edit


def _earlier(pid: int = 77, **extra: bytes | None) -> dict[str, bytes | None]:
    """An earlier capture as `capture` wrote it (one process), and what else `extra` adds."""
    manifest = {
        "format": "egf-audit-capture/1",
        "command": ["trainer"],
        "exit_code": 0,
        "wall_s": 1.0,
        "layout": None,
        "snapshot_kernels": [],
        "deep": False,
        "processes": [
            {
                "pid": pid,
                "audited": True,
                **dict.fromkeys(("kernels", "gemms", "memsets", "copies", "snapshots"), 0),
                "notes": [],
            }
        ],
    }
    return {
        "manifest.json": json.dumps(manifest).encode(),
        f"events-{pid}.jsonl": b"{}\n",
        f"snapshots-{pid}.bin": b"",
        **extra,
    }


def command_line(case: Case, folder: Folder, python: str) -> tuple[list[str], Path]:
    """The traced command of a class-7 case, and the --layout path it writes."""
    pid = json.loads((CLEAN / "manifest.json").read_text())["processes"][0]["pid"]
    layout = folder.root / "build" / "layout.json"
    layout.parent.mkdir(exist_ok=True)
    cmd = [python, "-c", COMMAND, "--data", str(CLEAN), "--root", str(folder.root)]
    cmd += ["--plant", case.plant or "nothing", "--pid", str(pid), "--layout-out", str(layout)]
    return cmd, layout


def _class7() -> Iterator[Case]:
    other = dict(json.loads(_earlier()["manifest.json"]), format="other-tool/1")  # type: ignore[arg-type]
    outs: dict[str, dict[str, bytes | None]] = {
        "manifest-of-another-program": {"manifest.json": b'{"name": "my-tool", "version": 3}'},
        "manifest-like-ours": {"manifest.json": b'{"command": ["make"], "exit_code": 0}'},
        "manifest-format-other": {"manifest.json": json.dumps(other).encode()},
        "values-report-xlsx": {"values-2024.binary-report.xlsx": b"PK\x03\x04"},
        "snapshots-old-bak": {"snapshots-old.bin.bak": b"\0" * 8},
        "events-orig": {"events-1.jsonl.orig": b"{}\n"},
        "trace-only": {"trace.jsonl": b"{}\n"},
        "layout-only": {"layout.json": b"{}"},
        "earlier-and-notes": _earlier(**{"notes.txt": b"mine"}),
        "earlier-and-subfolder": _earlier(**{"results": None}),
        "earlier-and-link": _earlier(**{"events-9.jsonl": b"LINK"}),
        "earlier-and-unlisted-pid": _earlier(**{"events-78.jsonl": b"{}\n"}),
        "earlier-and-values-of-unlisted": _earlier(**{"values-5.bin": b"\0"}),
        "earlier-without-snapshots": {
            k: v for k, v in _earlier().items() if not k.startswith("snapshots")
        },
        "earlier-manifest-a-link": {**_earlier(), "manifest.json": b"LINK"},
        "earlier-with-values-report": _earlier(**{"values-2024.binary-report.xlsx": b"PK"}),
    }
    for what, files in outs.items():
        yield Case(
            f"7-out-{what}",
            7,
            "",
            _out_holds(files),
            REFUSED,
            f"capture --out over a folder: {what}",
            command=True,
        )
    for plant in COMMAND_PLANTS:
        yield Case(
            f"7-command-plants-{plant.replace('link:', '')}{'-link' if 'link:' in plant else ''}",
            7,
            "",
            _out_holds(_earlier()),
            REFUSED,
            f"the traced command leaves {plant}",
            command=True,
            plant=plant,
        )


CASES: list[Case] = [
    *_class1(),
    *_class2(),
    *_class3(),
    *_class4(),
    *_class5(),
    *_class6(),
    *_class7(),
]
BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "case names are unique"


def build(case: Case, where: Path) -> Folder:
    """The case's folder under `where` (`where/capture`), edited."""
    folder = Folder(where, case.base)
    case.edit(folder)
    return folder


if __name__ == "__main__":
    counts = Counter((c.klass, c.expected) for c in CASES)
    words = {REFUSED: "refused (exit 2)", FAILED: "failed (exit 1)"}
    for (klass, expected), n in sorted(counts.items()):
        print(f"class {klass}: {n} cases, {words[expected]}")
    print(f"{len(CASES)} cases")
