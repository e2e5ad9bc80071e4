"""The cuBLAS log parser and the one-to-one matcher, on a log in cuBLAS's API-logger format."""

from __future__ import annotations

from pathlib import Path

import pytest

from egf_audit.runtime.cublas_witness import LoggerTap, match, match_tap, parse_log
from egf_audit.trace.model import Launch

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
            "handle": "0x1881fee0",
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


def _on_handle(handle: int, k: int = 32) -> str:
    """The fixture's Sgemm record as cuBLAS logs it on another handle (and with another k)."""
    record = LOG.split("I! cuBLAS", 2)[1]
    record = record.replace("0x0x1881fee0", f"0x0x{handle:x}").replace("val=32\n", f"val={k}\n", 1)
    return "I! cuBLAS" + record


PIPELINE, TORCH = 0x1881FEE0, 0x2F00BEEF


def test_gemms_on_another_handle_are_foreign_and_the_pipelines_still_match_one_to_one():
    """torch's start-up overlaps the scenarios and logs GEMMs of its own (on its own handle)
    between the pipeline's: they are counted as foreign and never paired."""
    log = _on_handle(TORCH, k=7) + LOG + _on_handle(TORCH, k=9) + _on_handle(PIPELINE, k=31)
    recorded = [_sgemm("a", "T", 32), _sgemm("b", "T", 31)]
    result = match(parse_log(log), recorded, handles={PIPELINE})
    assert (result.logged, result.recorded, result.matched, result.foreign) == (2, 2, 2, 2)
    assert result.ok and result.as_dict()["foreign"] == 2
    # the same log paired without the handle filter: the foreign calls break the pairing
    assert not match(parse_log(log), recorded).ok


def test_a_pipeline_gemm_missing_from_its_handle_is_not_covered_by_a_foreign_one():
    log = _on_handle(TORCH, k=31) + LOG
    result = match(parse_log(log), [_sgemm("a", "T", 32), _sgemm("b", "T", 31)], {PIPELINE})
    assert (result.logged, result.recorded, result.foreign, result.ok) == (1, 2, 1, False)


def test_a_call_whose_handle_the_log_does_not_show_is_paired_all_the_same():
    unnamed = LOG.replace(
        "i!  handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x1881fee0)\n", ""
    )
    assert "handle" not in parse_log(unnamed)[0]
    result = match(parse_log(unnamed + LOG), [_sgemm("a", "T", 32)], {PIPELINE})
    assert (result.logged, result.recorded, result.foreign, result.ok) == (2, 1, 0, False)


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


def test_cublas_log_without_a_usable_gpu_ends_with_exit_3(tmp_path):
    """`--device auto --cublas-log` on a machine without a GPU: the CPU backend is picked, and
    the witness it asked for cannot be had, which is said (exit 3), never a silent run."""
    import subprocess
    import sys

    from egf_audit.runtime.backends import cuda_usable

    if cuda_usable()[0]:
        pytest.skip("a usable GPU: tests/test_gpu.py covers the witness there")
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
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert "needs the CUDA backend" in proc.stderr, proc.stderr
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "audit.md").exists()


def _tap_lines(thread: int, record: str) -> list[tuple[int, str]]:
    return [(thread, line) for line in record.splitlines(keepends=True)]


PIPELINE_THREAD, TORCH_THREAD = 11, 22


def _interleaved(pipeline: list[str], torch: list[str]) -> LoggerTap:
    """A tap that received the two threads' records line by line, alternating, the way cuBLAS
    hands its logger each line in the thread that made the call."""
    tap = LoggerTap()
    ours = [x for record in pipeline for x in _tap_lines(PIPELINE_THREAD, record)]
    theirs = [x for record in torch for x in _tap_lines(TORCH_THREAD, record)]
    while ours or theirs:
        for side in (ours, theirs):
            if side:
                tap.lines.append(side.pop(0))
    return tap


def test_two_threads_logging_at_once_tear_the_log_but_not_the_witness():
    """torch's warm-up thread logs GEMMs, on the same library, while the pipeline's thread does:
    read as one log the records tear (fields lost, the pairing fails), read per thread every
    pipeline GEMM matches and the other thread's are foreign."""
    pipeline = [LOG, _on_handle(PIPELINE, k=31)]
    torch = [_on_handle(TORCH, k=7), _on_handle(TORCH, k=9), _on_handle(TORCH, k=5)]
    tap = _interleaved(pipeline, torch)
    recorded = [_sgemm("a", "T", 32), _sgemm("b", "T", 31)]
    torn = match(parse_log("".join(line for _, line in tap.lines)), recorded, {PIPELINE})
    assert not torn.ok
    result = match_tap(tap, PIPELINE_THREAD, recorded, {PIPELINE})
    assert (result.logged, result.recorded, result.matched, result.foreign) == (2, 2, 2, 3)
    assert result.ok


def test_a_pipeline_gemm_only_another_thread_logged_is_missing():
    """The other thread's calls never stand in for the pipeline's, whatever handle they name."""
    tap = _interleaved([LOG], [_on_handle(PIPELINE, k=31)])
    result = match_tap(tap, PIPELINE_THREAD, [_sgemm("a", "T", 32), _sgemm("b", "T", 31)], None)
    assert (result.logged, result.recorded, result.foreign, result.ok) == (1, 2, 1, False)


def test_the_tap_keeps_each_line_with_the_thread_that_logged_it():
    import threading

    tap = LoggerTap()
    tap._on_line(b"I! cuBLAS (v13.1.0) function cublasStatus_t cublasSgemm_v2(...) called:")
    seen = threading.Thread(target=tap._on_line, args=(b"i!  m: type=int; val=64\n",))
    seen.start()
    seen.join()
    me = threading.get_ident()
    assert tap.text_of(me).endswith("called:\n")  # a line without its newline gets one
    assert tap.other_threads(me) == [seen.ident]
    assert tap.text_of(seen.ident or 0) == "i!  m: type=int; val=64\n"
