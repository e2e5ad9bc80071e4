"""The capture reader's work is bounded by what its files really hold, and every byte a verdict
rests on is verified: gzipped files decompressed to their end (CRC and length) and never past
their cap, small JSON files parsed with nesting and numbers bounded, the layout file read as
`--config` is, a process's notes and a cuBLAS call's lines capped, a launch's regions spelled
out only inside its allocation, allocations found in O(log n). Each limit: one line, exit 2."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from capture_folders import write_manifest
from test_capture_files import EVENTS, SNAPSHOTS, Capture, refused

from egf_audit.capture import files
from egf_audit.capture.events import MAX_CALL_LINES, MAX_NOTES
from egf_audit.capture.files import gunzip_small, parse_json
from egf_audit.capture.layout import load_layout_file
from egf_audit.cli.capture_audit import audit_capture
from egf_audit.errors import UsageError
from egf_audit.invariants.capture_common import mix64_hex, zeros_hash
from egf_audit.trace.allocations import Allocation, AllocationIndex
from egf_audit.trace.contract import SCALE_KERNEL
from egf_audit.trace.spans import MAX_BOX_ROWS, Spans, Unbounded, box_ranges

DATA = Path(__file__).parent / "data" / "capture"


@pytest.fixture
def cap(tmp_path: Path) -> Capture:
    return Capture(tmp_path)


def _gzip_trailer(data: bytes, at: int) -> bytes:
    """`data` (a gzip member) with one bit of its trailer flipped: 0 the CRC, 4 the length."""
    out = bytearray(data)
    out[len(out) - 8 + at] ^= 1
    return bytes(out)


# ---- every gzipped byte verified ----
@pytest.mark.parametrize("at", [0, 4], ids=["crc", "length"])
def test_a_snapshots_file_whose_trailer_lies_is_refused_though_its_first_bytes_read(
    cap, at, monkeypatch
):
    """The events read the first bytes of the file only; its end is checked all the same (read
    4 KiB at a time here, so the trailer lies well past what the events need)."""
    monkeypatch.setattr(files, "GUNZIP_CHUNK", 4096)
    path = cap.folder / SNAPSHOTS
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(data + bytes(1 << 20)))  # the events read none of the tail
    path.write_bytes(_gzip_trailer(path.read_bytes(), at))
    refused(cap.folder, rf"^{re.escape(SNAPSHOTS)}: cannot read it \(")


def test_a_flipped_byte_in_the_deflate_stream_is_refused(cap):
    path = cap.folder / SNAPSHOTS
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF
    path.write_bytes(bytes(data))
    refused(cap.folder, rf"^{re.escape(SNAPSHOTS)}: ")


def test_a_gzipped_file_that_expands_past_its_cap_is_refused(cap, monkeypatch):
    """Its events read less than the cap; what follows is decompressed (to check the CRC) and
    dropped, up to the cap and no further."""
    path = cap.folder / SNAPSHOTS
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()) + bytes(2 << 20)))
    monkeypatch.setattr(files, "MAX_GUNZIPPED_BYTES", 3 << 19)
    refused(cap.folder, rf"^{re.escape(SNAPSHOTS)}: it expands to more than 1572864 bytes")


def test_a_gzipped_events_file_that_expands_past_its_cap_is_refused(cap, monkeypatch):
    monkeypatch.setattr(files, "MAX_GUNZIPPED_BYTES", 1 << 16)
    refused(cap.folder, rf"^{re.escape(EVENTS)}: it expands to more than 65536 bytes")


def test_a_small_gzipped_file_is_expanded_to_its_cap_at_most():
    bomb = gzip.compress(bytes(1 << 24))
    with pytest.raises(ValueError, match="expands to more than 65536 bytes"):
        gunzip_small(bomb, 1 << 16)
    with pytest.raises(ValueError, match="cut off"):
        gunzip_small(gzip.compress(b"[1, 2, 3]" * 100)[:30], 1 << 16)
    with pytest.raises(ValueError, match="no whole gzip file"):
        gunzip_small(_gzip_trailer(gzip.compress(b"{}"), 0), 1 << 16)
    assert gunzip_small(gzip.compress(b"{}"), 1 << 16) == b"{}"


# ---- small JSON files: nesting and numbers bounded ----
@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested 100000 deep"),
        (b'{"tau": 1' + b"0" * 400 + b"}", "an integer of 401 digits"),
        (b'{"tau": 1e999}', "the number 1e999 is out of range"),
        (b'{"tau": NaN}', "NaN is no JSON number"),
        (b'{"tau": -Infinity}', "-Infinity is no JSON number"),
        (b'{"a": 1} {"b": 2}', "Extra data"),
    ],
)
def test_small_json_is_parsed_with_its_nesting_and_numbers_bounded(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_json(text)


def test_brackets_inside_strings_are_no_nesting():
    assert parse_json(b' {"name": "[[[[[[{{{{", "n": [1, [2]]}\n') == {
        "name": "[[[[[[{{{{",
        "n": [1, [2]],
    }


# ---- the layout file, read as --config is ----
def _layout(tmp_path: Path) -> Path:
    path = tmp_path / "layout.json"
    path.write_bytes(gzip.decompress((DATA / "clean" / "layout.json.gz").read_bytes()))
    return path


def test_a_layout_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "layout.json"
    os.mkfifo(path)
    with pytest.raises(
        UsageError, match=r"layout file .* is a FIFO \(named pipe\), not a regular file"
    ):
        load_layout_file(path)


def test_a_layout_file_larger_than_its_cap_is_refused_unread(tmp_path):
    path = tmp_path / "layout.json"
    with path.open("wb") as f:
        f.truncate(2 << 30)  # sparse: never read
    with pytest.raises(UsageError, match=r"holds 2147483648 bytes or more; a layout file may hold"):
        load_layout_file(path)


def test_a_gzipped_layout_bomb_is_refused(tmp_path):
    path = tmp_path / "layout.json.gz"
    path.write_bytes(gzip.compress(b" " * (64 << 20)))
    with pytest.raises(UsageError, match=r"is not JSON: it expands to more than 16777216 bytes"):
        load_layout_file(path)


def test_a_layout_tau_of_ten_to_the_400_is_one_line(tmp_path):
    path = _layout(tmp_path)
    path.write_text(re.sub(r'"tau": [0-9.e-]+', '"tau": 1' + "0" * 400, path.read_text()))
    with pytest.raises(UsageError, match=r"is not JSON: an integer of 401 digits"):
        load_layout_file(path)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["dims"].update(B=2**31), r"dims\.B = 2147483648 is not a valid size"),
        (lambda d: d["dims"].update(A=[3] * 65), r"dims\.A = .* is not a valid size"),
        (lambda d: d["dims"].update(tau=True), r"dims\.tau = True is not a valid size"),
        (lambda d: d["buffers"]["d_h_s2"].update(address=4096), r"lies at 4096 with \d+ bytes"),
        (lambda d: d["buffers"]["d_h_s2"].update(address=(1 << 48) - 8), r"outside the process"),
        (
            lambda d: d["buffers"]["d_h_s2"].update(bytes=1 << 41),
            r"needs integer address and bytes",
        ),
        (
            lambda d: d["buffers"]["sn_state"]["tensors"].update(v_b0fc=[8, 1, 49]),
            "tensors u_b0fc and v_b0fc of buffers.sn_state overlap",
        ),
        (
            lambda d: d["param_offsets"].update(w_copy=d["param_offsets"]["w_b0fc"]),
            "of param_offsets overlap",
        ),
        (
            lambda d: d["buffers"]["sn_state"].update(views={"u_b0fc": [0, 1, 32]}),
            "names u_b0fc both as a tensor and as a view",
        ),
        (
            lambda d: d["buffers"]["sn_state"].update(views={"all": [0, 1, 10**6]}),
            "tensor all of buffers.sn_state does not fit",
        ),
        (
            lambda d: d["buffers"].update({"x" * 257: {"address": 1 << 40, "bytes": 4}}),
            "has a name of 257 characters",
        ),
        (
            lambda d: d["buffers"].update({"": {"address": 1 << 40, "bytes": 4}}),
            "has a name of 0 characters",
        ),
    ],
)
def test_a_layout_value_outside_its_domain_is_refused(tmp_path, edit, says):
    path = _layout(tmp_path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=says):
        load_layout_file(path)


def test_a_view_may_overlap_the_tensors_it_names_again(tmp_path):
    path = _layout(tmp_path)
    doc = json.loads(path.read_text())
    doc["buffers"]["sn_state"]["views"] = {"uv": [0, 1, 81], "u_again": [0, 1, 32]}
    path.write_text(json.dumps(doc))
    sn = load_layout_file(path).buffers["sn_state"]
    assert list(sn.tensors)[-2:] == ["uv", "u_again"]  # tensors first: a pointer finds u_b0fc
    layout = load_layout_file(path)
    assert layout.tensor_at(sn, 0)[0] == "u_b0fc"


# ---- caps on what a process may hold ----
def _insert_before_exit(cap: Capture, lines: list[dict]) -> None:
    last = cap.event(len(cap.lines))
    for i, e in enumerate(lines, 1):
        cap.lines.append(json.dumps(e | {"seq": last["seq"] + i, "tid": last["tid"]}))
    cap.save()


def test_more_notes_than_a_recorder_writes_are_refused(cap):
    _insert_before_exit(cap, [{"ev": "note", "msg": f"note {i}"} for i in range(MAX_NOTES + 1)])
    refused(cap.folder, rf"more than {MAX_NOTES} notes in one process")


def test_a_cublas_call_logged_in_too_many_lines_is_refused(cap):
    header = {
        "ev": "cublas",
        "msg": "I! cuBLAS (v13) function cublasStatus_t cublasSgemm_v2(x) called:\n",
    }
    args = [
        {"ev": "cublas", "msg": f"i!  x{i}: type=int; val={i}\n"} for i in range(MAX_CALL_LINES)
    ]
    _insert_before_exit(cap, [header, *args])
    refused(cap.folder, rf"a cuBLAS call \(line \d+\) logged in more than {MAX_CALL_LINES} lines")


# ---- a launch's regions inside its allocation ----
def test_a_box_is_spelled_out_only_inside_its_window():
    base = 0x7F00_0000_0000
    rows = box_ranges(base, (48, 2**31 - 1, 1, 49), window=(base, base + 12544))
    assert len(rows) == 64 and rows[0] == (base + 192, base + 196) and rows[-1][1] <= base + 12544
    with pytest.raises(Unbounded, match=f"more than {MAX_BOX_ROWS}"):
        box_ranges(base, (48, 2**31 - 1, 1, 49))  # no allocation to bound it


def test_box_rows_walked_backwards_are_the_same_rows():
    forward = Spans.of(box_ranges(1 << 20, (0, 5, 2, 8)))
    backward = Spans.of(box_ranges((1 << 20) + 4 * 32, (0, 5, 2, -8)))
    assert forward == backward


def test_a_scale_launch_of_2_31_rows_is_judged_in_bounded_work(cap):
    """rows = 2**31 - 1 against a 12 KiB buffer: EGF008 and EGF001 fail it, without 11 GB."""
    number = cap.first_of("kernel", SCALE_KERNEL)
    rows = [4, 2**31 - 1]
    cap.edit(number, lambda e: e | {"params": [*e["params"][:2], rows, *e["params"][3:]]})
    cap.append_exit()
    audit = audit_capture(write_manifest(cap.folder))
    assert {"EGF001", "EGF008"} <= audit.failed_codes()


# ---- allocations found in O(log n) ----
def test_the_allocation_index_finds_every_holder_in_the_order_made():
    rng = np.random.default_rng(7)
    made = [
        Allocation(int(a), int(n), i)
        for i, (a, n) in enumerate(
            zip(rng.integers(0, 4096, 400), rng.integers(0, 300, 400), strict=True)
        )
    ]
    index = AllocationIndex(made)
    for pointer in range(0, 4400, 7):
        want = [i for i, a in enumerate(made) if a.holds(pointer)]
        assert index.holding(pointer) == want


def test_zeros_are_hashed_a_chunk_at_a_time():
    for n in (0, 1, 3, (1 << 20) + 5):
        assert zeros_hash(n, "mix64") == mix64_hex(np.zeros(n, np.float32))


def test_a_gzip_stream_of_two_members_reads_as_one_file():
    """gzip allows members one after another (`cat a.gz b.gz`): both are read, each checked."""
    both = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert gunzip_small(both, 16) == b"abcd"
    with pytest.raises(ValueError, match="no whole gzip file"):
        gunzip_small(gzip.compress(b"ab") + _gzip_trailer(gzip.compress(b"cd"), 0), 16)


def test_a_launchs_declared_region_is_spelled_out_inside_its_allocation(cap):
    """declared() with the capture: the scale's rows = 2**31 - 1 give the rows of its
    allocation only (a column of 64 rows in the 12 KiB dX concat, not 2**31 of them)."""
    from egf_audit.capture.convert import to_trace
    from egf_audit.capture.events import read_capture
    from egf_audit.capture.inference import infer_layout
    from egf_audit.trace.spans import declared

    number = cap.first_of("kernel", SCALE_KERNEL)
    rows = [4, 2**31 - 1]
    cap.edit(number, lambda e: e | {"params": [*e["params"][:2], rows, *e["params"][3:]]})
    (proc,) = read_capture(cap.folder)
    ct = to_trace(proc, infer_layout(proc), "p")
    scale = next(
        r for r in ct.capture.records if r.name == SCALE_KERNEL and r.args["rows"] == 2**31 - 1
    )
    held = ct.capture.live_holder(scale.args["dx_concat"], scale.seq)
    writes = declared(scale, "w", ct)
    assert held is not None and 0 < len(writes.ranges) <= held.bytes // (4 * scale.args["ld"]) + 1
    assert writes.ranges[-1][1] <= held.address + held.bytes
    with pytest.raises(Unbounded):
        declared(scale, "w")  # without the capture, nothing bounds it: refused, not built


def test_a_dw_gemm_whose_reads_cannot_be_spelled_out_is_unplaced_not_a_crash(cap):
    """EGF002 on a capture whose dW w_b0fc GEMM reads a box of 2**21 separate rows outside
    every allocation: that GEMM is unplaced (what it reads is unknown), and the audit
    completes (it raised, an internal error)."""
    layout = json.loads(gzip.decompress((cap.folder / "layout.json.gz").read_bytes()))
    grad = layout["buffers"]["grad_buf"]
    dw = grad["address"] + 4 * grad["tensors"]["w_b0fc"][0]
    c_line = cap.first(lambda e: e["ev"] == "cublas" and f"0x0x{dw:x})" in e["msg"])
    header = max(n for n in range(1, c_line) if "cublasSgemm_v2(" in cap.event(n).get("msg", ""))
    edits = {  # A: k = 2**21 rows of 49 at a row stride of 64, where no allocation lies
        "k": "int; val=2097152",
        "lda": "int; val=64",
        "A": "float; val=POINTER (IN HEX:0x0x100000000000)",
    }
    for n in range(header + 1, c_line):
        for arg, value in edits.items():
            if f"i!  {arg}:" in cap.event(n)["msg"]:
                cap.edit(n, lambda e, a=arg, v=value: e | {"msg": f"i!  {a}: type={v}\n"})
    cap.append_exit()
    audit = audit_capture(write_manifest(cap.folder))
    verdict = dict(audit.processes[0].verdicts)["EGF002"]
    assert verdict.status != "pass" and "2097152 separate rows" in json.dumps(verdict.evidence)


# ---- the layout's buffers found in O(log n + nesting) ----
def _linear(layout, ptr):
    """The innermost holder as the reader found it before: a walk down every buffer."""
    by = sorted(layout.buffers.values(), key=lambda b: (b.base, -b.size))
    below = [b for b in by if b.base <= ptr]
    for b in reversed(below):
        if b.contains(ptr):
            offset = ptr - b.base
            return None if offset % 4 else (b.name, offset // 4)
    return None


def test_a_pointer_resolves_to_its_innermost_buffer_as_a_walk_would_find_it():
    from egf_audit.trace.buffers import Buffer, CaptureLayout

    rng = np.random.default_rng(11)
    for _ in range(300):
        layout = CaptureLayout()
        for k in range(int(rng.integers(1, 9))):
            base, size = int(rng.integers(0, 50)) * 4, int(rng.integers(0, 20))
            layout.add(Buffer(f"b{k}", base, size, {}, "test"))
        for ptr in range(0, 300, 2):
            found = layout.resolve(ptr)
            assert (None if found is None else (found[0].name, found[1])) == _linear(layout, ptr)


def test_the_outermost_buffers_are_those_inside_no_other():
    from egf_audit.trace.buffers import Buffer, CaptureLayout

    layout = CaptureLayout()
    for name, base, size in (
        ("params", 0, 100),
        ("w", 40, 10),
        ("same", 0, 100),
        ("apart", 800, 4),
    ):
        layout.add(Buffer(name, base, size, {}, "test"))
    assert sorted(layout.outermost().buffers) == ["apart", "params", "same"]
