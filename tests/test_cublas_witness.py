"""The cuBLAS log parser and the one-to-one matcher, on a log in cuBLAS's API-logger format."""

from __future__ import annotations

from egf_audit.cublas_witness import match, parse_log
from egf_audit.trace import Launch

LOG = """\
I! cuBLAS (v13.1) function cublasStatus_t cublasSgemm_v2(cublasContext*, cublasOperation_t, \
cublasOperation_t, int, int, int, const float*, const float*, int, const float*, int, \
const float*, float*, int) called:
i!  handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x5555)
i!  transa: type=cublasOperation_t; val=CUBLAS_OP_T(1)
i!  transb: type=cublasOperation_t; val=CUBLAS_OP_N(0)
i!  m: type=int; val=32
i!  n: type=int; val=64
i!  k: type=int; val=49
i!  alpha: type=float; val=POINTER (IN HEX:0x0x7ffd)
i!  A: type=float; val=POINTER (IN HEX:0x0x7f00)
i!  lda: type=int; val=49
i!  B: type=float; val=POINTER (IN HEX:0x0x7f01)
i!  ldb: type=int; val=49
i!  beta: type=float; val=POINTER (IN HEX:0x0x7ffe)
i!  C: type=float; val=POINTER (IN HEX:0x0x7f02)
i!  ldc: type=int; val=32
i! Time: 2026-12-02T10:00:00 elapsed from start 0.001 minutes or 0.06 seconds
i!Process=1 Thread=1 GPU=0 Handle=POINTER (IN HEX:0x0x5555) StreamId=0 (defaultStream) \
MathMode=CUBLAS_DEFAULT_MATH
I! cuBLAS (v13.1) function cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) called:
i!  handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x5555)
"""


def _sgemm(label: str, transa: str, k: int, executed: bool = True) -> Launch:
    args = {
        "transa": transa,
        "transb": "N",
        "m": 32,
        "n": 64,
        "k": k,
        "lda": 49,
        "ldb": 49,
        "ldc": 32,
    }
    return Launch(0, 0, "sgemm", "sgemm", label, args, (), executed)


def test_parser_reads_every_gemm_argument_and_skips_other_calls():
    calls = parse_log(LOG)
    assert calls == [
        {
            "api": "cublasSgemm_v2",
            "transa": "T",
            "transb": "N",
            "m": "32",
            "n": "64",
            "k": "49",
            "lda": "49",
            "ldb": "49",
            "ldc": "32",
        }
    ]


def test_matching_log_and_trace_agree_one_to_one():
    result = match(parse_log(LOG), [_sgemm("forward_branch_fc[d=0]@online", "T", 49)])
    assert (result.logged, result.recorded, result.matched, result.ok) == (1, 1, 1, True)


def test_a_recorded_argument_cuBLAS_did_not_see_is_a_mismatch():
    result = match(parse_log(LOG), [_sgemm("forward_branch_fc[d=0]@online", "T", 48)])
    assert not result.ok
    assert result.mismatches[0]["recorded"]["k"] == "48"
    assert result.mismatches[0]["logged"]["k"] == "49"


def test_unexecuted_launches_are_not_expected_in_the_log_and_counts_must_agree():
    refused = _sgemm("oob", "T", 49, executed=False)
    assert match(parse_log(LOG), [_sgemm("a", "T", 49), refused]).ok
    assert not match(parse_log(LOG), [_sgemm("a", "T", 49), _sgemm("b", "T", 49)]).ok
