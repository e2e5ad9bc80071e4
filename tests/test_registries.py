"""Tests that grow with the registries: every entry of INVARIANTS and FAULTS is tested here
without a line written for it, as PyTorch's OpInfo tests are.

- every invariant holds (or gives its documented warning) on the clean pipeline, in both modes;
- every invariant fails, naming what was missing, on a run that lacks the data it reads;
- every fault is caught by exactly the invariants its catalogue entry expects;
- the two registries cover each other: each invariant is expected to catch some fault;
- every invariant states its known limits, and `egf-audit explain` prints them.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from cli_fakes import invoke

from egf_audit.invariants import FAIL, INVARIANTS, INVARIANTS_BY_CODE, evaluate
from egf_audit.scenarios.faults import FAULTS
from egf_audit.trace.audit_run import AuditRun

MODES = ("sentinel", "live")


def by_code(inv):
    return inv.code


def by_name(fault):
    return fault.name


def well_formed(verdict) -> None:
    json.dumps(verdict.evidence, allow_nan=False)  # strict JSON: --json exports it whole
    assert verdict.summary and "\n" not in verdict.summary


# ---- the clean pipeline ----
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("invariant", INVARIANTS, ids=by_code)
def test_holds_on_the_clean_pipeline(ci_audit_run, invariant, mode):
    verdict = invariant.verdict(ci_audit_run, mode)
    assert verdict.status == invariant.holds_as, (verdict.summary, verdict.evidence)
    well_formed(verdict)


# ---- missing data: a FAIL that names it, never an exception ----
def without(run: AuditRun, what: str) -> AuditRun:
    """The run with every trace's launches, or its checkpoints and snapshots, removed."""

    def damage(trace):
        if what == "launches":
            return dataclasses.replace(trace, launches=[])
        kept = [x for x in trace.launches if x.kind != "checkpoint"]
        return dataclasses.replace(trace, launches=kept, snapshots={})

    return dataclasses.replace(run, traces={n: damage(t) for n, t in run.traces.items()})


@pytest.mark.parametrize("what", ["launches", "snapshots"])
@pytest.mark.parametrize("invariant", INVARIANTS, ids=by_code)
def test_fails_naming_what_is_missing(ci_audit_run, invariant, what):
    verdict = invariant.verdict(without(ci_audit_run, what), "live")
    well_formed(verdict)
    if what in invariant.reads:
        assert verdict.status == FAIL, verdict.summary
    else:  # proved from the rest of the trace alone: losing this changes nothing
        assert verdict.status == invariant.holds_as, verdict.summary


@pytest.mark.parametrize("invariant", INVARIANTS, ids=by_code)
def test_a_run_without_traces_fails_naming_what_is_missing(ci_config, invariant):
    verdict = invariant.verdict(AuditRun(ci_config, MODES, 2), "sentinel")
    assert verdict.status == FAIL
    assert any(word in verdict.summary for word in ("missing", "lack", "no ")), verdict.summary
    well_formed(verdict)


# ---- every fault caught by exactly what its entry expects ----
@pytest.mark.parametrize("fault", FAULTS, ids=by_name)
def test_caught_by_exactly_its_expected_invariants(fault_audit_run, fault):
    run = fault_audit_run(fault.name)
    failing = {r.code for r in evaluate(run) if r.verdict.status == FAIL}
    assert failing == set(fault.expected)


# ---- the registries cover each other ----
def test_every_invariant_is_expected_to_catch_some_fault():
    expected = {code for fault in FAULTS for code in fault.expected}
    assert [inv.code for inv in INVARIANTS if inv.code not in expected] == []


def test_faults_expect_only_known_invariants_and_names_are_unique():
    assert {code for fault in FAULTS for code in fault.expected} <= set(INVARIANTS_BY_CODE)
    assert len({f.name for f in FAULTS}) == len(FAULTS)
    assert [inv.code for inv in INVARIANTS] == sorted(INVARIANTS_BY_CODE)


def test_a_fault_with_an_unknown_wiring_choice_is_refused_when_built():
    from egf_audit.pipeline.wiring import PRODUCTION, Width

    with pytest.raises(TypeError, match="fwd_dir_k"):
        PRODUCTION.but(fwd_dir_k="sh2 ")  # a misspelt choice never falls back to production
    with pytest.raises(ValueError, match="scale_sites"):
        PRODUCTION.but(scale_sites=("main", "target"))
    assert PRODUCTION.but(fwd_dir_k=Width.SH2).fwd_dir_k is Width.SH2


# ---- the capture side of every entry ----
@pytest.mark.parametrize("invariant", INVARIANTS, ids=by_code)
def test_every_entry_says_how_a_capture_decides_it_or_why_it_cannot(invariant):
    """One judge per invariant: an entry holds its capture check beside its rebuild check, or
    the reason a capture of the trainer cannot show what it needs (printed as UNDECIDED)."""
    if invariant.capture is None:
        assert len(invariant.capture_undecidable) > 40, invariant.code
    else:
        assert not invariant.capture_undecidable, invariant.code
        assert invariant.capture.__module__ == invariant.check.__module__  # the same home
        assert invariant.capture.__doc__, invariant.code


# ---- the doc of every entry ----
@pytest.mark.parametrize("invariant", INVARIANTS, ids=by_code)
def test_every_entry_states_its_known_limits_and_explain_prints_them(invariant):
    """As ruff's rule docs have "Known problems": what the check cannot see, in a few
    sentences of its own (not a placeholder, not another field's text)."""
    limits = invariant.limits
    assert len(limits) > 120 and limits.endswith("."), invariant.code
    others = (invariant.what, invariant.why, invariant.how, invariant.catches, invariant.example)
    assert limits not in others
    result = invoke("explain", invariant.code, "--raw")
    assert result.exit_code == 0
    doc = result.stdout
    assert f"## Known limits\n{limits}\n" in doc
    assert doc.index("## Bug it catches") < doc.index("## Known limits") < doc.index("## Example")


def test_an_entry_without_known_limits_is_refused_when_built():
    with pytest.raises(ValueError, match="EGF001: an invariant states its known limits"):
        dataclasses.replace(INVARIANTS_BY_CODE["EGF001"], limits="  ")
