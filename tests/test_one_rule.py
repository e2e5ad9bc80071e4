"""The rules an invariant applies to the rebuild's trace and to a capture's alike (issue 30,
"one rule per invariant"): each rule judged on its own, exactly, here; that both modes reach the
same verdict through it on every fault of the catalogue is tests/test_capture_faults.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from egf_audit.invariants.common import bit_mismatch, bits
from egf_audit.invariants.egf002_dw_unaffected_by_scale import FlowCall, dw_flow_problems
from egf_audit.invariants.egf005_target_net_untouched import target_write
from egf_audit.invariants.egf007_d_h_s2_accumulation import zeroing
from egf_audit.invariants.egf012_gate_range_fail_closed import GateReading, reading_problem
from egf_audit.invariants.launch_shape import launch_shape_problem
from egf_audit.invariants.wire_gate import expected_wire
from egf_audit.trace.call_sites import Cut, Site, call_sites
from egf_audit.trace.contract import ACCUMULATE_KERNEL, POLYAK_KERNEL, TARGET
from egf_audit.trace.model import Binding, Launch, Region
from egf_audit.trace.spans import Spans

# ---- EGF012: one reading of ISV[393] against what the contract asks of it there ----
GATE_CASES = [
    # value, must be in [0, 1], must be +0.0, the rule's answer
    (0.0, True, True, None),
    (0.37, True, False, None),
    (1.0, True, False, None),
    (-0.0, False, True, "not-closed"),  # bitwise +0.0 only: -0.0 is an open gate
    (-0.0, True, False, None),  # -0.0 == 0.0 lies in [0, 1]
    (1e-45, False, True, "not-closed"),  # the smallest subnormal is open
    (math.nan, False, True, "not-closed"),
    (math.nan, True, False, "out-of-range"),
    (math.inf, True, False, "out-of-range"),
    (-1e-7, True, False, "out-of-range"),
    (1.0000001, True, False, "out-of-range"),
    (2.0, True, True, "out-of-range"),  # a probe that should close and reads 2.0: range first
    (0.5, True, True, "not-closed"),
    (None, True, False, "missing"),
    (None, False, True, "missing"),
]


@pytest.mark.parametrize(("value", "in_range", "closed", "problem"), GATE_CASES)
def test_gate_reading_rule(value, in_range, closed, problem):
    assert reading_problem(GateReading(value, in_range=in_range, closed=closed)) == problem


def test_a_reading_asked_nothing_holds_whatever_its_value():
    for value in (math.nan, -5.0, 3.0):
        assert reading_problem(GateReading(value, in_range=False, closed=False)) is None


# ---- EGF005: who writes the target net ----
def _launch(kind: str, name: str, *bindings: tuple[str, str, str]) -> Launch:
    """A launch whose bindings are (role, access, buffer), one element each."""
    bound = tuple(
        Binding(role, 4096, access, Region(buffer, 0, 1, 1, 1), None, None, True)
        for role, access, buffer in bindings
    )
    return Launch(7, 1, kind, name, f"{name}@test", {}, bound)


WRITER_CASES = [
    # the launch, whether the step's snapshots prove the target unchanged, the rule's answer
    (_launch("kernel", POLYAK_KERNEL, ("target", "rw", TARGET)), False, None),
    (_launch("sgemm", "sgemm", ("A", "r", TARGET), ("C", "w", "grad_buf")), False, None),
    (_launch("sgemm", "sgemm", ("A", "r", "params"), ("C", "rw", TARGET)), False, "declared"),
    (_launch("sgemm", "sgemm", ("A", "r", "params"), ("C", "rw", TARGET)), True, "declared"),
    (_launch("copy", "copy", ("dst", "w", TARGET), ("src", "r", "params")), False, "declared"),
    (_launch("kernel", "bias_relu", ("p0", "?", TARGET)), False, "unproven"),
    (_launch("kernel", "bias_relu", ("p0", "?", TARGET)), True, None),
    (_launch("kernel", "bias_relu", ("p0", "?", "params")), False, None),
    # a copy of polyak's name is no kernel: its write is declared like any other
    (_launch("copy", POLYAK_KERNEL, ("dst", "w", TARGET)), False, "declared"),
]


@pytest.mark.parametrize(("launch", "proven", "written"), WRITER_CASES)
def test_target_writer_rule(launch, proven, written):
    assert target_write(None, launch, proven) == written


# ---- EGF007: the zero baseline of d_h_s2 in one call site's window ----
N = 6  # elements of d_h_s2


def _on_d_h_s2(kind: str, name: str, access: str, width: int = N, **args) -> Launch:
    role = {"sgemm": "C", "memset": "dst", "copy": "dst"}.get(kind, "p0")
    region = Region("d_h_s2", 0, 1, width, width)
    bound = (Binding(role, 4096, access, region, None, None, True),)
    return Launch(3, 0, kind, name, f"{name}@test", args, bound)


ZERO = _on_d_h_s2("memset", "memset", "w", value=0)
ADD = _on_d_h_s2("sgemm", "sgemm", "rw", beta=1.0)
REPLACE = _on_d_h_s2("sgemm", "sgemm", "w", beta=0.0)
COPY = _on_d_h_s2("copy", "copy", "w")
UNKNOWN = _on_d_h_s2("kernel", "relu_grad", "?")

ZEROING_CASES = [
    # the window, the baseline the rule finds (its position), the launches that break it
    ([], None, []),
    ([ADD], None, []),
    ([_on_d_h_s2("memset", "memset", "w", width=N - 1, value=0), ADD], None, []),
    ([_on_d_h_s2("memset", "memset", "w", value=1), ADD], None, []),
    ([ZERO, ADD, ADD], 0, []),
    ([COPY, ZERO, ADD], 1, []),  # what came before the zeroing is wiped
    ([ZERO, ADD, REPLACE], 0, [2]),
    ([ZERO, COPY, ADD], 0, [1]),
    ([ZERO, UNKNOWN, ADD], 0, [1]),  # with nothing observed, it may have written anything
    ([ZERO, COPY, ZERO, ADD], 2, []),  # the last zeroing is the baseline
]


@pytest.mark.parametrize(("window", "zero", "breaks"), ZEROING_CASES)
def test_zeroing_rule(window, zero, breaks):
    found = zeroing(None, window, N)
    assert found.zero is (None if zero is None else window[zero])
    assert found.overwrites == [window[i] for i in breaks]


# ---- the call sites both modes cut from a trace's launches (trace/call_sites.py) ----
def _cut(*launches: str, step: int = 0) -> list[Cut]:
    """G: a GEMM, A: an accumulate, K: another kernel, M: a memset, C: a checkpoint."""
    kinds = {"G": ("sgemm", "sgemm"), "A": ("kernel", ACCUMULATE_KERNEL)}
    kinds |= {"K": ("kernel", "relu"), "M": ("memset", "memset"), "C": ("checkpoint", "mark")}
    return [Cut(*kinds[x], step) for x in launches]


def test_two_runs_of_accumulates_are_the_seed_s_two_call_sites():
    launches = _cut("M", "K", "G", "G", "A", "M", "A", "C", "A", "K", "M", "G", "A", "A")
    assert call_sites(launches) == [
        Site("cql", 0, begin=2, first_accumulate=4, end=8),  # a memset or checkpoint between
        Site("main", 0, begin=9, first_accumulate=12, end=13),
    ]


def test_another_number_of_runs_is_named_by_position():
    launches = _cut("G", "A", "K", "A", "K", "A")
    assert [s.name for s in call_sites(launches)] == ["site0", "site1", "site2"]


def test_each_step_is_cut_on_its_own():
    launches = _cut("G", "A", "G", "A") + _cut("K", "A", "G", "A", step=1)
    sites = call_sites(launches)
    assert [(s.step, s.name, s.begin) for s in sites] == [
        (0, "cql", 0),
        (0, "main", 2),
        (1, "cql", 4),  # a step without a GEMM before its first site starts at its first launch
        (1, "main", 6),
    ]


def test_the_rebuild_s_cut_agrees_with_its_own_labels(ci_audit_run):
    """The rebuild labels every launch of a call site with the site; the cut reads no label, and
    finds the same sites: every accumulate of a site bears its name, and its window holds the
    site's zeroing, its dX GEMMs and its scale."""
    traces = [t for t in ci_audit_run.traces.values() if t.call_sites()]
    assert traces
    for trace in traces:
        for site in trace.call_sites():
            assert site.name in ("cql", "main"), (trace.scenario, site)
            inside = trace.launches[site.begin : site.end + 1]
            accumulates = trace.launches[site.first_accumulate : site.end + 1]
            assert {x.site for x in accumulates if x.name == ACCUMULATE_KERNEL} == {site.name}
            labels = {x.label for x in inside}
            assert f"zero_d_h_s2@{site.name}" in labels, (trace.scenario, site)
            scale = f"sp14_scale_wire_col@{site.name}"  # a replay leaves it out on purpose
            ran = any(x.label == scale for x in trace.launches if x.step == site.step)
            assert (scale in labels) == ran, (trace.scenario, site)


# ---- EGF002: dW w_b0fc computed whole, from nothing the scale wrote ----
DW = Spans.of([(1000, 1000 + 4 * 6)])  # a [2, 3] dW
WIRE = Spans.of([(2000, 2004)])  # what the scale writes


def _call(seq, *, gemm=False, scale=False, writes=None, reads=None, **why):
    return FlowCall(f"call #{seq}", seq, gemm, scale, writes, reads, **why)


def test_dw_written_whole_from_clean_inputs_holds():
    calls = [_call(1, scale=True, writes=WIRE), _call(2, gemm=True, writes=DW, reads=Spans())]
    assert dw_flow_problems(calls, DW, 3, 0) == ([], [])


def test_a_dw_gemm_reading_the_scale_s_output_fails():
    calls = [_call(1, scale=True, writes=WIRE), _call(2, gemm=True, writes=DW, reads=WIRE)]
    problems, _ = dw_flow_problems(calls, DW, 3, 0)
    assert problems == [
        "step 0: the GEMM #2 that computes dW w_b0fc read 1 elements the scale wrote"
    ]


def test_what_overwrites_the_scale_s_output_clears_it():
    calls = [
        _call(1, scale=True, writes=WIRE),
        _call(2, writes=WIRE),  # a copy over it
        _call(3, gemm=True, writes=DW, reads=WIRE),
    ]
    assert dw_flow_problems(calls, DW, 3, 0) == ([], [])


def test_a_dw_left_partly_unwritten_names_its_first_missing_element():
    half = Spans.of([(1000, 1012)])  # row 0 only
    problems, _ = dw_flow_problems([_call(1, gemm=True, writes=half, reads=Spans())], DW, 3, 4)
    assert problems == [
        "step 4: the step's GEMMs leave 3 of 6 elements of dW w_b0fc unwritten "
        "(first: row 1, column 0)"
    ]


def test_the_scale_writing_dw_itself_fails_at_the_step_s_end():
    calls = [_call(1, gemm=True, writes=DW, reads=Spans()), _call(2, scale=True, writes=DW)]
    problems, _ = dw_flow_problems(calls, DW, 3, 0)
    assert problems == ["step 0: dW w_b0fc holds 6 elements the scale wrote when the step ends"]


def test_a_gemm_that_cannot_be_placed_leaves_the_coverage_unjudged():
    calls = [_call(1, gemm=True, unplaced="a box of too many rows")]
    assert dw_flow_problems(calls, DW, 3, 0) == ([], ["step 0: call #1 (a box of too many rows)"])
    unread = [_call(1, gemm=True, writes=DW, unread="too many batches")]
    assert dw_flow_problems(unread, DW, 3, 0) == ([], ["step 0: call #1 (too many batches)"])


# ---- EGF003 and EGF004: what the scale must leave in the wire column ----
G = np.array([-0.02, np.nan, np.inf, -np.inf, 3.0, -0.0, 1e-45], dtype=np.float32)


def test_a_closed_gate_leaves_plus_zero_on_every_row_whatever_the_wire_held():
    assert (bits(expected_wire(np.float32(0.0), G)) == 0).all()
    assert (bits(expected_wire(np.float32(-0.0), G)) == 0).all()  # -0.0 == 0.0: the gate is shut


@pytest.mark.parametrize("alpha", [0.37, 1.0, 1e-30])
def test_an_open_gate_leaves_the_fp32_product(alpha):
    a = np.float32(alpha)
    with np.errstate(invalid="ignore"):
        product = np.array([a * g for g in G], dtype=np.float32)
    assert not bit_mismatch(expected_wire(a, G), product).any()


@pytest.mark.parametrize("alpha", [0.0, 0.37, 1.0])
def test_the_rebuild_s_tensors_and_a_capture_s_arrays_get_the_same_bits(alpha):
    a = np.float32(alpha)
    from_tensor = expected_wire(a, torch.from_numpy(G.copy())).numpy()
    assert not bit_mismatch(from_tensor, expected_wire(a, G)).any()


# ---- EGF001: a kernel launch's grid and block against the threads its contract needs ----
def _kernel(name: str, grid: object, block: object, **args: int) -> Launch:
    return Launch(0, 0, "kernel", name, name, {**args, "grid": grid, "block": block})


SCALE_ARGS = {"rows": 64, "ld": 49, "wire_col": 48, "isv_index": 393}
SHAPE_CASES = [
    # the rebuild records x alone; a capture all three dimensions
    (_kernel("sp14_scale_wire_col", 1, 256, **SCALE_ARGS), None),
    (_kernel("sp14_scale_wire_col", [1, 1, 1], [64, 1, 1], **SCALE_ARGS), None),  # exactly
    (_kernel("sp14_scale_wire_col", [1, 1, 1], [63, 1, 1], **SCALE_ARGS), "runs 63 threads"),
    (_kernel("sp14_scale_wire_col", [2, 1, 1], [32, 1, 1], **SCALE_ARGS), None),
    (_kernel("sp14_scale_wire_col", 0, 256, **SCALE_ARGS), "runs 0 threads"),
    (_kernel("sp14_scale_wire_col", [1, 2, 1], [256, 1, 1], **SCALE_ARGS), "1-D"),
    (_kernel("sp14_scale_wire_col", [1, 1, 1], [256, 1, 2], **SCALE_ARGS), "1-D"),
    (_kernel("sp14_scale_wire_col", None, 256, **SCALE_ARGS), "not recorded"),
    (_kernel("sp14_scale_wire_col", [1, 1], [256, 1, 1], **SCALE_ARGS), "not recorded"),
    (_kernel("sp14_scale_wire_col", [True, 1, 1], [256, 1, 1], **SCALE_ARGS), "not recorded"),
    (_kernel("sp14_scale_wire_col", 1.5, 256, **SCALE_ARGS), "not recorded"),
    (_kernel("sp14_scale_wire_col", True, 256, **SCALE_ARGS), "not recorded"),
    (_kernel("sp14_scale_wire_col", [1, 1, 1], [256, 1, 1]), "do not say how many threads"),
    # one thread an element: rows * sh2 for the accumulate, n for Polyak
    (_kernel(ACCUMULATE_KERNEL, [12, 1, 1], [256, 1, 1], rows=64, sh2=48, ld_concat=49), None),
    (
        _kernel(ACCUMULATE_KERNEL, [11, 1, 1], [256, 1, 1], rows=64, sh2=48, ld_concat=49),
        "where its contract needs 3072",
    ),
    (_kernel(POLYAK_KERNEL, [55, 1, 1], [256, 1, 1], n=13874), None),
    (_kernel(POLYAK_KERNEL, [54, 1, 1], [256, 1, 1], n=13874), "the last 50 are never written"),
    # a kernel egf-audit does not know has no contract to hold its launch to
    (_kernel("dqn_bias_forward", [1, 1, 1], [1, 1, 1], rows=64), None),
]


@pytest.mark.parametrize(("launch", "problem"), SHAPE_CASES)
def test_launch_shape_rule(launch, problem):
    found = launch_shape_problem(launch)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def test_only_kernel_launches_have_a_shape_to_judge():
    memset = Launch(0, 0, "memset", POLYAK_KERNEL, "memset", {"grid": 0, "block": 0})
    assert launch_shape_problem(memset) is None


def test_every_launch_of_the_rebuild_has_the_shape_its_contract_asks(ci_audit_run):
    """The rebuild launches every kernel through `blocks_for`: the rule holds it, on every
    launch of every scenario (a rule that failed the rebuild would fail every clean audit)."""
    kernels = [x for t in ci_audit_run.traces.values() for x in t.launches if x.kind == "kernel"]
    assert kernels and all(launch_shape_problem(x) is None for x in kernels)


# ---- what a guard saw a kernel of the trainer's own write (trace/evidence.py) ----
def _guarded_bias_launch():
    """The outsider's GPU recording (a guard around each launch of its own kernels) and its
    first dqn_bias_forward launch whose guard compared the allocation target_params lies in."""
    from pathlib import Path

    from egf_audit.cli.capture_audit import audit_capture
    from egf_audit.trace.evidence import observed_write

    folder = Path(__file__).parent / "data" / "capture" / "outsider" / "recorded" / "out-clean"
    ct = audit_capture(folder, use_layout=True).processes[0].trace
    found = [
        x for x in ct.kernels("dqn_bias_forward") if observed_write(ct, x, "target_params") is False
    ]
    assert found, "no guarded bias launch compared the target"
    return ct, found[0]


def test_a_guard_is_evidence_only_for_a_buffer_it_compared_whole():
    from egf_audit.trace.evidence import observed_write

    ct, x = _guarded_bias_launch()
    target = ct.capture.layout.buffers["target_params"]
    start, end = target.base, target.base + 4 * target.size
    seq = ct.capture.records[x.index].seq
    guard = ct.capture.process.guards[seq]

    def seen(compared, changed=()):
        ct.capture.process.guards[seq] = guard._replace(compared=compared, changed=changed)
        return observed_write(ct, x, "target_params")

    assert seen(((start, end - start),)) is False  # compared exactly: nothing changed
    assert seen(((start - 256, end - start + 512),), ((end, 4), (start - 4, 4))) is False
    assert seen(((start, end - start),), ((start, 4),)) is True
    assert seen(((start, end - start),), ((end - 4, 4),)) is True
    # what was compared starts one word into the target, or ends one word short of it: the
    # target's first or last word was not compared, so the guard proves nothing of it
    assert seen(((start + 4, end - start),)) is None
    assert seen(((start, end - start - 4),)) is None
    ct.capture.process.guards[seq] = guard
