"""`egf-audit capture --cpu`: the C++ stand-ins run unmodified on egf-audit's own CUDA libraries
for the CPU, the real recorder writes the capture, and `run --capture` judges it as it judges
their H200 recordings (tests/data/capture/runtime/recorded: record.sh on an H200).

Each stand-in executes the stand-in's own steps from a plan (make_plan.py), so its capture on
the CPU must get, invariant by invariant, with the layout file and inferred, the statuses its
H200 capture got: the runtime trainer (<<<>>>, `-cudart shared`) clean and with each of the 12
capture-visible faults, through cublasGemmEx and cublasLtMatmul, captured --deep; the GEMM
probe and its two plants. The driver-API stand-in with NVRTC (trainer_driver.cpp) has no H200
recording yet: it runs the same plans, so it is held to the runtime trainer's H200 verdicts.
What --cpu refuses is refused by name, exit 2; a kernel writing outside its allocation ends the
process and the capture is incomplete. The stand-ins are built once and cached
(tests/cpu_standins.py); the exhaustive variants are `nightly`.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest
from cpu_standins import FAULTS, KERNELS, artifact, plan

from egf_audit.capture.cpu_capture import run_cpu_capture
from egf_audit.capture.cpu_kernels import build_source, find_kernels
from egf_audit.capture.cpu_libraries import expand, stubs_source
from egf_audit.capture.events import read_capture
from egf_audit.cli.capture_audit import audit_capture
from egf_audit.errors import UsageError
from egf_audit.invariants.registry import FAIL, PASS
from egf_audit.trace.gemm_operands import gemm_operands

RECORDED = Path(__file__).parent / "data" / "capture" / "runtime" / "recorded"
PROBE_KERNELS = Path(__file__).parent / "data" / "capture" / "cpu" / "kernels"
IN_CI = ("plans", "trainer", "trainer-driver", "gemm_probe", "cpu_probe", "cpu_probe-static")
needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc is not on PATH: the stand-ins are built with it"
)


@pytest.fixture(scope="module")
def built() -> dict[str, Path]:
    """The stand-ins every pull request's tests run, built in parallel (or from the cache)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(IN_CI, pool.map(artifact, IN_CI), strict=True))


def _capture(out: Path, command: list[str], kernels: Path | None, deep: bool = False) -> Path:
    writes = "--layout-out" in command  # the layout file the command writes
    layout = Path(command[command.index("--layout-out") + 1]) if writes else None
    outcome = run_cpu_capture(command, out, kernels, layout, deep=deep)
    assert outcome.exit_code == 0, outcome
    return out


@cache
def _statuses(folder: Path, use_layout: bool) -> tuple[bool, dict[str, str]]:
    audit = audit_capture(folder, use_layout=use_layout)
    return audit.ok, {code: v.status for p in audit.processes for code, v in p.verdicts}


def _same_verdicts(folder: Path, recorded: str) -> None:
    for use_layout in (True, False):
        assert _statuses(folder, use_layout) == _statuses(RECORDED / recorded, use_layout), (
            recorded,
            use_layout,
        )


def _summary(folder: Path, code: str) -> tuple[str, str]:
    (process,) = audit_capture(folder, use_layout=True).processes
    verdict = dict(process.verdicts)[code]
    return verdict.status, verdict.summary


def _runtime(built: dict[str, Path], tmp: Path, name: str, *more: str) -> list[str]:
    return [str(built["trainer"] / "trainer"), *plan(built["plans"], name, tmp / "layout"), *more]


def _driver(built: dict[str, Path], tmp: Path, name: str, *more: str) -> list[str]:
    program = str(built["trainer-driver"] / "trainer-driver")
    return [
        program,
        *plan(built["plans"], name, tmp / "layout"),
        "--kernel-sources",
        str(KERNELS),
        *more,
    ]


# ---- the stand-ins get their H200 verdicts ----
@needs_nvcc
@pytest.mark.parametrize("fault", ("clean", *FAULTS))
def test_the_runtime_trainer_on_the_cpu_gets_its_h200_verdicts(built, tmp_path, fault):
    folder = _capture(tmp_path / "cap", _runtime(built, tmp_path, fault), KERNELS)
    _same_verdicts(folder, "rt-clean-shared-cudart" if fault == "clean" else f"rt-{fault}")
    assert _statuses(folder, True)[0] is (fault == "clean")


def _own_calls(folder: Path) -> collections.Counter:
    """The events of the trainer's own calls as the recorder wrote them: its kernel launches
    (with their API, the runtime call they came through and their parameter sizes), copies,
    memsets and snapshot regions; not cuBLAS's own launches and allocations."""
    (path,) = folder.glob("events-*.jsonl*")
    opener = gzip.open if path.suffix == ".gz" else open
    calls: collections.Counter = collections.Counter()
    with opener(path, "rt") as f:
        for event in map(json.loads, f):
            if event["ev"] == "kernel" and not event.get("by", "").startswith("libcublas"):
                sizes = tuple(size for size, _ in event["params"])
                calls["kernel", event["api"], event.get("via"), event["name"], sizes] += 1
            elif event["ev"] in ("copy", "memset"):
                calls[event["ev"], event["api"], event["bytes"]] += 1
            elif event["ev"] == "snapshot":
                calls["snapshot", event["when"], event["region"], event["elements"]] += 1
    return calls


@needs_nvcc
def test_the_recorder_writes_the_trainer_s_calls_as_it_wrote_them_on_the_h200(built, tmp_path):
    """The fakes fire CUPTI's callbacks as NVIDIA's stack does: every launch of the trainer is
    the driver's cuLaunchKernel reached through the runtime's cudaLaunchKernel (the recorder's
    runtime path), with the parameter sizes of the H200's; copies, memsets and snapshot regions
    the same, number for number."""
    folder = _capture(tmp_path / "cap", _runtime(built, tmp_path, "clean"), KERNELS)
    ours, h200 = _own_calls(folder), _own_calls(RECORDED / "rt-clean-shared-cudart")
    assert sum(ours.values()) == 248 + 79 + 12 + 75
    assert ours == h200


@needs_nvcc
@pytest.mark.parametrize(
    ("recorded", "options"),
    [
        ("rt-gemm-ex", ("--gemm", "ex")),
        ("rt-gemm-lt-device", ("--gemm", "lt", "--device-scalars")),
        pytest.param("rt-gemm-lt", ("--gemm", "lt"), marks=pytest.mark.nightly),
    ],
)
def test_each_gemm_entry_point_on_the_cpu_gets_its_h200_verdicts(
    built, tmp_path, recorded, options
):
    folder = _capture(tmp_path / "cap", _runtime(built, tmp_path, "clean", *options), KERNELS)
    _same_verdicts(folder, recorded)
    gemms = [r for r in read_capture(folder)[0].records if r.kind in ("sgemm", "gemm")]
    assert len(gemms) == 213 and all("unbound" not in r.args for r in gemms)


@needs_nvcc
@pytest.mark.parametrize(
    "fault",
    (
        "clean",
        "dw-k-sh2",
        *[pytest.param(f, marks=pytest.mark.nightly) for f in FAULTS if f != "dw-k-sh2"],
    ),
)
def test_the_nvrtc_trainer_on_the_cpu_gets_the_h200_verdicts_of_its_plan(built, tmp_path, fault):
    """Every kernel compiled by the fake NVRTC from the source the trainer hands it; no
    --kernels (the recorder's own kernels are compiled all the same)."""
    folder = _capture(tmp_path / "cap", _driver(built, tmp_path, fault), None)
    _same_verdicts(folder, "rt-clean-shared-cudart" if fault == "clean" else f"rt-{fault}")
    (proc,) = read_capture(folder)
    assert {r.api for r in proc.kernels()} == {"cuLaunchKernel"}


@needs_nvcc
def test_the_deep_capture_on_the_cpu_decides_all_thirteen_as_on_the_h200(built, tmp_path):
    folder = _capture(tmp_path / "cap", _runtime(built, tmp_path, "clean"), KERNELS, deep=True)
    _same_verdicts(folder, "rt-deep-clean")
    status, summary = _summary(folder, "EGF010")
    assert status == "pass" and summary.startswith("264 tensor comparisons"), summary
    assert _summary(folder, "EGF013")[0] == "pass"
    (proc,) = read_capture(folder)
    assert proc.deep and proc.values and proc.init["hash"] == "mix64"
    # an SP14 process keeps its values: EGF010's oracle read them above
    assert (folder / f"values-{proc.pid}.bin").stat().st_size > 0
    (entry,) = json.loads((folder / "manifest.json").read_text())["processes"]
    assert "values_dropped" not in entry


def _manifest_edited(folder: Path, to: Path, edit) -> Path:
    shutil.copytree(folder, to)
    manifest = json.loads((to / "manifest.json").read_text())
    edit(manifest["processes"][0])
    (to / "manifest.json").write_text(json.dumps(manifest))
    return to


@needs_nvcc
def test_a_deep_capture_drops_the_values_of_a_process_no_sp14_invariant_reads(built, tmp_path):
    """The GEMM probe launches no ABI kernel: `capture --deep` drops its values file once it has
    ended (no invariant reads it: EGF001 and EGF013 read which bytes changed), says so in the
    manifest, and the audit decides what it decides with the values kept. A manifest that says
    so of a process whose values are there, or of an SP14 process, is refused."""
    command = [str(built["gemm_probe"] / "gemm_probe"), "--layout-out", str(tmp_path / "layout")]
    folder = _capture(tmp_path / "cap", command, None, deep=True)
    (proc,) = read_capture(folder)
    assert proc.deep and proc.values and proc.values_bytes > 0
    assert not list(folder.glob("values-*"))
    (entry,) = json.loads((folder / "manifest.json").read_text())["processes"]
    assert entry["values_dropped"] is True
    audit = audit_capture(folder, trainer="generic")
    verdicts = {code: v.status for p in audit.processes for code, v in p.verdicts}
    assert audit.ok and verdicts["EGF001"] == "pass" and verdicts["EGF013"] == "pass", verdicts

    # the manifest's word is held to the folder and to the process
    kept = _manifest_edited(folder, tmp_path / "kept", lambda e: e.pop("values_dropped"))
    with pytest.raises(UsageError, match=r"says its recorder kept values .* no values-"):
        audit_capture(kept, trainer="generic")
    there = _manifest_edited(folder, tmp_path / "there", lambda e: None)
    (there / f"values-{proc.pid}.bin").write_bytes(bytes(proc.values_bytes))
    with pytest.raises(UsageError, match=r"values-\d+\.bin: manifest.json says capture dropped"):
        audit_capture(there, trainer="generic")
    sp14 = RECORDED / "rt-deep-clean"
    lied = _manifest_edited(sp14, tmp_path / "sp14", lambda e: e.update(values_dropped=True))
    for name in lied.glob("values-*"):
        name.unlink()
    with pytest.raises(UsageError, match=r"it launched SP14 kernels, .* never drops those"):
        audit_capture(lied)


@needs_nvcc
@pytest.mark.nightly
@pytest.mark.parametrize(
    ("program", "recorded"), [("runtime", "rt-deep-dw-k-sh2"), ("driver", "rt-deep-clean")]
)
def test_the_deep_capture_on_the_cpu_nightly(built, tmp_path, program, recorded):
    fault = "dw-k-sh2" if "dw-k" in recorded else "clean"
    command = (_runtime if program == "runtime" else _driver)(built, tmp_path, fault)
    kernels = KERNELS if program == "runtime" else None
    folder = _capture(tmp_path / "cap", command, kernels, deep=True)
    _same_verdicts(folder, recorded)


@needs_nvcc
@pytest.mark.nightly
def test_the_trainer_with_cxx_named_kernels_on_the_cpu_passes(tmp_path):
    """<<<>>> launches of C++-mangled kernels, matched to their sources by their symbols."""
    trainer, plans = artifact("trainer-cxx"), artifact("plans")
    command = [str(trainer / "trainer-cxx"), *plan(plans, "clean", tmp_path / "layout")]
    folder = _capture(tmp_path / "cap", command, trainer / "kernels-cxx")
    _same_verdicts(folder, "rt-clean-mangled")


@needs_nvcc
@pytest.mark.parametrize(
    ("recorded", "options", "words"),
    [
        ("probe", (), None),
        ("probe-k-short", ("--plant", "k-short"), "operand A spans 15 of 16 columns of W"),
        ("probe-ld-long", ("--plant", "ld-long"), "operand C uses row stride 9 on S_strided"),
    ],
)
def test_the_gemm_probe_on_the_cpu_gets_its_h200_verdicts(
    built, tmp_path, recorded, options, words
):
    command = [str(built["gemm_probe"] / "gemm_probe"), "--layout-out", str(tmp_path / "layout")]
    folder = _capture(tmp_path / "cap", [*command, *options], None)
    _same_verdicts(folder, recorded)
    status, summary = _summary(folder, "EGF001")
    assert status == ("fail" if words else "pass") and (words is None or words in summary)


def _gemm_log(folder: Path) -> list[str]:
    """The cuBLAS log lines of the GEMM calls as the recorder kept them, addresses blanked (the
    lines shrink.py keeps: no Time, Process or COMPILED WITH line)."""
    (path,) = folder.glob("events-*.jsonl*")
    opener = gzip.open if path.suffix == ".gz" else open
    kept, gemm = [], False
    with opener(path, "rt") as f:
        for event in map(json.loads, f):
            if event["ev"] != "cublas":
                continue
            msg = event["msg"]
            if msg.startswith("I! "):
                gemm = "gemm" in msg.split("(")[1].lower()
            if gemm and not msg.lstrip().startswith(SHRUNK):
                kept.append(re.sub(r"0x0x[0-9a-f]+", "ADDRESS", msg))
    return kept


SHRUNK = ("i! Time:", "i!Process=", "i! COMPILED WITH", "i!  streamId:")


@needs_nvcc
def test_the_fake_cublas_logs_every_gemm_entry_point_in_nvidia_s_words(built, tmp_path):
    """The probe's seven classic GEMM calls (Sgemm in host and device pointer mode, GemmEx,
    SgemmStridedBatched, GemmStridedBatchedEx, SgemmBatched): every line the recorder wrote is
    the H200's cuBLAS 13.1's, word for word, but for the addresses."""
    command = [str(built["gemm_probe"] / "gemm_probe")]
    ours = _gemm_log(_capture(tmp_path / "cap", command, None))
    assert len(ours) == 109 and ours == _gemm_log(RECORDED / "probe")


# ---- cuBLAS's semantics, checked by the program itself ----
@needs_nvcc
@pytest.mark.parametrize("mode", ["clean", "k-short", "lda-short"])
def test_cublas_on_the_cpu_computes_exactly_what_its_arguments_say(built, tmp_path, mode):
    """clean and k-short compare the product bit for bit with the sum over the first k columns
    (k = lda - 1 drops the last one); lda-short expects CUBLAS_STATUS_INVALID_VALUE."""
    folder = _capture(
        tmp_path / "cap", [str(built["cpu_probe"] / "cpu_probe"), mode], PROBE_KERNELS
    )
    (gemm,) = [r for r in read_capture(folder)[0].records if r.kind == "sgemm"]
    assert (gemm.args["k"], gemm.args["lda"]) == {"clean": (4, 4), "k-short": (3, 4)}.get(
        mode, (2, 4)
    )


@needs_nvcc
def test_a_cublaslt_bias_epilogue_is_computed_and_its_vector_bound_as_read(built, tmp_path):
    """RELU_BIAS: the program checks max(A·B + bias, 0) bit for bit; the recorder reads the
    epilogue and the bias pointer from the descriptor, and the capture binds the vector as a
    read of one float a row of D, inside its allocation (EGF001 holds, as a generic program)."""
    folder = _capture(
        tmp_path / "cap", [str(built["cpu_probe"] / "cpu_probe"), "lt-bias"], PROBE_KERNELS
    )
    (gemm,) = [r for r in read_capture(folder)[0].records if r.kind == "gemm"]
    assert (gemm.args["bias_length"], gemm.args["bias_access"]) == (3, "r")
    assert [op.role for op in gemm_operands(gemm.args)] == ["A", "B", "C", "bias"]  # C is D
    (process,) = audit_capture(folder, use_layout=False).processes
    assert dict(process.verdicts)["EGF001"].status == PASS


@needs_nvcc
def test_a_cublaslt_bias_vector_past_its_allocation_fails_egf001(built, tmp_path):
    """The bias vector starts two floats before its allocation's end and is three long: on a GPU
    the epilogue reads past the allocation; the CPU computes nothing and the capture names it."""
    folder = _capture(
        tmp_path / "cap", [str(built["cpu_probe"] / "cpu_probe"), "lt-bias-past"], PROBE_KERNELS
    )
    (process,) = audit_capture(folder, use_layout=False).processes
    verdict = dict(process.verdicts)["EGF001"]
    assert verdict.status == FAIL, verdict.summary
    assert "operand bias" in verdict.summary, verdict.summary


@needs_nvcc
def test_a_kernel_of_a_ptx_module_runs_from_its_source_and_never_from_another(built, tmp_path):
    """cuModuleLoad of nvcc's PTX: `fill` runs as the probe's source compiled for the CPU (the
    program checks every element). A --kernels folder whose `fill` takes other parameters than
    the PTX entry's is refused, never run in its place."""
    probe = built["cpu_probe"]
    command = [str(probe / "cpu_probe"), "ptx", str(probe / "probe_kernels.ptx")]
    _capture(tmp_path / "cap", command, PROBE_KERNELS)
    with pytest.raises(UsageError) as refused:
        run_cpu_capture(command, tmp_path / "other", PROBE_KERNELS.with_name("kernels-other"))
    assert "the module's PTX gives it 3 parameters, its --kernels source 2" in str(refused.value)


# ---- what --cpu refuses, and what it stops ----
@needs_nvcc
@pytest.mark.parametrize(
    ("program", "mode", "words"),
    [
        ("cpu_probe-static", "clean", ("cuGetExportTable", "nvcc -cudart shared")),
        (
            "cpu_probe",
            "shared",
            ("tile_sum", "`__shared__` (shared memory)", "probe_kernels.cu:10"),
        ),
        ("cpu_probe", "orphan", ("orphan", "no source in --kernels")),
        ("cpu_probe", "graph", ("cudaStreamBeginCapture", "CUDA graph")),
        ("cpu_probe", "managed", ("cuMemAllocManaged", "managed")),
        ("cpu_probe", "device1", ("cuDeviceGet", "one device")),
        ("cpu_probe", "sgemv", ("cublasSgemv_v2", "does not model")),
        ("cpu_probe", "gemm-half", ("cublasGemmEx", "only fp32 data")),
    ],
)
def test_what_cpu_does_not_model_is_refused_by_name(built, tmp_path, program, mode, words):
    out = tmp_path / "cap"
    with pytest.raises(UsageError) as refused:
        run_cpu_capture([str(built[program] / program), mode], out, PROBE_KERNELS)
    message = str(refused.value)
    assert message.startswith(f"capture --cpu: the command called {words[0]}, ")
    assert all(w in message for w in words) and "\n" not in message
    assert not out.exists()  # nothing was replaced


@needs_nvcc
@pytest.mark.parametrize(
    ("mode", "kernel"), [("write-past", "write_past"), ("write-before", "write_before")]
)
def test_a_kernel_writing_outside_its_allocation_ends_the_process(
    built, tmp_path, mode, kernel, capfd
):
    """Past the end: the guard page faults; before the start: the canary changed. Either way
    the process ends with status 139 at that launch, its events written up to it, and the
    capture is incomplete."""
    out = tmp_path / "cap"
    outcome = run_cpu_capture([str(built["cpu_probe"] / "cpu_probe"), mode], out, PROBE_KERNELS)
    assert outcome.exit_code == 139
    assert f"kernel {kernel} " in capfd.readouterr().err
    (proc,) = read_capture(out)
    assert [r.name for r in proc.kernels()] == [kernel]
    audit = audit_capture(out, use_layout=False)
    assert not audit.ok and audit.incomplete


@needs_nvcc
@pytest.mark.parametrize(
    ("mode", "code", "words"),
    [
        (
            "hang",
            124,
            "kernel spin ran longer than 1 s (EGF_CPU_LAUNCH_TIMEOUT): stopped as a hang",
        ),
        ("exit", 134, "kernel quit called exit(), which no device code can"),
    ],
)
def test_a_kernel_that_hangs_or_exits_ends_the_capture_incomplete(
    built, tmp_path, monkeypatch, capfd, mode, code, words
):
    """A hang is stopped by the launch watchdog (the CPU backend's default, 1 s here); a kernel
    source that calls exit() cannot end the capture as a complete one: the recorder's exit
    event is written, and the process's status is 134 all the same."""
    monkeypatch.setattr("egf_audit.capture.cpu_capture.DEFAULT_LAUNCH_TIMEOUT_S", 1.0)
    out = tmp_path / "cap"
    outcome = run_cpu_capture([str(built["cpu_probe"] / "cpu_probe"), mode], out, PROBE_KERNELS)
    assert outcome.exit_code == code
    assert words in capfd.readouterr().err
    audit = audit_capture(out, use_layout=False)
    assert not audit.ok and audit.incomplete


# ---- the pieces, without a build ----
SOURCE = """
namespace ns {
extern "C" __global__ void plain(float *x, int n) { x[threadIdx.x] = n; }
__global__ void __launch_bounds__(256) bounded(float *x) { x[0] = 1; }
}
template <typename T> __global__ void generic(T *x) { x[0] = 0; }
__global__ void twice(float *x) { x[0] = 0; }
__global__ void twice(int *x) { x[0] = 0; }
__global__ void tiled(float *x) {
  __shared__ float t[32];
  t[threadIdx.x] = x[threadIdx.x];
}
__global__ void declared(float *x);
"""


def test_every_kernel_of_a_source_is_found_and_what_cannot_run_is_named():
    kernels = {k.name: k for k in find_kernels(SOURCE)}
    assert set(kernels) == {"plain", "bounded", "generic", "twice", "tiled"}
    assert kernels["plain"].qualified == "ns::plain" and kernels["plain"].why is None
    assert kernels["bounded"].qualified == "ns::bounded" and kernels["bounded"].why is None
    assert "template" in kernels["generic"].why
    assert "overloaded" in kernels["twice"].why


def test_a_kernel_needing_shared_memory_is_refused_and_the_others_still_run(tmp_path):
    built = build_source(SOURCE, "probe.cu", {})
    why = {k.name: k.why for k in built.kernels}
    assert why["tiled"] == "its body uses `__shared__` (shared memory) at probe.cu:10"
    assert why["plain"] is None and built.library is not None
    lines = built.index_lines()
    assert f"library {built.library}" in lines and "kernel 0 plain" in lines
    assert any(line.startswith("refused tiled its body uses") for line in lines)


def test_a_helper_needing_a_barrier_refuses_every_kernel_beside_it():
    source = (
        "__device__ void sync() { __syncthreads(); }\n__global__ void k(float *x) { sync(); }\n"
    )
    (kernel,) = build_source(source, "helper.cu", {}).kernels
    assert (
        kernel.why == "the code beside it uses `__syncthreads` (block-wide barrier) at helper.cu:1"
    )


def test_the_unmodeled_entry_points_expand_and_each_stub_refuses_by_name():
    assert expand("cublas{S,D}gemm{,Batched}") == [
        "cublasSgemm",
        "cublasSgemmBatched",
        "cublasDgemm",
        "cublasDgemmBatched",
    ]
    stubs = stubs_source(["cuGraphLaunch", "cuFoo"])
    assert 'egf_cpu_refuse("cuGraphLaunch", "CUDA graphs: egf-audit capture --cpu does not' in stubs
    assert 'egf_cpu_refuse("cuFoo", "egf-audit capture --cpu does not model this call")' in stubs
    assert stubs.count("return 801;") == 2


# ---- the command line and the libraries themselves (no stand-in built) ----
def _toolkit_or_skip() -> None:
    from egf_audit.capture.build import find_toolkit
    from egf_audit.errors import AuditEnvironmentError

    try:
        find_toolkit()
    except AuditEnvironmentError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--kernels", "src/kernels"], "give --cpu with it"),
        (["--cpu", "--kernels", "no-such-folder"], "--kernels no-such-folder: no such folder"),
    ],
)
def test_kernels_without_cpu_or_of_no_folder_is_refused_in_one_line(tmp_path, flags, words):
    from typer.testing import CliRunner

    from egf_audit.cli.app import app

    out = tmp_path / "c"
    result = CliRunner().invoke(app, ["capture", *flags, "--out", str(out), "--", "true"])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.startswith("egf-audit: error:")]
    assert len(lines) == 1 and words in lines[0], result.output
    assert not out.exists()


def test_the_fakes_come_first_for_the_loader_and_the_trainer_s_cublas_log_is_dropped(tmp_path):
    from egf_audit.capture.cpu_capture import _environment

    env = {"LD_LIBRARY_PATH": "/opt/cuda/lib64", "CUBLAS_LOGINFO_DBG": "1"}
    _environment(tmp_path / "libs", tmp_path / "k.index", tmp_path / "r.txt", env)
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path / 'libs'}:/opt/cuda/lib64"
    assert env["EGF_CPU_KERNEL_INDEX"] == str(tmp_path / "k.index")
    assert env["EGF_CPU_REFUSALS"] == str(tmp_path / "r.txt")
    assert "CUBLAS_LOGINFO_DBG" not in env


def test_a_header_entry_point_the_fakes_do_not_model_refuses_by_name(tmp_path):
    """The stubs generated from cuda.h and cuda_runtime_api.h: a call returns 801 (not
    supported) and leaves one refusal line; a modeled one works."""
    import subprocess
    import sys

    from egf_audit.capture.build import build_recorder
    from egf_audit.capture.cpu_libraries import build_cpu_libraries

    _toolkit_or_skip()
    libs = build_cpu_libraries(build_recorder())
    refusals = tmp_path / "refused.txt"
    script = (
        "import ctypes, sys\n"
        f"cuda = ctypes.CDLL('{libs}/libcuda.so.1')\n"
        f"rt = ctypes.CDLL('{libs}/libcudart.so.13')\n"
        "assert cuda.cuInit(0) == 0\n"
        "assert cuda.cuGraphCreate(None, 0) == 801\n"
        "assert rt.cudaGraphLaunch(None, None) == 801\n"
        "assert cuda.cuGraphCreate(None, 0) == 801\n"
    )
    env = {"EGF_CPU_REFUSALS": str(refusals), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert refusals.read_text().splitlines() == [
        "cuGraphCreate\tCUDA graphs: egf-audit capture --cpu does not model them",
        "cudaGraphLaunch\tCUDA graphs: egf-audit capture --cpu does not model them",
    ]
    assert proc.stderr.count("egf-audit capture --cpu: refused") == 2  # once per name
