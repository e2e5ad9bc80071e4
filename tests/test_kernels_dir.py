"""`egf-audit run --kernels DIR`: a trainer's own kernel sources audited in place of the bundled
ones, through the command line (typer's CliRunner, CPU backend: the same .cu files the GPU
backend compiles).

Every wrong variant under kernel_variants/<kernel>/ must exit 1 and name the invariant that
catches it; every correct but differently written one must exit 0; the cases under
kernel_variants/environment/ must exit 3 with one error line naming the file, the line and what
is wrong. docs/kernels-dir.md holds the same table with the reasons.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from egf_audit.cli.app import app
from egf_audit.kernels import KERNELS

VARIANTS = Path(__file__).parent / "kernel_variants"
ABI = tuple(k.name for k in KERNELS if k.abi)
CONCAT, SCALE, ACC, POLYAK = ABI
TERMINAL = {"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"}
# CI runs these on the CPU; EGF_AUDIT_TEST_DEVICE=cuda repeats the same table on a GPU.
DEVICE = os.environ.get("EGF_AUDIT_TEST_DEVICE", "cpu")


@dataclass(frozen=True)
class Variant:
    kernel: str  # the ABI kernel it replaces
    name: str  # file stem under kernel_variants/<kernel>/
    caught_by: tuple[str, ...] = ()  # invariants that must fail; () for a correct variant

    @property
    def source(self) -> Path:
        return VARIANTS / self.kernel / f"{self.name}.cu"

    @property
    def file(self) -> str:
        return f"{self.kernel}_kernel.cu"


def _id(v: Variant) -> str:
    return f"{v.kernel}/{v.name}"


# Measured on the CPU backend at the ci preset. `caught_by` lists every invariant that failed;
# the test requires each of them (another invariant failing as well is fine).
WRONG = (
    Variant(CONCAT, "bad_wire_at_col_sh2_minus_1", ("EGF002", "EGF006", "EGF010")),
    Variant(CONCAT, "bad_row_stride_sh2", ("EGF006", "EGF010")),
    Variant(CONCAT, "bad_up_down_swapped", ("EGF006", "EGF010")),
    Variant(CONCAT, "bad_last_row_skipped", ("EGF006", "EGF010")),
    Variant(SCALE, "bad_no_zero_branch", ("EGF003",)),
    Variant(SCALE, "bad_nan_only_guard", ("EGF003",)),
    Variant(SCALE, "bad_column_minus_1", ("EGF003", "EGF004", "EGF010")),
    Variant(SCALE, "bad_row_stride_wire_col", ("EGF003", "EGF004", "EGF010")),
    Variant(SCALE, "bad_whole_row", ("EGF004", "EGF010")),
    Variant(ACC, "bad_flat_index_ignores_ld", ("EGF007", "EGF010")),
    Variant(ACC, "bad_overwrites", ("EGF007", "EGF010")),
    Variant(ACC, "bad_skips_last_element", ("EGF007", "EGF010")),
    Variant(ACC, "bad_decomposes_by_ld", ("EGF007", "EGF010")),
    Variant(POLYAK, "bad_tau_swapped", ("EGF005", "EGF010")),
    Variant(POLYAK, "bad_tau_applied_twice", ("EGF005", "EGF010")),
    Variant(POLYAK, "bad_skips_last_element", ("EGF005", "EGF010")),
    Variant(POLYAK, "bad_hard_copy", ("EGF005", "EGF010")),
    Variant(POLYAK, "bad_delta_assigned", ("EGF005", "EGF010")),
)
CORRECT = (
    Variant(CONCAT, "ok_grid_stride_elements"),
    Variant(CONCAT, "ok_wire_first_row_loop"),
    Variant(SCALE, "ok_grid_stride_if_else"),
    Variant(ACC, "ok_thread_per_row"),
    Variant(ACC, "ok_grid_stride_2d"),
    Variant(POLYAK, "ok_grid_stride_commuted"),
    Variant(POLYAK, "ok_incremental_form"),
    Variant(POLYAK, "ok_launch_bounds"),  # __launch_bounds__ between void and the name
    Variant(POLYAK, "ok_extern_c_block"),  # extern "C" { ... } around the kernel
    Variant(POLYAK, "ok_rounding_intrinsics"),  # __fmul_rn / __fadd_rn
)


# Every pull request runs, for each ABI kernel, a wrong variant of each kind the table holds
# (a wrong column or stride, a row or element cut off, a wrong formula) and one or two correct
# ones; the variants that repeat a kind for the same kernel run nightly (.ci/nightly), each a
# whole audit (about 1.2 s of a 2-core runner's CPU).
NIGHTLY_ONLY = {
    f"{CONCAT}/bad_row_stride_sh2",
    f"{CONCAT}/bad_up_down_swapped",
    f"{SCALE}/bad_nan_only_guard",
    f"{SCALE}/bad_column_minus_1",
    f"{ACC}/bad_overwrites",
    f"{ACC}/bad_decomposes_by_ld",
    f"{POLYAK}/bad_tau_applied_twice",
    f"{POLYAK}/bad_hard_copy",
    f"{POLYAK}/bad_delta_assigned",
    f"{CONCAT}/ok_wire_first_row_loop",
    f"{ACC}/ok_grid_stride_2d",
    f"{POLYAK}/ok_grid_stride_commuted",
    f"{POLYAK}/ok_launch_bounds",
    f"{POLYAK}/ok_rounding_intrinsics",
}


def _params(variants: tuple[Variant, ...]) -> list[object]:
    nightly = pytest.mark.nightly
    return [
        pytest.param(v, id=_id(v), marks=[nightly] if _id(v) in NIGHTLY_ONLY else [])
        for v in variants
    ]


@dataclass(frozen=True)
class EnvCase:
    name: str  # file stem under kernel_variants/environment/
    kernel: str
    fragments: tuple[str, ...]  # each must appear in the one error line

    @property
    def source(self) -> Path:
        return VARIANTS / "environment" / f"{self.name}.cu"


POLYAK_SIGNATURE = (
    'expected extern "C" __global__ void polyak_ema(float* target, const float* online, '
    "float tau, long long n)"
)
ENVIRONMENT = (
    EnvCase("polyak_ema_int_n", POLYAK, ("polyak_ema_kernel.cu:3:", ", int)", POLYAK_SIGNATURE)),
    EnvCase("polyak_ema_size_t_n", POLYAK, ("polyak_ema_kernel.cu:2:", "size_t", POLYAK_SIGNATURE)),
    EnvCase("polyak_ema_wrong_name", POLYAK, ("polyak_ema_kernel.cu", "`polyak_ema`", "expected")),
    EnvCase("polyak_ema_no_extern_c", POLYAK, ("polyak_ema_kernel.cu", "`polyak_ema`", "expected")),
    EnvCase(
        "sp14_scale_wire_col_syntax_error",
        SCALE,
        ("does not compile", "sp14_scale_wire_col_kernel.cu:7:", "isv_idx"),
    ),
    EnvCase(
        "accumulate_d_h_s2_from_concat_syncthreads",
        ACC,
        ("accumulate_d_h_s2_from_concat_kernel.cu:9:", "__syncthreads", "not supported"),
    ),
    EnvCase(
        "sp14_dir_concat_qaux_shared",
        CONCAT,
        ("sp14_dir_concat_qaux_kernel.cu:6:", "__shared__", "not supported"),
    ),
)


# ---- setup ----
def kernels_dir(root: Path, *sources: tuple[Path, str]) -> Path:
    """A trainer-style kernels folder: each (source, file name) copied in."""
    root.mkdir(parents=True, exist_ok=True)
    for src, name in sources:
        shutil.copyfile(src, root / name)
    return root


def egf_audit(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env=TERMINAL)


def audit(kernels: Path, tmp_path: Path, *extra: object) -> Result:
    out = tmp_path / "audit.md"
    return egf_audit("run", "--device", DEVICE, "--kernels", kernels, "--out", out, *extra)


def failed_codes(result: Result) -> set[str]:
    """The codes named on the verdict line (`FAIL: n of m verdicts failed: EGF004[live], ...`)."""
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith(("FAIL:", "PASS:"))]
    assert len(lines) == 1, result.output
    return set(re.findall(r"\b(EGF\d{3})\[", lines[0]))


def error_lines(result: Result) -> list[str]:
    return [ln for ln in result.stderr.splitlines() if ln.startswith("egf-audit: error:")]


def assert_environment_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    errors = error_lines(result)
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


# ---- the table itself ----
def test_every_variant_file_is_in_a_table():
    listed = {v.source for v in WRONG + CORRECT}
    on_disk = {p for k in ABI for p in (VARIANTS / k).glob("*.cu")}
    assert on_disk == listed
    assert {c.source for c in ENVIRONMENT} == set((VARIANTS / "environment").glob("*.cu"))
    assert {_id(v) for v in WRONG + CORRECT} >= NIGHTLY_ONLY
    for kernel in ABI:  # several wrong and at least one correct implementation of each
        assert sum(v.kernel == kernel for v in WRONG) >= 3
        assert any(v.kernel == kernel for v in CORRECT)


# ---- verdicts ----
@pytest.mark.parametrize("variant", _params(WRONG))
def test_wrong_kernel_fails_naming_the_invariant_that_catches_it(variant, tmp_path):
    result = audit(kernels_dir(tmp_path / "k", (variant.source, variant.file)), tmp_path)
    assert result.exit_code == 1, result.output
    assert set(variant.caught_by) <= failed_codes(result), result.stdout


@pytest.mark.parametrize("variant", _params(CORRECT))
def test_correct_but_differently_written_kernel_passes(variant, tmp_path):
    result = audit(kernels_dir(tmp_path / "k", (variant.source, variant.file)), tmp_path)
    assert result.exit_code == 0, result.output
    assert failed_codes(result) == set()


def test_a_whole_trainer_folder_is_audited_and_listed_in_the_document(tmp_path):
    """All four ABI kernels replaced at once, plus a trainer kernel egf-audit does not know:
    exit 0, the unknown file named as ignored, every kernel listed with origin, path, sha256."""
    picks = {v.kernel: v for v in CORRECT}
    folder = kernels_dir(
        tmp_path / "trainer" / "kernels",
        *[(v.source, v.file) for v in picks.values()],
        (picks[POLYAK].source, "fused_layernorm_kernel.cu"),
    )
    result = audit(folder, tmp_path, "--json", tmp_path / "audit.json")
    assert result.exit_code == 0, result.output
    assert "warning: --kernels" in result.stderr
    assert "ignored fused_layernorm_kernel.cu" in result.stderr

    data = json.loads((tmp_path / "audit.json").read_text())
    assert data["kernels_ignored"] == ["fused_layernorm_kernel.cu"]
    rows = {k["name"]: k for k in data["kernels"]}
    assert set(rows) == {k.name for k in KERNELS}
    for kernel in KERNELS:
        row = rows[kernel.name]
        if kernel.name in picks:
            file = folder / kernel.file
            # relative to the document's folder (tmp_path: no repository around it)
            assert (row["origin"], row["path"]) == ("kernels-dir", f"trainer/kernels/{file.name}")
            assert row["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
        else:
            assert (row["origin"], row["path"]) == ("bundled", f"egf-audit:kernels/{kernel.file}")

    document = (tmp_path / "audit.md").read_text()
    for row in rows.values():
        assert row["sha256"] in document
    ignored = [ln for ln in document.splitlines() if "fused_layernorm_kernel.cu" in ln]
    assert ignored and "gnored" in ignored[0]


# ---- environment errors: exit 3, one line ----
@pytest.mark.parametrize("case", ENVIRONMENT, ids=lambda c: c.name)
def test_unusable_kernel_source_is_one_line_naming_file_and_line(case, tmp_path):
    folder = kernels_dir(tmp_path / "k", (case.source, f"{case.kernel}_kernel.cu"))
    assert_environment_error(audit(folder, tmp_path), *case.fragments)
    assert not (tmp_path / "audit.md").exists()  # no document for an audit that never ran


def test_missing_folder(tmp_path):
    missing = tmp_path / "no-such-kernels"
    assert_environment_error(audit(missing, tmp_path), str(missing), "no such directory")


def test_folder_without_a_known_kernel_file(tmp_path):
    folder = kernels_dir(tmp_path / "k", (VARIANTS / POLYAK / "bad_hard_copy.cu", "polyak.cu"))
    assert_environment_error(audit(folder, tmp_path), "holds no known kernel file")


# ---- the other commands take --kernels too ----
def test_mutants_audits_the_folder_and_skips_patches_its_code_lacks(tmp_path):
    """no-nan-branch patches the bundled scale kernel's text, which a trainer's own kernel does
    not contain: not applicable, never a false survivor; a wiring fault still runs and is caught."""
    ok = Variant(SCALE, "ok_grid_stride_if_else")
    folder = kernels_dir(tmp_path / "k", (ok.source, ok.file))
    json_out = tmp_path / "mutants.json"
    args = ["--only", "no-nan-branch", "--only", "skip-scale", "--json", json_out]
    result = egf_audit("mutants", "--device", DEVICE, "--kernels", folder, *args)
    assert result.exit_code == 0, result.output
    faults = {f["name"]: f for f in json.loads(json_out.read_text())["faults"]}
    assert faults["no-nan-branch"]["applicable"] is False
    assert {"EGF003", "EGF004", "EGF008"} <= set(faults["skip-scale"]["caught_by"])


@pytest.mark.parametrize("command", ["mutants", "bench"])
def test_other_commands_refuse_a_broken_folder_the_same_way(command, tmp_path):
    case = ENVIRONMENT[0]
    folder = kernels_dir(tmp_path / "k", (case.source, f"{case.kernel}_kernel.cu"))
    assert_environment_error(
        egf_audit(command, "--device", DEVICE, "--kernels", folder), *case.fragments
    )
