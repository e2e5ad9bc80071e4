"""The rules an invariant applies to the rebuild's trace and to a capture's alike (issue 30,
"one rule per invariant"): each rule judged on its own, exactly, here; that both modes reach the
same verdict through it on every fault of the catalogue is tests/test_capture_faults.py's."""

from __future__ import annotations

import math

import pytest

from egf_audit.invariants.egf005_target_net_untouched import target_write
from egf_audit.invariants.egf007_d_h_s2_accumulation import zeroing
from egf_audit.invariants.egf012_gate_range_fail_closed import GateReading, reading_problem
from egf_audit.runtime.contract import POLYAK_KERNEL, TARGET
from egf_audit.runtime.trace import Binding, Launch, Region

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
