"""The cuBLAS log parser and the one-to-one matcher, on a log in cuBLAS's API-logger format."""

from __future__ import annotations

from pathlib import Path

from egf_audit.cublas_witness import match, parse_log
from egf_audit.trace import Launch

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
