"""CPU SGEMMs follow cuBLAS's argument rules (issue 11, Deliver 8): what cuBLAS refuses with
CUBLAS_STATUS_INVALID_VALUE is refused here too, recorded on the launch and failed by EGF001 in
instrumented mode; alpha == 0 reads neither A nor B."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from egf_audit.invariants import INVARIANTS_BY_CODE
from egf_audit.pipeline.step import SP14Pipeline
from egf_audit.trace.gemm_rules import GemmRefused, GemmShape, invalid_value

# (transa, transb, m, n, k, lda, ldb, ldc) and the words of the refusal
REFUSED = (
    (("C", "N", 4, 3, 2, 4, 2, 4), "transa = 'C' is not N or T"),
    (("N", "X", 4, 3, 2, 4, 2, 4), "transb = 'X' is not N or T"),
    (("N", "N", -1, 3, 2, 4, 2, 4), "m = -1 is negative"),
    (("N", "N", 4, 3, -2, 4, 2, 4), "k = -2 is negative"),
    (("N", "N", 4, 3, 2, 3, 2, 4), "lda = 3 is below max(1, 4)"),
    (("T", "N", 4, 3, 2, 1, 2, 4), "lda = 1 is below max(1, 2)"),
    (("N", "T", 4, 3, 2, 4, 2, 4), "ldb = 2 is below max(1, 3)"),
    (("N", "N", 4, 3, 2, 4, 2, 3), "ldc = 3 is below max(1, 4)"),
    (("N", "N", 0, 0, 0, 0, 1, 1), "lda = 0 is below max(1, 0)"),
)
ACCEPTED = (
    ("N", "N", 4, 3, 2, 4, 2, 4),
    ("T", "T", 4, 3, 2, 2, 3, 5),  # a leading dimension above the stored rows is allowed
    ("N", "N", 0, 0, 0, 1, 1, 1),
)


@pytest.mark.parametrize(("args", "words"), REFUSED, ids=lambda v: str(v))
def test_cublas_refusals(args, words):
    reason = invalid_value(GemmShape(*args))
    assert reason is not None and reason.startswith("CUBLAS_STATUS_INVALID_VALUE")
    assert words in reason


@pytest.mark.parametrize("args", ACCEPTED, ids=str)
def test_valid_arguments_pass(args):
    assert invalid_value(GemmShape(*args)) is None


@pytest.fixture
def pipe(ci_config, cpu_backend):
    p = SP14Pipeline(ci_config, cpu_backend, instrumented=True, scenario="gemm-rules")
    yield p
    p.release()


def test_the_cpu_backend_refuses_what_cublas_refuses(pipe):
    a = pipe.ptr("obs")
    with pytest.raises(GemmRefused, match="lda = 1 is below"):
        pipe.backend.sgemm("N", "N", 2, 1, 1, 1.0, a, 1, a, 1, 0.0, a, 2)


def test_alpha_zero_reads_neither_a_nor_b(pipe):
    """C = beta * C with NaN in A and B: cuBLAS does not read them, so no NaN reaches C."""
    rec, d = pipe.rec, pipe.dims
    rec.upload("test:a", pipe.ptr("obs"), np.full((d.B, d.OBS), np.nan, np.float32))
    rec.upload("test:c", pipe.ptr("next_obs"), np.ones((d.B, d.OBS), np.float32))
    # C: next_obs as column-major OBS x B; A (OBS x 1) and B (1 x B) both from the NaN obs
    a, c = pipe.ptr("obs"), pipe.ptr("next_obs")
    rec.sgemm("test:alpha0", "N", "N", d.OBS, d.B, 1, 0.0, a, d.OBS, a, 1, 0.5, c, d.OBS)
    assert np.array_equal(rec.read("next_obs"), np.full(d.B * d.OBS, 0.5, np.float32))


def test_a_refused_sgemm_is_recorded_not_run_and_fails_egf001(pipe, ci_audit_run):
    rec = pipe.rec
    before = rec.read("next_obs")
    c = pipe.ptr("next_obs")
    rec.sgemm("test:bad_ldc", "N", "N", 4, 2, 1, 1.0, c, 4, c, 1, 0.0, c, 3)
    launch = rec.trace.launches[-1]
    assert not launch.executed and "ldc = 3 is below max(1, 4)" in launch.refused
    assert np.array_equal(rec.read("next_obs"), before)

    # the same launch in a production trace: EGF001 fails naming the refusal
    production = ci_audit_run.traces["live"]
    damaged = dataclasses.replace(production, launches=[*production.launches, launch])
    run = dataclasses.replace(ci_audit_run, traces={**ci_audit_run.traces, "live": damaged})
    verdict = INVARIANTS_BY_CODE["EGF001"].verdict(run, "live")
    assert verdict.failed and "CUBLAS_STATUS_INVALID_VALUE" in verdict.summary
    assert "test:bad_ldc" in verdict.summary
