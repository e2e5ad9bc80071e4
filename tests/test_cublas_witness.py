"""The cuBLAS log parser and the one-to-one matcher, on a log in cuBLAS's API-logger format."""

from __future__ import annotations

from pathlib import Path

import pytest

from egf_audit.runtime.cublas_witness import match, parse_log
from egf_audit.runtime.trace import Launch

# One Sgemm record and the start of the next call, verbatim as cuBLAS 13.1 logged them on an H200.
LOG = (Path(__file__).parent / "data" / "cublas_api_sgemm.log").read_text()


def _sgemm(label: str, transa: str, k: int, executed: bool = True) -> Launch:
    args = {
        "transa": transa,
        "transb": "N",
        "m": 64,
        "n": 64,
        "k": k,
        "lda": 32,
        "ldb": 32,
        "ldc": 64,
    }
    return Launch(0, 0, "sgemm", "sgemm", label, args, (), executed)


def test_parser_reads_every_gemm_argument_and_skips_other_calls():
    calls = parse_log(LOG)
    assert calls == [
        {
            "api": "cublasSgemm_v2",
            "transa": "T",
            "transb": "N",
            "m": "64",
            "n": "64",
            "k": "32",
            "lda": "32",
            "ldb": "32",
            "ldc": "64",
        }
    ]


def test_matching_log_and_trace_agree_one_to_one():
    result = match(parse_log(LOG), [_sgemm("forward_s1@online", "T", 32)])
    assert (result.logged, result.recorded, result.matched, result.ok) == (1, 1, 1, True)


def test_a_recorded_argument_cuBLAS_did_not_see_is_a_mismatch():
    result = match(parse_log(LOG), [_sgemm("forward_s1@online", "T", 31)])
    assert not result.ok
    assert result.mismatches[0]["recorded"]["k"] == "31"
    assert result.mismatches[0]["logged"]["k"] == "32"


def test_unexecuted_launches_are_not_expected_in_the_log_and_counts_must_agree():
    refused = _sgemm("oob", "T", 32, executed=False)
    assert match(parse_log(LOG), [_sgemm("a", "T", 32), refused]).ok
    assert not match(parse_log(LOG), [_sgemm("a", "T", 32), _sgemm("b", "T", 32)]).ok


def test_the_witness_stays_out_of_the_document(tmp_path):
    """The witness exists only on the CUDA backend, so a document with it must be the bytes of
    one made without it (e.g. on the CPU); the step summary shows it."""
    import dataclasses

    from egf_audit.cli.commands import RunRequest, run_audit
    from egf_audit.reports.document import render_document
    from egf_audit.reports.environment import environment_markdown

    outcome = run_audit(RunRequest(device="cpu", out=tmp_path / "audit.md", mode="sentinel"))
    witness = {"logged": 3, "recorded": 3, "matched": 3, "ok": True, "mismatches": []}
    report = dataclasses.replace(outcome.report, witness=witness)
    assert render_document(report) == outcome.document
    assert "### cuBLAS witness: 3 of 3 GEMMs match" in environment_markdown(report)


def test_cublas_log_on_the_cpu_backend_is_a_usage_error(tmp_path):
    from typer.testing import CliRunner

    from egf_audit.cli.app import app

    out = tmp_path / "audit.md"
    result = CliRunner().invoke(
        app,
        ["run", "--device", "cpu", "--cublas-log", "--out", str(out)],
        env={"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"},
    )
    assert result.exit_code == 2
    assert "--cublas-log needs --device cuda" in result.stderr
    assert "Traceback" not in result.output
    assert not out.exists()


def test_the_command_restarts_with_the_logger_switched_on(tmp_path):
    """`egf-audit run --cublas-log` starts itself again with cuBLAS's logger variables set (the
    marker reaches the command); without a GPU that command then ends with exit 3."""
    import os
    import subprocess
    import sys

    from egf_audit.runtime.backends import cuda_usable

    if cuda_usable()[0]:
        pytest.skip("a usable GPU: tests/test_gpu.py covers the witness there")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUBLAS_", "EGF_AUDIT_CUB"))}
    cmd = [
        sys.executable,
        "-m",
        "egf_audit",
        "run",
        "--device",
        "auto",
        "--cublas-log",
        "--quiet",
        "--out",
        str(tmp_path / "audit.md"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert "needs the CUDA backend" in proc.stderr, proc.stderr
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "audit.md").exists()
