"""`egf-audit capture --deep` on the CPU: the stand-in captured deep by the recorder's emulation
(tests/cpu_capture.py: after every launch, memset and copy, every buffer compared word by word
with a copy of it), then edited into lies. EGF013 must hold every observed change to what its
call may write and fail on each gap in the observation; the reader must refuse a malformed
effect. The fault catalogue captured deep is tests/test_capture_faults.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cpu_capture import PID, capture_standin

from egf_audit.cli.capture_audit import CaptureAudit, audit_capture
from egf_audit.errors import UsageError
from egf_audit.invariants.registry import FAIL, PASS, UNDECIDED
from egf_audit.trace.spans import Spans

EVENTS = f"events-{PID}.jsonl"


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return capture_standin(tmp_path_factory.mktemp("deep") / "clean", None, deep=True)


def _lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / EVENTS).read_text().splitlines()]


def without_values(events: list[dict]) -> list[dict]:
    """The events of a deep capture as a recorder that keeps no values writes them: no
    `contents` events, no "values" keys (an edit of the runs then needs no matching bytes)."""
    kept = [dict(e) for e in events if e["ev"] != "contents"]
    for e in kept:
        e.pop("values", None)
    return kept


def _edited(deep: Path, tmp_path: Path, edit, values: bool = False) -> Path:
    """A copy of the deep capture with its events passed through `edit` (a list in, a list
    out); without its values unless `values` (the values file then stays as it was)."""
    out = tmp_path / "edited"
    out.mkdir()
    for f in deep.iterdir():
        if f.name != EVENTS and (values or not f.name.startswith("values-")):
            (out / f.name).write_bytes(f.read_bytes())
    events = edit(_lines(deep) if values else without_values(_lines(deep)))
    text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
    (out / EVENTS).write_text(text)
    return out


def _verdict(audit: CaptureAudit, code: str):
    (process,) = audit.processes
    return dict(process.verdicts)[code]


def test_the_deep_capture_passes_and_observes_every_call(deep):
    audit = audit_capture(deep)
    assert audit.ok
    v = _verdict(audit, "EGF013")
    assert v.status == PASS
    events = _lines(deep)
    calls = [e for e in events if e["ev"] in ("kernel", "memset", "copy")]
    effects = [e for e in events if e["ev"] == "effect"]
    assert v.evidence["calls_observed"] == len(calls) == len(effects)
    assert v.evidence["bytes_changed"] > 0


def test_an_undeep_capture_leaves_egf013_undecided_with_the_reason(tmp_path):
    audit = audit_capture(capture_standin(tmp_path / "plain", None))
    v = _verdict(audit, "EGF013")
    assert v.status == UNDECIDED and v.summary.startswith("not a deep capture")
    assert _verdict(audit, "EGF002").status == PASS  # decided from the declared writes


def _first(events: list[dict], **match) -> int:
    return next(i for i, e in enumerate(events) if all(e.get(k) == v for k, v in match.items()))


def test_a_call_without_its_effect_fails(deep, tmp_path):
    def drop(events):
        scale = _first(events, ev="kernel", name="sp14_scale_wire_col")
        effect = _first(events, ev="effect", launch=events[scale]["seq"])
        return events[:effect] + events[effect + 1 :]

    v = _verdict(audit_capture(_edited(deep, tmp_path, drop)), "EGF013")
    assert v.status == FAIL
    assert "no effect of it was recorded" in v.summary and "sp14_scale_wire_col" in v.summary


def test_an_effect_that_skipped_an_allocation_fails(deep, tmp_path):
    def short(events):
        events[_first(events, ev="effect")]["allocations"] -= 1
        return events

    v = _verdict(audit_capture(_edited(deep, tmp_path, short)), "EGF013")
    assert v.status == FAIL and "bytes were live when it ran" in v.summary


def test_a_change_outside_the_declared_writes_is_named(deep, tmp_path):
    """The scale's effect gains one changed word in target_params: EGF013 names the launch, the
    buffer and the element."""
    layout = json.loads((deep / "layout.json").read_text())
    target = layout["buffers"]["target_params"]["address"]

    def stray(events):
        scale = _first(events, ev="kernel", name="sp14_scale_wire_col")
        effect = events[_first(events, ev="effect", launch=events[scale]["seq"])]
        effect["changed"] = sorted([*effect["changed"], [target + 8, 4]])
        return events

    v = _verdict(audit_capture(_edited(deep, tmp_path, stray)), "EGF013")
    assert v.status == FAIL
    assert "sp14_scale_wire_col wrote target_params[2]" in v.summary


@pytest.mark.parametrize("region", ["target", "wire"])
def test_an_effect_that_hides_what_the_snapshots_show_changed_fails(deep, tmp_path, region):
    """A polyak_ema whose target snapshots (or a scale whose wire column's) differ before and
    after it, its effect emptied: the capture contradicts itself, and EGF013 says so instead of
    passing a call that changed nothing (its other rules see only what changed). The wire is a
    column of the concat: the scale's body region gives the rows it lies in."""
    seen: dict[str, int] = {}

    def emptied(events):
        hashes: dict[tuple[int, str], dict[str, str]] = {}
        for e in events:
            if e["ev"] == "snapshot" and e["region"] == region and e["when"] != "step_start":
                hashes.setdefault((e["launch"], e["region"]), {})[e["when"]] = e["hash"]
        seq = next(s for (s, _), h in sorted(hashes.items()) if h["before"] != h["after"])
        events[_first(events, ev="effect", launch=seq)]["changed"] = []
        seen["seq"] = seq
        return events

    v = _verdict(audit_capture(_edited(deep, tmp_path, emptied)), "EGF013")
    assert v.status == FAIL, v.summary
    assert v.summary.startswith(
        f"the capture contradicts itself: #{seen['seq']}'s snapshots of {region} differ before "
        "and after it, and its effect shows no change there"
    ), v.summary


def test_a_gemm_kernel_writing_outside_c_is_the_gemm_s_finding(deep, tmp_path):
    """cuBLAS's own launch inside an SGEMM may write C (and cuBLAS's workspace), not A."""

    def stray(events):
        kernel = _first(events, ev="kernel", by="libcublas.so.13")
        effect = events[_first(events, ev="effect", launch=events[kernel]["seq"])]
        header = max(
            i for i in range(kernel) if events[i]["ev"] == "cublas" and "I! " in events[i]["msg"]
        )
        a = next(
            int(e["msg"].split("0x0x")[1].split(")")[0], 16)
            for e in events[header:kernel]
            if e["msg"].startswith("i!  A:")
        )
        effect["changed"] = sorted([*effect["changed"], [a, 4]])
        return events

    v = _verdict(audit_capture(_edited(deep, tmp_path, stray)), "EGF013")
    assert v.status == FAIL
    assert "(in cublasSgemm_v2 #" in v.summary and "outside its declared write region" in v.summary


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda e: e.update(launch=10**9), "no kernel launch, memset or copy of that seq"),
        (lambda e: e.update(changed=[[2**40 + 64, 8], [2**40 + 60, 8]]), "not after the run"),
        (lambda e: e.update(changed=[[2**40 + 64, 0]]), "byte count from 1"),
        (lambda e: e.pop("bytes"), '"bytes" is missing'),
    ],
    ids=["unknown-launch", "overlapping-runs", "empty-run", "no-bytes"],
)
def test_a_malformed_effect_is_refused(deep, tmp_path, edit, says):
    def broken(events):
        edit(events[_first(events, ev="effect")])
        return events

    with pytest.raises(UsageError, match=says):
        audit_capture(_edited(deep, tmp_path, broken))


def test_effects_in_a_capture_that_is_not_deep_are_refused(deep, tmp_path):
    def undeep(events):
        events[0].pop("deep")
        return events

    with pytest.raises(UsageError, match="does not say the capture is deep"):
        audit_capture(_edited(deep, tmp_path, undeep))


def test_a_second_effect_of_one_call_is_refused(deep, tmp_path):
    def twice(events):
        for e in events:  # room for one more line after each: every seq (and launch) doubled
            e["seq"] *= 2
            if "launch" in e:
                e["launch"] *= 2
        i = _first(events, ev="effect")
        events.insert(i + 1, dict(events[i], seq=events[i]["seq"] + 1))
        return events

    with pytest.raises(UsageError, match="a second effect of call"):
        audit_capture(_edited(deep, tmp_path, twice))


def test_spans_set_algebra():
    a = Spans.of([(0, 10), (20, 30), (5, 12)])
    assert a.ranges == ((0, 12), (20, 30))
    assert a.minus(Spans.of([(3, 4), (11, 25)])).ranges == ((0, 3), (4, 11), (25, 30))
    assert a.intersect(Spans.of([(8, 22)])).ranges == ((8, 12), (20, 22))
    assert a.union(Spans.of([(12, 20)])).ranges == ((0, 30),)
    assert Spans.runs([(100, 4), (104, 4)]).ranges == ((100, 108),)
    assert not a.minus(a) and a.bytes == 22


def test_a_process_not_recorded_deep_in_a_deep_capture_is_incomplete(deep, tmp_path):
    """--deep asked (the manifest says so) and the recorder wrote no effect: the capture
    cannot be complete; EGF013 is then UNDECIDED and must not let the gate pass."""

    def undeep(events):
        events[0].pop("deep")
        return [e for e in events if e["ev"] != "effect"]

    audit = audit_capture(_edited(deep, tmp_path, undeep))
    assert not audit.ok
    assert any("--deep was asked for" in line for line in audit.incomplete)


def test_deep_is_asked_of_the_recorder_only_by_the_option(tmp_path, monkeypatch):
    from egf_audit.capture.command import _environment

    monkeypatch.setenv("EGF_CAPTURE_DEEP", "1")  # inherited from the caller: ignored
    plain = _environment(tmp_path / "lib.so", tmp_path, (), None, deep=False)
    assert "EGF_CAPTURE_DEEP" not in plain
    assert (
        _environment(tmp_path / "lib.so", tmp_path, (), None, deep=True)["EGF_CAPTURE_DEEP"] == "1"
    )


def test_the_embedded_ptx_is_the_kernel_source_compiled(tmp_path):
    """The recorder's KERNELS_PTX is egf_recorder_kernels.cu as `nvcc -ptx -arch=compute_75`
    writes it, with its .version lowered to 7.0; it assembles for sm_90."""
    import re
    import shutil
    import subprocess

    from egf_audit.capture.build import HERE

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    text = (HERE / "rec_kernels.c").read_text(encoding="utf-8")
    block = text.split("/* ---- kernels ptx ---- */\n")[1].split(
        "/* ---- kernels ptx (end) ---- */"
    )[0]
    embedded = "".join(
        bytes(m, "utf-8").decode("unicode_escape") for m in re.findall(r'^\s*"(.*)"$', block, re.M)
    )
    out = subprocess.run(
        [
            nvcc,
            "-ptx",
            "-arch=compute_75",
            "-o",
            "-",
            str(HERE / "egf_recorder_kernels.cu"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [line for line in out.splitlines() if not line.startswith("//")]
    while lines and not lines[0].strip():
        lines.pop(0)
    compiled = "".join(
        (".version 7.0" if line.startswith(".version") else line) + "\n" for line in lines
    )
    assert embedded == compiled
    ptx = Path(
        subprocess.run(["mktemp", "--suffix=.ptx"], capture_output=True, text=True).stdout.strip()
    )
    ptx.write_text(embedded)
    assembled = subprocess.run(
        [str(Path(nvcc).with_name("ptxas")), "-arch=sm_90", str(ptx), "-o", "/dev/null"],
        capture_output=True,
        text=True,
    )
    assert assembled.returncode == 0, assembled.stderr


def test_only_a_cublas_library_on_the_stack_makes_a_launch_the_gemm_s(deep, tmp_path):
    """`by` names the library that made a launch; only libcublas* makes it part of the GEMM
    call before it. A trainer's library with 'cublas' elsewhere in its name is the trainer's."""
    from egf_audit.capture.events import read_capture

    (proc,) = read_capture(deep)
    inside = [r for r in proc.records if r.within is not None]
    gemms = {r.seq for r in proc.records if r.kind == "sgemm"}
    assert inside and {r.within for r in inside} <= gemms

    def renamed(events):
        for e in events:
            if e.get("by") == "libcublas.so.13":
                e["by"] = "my_cublas_helpers.so"
        return events

    edited = _edited(deep, tmp_path, renamed)
    (proc,) = read_capture(edited)
    assert all(r.within is None for r in proc.records)
    # the trainer's launch, bounded by what it was handed; the edit keeps no values, so EGF010
    # is undecided, which a deep capture allows only when the user does
    assert audit_capture(edited).processes[0].undecided_failing == ["EGF010"]
    assert audit_capture(edited, allow=frozenset({"EGF010"})).ok


def test_a_strided_batched_gemm_writes_every_batch_and_reads_a_and_b():
    """C of m = n = 8 at ldc 8 and strideC 64, 3 batches: three contiguous 256-byte boxes,
    back to back; A and B are read (4 x 8 at lda 4, strides 32), C is not (beta = 0)."""
    from egf_audit.trace.process import Record
    from egf_audit.trace.spans import declared

    args = {
        "transa": "T",
        "transb": "N",
        "m": 8,
        "n": 8,
        "k": 4,
        "alpha": 1.0,
        "A": 0x10000,
        "lda": 4,
        "strideA": 32,
        "B": 0x20000,
        "ldb": 4,
        "strideB": 32,
        "beta": 0.0,
        "C": 0x30000,
        "ldc": 8,
        "strideC": 64,
        "batch": 3,
    }
    r = Record(1, "gemm", "cublasSgemmStridedBatched", "cublasSgemmStridedBatched", args)
    assert declared(r, "w").ranges == ((0x30000, 0x30000 + 3 * 64 * 4),)
    reads = declared(r, "r")
    assert reads.ranges == ((0x10000, 0x10000 + 3 * 32 * 4), (0x20000, 0x20000 + 3 * 32 * 4))
    accumulating = Record(2, "gemm", r.name, r.api, {**args, "beta": 1.0})
    assert declared(accumulating, "r").intersect(declared(r, "w")).bytes == 3 * 64 * 4


def test_egf009_is_undecided_where_no_adam_update_is_launched(deep, tmp_path):
    """A trainer whose optimizer is its own fused kernel: no launch argument carries a
    tensor's Adam slices, so EGF009 says so; its launches are still held by EGF013 to the
    allocations they were handed."""

    def fused(events):
        for e in events:
            if e["ev"] == "kernel" and e["name"] == "adam_update":
                e["name"] = "my_fused_adam"
        return events

    folder = _edited(deep, tmp_path, fused)
    audit = audit_capture(folder)
    v = _verdict(audit, "EGF009")
    assert v.status == UNDECIDED and v.summary.startswith("no adam_update launch")
    assert "the layout's tables hold" in v.summary and v.evidence["failures"] == []
    assert _verdict(audit, "EGF013").status == PASS

    # what the layout states is judged all the same: a v_b0fc one element short fails
    layout = json.loads((folder / "layout.json").read_text())
    v_b0fc = layout["buffers"]["sn_state"]["tensors"]["v_b0fc"]
    v_b0fc[-1] -= 1  # [offset, rows, cols]: a row vector SH2 long
    (folder / "layout.json").write_text(json.dumps(layout))
    v = _verdict(audit_capture(folder), "EGF009")
    assert v.status == FAIL, v.summary
    (short,) = [f for f in v.evidence["failures"] if f["tensor"] == "v_b0fc"]
    assert (short["kind"], short["length"]) == ("sn-vector-length", short["expected"] - 1)


def test_a_zero_byte_allocation_is_not_counted_among_those_compared(deep, tmp_path):
    """cudaMalloc(0) succeeds and holds nothing: the recorder keeps no copy of it, and the
    reader does not count it live, so it makes no effect look short."""

    def empty_alloc(events):
        for e in events:  # room for one more line: every seq (and launch) doubled
            e["seq"] *= 2
            if "launch" in e:
                e["launch"] *= 2
        i = _first(events, ev="alloc")
        zero = dict(events[i], seq=events[i]["seq"] + 1, dst=0, bytes=0)
        events.insert(i + 1, zero)
        return events

    edited = _edited(deep, tmp_path, empty_alloc)
    v = _verdict(audit_capture(edited), "EGF013")
    assert v.status == PASS, v.summary
