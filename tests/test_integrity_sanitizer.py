"""`--sanitize` (issue 11, Deliver 2): the commands egf-audit gives compute-sanitizer and the
parsing of its reports. The two logs under data/ were recorded with compute-sanitizer 2025.3.1
(CUDA 13.0) on an H200, running the `b > rows` scale kernel (an out-of-bounds write, and reads of
an ISV nothing wrote); running the audit itself under the sanitizer needs a GPU (test_gpu.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from egf_audit.cli import sanitize
from egf_audit.cli.app import app
from egf_audit.cli.commands import RunRequest
from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime import sanitizer

DATA = Path(__file__).parent / "data"
MEMCHECK = (DATA / "compute_sanitizer_memcheck.log").read_text()
INITCHECK = (DATA / "compute_sanitizer_initcheck.log").read_text()


def test_a_recorded_memcheck_report_is_parsed():
    report = sanitizer.parse("memcheck", MEMCHECK)
    assert report.errors == 2 and report.failure is None
    write, launch_failure = report.findings
    assert write.what == "Invalid __global__ write of size 4 bytes"
    assert write.kernel == "sp14_scale_wire_col"
    assert write.thread == "thread (64,0,0) in block (0,0,0)"
    assert write.detail.startswith("Access to 0x") and write.detail.endswith("is out of bounds")
    assert launch_failure.what.startswith("Program hit cudaErrorLaunchFailure (error 719)")
    assert launch_failure.kernel is None
    assert report.failing(sanitize.AUDITED_KERNELS) == report.findings  # memcheck: every one


def test_a_recorded_initcheck_report_is_parsed():
    report = sanitizer.parse("initcheck", INITCHECK)
    assert report.errors == 65 and len(report.findings) == 65
    assert {f.kernel for f in report.findings} == {"sp14_scale_wire_col"}
    assert all(
        f.what == "Uninitialized __global__ memory read of size 4 bytes" for f in report.findings
    )
    assert len(report.failing(sanitize.AUDITED_KERNELS)) == 65
    assert report.as_dict()["findings"].count(";") == sanitizer.MAX_LISTED - 1


def test_initcheck_in_a_library_kernel_is_reported_but_does_not_fail():
    library = INITCHECK.replace("sp14_scale_wire_col", "sgemm_128x64_nn")
    report = sanitizer.parse("initcheck", library)
    assert report.errors == 65 and report.failing(sanitize.AUDITED_KERNELS) == []


def test_output_without_a_summary_is_a_failure_not_a_clean_report():
    report = sanitizer.parse("memcheck", MEMCHECK.split("========= ERROR SUMMARY")[0])
    assert report.failure == "no ERROR SUMMARY in its output"


def test_a_clean_report():
    report = sanitizer.parse(
        "memcheck", "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
    )
    assert (report.errors, report.findings, report.failure) == (0, [], None)
    assert report.as_dict() == {"errors": 0, "findings": "none"}


def test_the_commands():
    req = RunRequest(
        preset="ci", seed=3, steps=1, mode="live", kernels_dir=Path("k"), launch_timeout_s=7.0
    )
    config = type("Config", (), {"preset": "ci", "seed": 3})()
    child = sanitizer.audit_argv(sanitize.child_args(req, config), Path("scratch/audit.md"))
    assert child == [
        sys.executable, "-m", "egf_audit", "run", "--preset", "ci", "--seed", "3", "--steps",
        "1", "--mode", "live", "--kernels", "k", "--launch-timeout", "7.0", "--device", "cuda",
        "--out",
        "scratch/audit.md", "--quiet",
    ]  # fmt: skip
    assert sanitizer.sanitizer_command("/cs", "initcheck", child) == [
        "/cs", "--tool", "initcheck", "--print-limit", "100", "--show-backtrace", "no",
        "--target-processes", "all", *child,
    ]  # fmt: skip


def test_sanitize_runs_each_tool_and_fails_on_what_it_found(tmp_path, monkeypatch):
    """A stand-in compute-sanitizer that logs its arguments and prints the recorded reports."""
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls\n'
        f'if [ "$2" = memcheck ]; then cat {DATA}/compute_sanitizer_memcheck.log; '
        f"else cat {DATA}/compute_sanitizer_initcheck.log; fi\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    config = type("Config", (), {"preset": "ci", "seed": 0})()
    found, failing = sanitize.sanitize(RunRequest(), config, "cuda")
    assert found["memcheck"]["errors"] == 2 and found["initcheck"]["errors"] == 65
    assert (
        "Invalid __global__ write of size 4 bytes in sp14_scale_wire_col"
        in (found["memcheck"]["findings"])
    )
    assert len(failing) == 2 + 65
    assert failing[0].startswith("compute-sanitizer memcheck: Invalid __global__ write")
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[1] for c in calls] == ["memcheck", "initcheck"]
    assert all("-m egf_audit run" in c and "--device cuda" in c for c in calls)


def test_sanitize_without_the_tool_is_one_environment_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    config = type("Config", (), {"preset": "ci", "seed": 0})()
    with pytest.raises(AuditEnvironmentError, match="compute-sanitizer is not on PATH"):
        sanitize.sanitize(RunRequest(), config, "cuda")


def test_sanitize_on_the_cpu_is_a_usage_error(tmp_path):
    args = ["run", "--device", "cpu", "--sanitize", "--out", str(tmp_path / "a.md")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--sanitize needs --device cuda" in result.stderr
    assert not (tmp_path / "a.md").exists()
