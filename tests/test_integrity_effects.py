"""Kernels that crash, exit, hang or write where they do not declare (issue 11, Deliver 1 and 2):
each is a verdict of EGF013 in a written document and exit 1, never a dead or green gate.

The variants under kernel_variants/effects/ replace one kernel each through `--kernels DIR`, on
the CPU backend (a forked worker runs the kernels on guarded shared memory) and, where a GPU is
usable, on the CUDA backend (a worker process with its own context on the audit's memory). Each
audit runs one mode and one step: the first misbehaving launch is in the first scenario.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from egf_audit.cli.app import app
from egf_audit.runtime.backends import guarded_memory as gm
from egf_audit.runtime.guards import changed_outside

VARIANTS = Path(__file__).parent / "kernel_variants"
TERMINAL = {"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"}


SAME = "the same words as on the CPU"


@dataclass(frozen=True)
class Misbehaving:
    name: str  # file stem under kernel_variants/effects/ (or <kernel>/<stem> for a reused one)
    kernel: str  # the kernel it replaces
    problem: str  # words the EGF013 verdict must carry (CPU backend)
    label: str  # the launch it names
    # the words on the GPU (SAME: `problem`); None where the GPU cannot run it as such
    # (the tests after test_misbehaving_kernel_is_the_same_verdict_on_the_gpu say what it does)
    gpu: str | None = None

    @property
    def gpu_problem(self) -> str | None:
        return self.problem if self.gpu == SAME else self.gpu

    @property
    def source(self) -> Path:
        if "/" in self.name:
            return VARIANTS / f"{self.name}.cu"
        return VARIANTS / "effects" / f"{self.name}.cu"


SCALE_AT_CQL = "sp14_scale_wire_col@cql"
CASES = (
    Misbehaving(
        "crash_null_write",
        "sp14_scale_wire_col",
        "crashed with SIGSEGV",
        SCALE_AT_CQL,
        gpu="failed on the GPU: cudaErrorIllegalAddress: an illegal memory access was encountered",
    ),
    Misbehaving(
        "trap",
        "sp14_scale_wire_col",
        "crashed with SIGILL",
        SCALE_AT_CQL,
        gpu="failed on the GPU: cudaErrorLaunchFailure: unspecified launch failure",
    ),
    Misbehaving("exit_zero", "polyak_ema", "exited with status 0", "polyak_ema"),
    Misbehaving(
        "abort",
        "accumulate_d_h_s2_from_concat",
        "crashed with SIGABRT",
        "accumulate_d_h_s2_from_concat[d=0]@cql",
    ),
    Misbehaving(
        "hang",
        "sp14_dir_concat_qaux",
        "did not return within 1 s",
        "forward_dir_concat_qaux@online",
        gpu=SAME,
    ),
    # the read past the end of the buffer lands in the inaccessible zone behind it (on the GPU only
    # --sanitize sees a read)
    Misbehaving(
        "oob_read_before_bound_check", "sp14_scale_wire_col", "crashed with SIGSEGV", SCALE_AT_CQL
    ),
    # `b > rows`: the write one row past the buffer lands in the inaccessible zone; on the GPU in
    # the guard zone after the buffer (thread b = rows writes column SH2 = 48 past the [B, 49]
    # buffer)
    Misbehaving(
        "oob_write_off_by_one_bound",
        "sp14_scale_wire_col",
        "crashed with SIGSEGV",
        SCALE_AT_CQL,
        gpu="overwrote the guard zone 49 elements after sp14_d_dir_qaux_concat",
    ),
    # 4 MiB past (or before) the buffer: beyond one guard page, in mapped memory before the
    # CPU backend reserved 8 GiB of PROT_NONE on each side (the reads passed, the write was
    # caught in a later scenario only); on the GPU what lies there depends on the allocator
    Misbehaving(
        "oob_read_far_past_buffer", "sp14_scale_wire_col", "crashed with SIGSEGV", SCALE_AT_CQL
    ),
    Misbehaving(
        "oob_read_far_before_buffer", "sp14_scale_wire_col", "crashed with SIGSEGV", SCALE_AT_CQL
    ),
    Misbehaving(
        "oob_write_far_past_buffer", "sp14_scale_wire_col", "crashed with SIGSEGV", SCALE_AT_CQL
    ),
    Misbehaving(
        "oob_write_before_buffer",
        "sp14_scale_wire_col",
        "overwrote the guard zone 1 elements before sp14_d_dir_qaux_concat",
        SCALE_AT_CQL,
        gpu=SAME,
    ),
    Misbehaving(
        "sp14_scale_wire_col/bad_whole_row",
        "sp14_scale_wire_col",
        "wrote sp14_d_dir_qaux_concat[0] (sp14_d_dir_qaux_concat) outside its declared write "
        "region",
        SCALE_AT_CQL,
        gpu=SAME,
    ),
    Misbehaving(
        "neighbour_tensor_write",
        "sn_scale",
        "(b_b0fc) outside its declared write region",
        "spectral_norm:project",
        gpu=SAME,
    ),
)


def audit_with(case: Misbehaving, tmp_path: Path, *extra: str, device: str = "cpu"):
    folder = tmp_path / "kernels"
    folder.mkdir()
    shutil.copyfile(case.source, folder / f"{case.kernel}_kernel.cu")
    out = tmp_path / "audit.md"
    args = ["run", "--device", device, "--mode", "sentinel", "--steps", "1"]
    # only the hanging kernel gets a short watchdog: a loaded CI machine may delay a round trip
    timeout = "1" if "did not return" in case.problem else "60"
    args += ["--kernels", str(folder), "--out", str(out), "--launch-timeout", timeout, *extra]
    return CliRunner().invoke(app, args, env=TERMINAL), out


def verdict_row(document: Path) -> str:
    """EGF013's row of the document's invariant table (the first table that names it)."""
    rows = [ln for ln in document.read_text().splitlines() if ln.startswith("| EGF013 |")]
    assert rows, "the document has no EGF013 row"
    return rows[0]


def test_every_effects_variant_is_in_the_table():
    listed = {c.source for c in CASES if "/" not in c.name}
    assert listed == set((VARIANTS / "effects").glob("*.cu"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_misbehaving_kernel_is_an_egf013_verdict_in_the_document(case, tmp_path):
    assert_egf013_verdict(case, case.problem, *audit_with(case, tmp_path))


def assert_egf013_verdict(case: Misbehaving, problem: str, result, out: Path) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    verdict = [ln for ln in result.stdout.splitlines() if ln.startswith("FAIL:")]
    assert verdict and "EGF013[sentinel]" in verdict[0], result.stdout
    row = verdict_row(out)
    # the scenario, the launch (index and call site), the kernel, and what it did
    match = re.search(r"❌ fail \| sentinel launch #\d+ (\S+) \[(\w+)\]: ([^|]*)", row)
    assert match, row
    assert match.group(1) == case.label
    assert match.group(2) == case.kernel
    assert problem in match.group(3)


def test_clean_kernels_keep_egf013_passing_and_stdout_clean(tmp_path):
    """A correct kernel from a --kernels folder: every launch observed and contained."""
    ok = Misbehaving("sp14_scale_wire_col/ok_grid_stride_if_else", "sp14_scale_wire_col", "", "")
    result, out = audit_with(ok, tmp_path)
    assert result.exit_code == 0, result.output
    row = verdict_row(out)
    assert re.search(r"\d+ launches in \d+ traces observed: every change inside", row), row


@pytest.mark.parametrize("seconds", ["0", "-1", "nan"])
def test_launch_timeout_must_be_positive(seconds, tmp_path):
    result = CliRunner().invoke(
        app, ["run", "--device", "cpu", "--launch-timeout", seconds, "--out", str(tmp_path / "a")]
    )
    assert result.exit_code == 2, result.output
    assert "--launch-timeout" in result.stderr
    assert not (tmp_path / "a").exists()


# ---- the comparison behind stray writes ----
def test_changes_inside_exempt_boxes_are_allowed_and_others_reported():
    shadow = np.zeros(20, np.float32)
    live = shadow.copy()
    live[[2, 3, 7, 8, 12, 13]] = 1.0  # a [3, 2] box at offset 2 with row stride 5
    live[19] = -0.0  # bits differ from +0.0: a change
    found = changed_outside(np, live, shadow, ((2, 3, 2, 5),))
    assert found == (19, 1, 0x00000000, 0x80000000)
    assert shadow.tobytes() == live.tobytes()  # the shadow is brought up to date
    assert changed_outside(np, live, shadow, ()) is None


def test_a_box_whose_last_row_is_short_is_clipped_to_the_buffer():
    shadow = np.zeros(10, np.float32)
    live = shadow.copy()
    live[[3, 4, 8, 9]] = 2.0  # a [2, 2] box at offset 3, stride 5: its last stride is cut short
    live[5] = 2.0
    assert changed_outside(np, live, shadow, ((3, 2, 2, 5),)) == (5, 1, 0, 0x40000000)


def test_a_box_covering_the_whole_buffer_allows_every_change():
    shadow = np.zeros(6, np.float32)
    live = np.arange(6, dtype=np.float32)
    assert changed_outside(np, live, shadow, ((0, 2, 3, 3),)) is None
    assert shadow.tobytes() == live.tobytes()
    live[5] = 9.0  # a [2, 2] box with stride 3 leaves column 2 outside
    assert changed_outside(np, live, shadow, ((0, 2, 2, 3),)) == (5, 1, 0x40A00000, 0x41100000)


# ---- the same kernels on a GPU (skipped where none is usable) ----
# There the untrusted kernel runs in a worker process with its own CUDA context on the audit's
# memory (CUDA IPC), so a fault or a hang ends the worker, not the audit.
GPU_CASES = [c for c in CASES if c.gpu_problem is not None]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_misbehaving_kernel_is_the_same_verdict_on_the_gpu(case, tmp_path):
    assert_egf013_verdict(case, case.gpu_problem, *audit_with(case, tmp_path, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["exit_zero", "abort"])
def test_host_calls_in_a_kernel_are_refused_for_the_gpu_as_nvcc_refuses_them(name, tmp_path):
    """std::exit and std::abort are host functions: no CUDA compiler builds such a kernel, so
    on the GPU the audit cannot run and says which source, in one line (exit 3)."""
    case = next(c for c in CASES if c.name == name)
    result, _ = audit_with(case, tmp_path, device="cuda")
    assert result.exit_code == 3, result.output
    assert f"{case.kernel}_kernel.cu does not compile" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.gpu
def test_sanitize_names_the_out_of_bounds_read_and_write_on_the_gpu(tmp_path):
    """A read past a buffer changes no memory: on the GPU only compute-sanitizer sees it."""
    for name, access in [
        ("oob_read_before_bound_check", "read"),
        ("oob_write_off_by_one_bound", "write"),
    ]:
        case = next(c for c in CASES if c.name == name)
        (tmp_path / name).mkdir()
        result, out = audit_with(case, tmp_path / name, "--sanitize", device="cuda")
        assert result.exit_code == 1, result.output
        assert f"compute-sanitizer memcheck: Invalid __global__ {access}" in result.stderr
        assert "sp14_scale_wire_col" in out.read_text()


@pytest.mark.gpu
def test_a_hanging_kernel_ends_the_sanitized_run_too(tmp_path):
    """compute-sanitizer follows the kernel worker, whose watchdog still ends a hang."""
    case = next(c for c in CASES if c.name == "hang")
    result, out = audit_with(case, tmp_path, "--sanitize", device="cuda")  # --launch-timeout 1
    assert result.exit_code == 1, result.output
    assert "did not return within 1 s" in verdict_row(out)
    assert "did not finish" not in result.stderr


def test_the_cpu_watch_reports_changes_outside_the_boxes_in_one_call():
    """The C comparison the CPU backend runs after every launch: same answers as above."""
    first, second = gm.allocate(20, "f32"), gm.allocate(10, "i32")
    try:
        watcher = gm.Watcher([first, second])
        first.data[[2, 3, 7, 8, 12, 13, 19]] = 1.0  # a [3, 2] box at 2, stride 5, and element 19
        second.data[[3, 4, 8, 9, 5]] = 7  # a [2, 2] box at 3, stride 5, and element 5
        boxes = [0, 2, 3, 2, 5, 1, 3, 2, 2, 5]  # (buffer, offset, rows, width, row stride) each
        assert watcher.changes(boxes) == [(0, 19, 1, 0, 0x3F800000), (1, 5, 1, 0, 7)]
        assert watcher.changes([]) == []  # the shadows were brought up to date
        first.data[0] = -0.0  # a change of bits alone
        assert watcher.changes([]) == [(0, 0, 1, 0, 0x80000000)]
    finally:
        gm.release(first)
        gm.release(second)


@pytest.mark.parametrize(
    ("edge", "offset"),
    [
        ("end", 0),  # the first byte after the data
        ("end", 4 << 20),
        ("end", gm.REACH - 1),  # the zone's last byte
        ("canaries", -1),  # the last byte before the canary zone
        ("canaries", -gm.REACH),  # the zone's first byte
    ],
)
def test_every_address_within_reach_of_a_cpu_buffer_faults(edge, offset):
    """A forked child reads one byte there and must die of SIGSEGV: no address within REACH of
    a buffer is readable, however far past a single guard page."""
    buffer = gm.allocate(1000, "f32")
    try:
        start = buffer.data.ctypes.data + buffer.data.nbytes if edge == "end" else buffer.mapping
        address = start + offset if edge == "end" else start + gm.REACH + offset
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child dies on the read, or says it did not
            try:
                faulthandler.disable()  # the child's death is the expected outcome, not news
                ctypes.string_at(address, 1)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV, status
    finally:
        gm.release(buffer)


def test_the_reservation_holds_the_canaries_and_the_data_and_costs_their_pages_only():
    buffer = gm.allocate(1000, "f32")
    try:
        assert buffer.length == 2 * gm.REACH + buffer.committed
        assert buffer.canaries.ctypes.data == buffer.mapping + gm.REACH
        end = buffer.data.ctypes.data + buffer.data.nbytes
        assert end == buffer.mapping + gm.REACH + buffer.committed
        assert buffer.committed == gm.PAGE * -(-(4000 + 4 * 64) // gm.PAGE)
    finally:
        gm.release(buffer)
