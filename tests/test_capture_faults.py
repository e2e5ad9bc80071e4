"""The fault catalogue in capture form, on the CPU: every fault of
`egf_audit.scenarios.faults.FAULTS` put back into the stand-in trainer, captured by the emulating
recorder (tests/cpu_capture.py, as `egf-audit capture` would record it on a GPU) and audited
with `run --capture`'s audit, with the trainer's layout file and without it (inference).

An invariant that fails on the rebuild for a fault and that a capture decides must fail on the
capture of that fault too, except where a capture of the trainer cannot express it
(`CANNOT_EXPRESS*`, each with its reason); a fault no capture check can see at all is in
`CAPTURE_BLIND*`. Both lists must stay true: an exception whose invariant fails after all, or a
"blind" fault that some check catches, fails `test_the_exceptions_are_still_needed`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cpu_capture import MIX64_M1, MIX64_M2, MIX64_STEP, capture_standin, mix64, sgemm_log

from egf_audit.capture.cublas_log import parse_cublas
from egf_audit.capture.events import read_capture
from egf_audit.capture.layout import layout_in, load_layout_file
from egf_audit.cli.capture_audit import CaptureAudit, audit_capture
from egf_audit.invariants import FAIL, INVARIANTS, PASS, WARN, capture_common, evaluate
from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.runtime.guards import GUARD_ELEMENTS
from egf_audit.scenarios.faults import FAULTS
from egf_audit.trace.process import ProcessCapture

CAPTURE_DECIDES = frozenset(inv.code for inv in INVARIANTS if inv.capture is not None)
H200 = Path(__file__).parent / "data" / "capture"  # captures of the stand-in on an H200

# {fault: {code: why a capture of the trainer cannot show it}}: invariants the rebuild fails
# for the fault, that a capture decides in general, but not for this fault. The catalogue is
# captured --deep (every allocation compared after every call), the complete capture.
CANNOT_EXPRESS: dict[str, dict[str, str]] = {
    "gate-no-clamp": {
        "EGF012": "the stand-in's live gate stays in [0, 1] (its aux head is not below chance "
        "on its batch), so the missing clamp changes no ISV[393] a capture reads; the rebuild "
        "forces a below-chance head",
    },
    "dx-k-sh2": {
        "EGF010": "the dX GEMM drops the wire column, which reaches the gradients only through "
        "the gate: ISV[393] is 0 in the sentinel step and 5.8e-5 in the live one, so the trunk "
        "gradients move by less than the tolerance; the rebuild's replays force the gate to "
        "0.37 and 1 (EGF001 and EGF011 fail the capture)",
    },
}
_NO_GRAD_TABLE = (
    "inference names no grad_buf tensor: dW w_b0fc cannot be placed without a layout file "
    "(EGF002 is UNDECIDED)"
)
_NO_STATE_TABLES = (
    "inference names no Adam state or spectral-norm tables: without a layout file EGF009 is "
    "UNDECIDED"
)
_NO_ORACLE_NAMES = (
    "inference names none of the batch, activation and state buffers the oracle reads: "
    "without a layout file EGF010 is UNDECIDED"
)
# the same without the layout file (Polyak's tau is then held to the preset's)
CANNOT_EXPRESS_WITHOUT_LAYOUT: dict[str, dict[str, str]] = {
    fault: {
        **CANNOT_EXPRESS.get(fault, {}),
        **({"EGF010": _NO_ORACLE_NAMES} if "EGF010" in f.expected else {}),
    }
    for f in FAULTS
    for fault in [f.name]
}
CANNOT_EXPRESS_WITHOUT_LAYOUT["dw-k-sh2"]["EGF002"] = _NO_GRAD_TABLE
CANNOT_EXPRESS_WITHOUT_LAYOUT["scale-dw-wire-col"]["EGF002"] = _NO_GRAD_TABLE
CANNOT_EXPRESS_WITHOUT_LAYOUT["sn-vector-sh2"]["EGF009"] = _NO_STATE_TABLES
CANNOT_EXPRESS_WITHOUT_LAYOUT["adam-state-sh2"]["EGF009"] = _NO_STATE_TABLES
# faults no capture check can fail: their captures pass the audit
CAPTURE_BLIND: dict[str, str] = {
    "gate-no-clamp": "the clamp never acts in the stand-in's run (CANNOT_EXPRESS above)",
}
CAPTURE_BLIND_WITHOUT_LAYOUT: dict[str, str] = {
    **CAPTURE_BLIND,
    "adam-state-sh2": "only EGF009 and EGF010 judge it, and both need the layout file's "
    "names (the state tables; the buffers the oracle reads)",
}
FAULT_NAMES = [f.name for f in FAULTS]
EXPECTED = {f.name: frozenset(f.expected) for f in FAULTS}


def _without_layout(folder: Path, out: Path) -> Path:
    """The same capture as `egf-audit capture` without --layout writes it."""
    shutil.copytree(folder, out)
    (out / "layout.json").unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["layout"] = None
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out


@pytest.fixture(scope="session")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Path]:
    """(name, with layout file) -> capture folder, for clean and every fault, built once."""
    root = tmp_path_factory.mktemp("capture-faults")
    folders = {}
    for name in ["clean", *FAULT_NAMES]:
        folder = capture_standin(root / name, None if name == "clean" else name, deep=True)
        folders[name, True] = folder
        folders[name, False] = _without_layout(folder, root / f"{name}-without-layout")
    return folders


@pytest.fixture(scope="session")
def audits(captures: dict[tuple[str, bool], Path]) -> dict[tuple[str, bool], CaptureAudit]:
    return {key: audit_capture(folder) for key, folder in captures.items()}


def _failing(audit: CaptureAudit) -> str:
    """What failed, in words, for an assertion message."""
    lines = [f"incomplete: {i}" for i in audit.incomplete + audit.missing]
    for process in audit.processes:
        for code, verdict in process.verdicts:
            if verdict.failed:
                lines.append(f"{code}: {verdict.summary}")
    return "\n".join(lines) or "nothing fails"


def test_the_clean_capture_passes(audits):
    audit = audits["clean", True]
    assert audit.ok, _failing(audit)
    assert len(audit.processes) == 1


def test_the_clean_capture_by_inference_fails_only_on_what_a_layout_file_decides(audits):
    """Deep, so nothing is allowed undecided by default: what inference cannot name (EGF001's
    unnamed activations, EGF002's grad table, EGF009's state, EGF010's oracle buffers) is
    undecided, and that fails the gate; nothing fails outright."""
    audit = audits["clean", False]
    assert not audit.ok and not audit.failed_codes(), _failing(audit)
    (process,) = audit.processes
    assert process.allowed == frozenset()
    assert set(process.undecided_failing) == {"EGF001", "EGF002", "EGF009", "EGF010"}


def _required(fault: str, exceptions: dict[str, dict[str, str]]) -> set[str]:
    return set(EXPECTED[fault] & CAPTURE_DECIDES) - set(exceptions.get(fault, {}))


@pytest.mark.parametrize("fault", FAULT_NAMES)
def test_each_fault_fails_its_invariants_on_the_capture(audits, fault):
    audit = audits[fault, True]
    missing = _required(fault, CANNOT_EXPRESS) - audit.failed_codes()
    assert not missing, f"{fault}: {sorted(missing)} hold on the capture\n{_failing(audit)}"
    if fault not in CAPTURE_BLIND:
        assert not audit.ok, f"{fault}: the capture passes"


@pytest.mark.parametrize("fault", FAULT_NAMES)
def test_each_fault_fails_its_invariants_on_the_capture_without_layout(audits, fault):
    audit = audits[fault, False]
    missing = _required(fault, CANNOT_EXPRESS_WITHOUT_LAYOUT) - audit.failed_codes()
    assert not missing, f"{fault}: {sorted(missing)} hold on the capture\n{_failing(audit)}"
    if fault not in CAPTURE_BLIND_WITHOUT_LAYOUT:
        assert not audit.ok, f"{fault}: the capture passes"


@pytest.mark.parametrize("with_layout", [True, False], ids=["layout-file", "inferred"])
def test_the_exceptions_are_still_needed(audits, with_layout):
    """An excepted invariant that fails after all, or a blind fault some check catches: the
    lists above say less than the truth and must shrink."""
    exceptions = CANNOT_EXPRESS if with_layout else CANNOT_EXPRESS_WITHOUT_LAYOUT
    blind = CAPTURE_BLIND if with_layout else CAPTURE_BLIND_WITHOUT_LAYOUT
    stale = {
        fault: sorted(set(codes) & audits[fault, with_layout].failed_codes())
        for fault, codes in exceptions.items()
    }
    stale |= {
        fault: sorted(audits[fault, with_layout].failed_codes())
        for fault in blind
        if not audits[fault, with_layout].ok
    }
    assert not {k: v for k, v in stale.items() if v}


def test_the_exceptions_name_real_faults_and_decided_invariants():
    named = {*CANNOT_EXPRESS_WITHOUT_LAYOUT, *CAPTURE_BLIND_WITHOUT_LAYOUT}
    assert named <= set(FAULT_NAMES)
    for fault, codes in CANNOT_EXPRESS_WITHOUT_LAYOUT.items():
        assert set(codes) <= EXPECTED[fault] & CAPTURE_DECIDES, fault
    # blind: nothing the fault is expected to fail is left to a capture
    for blind, exceptions in (
        (CAPTURE_BLIND, CANNOT_EXPRESS),
        (CAPTURE_BLIND_WITHOUT_LAYOUT, CANNOT_EXPRESS_WITHOUT_LAYOUT),
    ):
        assert not [fault for fault in blind if _required(fault, exceptions)]


# ---- the emulation itself ----
def test_the_checks_hash_regions_as_the_recorder_does():
    """The capture checks recompute the recorder's region hash (a zeroed wire column, kept
    values against their region's hash) with the constants of the recorder's rec_snapshot.c."""
    constants = (capture_common.MIX64_STEP, capture_common.MIX64_M1, capture_common.MIX64_M2)
    assert constants == (MIX64_STEP, MIX64_M1, MIX64_M2)


def test_cublas_log_lines_read_back_to_the_call():
    args = ("N", "T", 49, 64, 32, 0x7F1599E25E0C, 49, 0x7F1599E6B200, 64, 0x7F15A0000004, 49)
    function, got = parse_cublas("".join(sgemm_log(*args)))
    assert function == "cublasSgemm_v2"
    keys = ("transa", "transb", "m", "n", "k", "A", "lda", "B", "ldb", "C", "ldc")
    assert {k: got[k] for k in keys} == dict(zip(keys, args, strict=True))


# ---- the emulation against the H200 recordings (tests/data/capture, record.sh) ----
# How record.sh ran the stand-in in each fixture folder that is no fault's own: (fault, steps,
# whether the recording is the whole run or a prefix of it). A fault's folder is named after it
# and ran the stand-in with --fault, 2 steps.
STANDIN_RUNS: dict[str, tuple[str | None, int, bool]] = {
    "clean": (None, 2, True),
    # a torch launcher that uses CUDA itself, then the clean stand-in as its child: the child is
    # compared; the launcher launches no kernel of egf-audit (_trainer)
    "two-processes": (None, 2, True),
    # one step, then SIGKILL: no exit event, and nothing after the kill
    "killed": (None, 1, False),
}
NOT_THE_STANDIN = {
    "not-a-trainer": "a torch matrix product, not the stand-in: there is nothing to emulate",
    # the scripts that record other programs (their README.md): no stand-in in them
    "runtime": "the C++ runtime-launch trainer's and GEMM probe's scripts and H200 recordings "
    "(tests/test_capture_h200_programs.py judges those)",
    "llmc": "karpathy/llm.c's trainer: its scripts and H200 recordings "
    "(tests/test_capture_h200_programs.py judges those)",
    "deep": "the stand-in captured --deep on the H200 (tests/test_capture_h200_programs.py "
    "judges those; the emulation's deep capture is tests/test_capture_deep.py's)",
    "outsider": "a trainer written from the docs alone, with its scripts (its README.md): "
    "not the stand-in (tests/test_capture_h200_programs.py judges its GPU recording)",
    "cpu": "capture --cpu's probe program, its kernels and its benchmark: no recording "
    "(tests/test_capture_cpu.py builds and captures them on the CPU)",
}
# CuPy's own kernels the emulation writes (the guard zones' canary fill, a one-element upload):
# compared with their launch shape and raw parameters
EMULATED_CUPY_KERNELS = ("cupy_fill", "cupy_copy__")


def _where(layout, ptr):
    """(buffer, element offset) of a device pointer; a pointer into the guard zone in front of a
    buffer (the CUDA backend's guarded block starts GUARD_ELEMENTS before it) as a negative
    offset into that buffer; None when no buffer of the layout holds it."""
    if not isinstance(ptr, int) or ptr <= 1 << 32:
        return None
    found = layout.resolve(ptr)
    if found is not None:
        return found[0].name, found[1]
    for buffer in layout.buffers.values():
        before = buffer.base - ptr
        if 0 < before <= GUARD_ELEMENTS * 4 and before % 4 == 0:
            return buffer.name, -before // 4
    return None


def _named(layout, value):
    """A pointer as (buffer, element offset); any other value (or a pointer no buffer holds) as
    itself, so an unnamed address never matches across two captures."""
    found = _where(layout, value)
    return value if found is None else found


def _trainer(folder: Path):
    """The one process of a capture that launched egf-audit's kernels."""
    trainers = [
        proc
        for proc in read_capture(folder)
        if any(r.kind == "kernel" and r.name in KERNELS_BY_NAME for r in proc.records)
    ]
    assert len(trainers) == 1, f"{folder.name}: {len(trainers)} processes ran the stand-in"
    return trainers[0]


def _program(folder: Path) -> tuple[list, list, ProcessCapture]:
    """What a capture says the trainer did, addresses named: egf-audit's kernels with their
    decoded arguments and launch shapes, the CuPy kernels the emulation writes, GEMMs with their
    operands, every memset, the allocations and copies of named buffers, in order; the
    snapshot regions in order, with the number of values each kept; and the process."""
    layout = load_layout_file(layout_in(folder))
    proc = _trainer(folder)
    calls = []
    for r in proc.records:
        a = r.args
        if r.kind == "kernel" and r.name in KERNELS_BY_NAME:
            calls.append((r.name, {k: _named(layout, v) for k, v in a.items()}))
        elif r.kind == "kernel" and r.name.startswith(EMULATED_CUPY_KERNELS):
            calls.append((r.name, a))
        elif r.kind == "sgemm":
            operands = {k: _named(layout, a[k]) for k in ("A", "B", "C")}
            keys = ("transa", "transb", "m", "n", "k", "lda", "ldb", "ldc", "alpha", "beta")
            calls.append(("sgemm", *(a[k] for k in keys), operands))
        elif r.kind == "memset":
            calls.append(("memset", r.api, _named(layout, a["dst"]), a["bytes"], a["value"]))
        elif r.kind == "alloc" and _where(layout, a["dst"]) is not None:
            calls.append(("alloc", r.api, _where(layout, a["dst"]), a["bytes"]))
        elif r.kind == "copy":
            dst, src = _where(layout, a["dst"]), _where(layout, a["src"])
            if dst is not None or src is not None:
                calls.append(("copy", r.api, dst, src, a["bytes"]))
    kinds = {r.seq: r.name for r in proc.records}
    regions = [
        (
            kinds[s.launch] if s.when != "step_start" else "step_start",
            s.when,
            s.region,
            _named(layout, s.ptr),
            s.elements,
            s.rows,
            s.ld,
            s.skip_col,
            s.values.size,
        )
        for s in proc.snapshots
    ]
    return calls, regions, proc


def _h200_cases() -> list:
    cases = []
    for folder in sorted(p for p in H200.iterdir() if p.is_dir()):
        name = folder.name
        if name in NOT_THE_STANDIN:
            reason = f"{name}: {NOT_THE_STANDIN[name]}"
            cases.append(pytest.param(name, id=name, marks=pytest.mark.skip(reason=reason)))
        else:
            cases.append(pytest.param(name, id=name))
    return cases


def _run_of(name: str) -> tuple[str | None, int, bool]:
    if name in STANDIN_RUNS:
        return STANDIN_RUNS[name]
    assert name in FAULT_NAMES, f"{name}: a fixture folder with no rule here (STANDIN_RUNS)"
    return name, 2, True


def _recorded_run(folder: Path) -> tuple[str | None, int]:
    """(--fault, --steps) the recorded command passed the stand-in (its defaults where absent),
    read from the manifest: in its argv, or in the `python -c` script that ran it."""
    command = " ".join(json.loads((folder / "manifest.json").read_text())["command"])
    words = command.replace("'", " ").replace(",", " ").replace("[", " ").split()

    def option(flag: str) -> str | None:
        return words[words.index(flag) + 1] if flag in words else None

    return option("--fault"), int(option("--steps") or 2)


@pytest.mark.parametrize("name", _h200_cases())
def test_the_emulation_records_what_the_h200_recorded(captures, tmp_path, name):
    """The stand-in, emulated, against its H200 capture: the same kernels of egf-audit with the
    same arguments and launch shapes (pointers as buffer and offset), the same CuPy fills and
    copies around them, GEMMs, memsets, allocations and copies of named buffers, and snapshot
    regions with every value kept, in the same order; both end with the exit event, unless the
    process was killed (then the recording is a prefix of the emulation).
    tests/data/capture/EMULATED.md lists what differs."""
    fault, steps, whole = _run_of(name)
    assert _recorded_run(H200 / name) == (fault, steps)
    if steps == 2:  # the stand-in's default run, emulated once for the fault tests
        folder = captures["clean" if fault is None else fault, True]
    else:
        folder = capture_standin(tmp_path / name, fault, steps=steps)
    emulated_calls, emulated_regions, emulated = _program(folder)
    calls, regions, recorded = _program(H200 / name)
    for proc in (emulated, recorded):  # every value kept (the body of a matrix: its hash only)
        kept = [(s.values.size, s.elements if s.skip_col < 0 else 0) for s in proc.snapshots]
        assert all(count == expected for count, expected in kept), f"{proc.pid}: values cut"
    assert emulated.ended
    if whole:
        assert recorded.ended
        assert emulated_calls == calls
        assert emulated_regions == regions
    else:
        manifest = json.loads((H200 / name / "manifest.json").read_text())
        assert not recorded.ended and manifest["exit_code"] == -9  # SIGKILL
        assert any(c[0] == "polyak_ema" for c in calls), "the recording ends before its step does"
        assert emulated_calls[: len(calls)] == calls
        assert emulated_regions[: len(regions)] == regions


def test_every_h200_fixture_is_compared_or_says_why_not():
    folders = {p.name for p in H200.iterdir() if p.is_dir()}
    ruled = set(STANDIN_RUNS) | set(NOT_THE_STANDIN) | (folders & set(FAULT_NAMES))
    assert folders <= ruled, sorted(folders - ruled)
    assert set(NOT_THE_STANDIN) <= folders


def test_kept_values_are_the_hashed_ones(captures):
    """Every complete region's values hash, as the recorder hashes, to the region's hash."""
    (proc,) = read_capture(captures["clean", True])
    complete = [s for s in proc.snapshots if s.complete]
    assert complete
    assert {s.hash_kind for s in proc.snapshots} == {"mix64"}
    for s in complete:
        assert f"{mix64(s.values, 0, -1):016x}" == s.hash


# ---- one meaning per invariant: the rebuild and the capture of the same run agree ----
# Every fault of the catalogue is judged both ways: by the rebuild (egf-audit's own pipeline with
# the fault's wiring, sentinel and live, as `egf-audit mutants --device cpu` runs it) and by the
# CPU-emulated deep capture of the stand-in running the same pipeline with the same fault (step
# 0 sentinel, step 1 live), with its layout file. For every invariant both decide, the two
# verdicts must be the same (failed, or held), except the rows of docs/capture.md's table
# "Where the rebuild and the capture differ", which this test holds to what it measures: a row
# the code no longer needs, or a difference without a row, fails here.
DIFFER_DOC = Path(__file__).resolve().parents[1] / "docs" / "capture.md"
DIFFER_REGION = re.compile(
    r"<!-- BEGIN modes-differ: tested against the catalogue "
    r"\(tests/test_capture_faults.py\) -->\n(?P<body>.*?)<!-- END modes-differ -->",
    re.DOTALL,
)
HELD = {PASS: "holds", WARN: "holds", FAIL: "fails"}


@pytest.fixture(scope="session")
def rebuilds(ci_audit_run, fault_audit_run) -> dict[str, dict[str, str]]:
    """fault (or 'clean') -> {code: 'fails' | 'holds'} on the rebuild, any mode failing."""
    out = {}
    for name in ["clean", *FAULT_NAMES]:
        run = ci_audit_run if name == "clean" else fault_audit_run(name)
        statuses: dict[str, str] = {}
        for result in evaluate(run):
            seen = HELD[result.verdict.status]
            statuses[result.code] = (
                "fails" if "fails" in (seen, statuses.get(result.code)) else seen
            )
        out[name] = statuses
    return out


def _measured_differences(rebuilds, audits) -> dict[tuple[str, str], tuple[str, str]]:
    """(fault, code) -> (rebuild, capture) wherever both decide and they disagree."""
    differ = {}
    for name, rebuild in rebuilds.items():
        (process,) = audits[name, True].processes
        for code, verdict in process.verdicts:
            if verdict.status in HELD and HELD[verdict.status] != rebuild[code]:
                differ[name, code] = (rebuild[code], HELD[verdict.status])
    return differ


def _documented_differences() -> dict[tuple[str, str], tuple[str, str, str]]:
    """(fault, code) -> (rebuild, capture, why), from the table in docs/capture.md."""
    match = DIFFER_REGION.search(DIFFER_DOC.read_text(encoding="utf-8"))
    assert match, "docs/capture.md lost its modes-differ table"
    rows = [line for line in match["body"].splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        fault, code, rebuild, capture, why = (c.strip() for c in row.strip("|").split("|"))
        table[fault.strip("`"), code] = (rebuild, capture, why)
    return table


def test_the_rebuild_and_the_capture_give_one_verdict_per_invariant(rebuilds, audits):
    measured = _measured_differences(rebuilds, audits)
    documented = _documented_differences()
    assert set(rebuilds) == {"clean", *FAULT_NAMES}
    rows = "\n".join(
        f"| `{fault}` | {code} | {rebuild} | {capture} | "
        f"{documented.get((fault, code), ('', '', 'WHY?'))[2]} |"
        for (fault, code), (rebuild, capture) in sorted(measured.items())
    )
    assert {k: v[:2] for k, v in documented.items()} == measured, (
        f"the rebuild and the capture differ where docs/capture.md does not say so, or no "
        f"longer where it does; the table as measured:\n{rows}"
    )


def test_the_agreement_compares_every_invariant_on_every_fault(rebuilds, audits):
    """The comparison is not empty: every fault is judged by both, and on each the two decide
    at least the invariants a deep capture with its layout file always decides."""
    for name, rebuild in rebuilds.items():
        assert set(rebuild) == {inv.code for inv in INVARIANTS}, name
        (process,) = audits[name, True].processes
        decided = {code for code, v in process.verdicts if v.status in HELD}
        assert {"EGF001", "EGF005", "EGF007", "EGF010", "EGF013"} <= decided, (name, decided)
