"""Captures of programs egf-audit did not launch itself, recorded on an H200 and judged here on
the CPU: the runtime-launch C++ trainer (tests/data/capture/runtime/record.sh: `<<<>>>` launches
under `extern "C"` and C++-mangled names, static and shared CUDA runtime, GEMMs through
`cublasSgemm_v2`, `cublasGemmEx` and `cublasLtMatmul`), the GEMM probe (every GEMM entry point
once, no SP14 trainer) and karpathy/llm.c's `train_gpt2_fp32.cu` (tests/data/capture/llmc/:
two training steps, unmodified, and a copy with one token changed in `matmul_backward`).

The runtime trainer executes the stand-in's own steps (make_plan.py), so each of its captures
must get, invariant by invariant, the verdicts the driver-API stand-in's H200 recording of the
same fault gets (tests/data/capture/<fault>): the kill matrix of docs/capture.md, read from
launches the recorder decoded through the runtime."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest
from test_capture_outsider import checker, recorded_lines
from test_capture_runtime import RECORDINGS

from egf_audit.capture.events import read_capture
from egf_audit.cli.capture_audit import CaptureAudit, audit_capture
from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.trace.process import ProcessCapture

DATA = Path(__file__).parent / "data" / "capture"
RUNTIME = DATA / "runtime" / "recorded"
LLMC = DATA / "llmc" / "recorded"
# the stand-in's capture-visible faults, as its H200 recordings hold them
FAULTS = tuple(name for name in RECORDINGS if name != "clean")
# the clean trainer built and called other ways: each must read as the clean step
CLEAN_VARIANTS = ("rt-clean", "rt-clean-mangled", "rt-clean-shared-cudart", "rt-gemm-ex")
GEMM_ENTRY_POINTS = {
    "cublasSgemm_v2",
    "cublasGemmEx",
    "cublasSgemmStridedBatched",
    "cublasGemmStridedBatchedEx",
    "cublasSgemmBatched",
    "cublasLtMatmul",
}


@cache
def _audit(folder: Path, use_layout: bool) -> CaptureAudit:
    return audit_capture(folder, use_layout=use_layout)


def _statuses(folder: Path, use_layout: bool) -> dict[str, str]:
    (process,) = _audit(folder, use_layout).processes
    return {code: v.status for code, v in process.verdicts}


def _verdict(folder: Path, code: str, use_layout: bool = True) -> tuple[str, str]:
    (process,) = _audit(folder, use_layout).processes
    verdict = dict(process.verdicts)[code]
    return verdict.status, verdict.summary


def _process(folder: Path) -> ProcessCapture:
    (proc,) = read_capture(folder)
    return proc


def _kernel_events(folder: Path) -> list[dict]:
    """The recorder's kernel events as it wrote them."""
    (path,) = folder.glob("events-*.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if '"ev":"kernel"' in line]


@pytest.mark.parametrize("use_layout", [True, False], ids=["layout-file", "inferred"])
@pytest.mark.parametrize("fault", ("clean", *FAULTS))
def test_the_runtime_trainer_gets_the_driver_api_stand_ins_verdicts(fault, use_layout):
    recorded = _statuses(RUNTIME / f"rt-{fault}", use_layout)
    assert recorded == _statuses(DATA / fault, use_layout)
    # by inference EGF001, EGF002 and EGF009 stay undecided, which fails the gate
    assert _audit(RUNTIME / f"rt-{fault}", use_layout).ok is (fault == "clean" and use_layout)


@pytest.mark.parametrize("name", CLEAN_VARIANTS)
def test_every_build_of_the_clean_runtime_trainer_passes_the_gate(name):
    for use_layout in (True, False):
        audit = _audit(RUNTIME / name, use_layout)
        assert not audit.incomplete and not audit.missing and not audit.failed_codes()
        assert _statuses(RUNTIME / name, use_layout) == _statuses(DATA / "clean", use_layout)
        (process,) = audit.processes
        # names inferred: what a layout file decides stays undecided, and fails the gate
        failing = set() if use_layout else {"EGF001", "EGF002", "EGF009"}
        assert set(process.undecided_failing) == failing and audit.ok is use_layout


@pytest.mark.parametrize("name", CLEAN_VARIANTS)
def test_every_runtime_launch_was_recorded_with_its_arguments(name):
    """The runtime reaches the driver's cuLaunchKernel with a CUkernel handle; every launch of
    the process (egf-audit's kernels and cuBLAS's own) has its parameters, and every egf-audit
    kernel is decoded by its signature, under its mangled name where it was built as C++."""
    events = _kernel_events(RUNTIME / name)
    assert len(events) == 470
    assert all(event["params"] and "param_info_rc" not in event for event in events)
    kernels = _process(RUNTIME / name).kernels()
    assert len(kernels) == 470
    ours = [r for r in kernels if r.name in KERNELS_BY_NAME]
    assert len(ours) == 248 and all(r.decoded for r in ours)
    if name == "rt-clean-mangled":
        assert all(r.args["symbol"].startswith("_Z") for r in ours)
    else:
        assert all("symbol" not in r.args for r in ours)


def test_the_runtime_trainers_gemms_are_bound_through_each_entry_point():
    for name, function in (
        ("rt-clean", "cublasSgemm_v2"),
        ("rt-gemm-ex", "cublasGemmEx"),
        ("rt-gemm-lt", "cublasLtMatmul"),
    ):
        gemms = [r for r in _process(RUNTIME / name).records if r.kind in ("sgemm", "gemm")]
        assert len(gemms) == 213
        assert {r.name for r in gemms} == {function}
        assert all("unbound" not in r.args for r in gemms)


def test_the_gemm_probe_binds_every_entry_point_and_passes_the_generic_check():
    proc = _process(RUNTIME / "probe")
    gemms = [r for r in proc.records if r.kind in ("sgemm", "gemm")]
    assert {r.name for r in gemms} == GEMM_ENTRY_POINTS
    assert all("unbound" not in r.args for r in gemms)
    assert _verdict(RUNTIME / "probe", "EGF001")[0] == "pass"
    # no SP14 trainer: the gate fails it, and the SP14 invariants say why they do not apply
    audit = _audit(RUNTIME / "probe", True)
    assert not audit.ok
    assert any("no process is an SP14 trainer" in m for m in audit.missing)
    status, summary = _verdict(RUNTIME / "probe", "EGF007")
    assert status == "not applicable" and summary.startswith("not applicable")
    # containment needs no SP14 name, but this capture is not deep
    status, summary = _verdict(RUNTIME / "probe", "EGF013")
    assert status == "undecided" and summary.startswith("not a deep capture")


@pytest.mark.parametrize(
    "name, words",
    [
        ("probe-k-short", "operand A spans 15 of 16 columns of W"),
        ("probe-ld-long", "operand C uses row stride 9 on S_strided, whose row stride is 8"),
    ],
)
def test_one_token_wrong_in_the_probe_fails_egf001_with_its_tensor_named(name, words):
    status, summary = _verdict(RUNTIME / name, "EGF001")
    assert status == "fail" and words in summary


def test_llmc_every_launch_has_its_arguments_and_every_gemm_is_bound():
    proc = _process(LLMC / "llmc")
    kernels = proc.kernels()
    assert len(kernels) == 267
    events = _kernel_events(LLMC / "llmc")
    assert len(events) == 267 and all(event["params"] for event in events)
    gemms = [r for r in proc.records if r.kind in ("sgemm", "gemm")]
    assert len(gemms) == 72
    assert {r.name for r in gemms} == {"cublasSgemm_v2", "cublasSgemmStridedBatched"}
    assert all("unbound" not in r.args for r in gemms)


def test_llmc_clean_passes_egf001_and_the_gate_says_it_is_no_sp14_trainer():
    for use_layout in (True, False):
        status, summary = _verdict(LLMC / "llmc", "EGF001", use_layout)
        assert status == "pass" and summary.startswith("72 GEMMs keep every operand")
        audit = _audit(LLMC / "llmc", use_layout)
        assert not audit.ok
        assert any("no process is an SP14 trainer" in m for m in audit.missing)


def test_llmc_one_token_in_matmul_backward_is_caught_by_the_generic_egf001():
    """The dinp GEMM's K = OC - 1: it reduces over one row short of the layer's weight slice
    (and one column short of dout's OC). Where the layout declares the weights stacked over
    layers, EGF001 names the slice and the row left out; by allocation alone the read stays
    inside its buffer, so it cannot be seen (docs/capture.md)."""
    status, summary = _verdict(LLMC / "llmc-planted", "EGF001")
    assert status == "fail"
    assert (
        "operand A spans 127 of 128 rows of slice [1] of fcprojw [2, 128, 512]: row 127 " in summary
    )
    assert _verdict(LLMC / "llmc-planted", "EGF001", use_layout=False)[0] == "pass"


def _generic(folder: Path, use_layout: bool = True) -> CaptureAudit:
    return audit_capture(folder, use_layout=use_layout, trainer="generic")


@pytest.mark.parametrize("use_layout", [True, False], ids=["layout-file", "inferred"])
@pytest.mark.parametrize("name", ["llmc", "llmc-deep"])
def test_llmc_unmodified_passes_as_a_generic_program(name, use_layout):
    """--trainer generic: llm.c is no SP14 trainer by design. EGF001 decides and holds; EGF013
    holds where the capture is deep and is allowed undecided where it is not; the eleven SP14
    invariants are not applicable, never held."""
    audit = _generic(LLMC / name, use_layout)
    assert audit.ok and not audit.missing and not audit.incomplete
    (process,) = audit.processes
    statuses = {code: v.status for code, v in process.verdicts}
    assert statuses.pop("EGF001") == "pass"
    assert statuses.pop("EGF013") == ("pass" if name == "llmc-deep" else "undecided")
    assert set(statuses.values()) == {"not applicable"} and len(statuses) == 11
    assert process.allowed == (frozenset() if name == "llmc-deep" else {"EGF010", "EGF013"})


def test_llmc_planted_fails_as_a_generic_program():
    audit = _generic(LLMC / "llmc-planted")
    assert not audit.ok and audit.failed_codes() == {"EGF001"} and not audit.missing


@pytest.mark.parametrize(
    ("folder", "ok"),
    [
        (DATA / "not-a-trainer", True),
        (RUNTIME / "probe", True),
        (RUNTIME / "probe-k-short", False),
        (RUNTIME / "probe-ld-long", False),
    ],
)
def test_the_generic_gate_passes_a_held_program_and_fails_a_planted_one(folder, ok):
    audit = _generic(folder)
    assert audit.ok is ok and audit.missing == []
    assert audit.failed_codes() == (set() if ok else {"EGF001"})
    assert not _audit(folder, True).ok  # the default --trainer sp14: no SP14 trainer in it


def test_generic_still_judges_an_sp14_process_as_a_trainer():
    """A process that launched the ABI kernels is judged on all 13 under --trainer generic: a
    settings file cannot turn an SP14 trainer's invariants into "not applicable"."""
    for fault in ("clean", "skip-rebuild"):
        generic = _generic(RUNTIME / f"rt-{fault}")
        assert _statuses(RUNTIME / f"rt-{fault}", True) == {
            code: v.status for code, v in generic.processes[0].verdicts
        }
        assert generic.ok is (fault == "clean")


@pytest.mark.parametrize(("name", "mode"), [("rt-gemm-lt", 0), ("rt-gemm-lt-device", 1)])
def test_the_cublaslt_trainer_s_scalars_are_read_and_it_passes(name, mode):
    """cuBLASLt's API log never prints alpha and beta: the recorder, preloaded, reads them in
    its own cublasLtMatmul before the call (device memory in device pointer mode), so the
    in-place dX GEMM into d_h_s2 is seen to accumulate and the trainer gets the clean verdicts."""
    gemms = [r for r in _process(RUNTIME / name).records if r.kind == "gemm"]
    assert len(gemms) == 213 and {r.args["pointer_mode"] for r in gemms} == {mode}
    assert {(r.args["alpha"], r.args["beta"]) for r in gemms} == {(1.0, 0.0), (1.0, 1.0)}
    for use_layout in (True, False):
        assert _statuses(RUNTIME / name, use_layout) == _statuses(DATA / "clean", use_layout)


def test_a_cublaslt_call_without_its_scalars_fails_egf007_closed(tmp_path):
    """Where alpha and beta could not be read (a cuBLASLt the recorder was not preloaded in
    front of), beta is unknown: the in-place dX GEMM into d_h_s2 cannot be shown to accumulate,
    and EGF007 fails rather than trust it."""
    out = tmp_path / "rt-gemm-lt"
    out.mkdir()
    for f in (RUNTIME / "rt-gemm-lt").iterdir():
        if f.name.startswith("events-"):
            lines = [json.loads(x) for x in gzip.decompress(f.read_bytes()).splitlines()]
            for e in lines:
                if e["ev"] == "ltmatmul":
                    e.pop("alpha_bits", None)
                    e.pop("beta_bits", None)
            text = "".join(json.dumps(e) + "\n" for e in lines)
            (out / f.name.removesuffix(".gz")).write_text(text)
        else:
            (out / f.name).write_bytes(f.read_bytes())
    gemms = [r for r in _process(out).records if r.kind == "gemm"]
    assert gemms and all(r.args["beta"] is None for r in gemms)
    status, summary = _verdict(out, "EGF007")
    assert status == "fail"
    assert "cublasLtMatmul@cql" in summary and "overwrites d_h_s2 after its zeroing" in summary


# ---- captured --deep on the H200 (tests/data/capture/deep, runtime/record.sh, llmc/record.sh) ----
DEEP = DATA / "deep"


def test_the_deep_stand_in_decides_twelve_invariants_and_passes_where_egf010_is_allowed():
    """Recorded before the deep capture kept values: EGF010 is UNDECIDED, saying so. A deep
    capture allows nothing undecided by default, so the gate fails it unless the user allows
    EGF010."""
    audit = _audit(DEEP / "clean", True)
    assert not audit.ok and not audit.failed_codes() and not audit.incomplete
    assert audit.processes[0].undecided_failing == ["EGF010"]
    assert audit_capture(DEEP / "clean", allow=frozenset({"EGF010"})).ok
    statuses = _statuses(DEEP / "clean", True)
    assert {k for k, v in statuses.items() if v != "pass"} == {"EGF010"}
    status, summary = _verdict(DEEP / "clean", "EGF010")
    assert status == "undecided" and summary.startswith("the deep capture kept no values")
    (proc,) = read_capture(DEEP / "clean")
    assert proc.deep
    observed = [r for r in proc.records if r.kind in ("kernel", "memset", "copy")]
    assert observed and all(r.seq in proc.effects for r in observed)
    inside = [r for r in proc.records if r.within is not None]
    assert inside and all(r.within >= 0 for r in inside)  # cuBLAS's launches, each in its GEMM


@pytest.mark.parametrize(
    ("name", "code", "words"),
    [
        ("scale-writes-past-region", "EGF013", "sp14_scale_wire_col wrote isv_signals[394]"),
        ("scale-dw-wire-col", "EGF002", "that computes dW w_b0fc read 32 elements the scale"),
    ],
)
def test_a_deep_capture_catches_what_only_the_rebuild_saw(name, code, words):
    status, summary = _verdict(DEEP / name, code)
    assert status == "fail" and words in summary, summary


def test_the_runtime_trainer_captured_deep_passes_all_thirteen():
    """Captured --deep with values: EGF010's oracle reads the trainer's own steps, rebuilt
    from the memory history, and agrees."""
    statuses = _statuses(RUNTIME / "rt-deep-clean", True)
    assert set(statuses.values()) == {"pass"} and len(statuses) == 13
    (proc,) = read_capture(RUNTIME / "rt-deep-clean")
    assert proc.values and proc.contents
    status, summary = _verdict(RUNTIME / "rt-deep-clean", "EGF010")
    assert status == "pass"
    assert summary.startswith("264 tensor comparisons") and "over 2 steps" in summary


def test_the_runtime_trainer_s_dw_k_sh2_fails_the_oracle_from_its_capture():
    status, summary = _verdict(RUNTIME / "rt-deep-dw-k-sh2", "EGF002")
    assert status == "fail" and "leave 8 of 88 elements of dW w_b0fc unwritten" in summary
    status, summary = _verdict(RUNTIME / "rt-deep-dw-k-sh2", "EGF010")
    assert (
        status == "fail" and summary == "1 tensor(s) disagree with the float64 model: grad w_b0fc"
    )


def test_the_oracle_needs_the_layout_file_s_names():
    status, summary = _verdict(RUNTIME / "rt-deep-clean", "EGF010", use_layout=False)
    assert status == "undecided"
    assert summary.startswith("the layout does not name what the oracle reads"), summary


def test_llmc_captured_deep_keeps_every_change_in_what_its_calls_may_write():
    """EGF013 needs no SP14 name: llm.c's own kernels are bounded by the allocations their
    pointers reach, its GEMMs by their C boxes (cuBLAS's launches inside them included)."""
    status, summary = _verdict(LLMC / "llmc-deep", "EGF013")
    assert status == "pass" and summary.startswith("288 calls observed"), summary


# ---- the outsider trainer (tests/data/capture/outsider), recorded on an H100 ----
# record.sh's whole run (clean and every fault in default, --deep and runtime-API modes, each
# judged on the GPU machine as it was recorded) is kept as its verdicts.jsonl; three of its
# capture folders are kept whole (the deep ones are left out: their values are 4 MB each).
OUTSIDER_RECORDED = DATA / "outsider" / "recorded"


def test_the_outsider_s_gpu_recording_gives_every_expected_verdict():
    check = checker()
    lines = list(recorded_lines())
    modes = {check._mode_and_fault(x["capture"])[0] for x in lines}
    assert modes == {"default", "deep", "runtime"}
    assert len(lines) == 2 * 3 * len(check.EXPECTED["fails"])  # with and without the layout
    assert check.problems(lines) == []


@pytest.mark.parametrize("name", ["out-clean", "out-dx-reads-target", "out-rt-clean"])
def test_an_outsider_recording_judged_here_gives_what_the_gpu_machine_gave(name):
    """The same folder, judged by today's code on the CPU, gives the verdicts (status and words)
    the GPU machine's egf-audit gave when it recorded it, with and without the layout file."""
    recorded = {(x["capture"], x["layout"]): x for x in recorded_lines()}
    for use_layout in (True, False):
        audit = _audit(OUTSIDER_RECORDED / name, use_layout)
        (process,) = audit.processes
        line = recorded[name, "file" if use_layout else "inferred"]
        assert audit.ok == line["ok"]
        assert {c: [v.status, v.summary] for c, v in process.verdicts} == line["processes"][0][
            "verdicts"
        ]


def test_the_outsider_s_dx_gemm_on_the_target_s_weights_fails_egf001_naming_both():
    status, summary = _verdict(OUTSIDER_RECORDED / "out-dx-reads-target", "EGF001")
    assert status == "fail"
    assert "reads target_params.w_b0fc, where the contract's" in summary, summary
    assert "reads params.w_b0fc" in summary, summary
