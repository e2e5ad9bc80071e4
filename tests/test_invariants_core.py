"""The core wiring invariants EGF001-EGF006 on the CPU cpu_backend.

Each holds on the clean pipeline in both modes; each fails on the faults it exists for, with the
deciding fact named in its evidence; the whole fault catalogue gives exactly the kill pattern
below; and no check raises on a run that lost snapshots, launches or scenarios.

Long on purpose: one table of deciding evidence per (invariant, fault) pair, kept next to the
tests that read it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rebuild_damages import (
    concat_rebuild_short_grid,
    damaged,
    dh_s2_gemms_overwrite,
    dw_gemms_not_run,
    dw_reads_the_scaled_dx,
    memset_onto_the_target,
    online_concat_reads_the_target,
    scale_writes_dw,
    unknown_kernel_on_the_target,
)

from egf_audit.invariants import FAIL, INVARIANTS_BY_CODE, PASS, Verdict
from egf_audit.invariants.polyak import polyak_error_ulps
from egf_audit.pipeline.config import preset_config
from egf_audit.scenarios.faults import FAULTS
from egf_audit.trace.audit_run import AuditRun

CODES = ("EGF001", "EGF002", "EGF003", "EGF004", "EGF005", "EGF006")
MODES = ("sentinel", "live")
CONFIG = preset_config("ci")
B, SH2, ADV = CONFIG.dims.B, CONFIG.dims.SH2, CONFIG.dims.ADV
TAU = CONFIG.hyper.tau
MODE = "<mode>"  # in an expectation: the production scenario of the mode under test


# ---- expectations ----
@dataclass(frozen=True)
class Holds:
    """A predicate on an evidence value and the mode, for facts that are not one exact value."""

    words: str
    test: Callable[[Any, str], bool]

    def __repr__(self) -> str:
        return self.words


POSITIVE = Holds("> 0", lambda value, _mode: value > 0)


def only_site(site: str) -> Holds:
    return Holds(
        f"all at {site}",
        lambda sites, _mode: bool(sites) and all(s.endswith(f":{site}") for s in sites),
    )


def contains(*items: str) -> Holds:
    """Every item (MODE replaced) is in the evidence list."""
    return Holds(
        f"contains {items}",
        lambda values, mode: all(i.replace(MODE, mode) in values for i in items),
    )


def _forced_alphas(alphas: dict[str, Any], mode: str) -> bool:
    return alphas[f"{mode}/alpha=0.37"] == pytest.approx(0.37) and alphas[f"{mode}/alpha=1"] == 1


@dataclass(frozen=True)
class Catch:
    """A fault an invariant must fail on, and the evidence that must decide it: each key is a
    dotted path into the verdict's evidence ("first.label"), each value the exact expected value
    or a `Holds` predicate; MODE inside a string stands for the mode's production scenario."""

    code: str
    fault: str
    expect: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.code}-{self.fault}"


def _wire_k(label: str, operand: str, **args: Any) -> dict[str, Any]:
    """The evidence of a K mismatch on w_b0fc: SH2 of its SH2 + 1 columns read."""
    expect = {
        "first.scenario": MODE,
        "first.label": label,
        "first.operand": operand,
        "first.tensor": "w_b0fc",
        "first.columns_read": SH2,
        "first.columns_held": SH2 + 1,
        "sgemms_checked": POSITIVE,
    }
    return expect | {f"first.sgemm_args.{k}": v for k, v in args.items()}


WIRE_NOT_ZERO = f"wire column {SH2} of sp14_d_dir_qaux_concat is not +0.0 after the scale"
WIRE_NOT_SCALED = f"wire column {SH2} is not fl(alpha * g)"

CATCHES = (
    # EGF001: the historical K mismatches, the wrapper on a call site, the short SN vector
    Catch(
        "EGF001",
        "fwd-k-sh2",
        _wire_k(
            "forward_branch_fc[d=0]@online",
            "A",
            transa="T",
            transb="N",
            m=ADV,
            n=B,
            k=SH2,
            lda=SH2 + 1,
            ldb=SH2 + 1,
            ldc=ADV,
        ),
    ),
    Catch(
        "EGF001",
        "dw-k-sh2",
        _wire_k(
            "backward_branch_dw[d=0]@cql", "C", transa="N", transb="T", m=SH2, k=B, ldc=SH2 + 1
        ),
    ),
    Catch(
        "EGF001",
        "dx-k-sh2",
        _wire_k("backward_branch_dx[d=0]@cql", "A", transa="N", transb="N", m=SH2, lda=SH2 + 1),
    ),
    Catch(
        "EGF001",
        "wrapper-on-main",
        _wire_k("backward_full_wrapper:backward_branch_dw[d=0]@main", "C", k=B, lda=SH2),
    ),
    Catch("EGF001", "sn-vector-sh2", _wire_k("spectral_norm:wt_u", "A", m=SH2, lda=SH2 + 1)),
    # EGF002: dW of w_b0fc must not follow the gate, and its wire column must be written
    Catch(
        "EGF002",
        "scale-dw-wire-col",
        {
            "alphas": Holds("the forced gates", _forced_alphas),
            "elements_differing": Holds("some", lambda d, mode: d[f"{mode}/alpha=0.37"] > 0),
            "columns_differing": [SH2],  # only the wire column moves with the gate
        },
    ),
    Catch(
        "EGF002",
        "dw-k-sh2",
        {"wire_column_zero_elements": ADV, "columns_differing": []},
    ),
    # EGF003: gate 0 closes the wire at both sites, NaN-safe, and the aux head gets nothing
    Catch(
        "EGF003",
        "skip-scale",
        {
            "first.scenario": MODE,
            "first.problems": [
                WIRE_NOT_ZERO,
                "aux_wire_backward changed d_aux_logits under gate 0",
            ],
            "failing_sites": contains(f"{MODE}@0:cql", f"{MODE}@0:main"),
        },
    ),
    Catch(
        "EGF003",
        "cql-site-ungated",
        {"first.site": "cql", "first.problems.0": WIRE_NOT_ZERO, "failing_sites": only_site("cql")},
    ),
    Catch(
        "EGF003",
        "scale-x-concat",
        {"first.problems.0": WIRE_NOT_ZERO, "failing_sites": contains(f"{MODE}@0:main")},
    ),
    Catch(
        "EGF003",
        "scale-dw-wire-col",
        {"first.problems.0": WIRE_NOT_ZERO, "first.rows_not_plus_zero": POSITIVE},
    ),
    Catch(
        "EGF003",
        "no-nan-branch",
        {
            "first.scenario": MODE,
            "first.first_bits": "0x80000000",  # -g * 0 is -0.0 without the alpha == 0 branch
            "failing_sites": contains(f"{MODE}/nonfinite@0:cql", f"{MODE}/nonfinite@0:main"),
        },
    ),
    Catch("EGF003", "scale-wrong-col", {"first.problems.0": WIRE_NOT_ZERO}),
    # EGF004: 0 < alpha <= 1 scales the wire column, and nothing else
    Catch(
        "EGF004",
        "scale-wrong-col",
        {
            "first.problems": [WIRE_NOT_SCALED, f"the scale changed columns [0, {SH2})"],
            "first.columns_touched": [SH2 - 1],
        },
    ),
    Catch(
        "EGF004",
        "skip-scale",
        {"first.problems": [WIRE_NOT_SCALED], "first.rows_wrong": POSITIVE},
    ),
    # EGF005: only Polyak writes the target, and with tau the right way round
    Catch(
        "EGF005",
        "polyak-tau-swap",
        {
            "first.scenario": MODE,
            "first.step": 0,
            "first.problem": "step_end target is not tau * params + (1 - tau) * target "
            "within 2 ulp",
            "first.elements_off": POSITIVE,
            "first.max_ulp": Holds("> 1000", lambda value, _mode: value > 1000),
        },
    ),
    Catch(
        "EGF005",
        "target-grad-leak",
        {
            "first.label": "backward_value_out_dw@cql",
            "first.problem": "a launch other than polyak_ema writes target_params",
            "first.operand": "C",
            "first.tensor": "w_v1",
        },
    ),
    # EGF006: the d = 0 dW reads the online concat
    Catch(
        "EGF006",
        "skip-rebuild",
        {
            "first.label": "backward_branch_dw[d=0]@cql",
            "first.scenario": MODE,
            "first.problem": "the x operand is not the online concat",
            "first.buffer": "sp14_dir_qaux_concat_scratch",
            "first.equals_target_concat": True,
        },
    ),
    Catch("EGF006", "dw-k-sh2", {"first.buffer": "save_h_s2", "first.columns_read": SH2}),
    Catch(
        "EGF006",
        "wrapper-on-main",
        {"missing": contains(f"no launch backward_branch_dw[d=0]@main (step 0) in {MODE}")},
    ),
)

FAULT_ORDER = [f.name for f in FAULTS]
BY_FAULT = sorted(CATCHES, key=lambda c: FAULT_ORDER.index(c.fault))  # one fault run per group


def _evidence_at(evidence: dict[str, Any], path: str) -> Any:
    value: Any = evidence
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def _matches(actual: Any, expected: Any, mode: str) -> bool:
    if isinstance(expected, Holds):
        return expected.test(actual, mode)
    if isinstance(expected, str):
        return actual == expected.replace(MODE, mode)
    if isinstance(expected, list):
        return len(actual) == len(expected) and all(
            _matches(a, e, mode) for a, e in zip(actual, expected, strict=True)
        )
    return actual == expected


# ---- fixtures: every fault's run, shared with the other files of its group (conftest.py) ----
@pytest.fixture(scope="module")
def fault_run(fault_audit_run):
    return fault_audit_run


def _verdict(run: AuditRun, code: str, mode: str) -> Verdict:
    verdict = INVARIANTS_BY_CODE[code].verdict(run, mode)
    json.dumps(verdict.evidence, allow_nan=False)  # strict JSON: --json exports it whole
    assert verdict.status in (PASS, FAIL)
    assert verdict.summary and "\n" not in verdict.summary
    return verdict


# ---- the clean pipeline ----
def test_clean_verdicts_count_what_they_checked(ci_audit_run):
    ev = {code: _verdict(ci_audit_run, code, "sentinel").evidence for code in CODES}
    # 2 production steps + 4 replays of step 0, at both call sites
    assert ev["EGF006"]["launches_checked"] == (2 + 4) * 2
    assert ev["EGF005"]["steps_checked"] == 2 + 4
    assert ev["EGF005"]["polyak_max_ulp"] <= 2
    # sentinel: both production steps, the skip-scale replay excluded, the injection replay
    assert ev["EGF003"]["gate_zero_steps"] == ["sentinel@0", "sentinel@1", "sentinel/nonfinite@0"]
    assert ev["EGF003"]["injected_steps"] == 1
    assert ev["EGF004"]["gated_steps"] == ["sentinel/alpha=0.37@0", "sentinel/alpha=1@0"]
    assert ev["EGF002"]["alphas"] == {
        "sentinel": 0.0,
        "sentinel/alpha=0.37": pytest.approx(0.37),
        "sentinel/alpha=1": 1.0,
        "sentinel/skip-scale": 0.0,
        "sentinel/nonfinite": 0.0,
    }
    assert ev["EGF002"]["wire_column_zero_elements"] < ADV
    assert ev["EGF001"]["sgemms_checked"] > 0


def test_egf001_ignores_the_diagnostic_wrapper_call(ci_audit_run):
    # the audit itself calls the legacy wrapper (K = SH2) in diagnostic/wrapper: not a finding
    wrapper = ci_audit_run.traces["diagnostic/wrapper"]
    assert any(x.label.startswith("backward_full_wrapper:") for x in wrapper.sgemms())
    assert (
        "diagnostic/wrapper" not in _verdict(ci_audit_run, "EGF001", "sentinel").evidence["traces"]
    )


# ---- the faults ----
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("catch", BY_FAULT, ids=lambda c: c.id)
def test_fails_on_its_fault_with_the_deciding_evidence(fault_run, catch, mode):
    verdict = _verdict(fault_run(catch.fault), catch.code, mode)
    assert verdict.status == FAIL, verdict.summary
    for path, expected in catch.expect.items():
        actual = _evidence_at(verdict.evidence, path)
        assert _matches(actual, expected, mode), (path, actual, expected, verdict.summary)


# ---- never raise, fail with what was missing ----
def _damaged(run: AuditRun, damage: Callable[[Any], Any]) -> AuditRun:
    traces = {name: damage(trace) for name, trace in run.traces.items()}
    return dataclasses.replace(run, traces=traces)


def _without_checkpoint(name: str) -> Callable[[Any], Any]:
    def damage(trace):
        kept = {key: value for key, value in trace.snapshots.items() if key[1] != name}
        return dataclasses.replace(trace, snapshots=kept)

    return damage


NEEDED = {
    "EGF002": ("after_backward", "after_losses"),
    "EGF003": (
        "after_losses",
        "cql:after_scale",
        "main:after_scale",
        "cql:after_inject",
        "main:aux_before_wire",
        "cql:aux_after_wire",
    ),
    "EGF004": ("after_losses", "cql:after_scale", "main:after_backward_full"),
    "EGF005": ("step_start", "before_polyak", "step_end"),
    "EGF006": ("after_forward", "input:backward_branch_dw[d=0]@main"),
}


@pytest.mark.parametrize(
    ("code", "checkpoint"),
    [(code, checkpoint) for code, names in NEEDED.items() for checkpoint in names],
)
def test_a_missing_snapshot_fails_naming_it(ci_audit_run, code, checkpoint):
    verdict = _verdict(_damaged(ci_audit_run, _without_checkpoint(checkpoint)), code, "sentinel")
    assert verdict.status == FAIL
    assert checkpoint in verdict.evidence["missing"], verdict.evidence


@pytest.mark.parametrize("code", CODES)
def test_no_check_raises_on_any_lost_checkpoint(ci_audit_run, code):
    names = sorted({key[1] for trace in ci_audit_run.traces.values() for key in trace.snapshots})
    for name in names:
        _verdict(_damaged(ci_audit_run, _without_checkpoint(name)), code, "sentinel")


def _without_launches(trace):
    return dataclasses.replace(trace, launches=[])


def _without_snapshots(trace):
    return dataclasses.replace(trace, snapshots={})


@pytest.mark.parametrize("code", CODES)
def test_a_mode_without_traces_fails(ci_audit_run, code):
    sentinel_only = dataclasses.replace(
        ci_audit_run,
        modes=("sentinel",),
        scenarios={k: s for k, s in ci_audit_run.scenarios.items() if s.mode != "live"},
    )
    assert _verdict(sentinel_only, code, "live").status == FAIL


# ---- the Polyak tolerance ----
FP32 = st.floats(min_value=-(2.0**100), max_value=2.0**100, width=32)  # no overflow


@settings(max_examples=100)  # cheap: hypothesis's default count, whatever the profile
@given(online=FP32, target=FP32)
def test_polyak_tolerance_admits_both_kernel_roundings(online, target):
    """The bound EGF005 applies holds for the kernel as the CPU compiles it (two products and a
    sum, each rounded) and as NVRTC may contract it (one FMA)."""
    tau = np.float32(TAU)
    o, t = np.float32(online), np.float32(target)
    other = np.float32(np.float32(1.0) - tau) * t
    separate = tau * o + other
    fused = np.float32(float(tau) * float(o) + float(other))
    for end in (separate, fused):
        ulps = polyak_error_ulps(np.array([o]), np.array([t]), np.array([end]), TAU)
        assert ulps[0] <= 2, (o, t, end, ulps)


def test_polyak_tolerance_at_cancellation_and_for_swapped_tau():
    # a parameter crossing zero: tau * online and (1 - tau) * target nearly cancel, so the
    # result's own ulp is far below the products' roundings (seen at ci shapes, step 1)
    o, t = np.float32(-0.0019142809), np.float32(1.27069e-05)
    tau = np.float32(TAU)
    end = tau * o + np.float32(np.float32(1.0) - tau) * t
    assert polyak_error_ulps(np.array([o]), np.array([t]), np.array([end]), TAU)[0] <= 2
    swapped = np.float32(1.0 - tau) * o + tau * t
    assert polyak_error_ulps(np.array([o]), np.array([t]), np.array([swapped]), TAU)[0] > 1e6
    nan = np.array([np.nan], np.float32)
    assert polyak_error_ulps(nan, np.array([t]), nan, TAU)[0] == 0  # NaN in, NaN out: no finding
    assert polyak_error_ulps(np.array([o]), np.array([t]), nan, TAU)[0] == np.inf


# ---- the shared rules on the rebuild: launches changed where their values cannot show it ----
def _fails_damaged(run: AuditRun, damage: Callable[[Any], Any], code: str, mode: str) -> Verdict:
    """`code`'s verdict on `run` damaged by `damage` (tests/rebuild_damages.py), held to FAIL."""
    verdict = _verdict(damaged(run, damage), code, mode)
    assert verdict.status == FAIL, verdict.summary
    return verdict


# EGF001's launch-shape rule: the threads a kernel ran, against its contract
@pytest.mark.parametrize("mode", ["sentinel", "live"])
def test_egf001_fails_a_rebuild_kernel_launched_with_too_few_threads(ci_audit_run, mode):
    verdict = _fails_damaged(ci_audit_run, concat_rebuild_short_grid, "EGF001", mode)
    first = verdict.evidence["first"]
    assert first["operand"] == "launch shape", first
    assert first["label"] == "forward_dir_concat_qaux@online", first
    assert first["problem"] == (
        "runs 32 threads (grid 1 × block 32) where its contract needs 64, one a row or "
        "element: the last 32 are never written"
    )


# EGF007's zeroing rule: a write after the zeroing replaces the baseline
@pytest.mark.parametrize("mode", ["sentinel", "live"])
def test_egf007_fails_a_rebuild_whose_dx_gemm_overwrites_the_zeroed_d_h_s2(ci_audit_run, mode):
    verdict = _fails_damaged(ci_audit_run, dh_s2_gemms_overwrite, "EGF007", mode)
    assert "d_h_s2 overwritten after its zeroing at 4 of 4 site-steps" in verdict.summary
    found = [f for f in verdict.evidence["failures"] if f["kind"] == "d_h_s2-overwritten"]
    assert [(f["step"], f["site"], f["zeroed_by"]) for f in found] == [
        (step, site, f"zero_d_h_s2@{site}") for step in (0, 1) for site in ("cql", "main")
    ]
    assert all(f["overwritten_by"] for f in found)


# EGF002's data flow: what the values cannot show
@pytest.mark.parametrize("mode", ["sentinel", "live"])
def test_egf002_follows_the_rebuild_s_launches_as_a_capture_s(ci_audit_run, mode):
    verdict = _fails_damaged(ci_audit_run, dw_gemms_not_run, "EGF002", mode)
    assert verdict.summary.startswith("step 0: the step's GEMMs leave "), verdict.summary
    assert "elements of dW w_b0fc unwritten (first: row 0, column 0)" in verdict.summary


@pytest.mark.parametrize("mode", ["sentinel", "live"])
def test_egf002_fails_a_rebuild_dw_gemm_reading_what_the_scale_wrote(ci_audit_run, mode):
    verdict = _fails_damaged(ci_audit_run, dw_reads_the_scaled_dx, "EGF002", mode)
    assert "that computes dW w_b0fc read 64 elements the scale wrote" in verdict.summary


@pytest.mark.parametrize("mode", ["sentinel", "live"])
def test_egf002_fails_a_rebuild_whose_dw_holds_the_scale_s_output(ci_audit_run, mode):
    verdict = _fails_damaged(ci_audit_run, scale_writes_dw, "EGF002", mode)
    # the cql site's scale output is read by the main site's accumulating dW GEMM, and the
    # main site's own is left in dW when each step ends
    read = r"the GEMM #\d+ that computes dW w_b0fc read 32 elements the scale wrote"
    held = "dW w_b0fc holds 32 elements the scale wrote when the step ends"
    wanted = [f"step {step}: {f}" for step in (0, 1) for f in (read, re.escape(held))]
    problems = verdict.evidence["problems"]
    assert len(problems) == len(wanted), problems
    assert all(re.fullmatch(w, p) for w, p in zip(wanted, problems, strict=True)), problems


# EGF006's data flow: the rebuild launch held to the contract
@pytest.mark.parametrize("mode", ["sentinel", "live"])
def test_egf006_follows_the_rebuild_s_launches_as_a_capture_s(ci_audit_run, mode):
    verdict = _fails_damaged(ci_audit_run, online_concat_reads_the_target, "EGF006", mode)
    assert verdict.summary.startswith(f"{mode}: step 0 @cql: the rebuild rebuild_online_concat@cql")
    assert "h_s2 points at tgt_h_s2[0], not at the start of save_h_s2" in verdict.summary


# EGF005's writer rule: a launch that may write the target, undeclared
@pytest.mark.parametrize("mode", ["sentinel", "live"])
def test_egf005_fails_a_rebuild_launch_that_may_write_the_target_undeclared(ci_audit_run, mode):
    verdict = _fails_damaged(ci_audit_run, unknown_kernel_on_the_target, "EGF005", mode)
    assert "a launch other than polyak_ema may write target_params" in verdict.summary


@pytest.mark.parametrize("mode", ["sentinel", "live"])
def test_egf005_names_a_rebuild_memset_that_writes_the_target(ci_audit_run, mode):
    verdict = _fails_damaged(ci_audit_run, memset_onto_the_target, "EGF005", mode)
    first = verdict.evidence["first"]
    assert first["problem"] == "a launch other than polyak_ema writes target_params"
    assert (first["label"], first["operand"], first["step"]) == ("zero_d_h_s2@main", "dst", 0)
