"""Which tensor each GEMM reads and writes, and whether each reduction covers its tensor: EGF001's
operand-identity rule (the contract's table of GEMM roles, trace/contract_gemms.py, matched in
invariants/capture_roles.py) and its slice rule (layout tensors declared with leading axes, and
the slices a strided batch implies, invariants/gemm_spans.py).

The table is held to the rebuild's own GEMMs; the rules to the committed captures, unedited (they
keep their verdicts) and edited as tests/data/capture/lies.py edits a capture: one GEMM event's
pointer or K changed, the rest as recorded.
"""

from __future__ import annotations

import copy
from pathlib import Path

import capture_plants
import pytest

from egf_audit.cli.capture_audit import audit_capture
from egf_audit.invariants.capture_roles import role_problems
from egf_audit.invariants.common import mode_traces
from egf_audit.invariants.egf001_gemm_k_matches_lda import INVARIANT as EGF001
from egf_audit.invariants.gemm_spans import implied_slice_problem, slice_problem
from egf_audit.trace.contract_gemms import CONTRACT_GEMMS, TensorRef, entry_of
from egf_audit.trace.model import Region, Trace

DATA = Path(__file__).parent / "data" / "capture"


lies = capture_plants.lies


def _egf001(folder: Path, use_layout: bool = True) -> tuple[str, str]:
    (process,) = audit_capture(folder, use_layout=use_layout).processes
    verdict = dict(process.verdicts)["EGF001"]
    return verdict.status, verdict.summary


# ---- the table of GEMM roles ----
def test_the_contract_table_is_the_rebuilds_gemms(ci_audit_run):
    """Every SGEMM the rebuild records, in both modes and every replay, has its label's entry
    and reads and writes exactly that entry's tensors; every entry is recorded."""
    seen = set()
    for mode in ("sentinel", "live"):
        for _, trace in mode_traces(ci_audit_run, mode):
            for x in trace.sgemms():
                entry = entry_of(x.label)
                assert entry is not None, x.label
                got = tuple(TensorRef(b.region.buffer, b.tensor) for b in x.bindings)
                assert got == (entry.a, entry.b, entry.c), x.label
                seen.add(entry.label)
    assert seen == {g.label for g in CONTRACT_GEMMS}


@pytest.mark.parametrize("with_layout", [True, False], ids=["layout-file", "inferred"])
def test_the_dx_gemm_reading_the_targets_w_b0fc_fails_naming_both_tensors(tmp_path, with_layout):
    """The d = 0 dX GEMM with its A pointer moved onto target_params' w_b0fc (the same shape,
    every span whole): EGF001 names the tensor read and the one the contract names; the same
    capture unedited passes."""
    lie = lies.make("dx-reads-target-w-b0fc", tmp_path / "lie", with_layout=with_layout)
    status, summary = _egf001(lie, with_layout)
    read = "target_params.w_b0fc" if with_layout else "target_params[5379]"
    assert status == "fail"
    assert f"operand A reads {read}, where the contract's backward_branch_dx[d=0]" in summary
    assert "reads params.w_b0fc" in summary and "(4 GEMMs, 0 other launches offend)" in summary
    clean = lies.make("clean-with-exit-event", tmp_path / "clean", with_layout=with_layout)
    assert _egf001(clean, with_layout)[0] == ("pass" if with_layout else "undecided")


def _reordered(ct: Trace, order: list[int]) -> Trace:
    """The capture with its launches in another order (positions into its launches)."""
    trace = copy.copy(ct)
    trace.launches = [ct.launches[i] for i in order]
    return trace


def _clean_trace() -> Trace:
    (process,) = audit_capture(DATA / "clean", use_layout=True).processes
    return process.trace


def _positions(ct: Trace, step: int, c: str) -> list[int]:
    """The positions of the step's GEMMs writing the buffer (or grad_buf tensor) `c`."""
    return [
        i
        for i, x in enumerate(ct.launches)
        if x.kind == "sgemm"
        and x.step == step
        and any(b.role == "C" and c in (b.tensor, b.region and b.region.buffer) for b in x.bindings)
    ]


def test_a_step_order_the_contract_allows_passes():
    """No data between them: the target forward may run before the online one, and a branch's
    dX before its dW. Matched by role, the reordered step keeps every GEMM's tensors."""
    ct = _clean_trace()
    assert role_problems(ct) == {}
    order = list(range(len(ct.launches)))
    forward = [i for i, x in enumerate(ct.launches) if x.step == 0 and x.kind == "sgemm"][
        :26
    ]  # the online net's 13 forward GEMMs, then the target's 13
    assert len(forward) == 26
    swapped = forward[13:] + forward[:13]
    for at, i in zip(forward, swapped, strict=True):
        order[at] = i
    dws, dxs = _positions(ct, 0, "w_b0fc"), _positions(ct, 0, "sp14_d_dir_qaux_concat")
    assert len(dws) == 2
    for dw, dx in zip(dws, dxs, strict=True):
        order[dw], order[dx] = order[dx], order[dw]
    moved = _reordered(ct, order)
    assert role_problems(moved) == {}
    assert EGF001.capture(moved).status == "pass"


def test_a_gemm_before_the_gemm_that_writes_its_input_fails():
    """The trunk's first-layer dW (reads d_h_s1) moved ahead of the step's forward: it reads a
    tensor a contract GEMM writes before any launch of its step wrote it."""
    ct = _clean_trace()
    order = list(range(len(ct.launches)))
    (first, *_), dw = _positions(ct, 0, "save_h_s1"), _positions(ct, 0, "w_s1")[0]
    order.insert(first, order.pop(dw))
    moved = _reordered(ct, order)
    problems = role_problems(moved)
    assert list(problems.values()) == [
        "reads d_h_s1 before any launch of its step wrote it (the contract's backward_s1_dw runs "
        "after backward_s2_dx)"
    ]
    verdict = EGF001.capture(moved)
    assert verdict.status == "fail" and "reads d_h_s1 before any launch" in verdict.summary


def test_a_captured_gemm_moved_ahead_of_the_gemm_writing_its_input_fails(tmp_path):
    """The same, recorded: the trunk's first dW call moved ahead of step 0's forward in the
    events, the recorder replayed over them."""
    lie = lies.write(
        lies.rerecord(capture_plants.trunk_dw_before_the_forward(lies.base())), tmp_path, True
    )
    status, summary = _egf001(lie)
    assert status == "fail"
    assert "reads d_h_s1 before any launch of its step wrote it" in summary


# ---- reductions over slices: llm.c ----
LLMC = capture_plants.LLMC


def _plant(src: Path, dst: Path, chosen) -> Path:
    return capture_plants.k_short(src, chosen)(dst, True)


_dweight, _attention_dq = capture_plants.dweight, capture_plants.attention_dq


@pytest.mark.parametrize("name", ["llmc", "llmc-deep"])
def test_llmc_unmodified_passes_egf001_with_its_stacked_layout(name):
    for use_layout in (True, False):
        status, summary = _egf001(LLMC / name, use_layout)
        assert status == "pass" and summary.startswith("72 GEMMs keep every operand"), summary


@pytest.mark.parametrize("name", ["llmc", "llmc-deep"])
def test_llmc_dweight_k_one_short_fails_naming_tensor_slice_and_row(name, tmp_path):
    folder = _plant(LLMC / name, tmp_path / "dweight", _dweight)
    status, summary = _egf001(folder)
    assert status == "fail", summary
    assert (
        "operand A spans 127 of 128 rows of slice [1] of fch_gelu [2, 128, 512]: row 127 missing"
        in summary
    )
    # by inference nothing names fch_gelu, and one GEMM implies no slice: it cannot be seen
    assert _egf001(folder, use_layout=False)[0] == "pass"


@pytest.mark.parametrize("name", ["llmc", "llmc-deep"])
def test_llmc_attention_dq_k_one_short_fails_with_and_without_the_layout(name, tmp_path):
    folder = _plant(LLMC / name, tmp_path / "dq", _attention_dq)
    status, summary = _egf001(folder)
    assert status == "fail", summary
    assert (
        "operand A spans 31 of 32 rows of slice [1, 1, 0, 0] of qkvr [2, 3, 4, 4, 32, 32]: "
        "row 31 missing" in summary
    )
    status, summary = _egf001(folder, use_layout=False)
    assert status == "fail", summary
    assert (
        "operand A reduces over 31 of the 32 rows of each batch's slice (batch stride 1024 = "
        "32 x 32): row 31 of every batch left out" in summary
    )


# ---- the slice arithmetic, branch by branch ----
QKVR = (2, 3, 4, 4, 32, 32)  # [L, 3, B, NH, T, HS]
QKVR_FLAT = (100, 2 * 3 * 4 * 4 * 32, 32)  # at element 100


@pytest.mark.parametrize(
    ("region", "words"),
    [
        (Region("acts", 100, 32, 32, 32), None),  # one whole slice
        (Region("acts", 100 + 5 * 1024, 64, 32, 32), None),  # two whole slices
        (Region("acts", 100, 32, 31, 32), "spans 31 of 32 columns of each slice of qkvr"),
        (Region("acts", 100, 32, 32, 33), "uses row stride 33 on qkvr"),
        (Region("acts", 100 + 32, 32, 32, 32), "starts at row 1, column 0 of slice [0, 0, 0, 0]"),
        (Region("acts", 100 + 3, 1, 32, 32), "starts at row 0, column 3 of slice [0, 0, 0, 0]"),
        (Region("acts", 100 + 95 * 1024, 64, 32, 32), "reaches 32 rows past the end of qkvr"),
        (
            Region("acts", 100 + 17 * 1024, 30, 32, 32),
            "spans 30 of 32 rows of slice [0, 1, 0, 1] of qkvr [2, 3, 4, 4, 32, 32]: rows 30 "
            "to 31 missing",
        ),
        (Region("acts", 100, 0, 32, 32), None),  # an empty box reads nothing
    ],
)
def test_slice_problem(region, words):
    found = slice_problem(region, QKVR_FLAT, QKVR, "qkvr")
    assert found == words if words is None else words in found


@pytest.mark.parametrize(
    ("args", "role", "box", "words"),
    [
        # the dq GEMM, K = T - 1: A's rows run along K
        (
            {"transa": "N", "transb": "N", "batch": 16, "strideA": 1024},
            "A",
            (31, 32, 32),
            "reduces over 31 of the 32 rows",
        ),
        ({"transa": "N", "transb": "N", "batch": 16, "strideA": 1024}, "A", (32, 32, 32), None),
        ({"transa": "N", "transb": "N", "batch": 1, "strideA": 1024}, "A", (31, 32, 32), None),
        ({"transa": "N", "transb": "N", "batch": 16, "strideA": 1000}, "A", (31, 32, 32), None),
        ({"transa": "N", "transb": "N", "batch": 16, "strideA": 0}, "A", (31, 32, 32), None),
        # K along the columns (op T on A): a block of rows per batch is M, not the reduction
        ({"transa": "T", "transb": "N", "batch": 16, "strideA": 1024}, "A", (31, 32, 32), None),
        ({"transa": "N", "transb": "N", "batch": 16, "strideC": 1024}, "C", (31, 32, 32), None),
    ],
)
def test_implied_slice_problem(args, role, box, words):
    found = implied_slice_problem(args, role, box)
    assert found == words if words is None else words in found
