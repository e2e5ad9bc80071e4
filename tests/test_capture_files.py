"""The capture reader fails closed: every hostile or incomplete capture file is refused with one
UsageError (exit 2) naming the file and, for events, the line. Each case is built from the
committed clean capture (tests/data/capture/clean) in tmp_path, edited as an attacker or a
killed process would leave it. Nothing here depends on the fixture's pid or counts: the tests
hold whichever recording of the stand-in the folder has."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from egf_audit.capture.events import read_capture
from egf_audit.capture.manifest import Manifest, exit_words, read_manifest
from egf_audit.cli.app import app
from egf_audit.errors import UsageError
from egf_audit.trace.contract import POLYAK_KERNEL, SCALE_KERNEL

CLEAN = Path(__file__).parent / "data" / "capture" / "clean"
EVENTS = next(CLEAN.glob("events-*.jsonl.gz")).name
PID = int(EVENTS.split("-")[1].split(".")[0])
SNAPSHOTS = f"snapshots-{PID}.bin.gz"
PLAIN_EVENTS, PLAIN_SNAPSHOTS = EVENTS.removesuffix(".gz"), SNAPSHOTS.removesuffix(".gz")

# The keys each event kind carries (as the recorder's units write them), checked every one.
KEYS = {
    "init": ("ev", "seq", "tid", "pid", "ppid", "cupti_version", "subscribe", "param_info"),
    "note": ("ev", "seq", "tid", "msg"),
    "kernel": ("ev", "seq", "tid", "api", "name", "grid", "block", "params"),
    "memset": ("ev", "seq", "tid", "api", "dst", "src", "bytes", "value"),
    "copy": ("ev", "seq", "tid", "api", "dst", "src", "bytes", "value"),
    "alloc": ("ev", "seq", "tid", "api", "dst", "src", "bytes", "value"),
    "cublas": ("ev", "seq", "tid", "msg"),
    "snapshot": (
        *("ev", "seq", "tid", "launch", "when", "region", "ptr", "elements", "rows", "ld"),
        *("skip_col", "hash", "offset", "count"),
    ),
    "exit": ("ev", "seq", "tid", "pid"),
}
KIND_KEYS = [(kind, key) for kind, keys in KEYS.items() for key in keys]
FIFO_REFUSED = r"a FIFO [(]named pipe[)], not a regular file$"  # as small_files words it


# ---- building hostile captures ----
class Capture:
    """A copy of the clean capture in tmp_path, its events as lines to edit, without the
    recorder's exit event (a test that needs one appends it)."""

    def __init__(self, tmp_path: Path, plain: bool = False):
        self.folder = tmp_path / "capture"
        shutil.copytree(CLEAN, self.folder)
        self.name = EVENTS
        if plain:  # as the recorder writes them: not gzipped
            for gz in (EVENTS, SNAPSHOTS):
                src = self.folder / gz
                (self.folder / gz.removesuffix(".gz")).write_bytes(
                    gzip.decompress(src.read_bytes())
                )
                src.unlink()
            self.name = PLAIN_EVENTS
        self.lines = self._read().decode("utf-8").splitlines()
        if json.loads(self.lines[-1])["ev"] == "exit":
            del self.lines[-1]
            self.save()

    @property
    def path(self) -> Path:
        return self.folder / self.name

    def _read(self) -> bytes:
        data = self.path.read_bytes()
        return gzip.decompress(data) if self.name.endswith(".gz") else data

    def write_bytes(self, data: bytes) -> None:
        self.path.write_bytes(gzip.compress(data) if self.name.endswith(".gz") else data)

    def save(self) -> None:
        self.write_bytes(("\n".join(self.lines) + "\n").encode("utf-8"))

    def event(self, number: int) -> dict[str, Any]:
        return json.loads(self.lines[number - 1])

    def first(self, test: Callable[[dict[str, Any]], bool]) -> int:
        """The 1-based line of the first event that passes `test`."""
        return next(i for i, line in enumerate(self.lines, 1) if test(json.loads(line)))

    def first_of(self, ev: str, name: str | None = None) -> int:
        return self.first(lambda e: e["ev"] == ev and (name is None or e.get("name") == name))

    def edit(self, number: int, change: Callable[[dict[str, Any]], Any]) -> int:
        event = self.event(number)
        changed = change(event)
        event = event if changed is None else changed
        self.lines[number - 1] = event if isinstance(event, str) else json.dumps(event)
        self.save()
        return number

    def append_exit(self, pid: int = PID) -> int:
        last = self.event(len(self.lines))
        exit_event = {"ev": "exit", "seq": last["seq"] + 1, "tid": last["tid"], "pid": pid}
        self.lines.append(json.dumps(exit_event, separators=(",", ":")))
        self.save()
        return len(self.lines)

    def step_start(self, legacy: bool) -> tuple[int, int]:
        """The first step_start snapshot and the launch it was taken at, rewritten as the
        recorder writes them now (the launch, then the snapshot naming it) or, `legacy`, as it
        wrote them before (the snapshot first, named by its own seq, then the launch). Returns
        (the snapshot's line, the launch's seq)."""
        number = self.first(lambda e: e.get("when") == "step_start")
        snap = self.event(number)
        if snap["launch"] == snap["seq"]:  # legacy: the launch is the next line
            first, kernel = number, self.event(number + 1)
        else:
            first, kernel = number - 1, self.event(number - 1)
        assert kernel["ev"] == "kernel" and kernel["tid"] == snap["tid"]
        low, high = sorted((snap["seq"], kernel["seq"]))
        if legacy:
            pair = [snap | {"seq": low, "launch": low}, kernel | {"seq": high}]
        else:
            pair = [kernel | {"seq": low}, snap | {"seq": high, "launch": low}]
        self.lines[first - 1 : first + 1] = [json.dumps(e) for e in pair]
        self.save()
        return (first if legacy else first + 1), (high if legacy else low)


@pytest.fixture
def cap(tmp_path: Path) -> Capture:
    return Capture(tmp_path)


@pytest.fixture
def plain(tmp_path: Path) -> Capture:
    return Capture(tmp_path, plain=True)


def refused(folder: Path, *patterns: str) -> str:
    """The one-line message read_capture refuses `folder` with; it matches every pattern."""
    with pytest.raises(UsageError, match=patterns[0]) as info:
        read_capture(folder)
    message = str(info.value)
    assert "\n" not in message
    for pattern in patterns[1:]:
        assert re.search(pattern, message), message
    return message


def at(name: str, number: int) -> str:
    return rf"^{re.escape(name)} line {number}: "


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail, rather than hang, when a read blocks (pytest-timeout is not installed)."""

    def expire(signum, frame):
        raise TimeoutError("the read blocked")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---- the committed captures still read ----
def test_the_committed_fixture_reads():
    text = gzip.decompress((CLEAN / EVENTS).read_bytes())
    lines = [json.loads(line) for line in text.splitlines()]
    (proc,) = read_capture(CLEAN)
    assert proc.events_file == EVENTS and proc.ended == (lines[-1]["ev"] == "exit")
    assert len(proc.kernels()) == sum(e["ev"] == "kernel" for e in lines)
    assert len(proc.snapshots) == sum(e["ev"] == "snapshot" for e in lines)
    assert all(not s.values.flags.writeable for s in proc.snapshots)
    scale = proc.kernels(SCALE_KERNEL)[0]
    event = lines[scale.line - 1]
    assert event["seq"] == scale.seq and event["name"] == SCALE_KERNEL


def test_a_capture_without_the_exit_event_reads_as_not_ended(cap):
    """As the fixtures recorded before the exit event existed: the audit, not the reader, calls
    such a capture incomplete."""
    (proc,) = read_capture(cap.folder)
    assert not proc.ended and proc.kernels()


@pytest.mark.parametrize("legacy", [False, True], ids=["after-its-launch", "by-its-own-seq"])
def test_a_step_start_snapshot_names_the_launch_it_was_taken_at(cap, legacy):
    """The recorder writes it after the launch, naming it; recorders before the exit event wrote
    it before the launch, named by its own seq: that launch is the one that follows."""
    _, launch = cap.step_start(legacy)
    (proc,) = read_capture(cap.folder)
    (start,) = [s for s in proc.snapshots if s.when == "step_start"]
    assert start.launch == launch and launch in {r.seq for r in proc.kernels()}


def test_a_step_start_snapshot_by_its_own_seq_that_no_launch_follows_is_refused(cap):
    number, _ = cap.step_start(legacy=True)
    del cap.lines[number:]  # the process ended right after it
    cap.save()
    refused(cap.folder, at(EVENTS, number) + "a step_start snapshot that no kernel launch follows")


# ---- the end of the process ----
def test_the_exit_event_as_the_last_line_marks_the_process_ended(cap):
    cap.append_exit()
    (proc,) = read_capture(cap.folder)
    assert proc.ended


def test_an_exit_event_that_is_not_the_last_leaves_the_process_not_ended(cap):
    cap.append_exit()
    last = cap.event(len(cap.lines))
    note = {"ev": "note", "seq": last["seq"] + 1, "tid": last["tid"], "msg": "after exit"}
    cap.lines.append(json.dumps(note))
    cap.save()
    (proc,) = read_capture(cap.folder)
    assert not proc.ended


def test_an_exit_event_of_another_pid_is_refused(cap):
    number = cap.append_exit(pid=PID + 1)
    refused(cap.folder, at(EVENTS, number) + rf'"pid" {PID + 1} is not the pid {PID}')


# ---- lines that are not JSON objects ----
def test_bytes_that_are_not_utf8_are_refused(cap):
    number = cap.first_of("note")
    cap.lines[number - 1] = cap.lines[number - 1].replace("cublas", "\udcff")
    data = "\n".join(cap.lines).encode("utf-8", "surrogateescape") + b"\n"
    cap.write_bytes(data)
    refused(cap.folder, at(EVENTS, number) + "not UTF-8")


@pytest.mark.parametrize("line", ["[1, 2]", "42", '{"ev": "note", "seq": 9,', "", "{} {}"])
def test_a_line_that_is_no_json_object_is_refused(cap, line):
    number = cap.edit(100, lambda e: line)
    refused(cap.folder, at(EVENTS, number) + "not a JSON object")


def test_a_last_line_cut_off_reads_what_came_before_and_says_where(plain):
    """A process killed while the recorder wrote a line: a faithful record up to that line,
    which the audit calls incomplete (exit 1), never refuses."""
    data = ("\n".join(plain.lines)).encode()
    plain.write_bytes(data[:-20])
    (proc,) = read_capture(plain.folder)
    assert proc.cut_off == f"{plain.name} line {len(plain.lines)}"
    assert not proc.ended
    kept = sum('"ev":"kernel"' in line for line in plain.lines[:-1])
    assert len(proc.kernels()) == kept


def test_a_last_line_without_its_newline_that_parses_whole_reads(plain):
    plain.write_bytes(("\n".join(plain.lines)).encode())
    (proc,) = read_capture(plain.folder)
    assert len(proc.kernels()) == sum('"ev":"kernel"' in line for line in plain.lines)


def test_a_gzip_stream_cut_off_is_refused(cap):
    data = cap.path.read_bytes()
    cap.path.write_bytes(data[: len(data) // 2])
    refused(cap.folder, rf"^{re.escape(EVENTS)} line \d+: ", "cut off")


def test_a_line_longer_than_a_megabyte_is_refused(cap):
    number = cap.edit(cap.first_of("note"), lambda e: e | {"msg": "x" * (1 << 20)})
    refused(cap.folder, at(EVENTS, number) + "longer than")


def test_nesting_deeper_than_the_parser_goes_is_refused(cap):
    number = cap.edit(50, lambda e: "[" * 200_000 + "]" * 200_000)
    refused(cap.folder, at(EVENTS, number) + "not a JSON object")


# ---- keys ----
def without(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda e: {k: v for k, v in e.items() if k not in keys}


def _line_of(cap: Capture, kind: str) -> int:
    return cap.append_exit() if kind == "exit" else cap.first_of(kind)


@pytest.mark.parametrize(("kind", "key"), KIND_KEYS, ids=[f"{k}-{v}" for k, v in KIND_KEYS])
def test_every_key_of_every_event_kind_is_required(cap, kind, key):
    number = cap.edit(_line_of(cap, kind), without(key))
    refused(cap.folder, at(EVENTS, number) + f'"{key}" is missing')


@pytest.mark.parametrize(("kind", "key"), KIND_KEYS, ids=[f"{k}-{v}" for k, v in KIND_KEYS])
def test_every_key_of_every_event_kind_must_have_its_json_type(cap, kind, key):
    wrong = 1 if key == "param_info" else True  # a JSON true is no integer, string or list
    number = cap.edit(_line_of(cap, kind), lambda e: e | {key: wrong})
    refused(cap.folder, at(EVENTS, number) + f'"{key}" must be')


@pytest.mark.parametrize("key", ["pointer_mode", "alpha_bits", "beta_bits"])
def test_the_bits_a_cublas_line_carries_must_be_integers(cap, key):
    number = cap.edit(cap.first(lambda e: "alpha_bits" in e), lambda e: e | {key: "1"})
    refused(cap.folder, at(EVENTS, number) + f'"{key}" must be an integer')


def test_an_unknown_event_kind_is_refused(cap):
    number = cap.edit(cap.first_of("note"), lambda e: e | {"ev": "launch"})
    refused(cap.folder, at(EVENTS, number) + "unknown event kind 'launch'")


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("snapshot", "count", -1),
        ("snapshot", "elements", 2**41),
        ("snapshot", "offset", -4),
        ("snapshot", "offset", 2**50),
        ("snapshot", "skip_col", -2),
        ("memset", "bytes", -4),
        ("copy", "bytes", 2**41),
        ("alloc", "bytes", 2**64),
        ("memset", "dst", -1),
        ("kernel", "grid", [1, -1, 1]),
        ("kernel", "params", [[-8, 0]]),
        ("kernel", "params", [[4, 2**40]]),
        ("kernel", "params", [[8, 0]] * 65),
        ("snapshot", "when", "later"),
        ("snapshot", "hash", "e92a600da14f604"),
        ("init", "pid", -PID),
    ],
)
def test_negative_or_absurd_values_are_refused(cap, kind, key, value):
    number = cap.edit(cap.first_of(kind), lambda e: e | {key: value})
    refused(cap.folder, at(EVENTS, number) + f'"{key}" ')


def test_a_snapshot_of_more_values_than_elements_is_refused(cap):
    number = cap.edit(cap.first_of("snapshot"), lambda e: e | {"count": e["elements"] + 1})
    refused(cap.folder, at(EVENTS, number) + r'"count" \d+ is more than its "elements"')


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"rows": 0}, r'"rows" 0 times "ld" \d+ is not its "elements" \d+'),
        ({"ld": 2}, r'"rows" \d+ times "ld" 2 is not its "elements" \d+'),
        ({"skip_col": 49}, r'"skip_col" 49 is no column of rows of 49 elements'),
    ],
)
def test_a_snapshot_whose_walk_is_not_its_elements_is_refused(cap, edit, expected):
    """rows x ld is the walk the recorder hashed: a region of rows 0 (or another stride, or a
    skipped column past its rows) claims other elements than it hashed."""
    number = cap.first(lambda e: e["ev"] == "snapshot" and e["region"] == "body")
    event = cap.event(number)
    assert event["rows"] * event["ld"] == event["elements"] and event["ld"] > 5
    cap.edit(number, lambda e: e | edit)
    refused(cap.folder, at(EVENTS, number) + expected)


# ---- order and references ----
def test_seqs_that_do_not_increase_are_refused(cap):
    number = 200
    before = cap.event(number - 1)["seq"]
    cap.edit(number, lambda e: e | {"seq": before})
    expected = f'"seq" {before} is not above {before}, the seq of line {number - 1}'
    refused(cap.folder, at(EVENTS, number) + expected)


def test_a_snapshot_of_no_launch_before_it_is_refused(cap):
    number = cap.first_of("snapshot")
    later = cap.event(cap.first_of("kernel", POLYAK_KERNEL))["seq"]
    cap.edit(number, lambda e: e | {"launch": later})
    refused(cap.folder, at(EVENTS, number) + f"a snapshot of launch {later}: no kernel launch")


def test_a_snapshot_naming_a_gemm_instead_of_a_kernel_is_refused(cap):
    number = cap.first_of("snapshot")
    gemm = cap.event(cap.first_of("cublas"))["seq"]
    cap.edit(number, lambda e: e | {"launch": gemm})
    refused(cap.folder, at(EVENTS, number) + f"a snapshot of launch {gemm}: no kernel launch")


# ---- the snapshots file ----
def _snapshot_end(cap: Capture, number: int) -> int:
    event = cap.event(number)
    return event["offset"] + 4 * event["count"]


def test_a_snapshots_file_shorter_than_its_events_say_is_refused(cap):
    snaps = cap.folder / SNAPSHOTS
    last = max(
        (i for i, line in enumerate(cap.lines, 1) if '"ev":"snapshot"' in line),
        key=lambda i: _snapshot_end(cap, i),
    )
    size = _snapshot_end(cap, last) - 4  # one value short
    snaps.write_bytes(gzip.compress(gzip.decompress(snaps.read_bytes())[:size]))
    pattern = rf"^{re.escape(SNAPSHOTS)}: {size} bytes, but {re.escape(EVENTS)} line {last} "
    refused(cap.folder, pattern)


def test_a_plain_snapshots_file_cut_short_is_refused(plain):
    snaps = plain.folder / PLAIN_SNAPSHOTS
    size = snaps.stat().st_size
    os.truncate(snaps, 100)
    pattern = rf"^{re.escape(PLAIN_SNAPSHOTS)}: 100 bytes, but {re.escape(PLAIN_EVENTS)} line"
    message = refused(plain.folder, pattern)
    assert size > 100 and "cut off" in message


@pytest.mark.parametrize("gzipped", [True, False], ids=["gzipped", "plain"])
def test_a_snapshot_a_terabyte_into_the_file_is_refused_without_reading_it(tmp_path, gzipped):
    capture = Capture(tmp_path, plain=not gzipped)
    number = capture.edit(capture.first_of("snapshot"), lambda e: e | {"offset": 2**40})
    name = re.escape(SNAPSHOTS if gzipped else PLAIN_SNAPSHOTS)
    if gzipped:  # a fixture is decompressed into memory: never a terabyte of it
        refused(capture.folder, rf"^{name}: its events read \d+ bytes of it: .* gunzip it")
    else:  # a plain file is mapped: the events point past its end
        refused(capture.folder, rf"^{name}: \d+ bytes, but .* line {number} .* cut off")


def test_snapshot_values_without_a_snapshots_file_are_refused(cap):
    (cap.folder / SNAPSHOTS).unlink()
    number = cap.first(lambda e: e["ev"] == "snapshot" and e["count"] > 0)
    refused(cap.folder, at(EVENTS, number) + "snapshot values at bytes .* no snapshots file")


def test_plain_snapshot_values_are_read_only_views_of_the_mapped_file(plain):
    (proc,) = read_capture(plain.folder)
    kept = [s for s in proc.snapshots if s.values.size]
    data = np.fromfile(plain.folder / PLAIN_SNAPSHOTS, dtype="<f4")
    assert kept and all(not s.values.flags.owndata and not s.values.flags.writeable for s in kept)
    bases = {id(s.values.base) for s in kept}
    assert len(bases) == 1  # one mapping of the file, every region a view into it
    first = kept[0]
    assert np.array_equal(first.values, data[: first.values.size])


# ---- undecoded launches ----
@pytest.mark.parametrize(
    ("params", "why"),
    [
        (None, '"params" is null'),
        ([[8, 1], [8, 2], [4, 64], [4, 49], [4, 48]], "5 parameters of sizes"),
        ([[8, 1], [8, 2], [8, 64], [4, 49], [4, 48], [4, 393]], r"sizes \[8, 8, 8, 4, 4, 4\]"),
    ],
    ids=["runtime-launch", "count", "sizes"],
)
def test_an_abi_launch_whose_arguments_were_not_decoded_is_refused(cap, params, why):
    number = cap.edit(cap.first_of("kernel", SCALE_KERNEL), lambda e: e | {"params": params})
    refused(cap.folder, at(EVENTS, number) + f"{SCALE_KERNEL} launch .*{why}")


def test_a_runtime_launch_of_another_kernel_is_kept_undecoded(cap):
    number = cap.edit(cap.first_of("kernel"), lambda e: e | {"params": None})
    (proc,) = read_capture(cap.folder)
    (record,) = [r for r in proc.records if r.line == number]
    assert not record.decoded


def _sgemm_lines(cap: Capture) -> tuple[int, list[int]]:
    header = cap.first(lambda e: "cublasSgemm_v2" in e.get("msg", ""))
    body = []
    for n in range(header + 1, len(cap.lines) + 1):
        e = cap.event(n)
        if e["ev"] != "cublas" or e["msg"].startswith("I! "):
            break
        body.append(n)
    return header, body


@pytest.mark.parametrize("arg", ["transa", "m", "k", "lda", "ldc", "A", "C", "alpha", "beta"])
def test_an_sgemm_whose_log_lacks_an_argument_is_refused(cap, arg):
    header, body = _sgemm_lines(cap)
    (number,) = [n for n in body if f"i!  {arg}:" in cap.event(n)["msg"]]
    del cap.lines[number - 1]
    cap.save()
    missing = f"{arg} bits" if arg in ("alpha", "beta") else arg
    refused(cap.folder, at(EVENTS, header) + f"cublasSgemm_v2 call: its log gives no {missing}")


def test_an_sgemm_without_alpha_bits_in_device_pointer_mode_reads(cap):
    header, body = _sgemm_lines(cap)
    for n in body:
        if "alpha_bits" in cap.lines[n - 1] or "beta_bits" in cap.lines[n - 1]:
            cap.edit(n, lambda e: without("alpha_bits", "beta_bits")(e) | {"pointer_mode": 1})
    (proc,) = read_capture(cap.folder)
    first = next(r for r in proc.records if r.kind == "sgemm")
    assert first.line == header and first.args["alpha"] is None and first.args["beta"] is None


def test_an_sgemm_with_an_unparsed_size_is_refused(cap):
    header, body = _sgemm_lines(cap)
    (number,) = [n for n in body if "i!  m:" in cap.event(n)["msg"]]
    cap.edit(number, lambda e: e | {"msg": "i!  m: type=int; val=-64\n"})
    refused(cap.folder, at(EVENTS, header) + "cublasSgemm_v2 call: m -64 is no int")


def test_another_gemm_stays_recorded_as_gemm_without_every_argument(cap):
    header, body = _sgemm_lines(cap)
    cap.edit(header, lambda e: e | {"msg": e["msg"].replace("cublasSgemm_v2", "cublasGemmEx")})
    del cap.lines[body[-1] - 1]
    cap.save()
    (proc,) = read_capture(cap.folder)
    (record,) = [r for r in proc.records if r.line == header]
    assert record.kind == "gemm" and record.name == "cublasGemmEx"


def test_cublas_arguments_without_their_call_are_refused(cap):
    header, _ = _sgemm_lines(cap)
    del cap.lines[header - 1]
    cap.save()
    refused(cap.folder, at(EVENTS, header) + "cuBLAS log arguments without")


def test_records_keep_no_cublas_log_text(cap):
    (proc,) = read_capture(cap.folder)
    for r in proc.records:
        assert not any(isinstance(v, str) and "i!" in v for v in r.args.values())


# ---- paths that are not regular files, and files that cannot be read ----
def test_an_events_fifo_is_refused_without_blocking(plain, deadline):
    plain.path.unlink()
    os.mkfifo(plain.path)
    refused(plain.folder, rf"^{re.escape(PLAIN_EVENTS)}: {FIFO_REFUSED}")


def test_a_snapshots_fifo_is_refused_without_blocking(plain, deadline):
    snaps = plain.folder / PLAIN_SNAPSHOTS
    snaps.unlink()
    os.mkfifo(snaps)
    refused(plain.folder, rf"^{re.escape(PLAIN_SNAPSHOTS)}: {FIFO_REFUSED}")


def test_a_manifest_fifo_is_refused_without_blocking(cap, deadline):
    (cap.folder / "manifest.json").unlink()
    os.mkfifo(cap.folder / "manifest.json")
    with pytest.raises(UsageError, match=rf"^manifest[.]json: {FIFO_REFUSED}"):
        read_manifest(cap.folder)


def test_a_directory_named_like_an_events_file_is_refused(cap):
    (cap.folder / "events-9.jsonl").mkdir()
    refused(cap.folder, r"^events-9[.]jsonl: a directory, not a regular file$")


def test_a_device_named_like_an_events_file_is_refused(cap, deadline):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    (cap.folder / "events-9.jsonl").symlink_to("/dev/zero")
    refused(cap.folder, r"^events-9[.]jsonl: a character device, not a regular file$")


def test_two_events_files_of_one_process_are_refused(cap):
    shutil.copy(cap.path, cap.folder / PLAIN_EVENTS)
    refused(cap.folder, "two events files of one process")


def test_an_events_file_not_named_by_a_pid_is_refused(cap):
    shutil.copy(cap.path, cap.folder / f"{PLAIN_EVENTS}.orig")
    refused(cap.folder, rf"^{re.escape(PLAIN_EVENTS)}[.]orig: not a capture file name")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_events_file_without_read_permission_is_refused(cap):
    cap.path.chmod(0)
    try:
        refused(cap.folder, rf"^{re.escape(EVENTS)}: cannot read it \(Permission denied\)")
    finally:
        cap.path.chmod(0o644)


def test_an_os_error_opening_a_file_is_one_line_naming_it(cap, monkeypatch):
    """As a permission error reads to a user that is not root."""
    real_open = os.open

    def denied(path, *args, **kwargs):
        if str(path).endswith(SNAPSHOTS):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    refused(cap.folder, rf"^{re.escape(SNAPSHOTS)}: cannot read it \(Permission denied\)$")


# ---- the manifest ----
def test_the_manifest_reads_the_command_and_its_exit_code(cap):
    manifest = read_manifest(cap.folder)
    assert isinstance(manifest, Manifest)
    assert manifest.command[1:3] == ["-m", "egf_audit.capture.standin"]
    assert (manifest.exit_code, manifest.layout, manifest.ended) == (0, "layout.json", "exited 0")
    assert manifest.raw["processes"][0]["pid"] == PID


def test_a_folder_without_a_manifest_has_none(cap):
    (cap.folder / "manifest.json").unlink()
    assert read_manifest(cap.folder) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"command": ["x"], "exit_code": true}', '"exit_code" must be an integer'),
        ('{"command": ["x"], "exit_code": "0"}', '"exit_code" must be an integer'),
        ('{"command": ["x"]}', '"exit_code" must be an integer'),
        ('{"command": "x", "exit_code": 0}', '"command" must be a list of strings'),
        ('{"command": ["x"], "exit_code": 0, "layout": 3}', '"layout" must be a string'),
    ],
)
def test_an_invalid_manifest_is_refused(cap, text, why):
    (cap.folder / "manifest.json").write_text(text)
    with pytest.raises(UsageError, match=rf"^manifest[.]json: {why}"):
        read_manifest(cap.folder)


def test_a_manifest_that_is_not_utf8_is_refused(cap):
    (cap.folder / "manifest.json").write_bytes(b'{"command": ["\xff"], "exit_code": 0}')
    with pytest.raises(UsageError, match=r"^manifest[.]json: not UTF-8"):
        read_manifest(cap.folder)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (0, "exited 0"),
        (1, "exited 1"),
        (128, "exited 128"),
        (-11, "died of signal 11 (SIGSEGV)"),
        (139, "died of signal 11 (SIGSEGV)"),
        (-9, "died of signal 9 (SIGKILL)"),
        (130, "died of signal 2 (SIGINT)"),
        (255, "exited 255"),
    ],
)
def test_a_non_zero_exit_is_worded_as_a_shell_words_it(code, words):
    assert exit_words(code) == words


# ---- the command line: exit 2, one line, no traceback ----
def _cli_refuses(folder: Path, tmp_path: Path, *patterns: str) -> None:
    result = CliRunner().invoke(
        app, ["run", "--capture", str(folder), "--out", str(tmp_path / "d.md")]
    )
    errors = [line for line in result.output.splitlines() if line.startswith("egf-audit: error:")]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1, result.output
    assert "Traceback" not in result.output
    for pattern in patterns:
        assert pattern in errors[0], errors[0]


def test_the_cli_refuses_a_line_that_is_not_utf8(cap, tmp_path):
    data = "\n".join(cap.lines).encode() + b"\n\xff\xfe\n"
    cap.write_bytes(data)
    _cli_refuses(cap.folder, tmp_path, f"{EVENTS} line {len(cap.lines) + 1}: not UTF-8")


def test_the_cli_refuses_a_missing_key(cap, tmp_path):
    number = cap.edit(cap.first_of("kernel", POLYAK_KERNEL), without("params"))
    _cli_refuses(cap.folder, tmp_path, f'{EVENTS} line {number}: "params" is missing')


def test_the_cli_refuses_an_events_fifo(plain, tmp_path, deadline):
    plain.path.unlink()
    os.mkfifo(plain.path)
    _cli_refuses(plain.folder, tmp_path, f"{PLAIN_EVENTS}: a FIFO (named pipe), not a regular file")


def test_the_cli_refuses_an_undecoded_abi_launch(cap, tmp_path):
    number = cap.edit(cap.first_of("kernel", SCALE_KERNEL), lambda e: e | {"params": None})
    _cli_refuses(cap.folder, tmp_path, f"{EVENTS} line {number}: {SCALE_KERNEL} launch")


def test_the_cli_refuses_an_invalid_manifest(cap, tmp_path):
    (cap.folder / "manifest.json").write_text('{"command": ["x"], "exit_code": null}')
    _cli_refuses(cap.folder, tmp_path, 'manifest.json: "exit_code" must be an integer')


def _cut_inside_a_gemm_log(cap: Capture) -> int:
    """Keep the events up to a GEMM's header and its first argument line: a process that died
    while cuBLAS logged that call. Returns how many lines are kept."""
    header = cap.first(lambda e: e["ev"] == "cublas" and "cublasSgemm_v2" in e["msg"])
    del cap.lines[header + 1 :]
    cap.save()
    return header + 1


def test_a_process_that_died_while_cublas_logged_a_call_reads_as_not_ended(cap):
    kept = _cut_inside_a_gemm_log(cap)
    (proc,) = read_capture(cap.folder)
    assert not proc.ended and len(cap.lines) == kept
    sgemms = sum(r.kind == "sgemm" for r in proc.records)
    logged = sum("cublasSgemm_v2" in line and '"I! ' in line for line in cap.lines)
    assert sgemms == logged - 1  # the call whose log was cut short is not recorded


def test_a_process_that_ended_with_a_call_logged_in_part_is_refused(cap):
    _cut_inside_a_gemm_log(cap)
    number = cap.append_exit()
    refused(cap.folder, r"cublasSgemm_v2 call: its log gives no ")
    assert number == len(cap.lines)
