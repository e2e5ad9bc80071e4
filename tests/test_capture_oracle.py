"""EGF010 from a deep capture with values (invariants/capture_oracle.py) and the memory history
it reads (trace/memory_history.py): what the history knows and what it refuses to guess, and
the ways a values file can lie or be cut off, each a FAIL or a refusal (exit 2), never a pass.

The capture edited here is the runtime trainer's, captured --deep on the H200
(tests/data/capture/runtime/recorded/rt-deep-clean: small dims, 2 steps, 13 of 13 pass).
"""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from capture_folders import write_manifest

from egf_audit.capture.events import read_capture
from egf_audit.cli.capture_audit import audit_capture
from egf_audit.errors import UsageError
from egf_audit.invariants.registry import FAIL, PASS, UNDECIDED
from egf_audit.trace.memory_history import MemoryHistory, Request
from egf_audit.trace.model import Missing
from egf_audit.trace.process import Contents, Effect, ProcessCapture, Record

CLEAN = Path(__file__).parent / "data" / "capture" / "runtime" / "recorded" / "rt-deep-clean"


def _events() -> list[dict]:
    (path,) = CLEAN.glob("events-*.jsonl.gz")
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]


def _values() -> bytearray:
    (path,) = CLEAN.glob("values-*.bin.gz")
    return bytearray(gzip.decompress(path.read_bytes()))


def _pid() -> str:
    (path,) = CLEAN.glob("events-*.jsonl.gz")
    return path.name.split("-")[1].split(".")[0]


def _edited(
    tmp_path: Path,
    events: Callable[[list[dict]], list[dict]] = lambda e: e,
    values: Callable[[bytearray], bytes] = bytes,
) -> Path:
    """A copy of the capture with its events and its values file passed through the edits."""
    out = tmp_path / "edited"
    out.mkdir()
    for f in CLEAN.iterdir():
        if not f.name.startswith(("events-", "values-")):
            (out / f.name).write_bytes(f.read_bytes())
    lines = events(_events())
    text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in lines)
    (out / f"events-{_pid()}.jsonl").write_text(text)
    if any(e["ev"] == "init" and e.get("values") for e in lines):  # the recorder kept values
        (out / f"values-{_pid()}.bin").write_bytes(values(_values()))
    return write_manifest(out)


def _egf010(folder: Path):
    (process,) = audit_capture(folder).processes
    return dict(process.verdicts)["EGF010"]


def _grad_buf() -> tuple[int, int]:
    layout = json.loads(gzip.decompress((CLEAN / "layout.json.gz").read_bytes()))
    b = layout["buffers"]["grad_buf"]
    return b["address"], b["bytes"]


def _effects_into(events: list[dict], lo: int, hi: int) -> list[int]:
    """Indices of the effect events with a run that touches [lo, hi)."""
    return [
        i
        for i, e in enumerate(events)
        if e["ev"] == "effect" and any(a < hi and lo < a + n for a, n in e["changed"])
    ]


def test_the_recorded_capture_passes_the_oracle():
    v = _egf010(CLEAN)
    assert v.status == PASS
    assert set(v.evidence["steps"]) == {"process 1 step 0", "process 1 step 1"}


def test_a_value_changed_in_the_file_fails_the_oracle(tmp_path):
    """A lying values file: one float of a gradient GEMM's output in grad_buf moved by 1.0."""
    events = _events()
    lo, size = _grad_buf()
    i = _effects_into(events, lo, lo + size)[-1]
    at = events[i]["values"]

    def lie(values: bytearray) -> bytes:
        (x,) = struct.unpack_from("<f", values, at)
        struct.pack_into("<f", values, at, x + 1.0)
        return bytes(values)

    v = _egf010(_edited(tmp_path, values=lie))
    assert v.status == FAIL
    assert "disagree with the float64 model" in v.summary


def test_a_cut_off_values_file_fails_naming_it(tmp_path):
    v = _egf010(_edited(tmp_path, values=lambda b: bytes(b[: len(b) // 2])))
    assert v.status == FAIL
    problems = [p for step in v.evidence["steps"].values() for p in step.get("problems", [])]
    assert any("the values file ends at byte" in p for p in problems), problems


def test_a_change_without_its_bytes_makes_the_buffer_unknown(tmp_path):
    """An effect without "values" (the recorder's budget ran out): the bytes it changed in
    grad_buf are unknown until a later call writes them again, and the last GEMM of step 1
    that writes grad_buf is followed by none before the oracle reads it."""

    def drop(events: list[dict]) -> list[dict]:
        lo, size = _grad_buf()
        i = _effects_into(events, lo, lo + size)[-1]
        del events[i]["values"]
        return events

    v = _egf010(_edited(tmp_path, events=drop))
    assert v.status == FAIL
    problems = [p for step in v.evidence["steps"].values() for p in step.get("problems", [])]
    assert any("its bytes were not kept" in p for p in problems), problems


def test_a_call_without_its_effect_makes_memory_unknown_after_it(tmp_path):
    def drop(events: list[dict]) -> list[dict]:
        first = next(i for i, e in enumerate(events) if e["ev"] == "effect")
        return events[:first] + events[first + 1 :]

    v = _egf010(_edited(tmp_path, events=drop))
    assert v.status == FAIL
    assert "lack inputs" in v.summary


def test_no_values_is_undecided_saying_why(tmp_path):
    def strip(events: list[dict]) -> list[dict]:
        kept = [e for e in events if e["ev"] != "contents"]
        for e in kept:
            e.pop("values", None)
        return kept

    v = _egf010(_edited(tmp_path, events=strip))
    assert v.status == UNDECIDED
    assert v.summary.startswith("the deep capture kept no values")


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (  # values named by a capture whose init says it keeps none
            lambda es: [
                {k: v for k, v in e.items() if k != "values"} if e["ev"] == "init" else e
                for e in es
            ],
            "the init event does not say the capture records them",
        ),
        (  # an event's bytes overlap the ones before it
            lambda es: [
                {**e, "values": max(e["values"] - 4, 0)}
                if e["ev"] == "effect" and e["changed"]
                else e
                for e in es
            ],
            "never overlap them",
        ),
        (  # contents of no allocation
            lambda es: [{**e, "alloc": e["seq"]} if e["ev"] == "contents" else e for e in es],
            "no allocation of that seq without its contents comes before it",
        ),
        (  # contents outside their allocation
            lambda es: [
                {**e, "changed": [[2**40, 4]], "values": 0}
                if e["ev"] == "contents" and e["alloc"] == 4
                else e
                for e in es
            ],
            "outside its",
        ),
    ],
    ids=["values-without-init", "overlapping-values", "contents-of-nothing", "contents-outside"],
)
def test_a_malformed_values_event_is_refused(tmp_path, edit, words):
    folder = _edited(tmp_path, events=edit)
    with pytest.raises(UsageError, match=words):
        read_capture(folder)


# ---- the history itself, on a made-up process ----
def _process(records: list[Record], effects: list[Effect], contents: list[Contents], values: bytes):
    proc = ProcessCapture(1, {}, deep=True, values=True)
    proc.records = records
    proc.effects = {e.launch: e for e in effects}
    proc.contents = {c.alloc: c for c in contents}
    data = np.frombuffer(values, np.uint8)
    proc.read_values = lambda: data
    return proc


def _alloc(seq: int, dst: int, size: int) -> Record:
    return Record(
        seq, "alloc", "alloc", "cuMemAlloc_v2", {"dst": dst, "src": 0, "bytes": size, "value": 0}
    )


def _kernel(seq: int) -> Record:
    return Record(seq, "kernel", "k", "cuLaunchKernel", {})


def test_the_history_replays_contents_and_changes_exactly():
    base = 1 << 20
    ones = np.ones(2, "<f4").tobytes()
    twos = np.full(1, 2.0, "<f4").tobytes()
    proc = _process(
        [
            _alloc(0, base, 16),
            _kernel(2),
            _kernel(4),
            Record(6, "free", "free", "cuMemFree", {"dst": base, "src": 0, "bytes": 0, "value": 0}),
        ],
        [Effect(2, 1, 256, ((base + 4, 4),), 8), Effect(4, 1, 256, (), 12)],
        [Contents(0, ((base, 8),), 0)],
        ones + twos,
    )
    got = MemoryHistory(proc).read(
        [
            Request("made", 1, base, 16),
            Request("after-k", 3, base, 16),
            Request("after-free", 7, base, 16),
        ]
    )
    assert np.frombuffer(got["made"], "<f4").tolist() == [1.0, 1.0, 0.0, 0.0]
    assert np.frombuffer(got["after-k"], "<f4").tolist() == [1.0, 2.0, 0.0, 0.0]
    assert np.frombuffer(got["made"], "<u4")[2:].tolist() == [0, 0]  # +0.0: all bits clear
    assert isinstance(got["after-free"], Missing)
    assert "freed" in str(got["after-free"])


def test_the_history_never_guesses_memory_no_allocation_holds():
    proc = _process([_kernel(1)], [Effect(1, 0, 0, ())], [], b"")
    got = MemoryHistory(proc).read([Request("x", 2, 4096, 8)])
    assert isinstance(got["x"], Missing) and "no recorded allocation holds it" in str(got["x"])


def test_the_history_agrees_with_every_snapshot_region_it_knows():
    v = _egf010(CLEAN)
    assert v.evidence["snapshot_regions_agreeing"] > 0


def test_a_snapshot_that_contradicts_the_values_file_fails(tmp_path):
    """One float of a d_h_s2 snapshot changed, and its hash recomputed to match: the snapshots
    agree with themselves, not with the memory history."""
    from cpu_capture import mix64

    out = _edited(tmp_path)
    (snap_gz,) = CLEAN.glob("snapshots-*.bin.gz")
    snaps = bytearray(gzip.decompress(snap_gz.read_bytes()))
    events_path = out / f"events-{_pid()}.jsonl"
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    i = next(
        k
        for k, e in enumerate(events)
        if e["ev"] == "snapshot" and e["region"] == "d_h_s2" and e["count"] == e["elements"]
    )
    e = events[i]
    (x,) = struct.unpack_from("<f", snaps, e["offset"])
    struct.pack_into("<f", snaps, e["offset"], x + 1.0)
    kept = np.frombuffer(bytes(snaps[e["offset"] : e["offset"] + 4 * e["count"]]), "<f4")
    e["hash"] = f"{mix64(kept, e['ld'], e['skip_col']):016x}"
    events_path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in events))
    (out / snap_gz.name).unlink()
    (out / f"snapshots-{_pid()}.bin").write_bytes(bytes(snaps))
    v = _egf010(out)
    assert v.status == FAIL
    assert any("contradicts itself" in p for p in v.evidence["problems"]), v.evidence


def test_a_capture_that_ends_inside_a_step_fails(tmp_path):
    """The last step ran its backward and no polyak_ema (its Polyak dropped, with its effect and
    snapshots): it cannot be compared, so a lie in its gradients cannot pass unseen."""

    def cut(events: list[dict]) -> list[dict]:
        polyak = [e["seq"] for e in events if e["ev"] == "kernel" and "polyak_ema" in e["name"]]
        last = polyak[-1]
        return [e for e in events if e["seq"] != last and e.get("launch") != last]

    v = _egf010(_edited(tmp_path, events=cut))
    assert v.status == FAIL
    assert any("reached no polyak_ema" in p for p in v.evidence["problems"]), v.evidence


def test_a_new_allocation_packed_against_a_live_one_leaves_it_known():
    """A allocated at X with 128 bytes after B was allocated at X + 128 and written: the
    recorder compares A only up to B, so A's contents and its free say nothing about B."""
    x = 1 << 20
    seven = np.full(1, 7.0, "<f4").tobytes()
    proc = _process(
        [
            _alloc(0, x + 128, 256),
            _kernel(2),
            _alloc(4, x, 128),
            Record(6, "free", "free", "cuMemFree", {"dst": x, "src": 0, "bytes": 0, "value": 0}),
        ],
        [Effect(2, 1, 256, ((x + 128, 4),), 0)],
        [Contents(0, (), 0), Contents(4, (), 4)],
        seven,
    )
    got = MemoryHistory(proc).read([Request("b", 5, x + 128, 4), Request("b-after", 7, x + 128, 4)])
    assert np.frombuffer(got["b"], "<f4").tolist() == [7.0]
    assert np.frombuffer(got["b-after"], "<f4").tolist() == [7.0]
