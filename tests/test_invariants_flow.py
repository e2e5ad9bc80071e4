"""The data-flow invariants EGF007, EGF008, EGF009, EGF011 and EGF012 on the CPU cpu_backend.

Each holds on the clean pipeline in both modes (EGF011 warns, with the residual measured), and
fails on the faults it exists for, with the deciding failure named in its evidence. A check
must also never raise: on a run missing checkpoints or snapshots it fails with evidence.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from egf_audit.invariants import FAIL, INVARIANTS_BY_CODE, PASS, WARN
from egf_audit.pipeline.config import preset_config
from egf_audit.pipeline.layout import build_layout
from egf_audit.scenarios.audit import GATE_PROBES
from egf_audit.scenarios.faults import FAULTS
from egf_audit.trace.audit_run import AuditRun
from egf_audit.trace.contract import ALPHA_GRAD_SMOOTHED_INDEX, BRANCHES

CODES = ("EGF007", "EGF008", "EGF009", "EGF011", "EGF012")
MODES = ("sentinel", "live")
STEPS = 2  # the Auditor's default
DIMS = preset_config("ci").dims
B, SH2, ADV = DIMS.B, DIMS.SH2, DIMS.ADV
W_B0FC = build_layout(DIMS).buffer("params").tensor("w_b0fc").offset  # poff == goff == moff
MODE = "<mode>"  # in an expected failure: the production scenario of the mode under test


@dataclass(frozen=True)
class Catch:
    """A fault an invariant must fail on, and facts its evidence must carry: every dict in
    `expect` must be a sub-dict of one listed failure."""

    code: str
    fault: str
    expect: tuple[dict[str, Any], ...]

    @property
    def id(self) -> str:
        return f"{self.code}-{self.fault}"


def _wire_hits(rows: int, width: int, ld: int) -> int:
    """Elements of a [rows, width] box with row stride ld that fall in column SH2 of a
    [B, SH2 + 1] buffer: what an accumulate reading with the wrong stride picks up."""
    flat = (np.arange(rows)[:, None] * ld + np.arange(width)[None, :]).ravel()
    return int(np.count_nonzero(flat % (SH2 + 1) == SH2))


def _scale_on(buffer: str, offset: int, rows: int, site: str) -> dict[str, Any]:
    """A scale launch on the wrong buffer as EGF008's evidence names it, with the reason."""
    return {
        "problems": [f"writes {buffer}, not sp14_d_dir_qaux_concat"],
        "label": f"sp14_scale_wire_col@{site}",
        "when": "between",
        "dx_concat": {"buffer": buffer, "offset": offset, "rows": rows, "width": 1, "ld": SH2 + 1},
        "isv": {
            "buffer": "isv_signals",
            "offset": ALPHA_GRAD_SMOOTHED_INDEX,
            "rows": 1,
            "width": 1,
            "ld": 1,
        },
    }


def _adam_table(state: str) -> dict[str, Any]:
    """The state table's w_b0fc still [ADV, SH2] where params has [ADV, SH2 + 1]."""
    return {
        "kind": "adam-state-table",
        "buffer": state,
        "tensor": "w_b0fc",
        "state": [W_B0FC, ADV, SH2],
        "param": [W_B0FC, ADV, SH2 + 1],
    }


CATCHES = (
    Catch(
        "EGF007",
        "no-zero-d-h-s2",
        (
            {"kind": "d_h_s2-not-zeroed", "step": 0, "site": "cql", "last_write": None},
            {
                "kind": "d_h_s2-not-zeroed",
                "step": 0,
                "site": "main",
                "last_write": "relu_backward_s2@cql",  # the CQL site's trunk backward
            },
            {"kind": "trunk-entry-mismatch", "step": 0, "site": "main"},
        ),
    ),
    Catch(
        "EGF007",
        "accumulate-wire-col",
        (
            {
                "kind": "wire-column-accumulated",
                "step": 0,
                "label": "accumulate_d_h_s2_from_concat[d=0]@cql",
                "elements": _wire_hits(B, SH2, SH2),
            },
            {"kind": "trunk-entry-mismatch", "step": 0, "site": "cql"},
        ),
    ),
    Catch(
        "EGF008",
        "cql-site-ungated",
        ({"kind": "site-ungated", "step": 0, "site": "cql", "scale_launches": []},),
    ),
    Catch(
        "EGF008",
        "skip-scale",
        tuple(
            {"kind": "site-ungated", "step": 0, "site": site, "scale_launches": []}
            for site in ("cql", "main")
        ),
    ),
    Catch(
        "EGF008",
        "scale-x-concat",
        (
            {
                "kind": "site-ungated",
                "site": "cql",
                "scale_launches": [_scale_on("sp14_dir_qaux_concat_scratch", SH2, B, "cql")],
            },
        ),
    ),
    Catch(
        "EGF008",
        "scale-dw-wire-col",
        (
            {
                "kind": "site-ungated",
                "site": "main",
                "scale_launches": [_scale_on("grad_buf", W_B0FC + SH2, ADV, "main")],
            },
        ),
    ),
    Catch(
        "EGF009",
        "sn-vector-sh2",
        (
            {"kind": "sn-vector-length", "tensor": "v_b0fc", "length": SH2, "expected": SH2 + 1},
            {"kind": "sn-vector-length", "tensor": "sn_scratch_v", "length": SH2},
            {
                "kind": "sn-launch-length",
                "step": 0,
                "label": "spectral_norm:w_v",
                "role": "B",
                "tensor": "v_b0fc",
                "length": SH2,
            },
        ),
    ),
    Catch(
        "EGF009",
        "adam-state-sh2",
        (
            _adam_table("adam_m"),
            _adam_table("adam_v"),
            {
                "kind": "adam-slice",
                "step": 0,
                "label": "adam[w_b0fc]",
                "param_size": ADV * (SH2 + 1),
            },
        ),
    ),
    Catch(
        "EGF011",
        "wrapper-on-main",
        ({"kind": "k-sh2-gemm", "scenario": MODE, "sites": ["main"]},),
    ),
    Catch(
        "EGF012",
        "gate-no-clamp",
        ({"kind": "probe-out-of-range", "probe": "below-chance"},),
    ),
)


# ---- fixtures: every fault's run, shared with the other files of its group (conftest.py) ----
@pytest.fixture(scope="module")
def fault_run(fault_audit_run):
    return fault_audit_run


def verdict(run: AuditRun, code: str, mode: str):
    return INVARIANTS_BY_CODE[code].verdict(run, mode)


def assert_well_formed(v) -> None:
    """Strict JSON evidence, and a summary that holds no measured float (it is printed outside
    the document's environment block, so it must read the same on every cpu_backend)."""
    json.dumps(v.evidence, allow_nan=False)
    assert "\n" not in v.summary
    measured = re.compile(r"\d\.\d|\de-\d")
    assert not measured.search(v.summary.replace("+0.0", "")), v.summary  # +0.0 is a bit pattern


def matching(failures: list[dict], expected: dict, mode: str) -> list[dict]:
    want = {k: (mode if v == MODE else v) for k, v in expected.items()}
    return [f for f in failures if all(f.get(k) == v for k, v in want.items())]


@pytest.mark.parametrize("mode", MODES)
def test_egf007_recomputes_every_site_step(ci_audit_run, mode):
    ev = verdict(ci_audit_run, "EGF007", mode).evidence
    assert ev["accumulate_launches"] == STEPS * 2 * len(BRANCHES)
    assert 0 < ev["max_err_over_bound"] < 1  # a real comparison, inside the proved bound


@pytest.mark.parametrize("mode", MODES)
def test_egf008_names_the_gating_launch_of_every_site_step(ci_audit_run, mode):
    ev = verdict(ci_audit_run, "EGF008", mode).evidence
    assert ev["gated"] == [
        {"step": step, "site": site, "scale": f"sp14_scale_wire_col@{site}"}
        for step in range(STEPS)
        for site in ("cql", "main")
    ]


@pytest.mark.parametrize("mode", MODES)
def test_egf011_warns_with_the_measured_residual(ci_audit_run, mode):
    v = verdict(ci_audit_run, "EGF011", mode)
    assert v.status == WARN
    ev = v.evidence
    assert ev["dw_label"] == "backward_full_wrapper:backward_branch_dw[d=0]@wrapper"
    assert (ev["dw_columns_written"], ev["w_b0fc_cols"]) == (SH2, SH2 + 1)
    assert (ev["dx_columns_read"], ev["dx_writes"]) == (SH2, "d_h_s2")
    assert ev["wire_col_nonzero_after_wrapper"] == 0
    assert ev["wire_col_nonzero_after_full"] > 0
    assert f"writes {SH2} of {SH2 + 1} columns" in v.summary


@pytest.mark.parametrize("mode", MODES)
def test_egf012_reports_every_gate_probe(ci_audit_run, mode):
    ev = verdict(ci_audit_run, "EGF012", mode).evidence
    assert ev["alpha_at_start"] == 0.0
    assert len(ev["alpha_after_losses"]) == STEPS
    assert list(ev["probes"]) == [name for name, _, _ in GATE_PROBES]
    closed = {name for name, p in ev["probes"].items() if p["nonfinite"]}
    assert closed == {"nan-input", "inf-input", "nan-previous"}
    assert all(ev["probes"][name]["alpha"] == 0.0 for name in closed)


# ---- the faults each invariant exists for ----
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("catch", CATCHES, ids=lambda c: c.id)
def test_fault_is_caught_with_its_evidence(fault_run, catch, mode):
    v = verdict(fault_run(catch.fault), catch.code, mode)
    assert v.status == FAIL, v.summary
    assert_well_formed(v)
    assert v.evidence["failures_total"] >= len(catch.expect)
    for expected in catch.expect:
        assert matching(v.evidence["failures"], expected, mode), (expected, v.evidence)


@pytest.mark.parametrize("mode", MODES)
def test_egf008_keeps_the_gated_site_when_one_is_ungated(fault_run, mode):
    ev = verdict(fault_run("cql-site-ungated"), "EGF008", mode).evidence
    assert {g["site"] for g in ev["gated"]} == {"main"}
    assert {f["site"] for f in ev["failures"]} == {"cql"}


@pytest.mark.parametrize("mode", MODES)
def test_egf011_counts_every_trace_that_reaches_the_wrapper(fault_run, mode):
    run = fault_run("wrapper-on-main")
    ev = verdict(run, "EGF011", mode).evidence
    audited = [s.name for s, _ in run.for_mode(mode) if s.kind in ("production", "replay")]
    assert [f["scenario"] for f in ev["failures"]] == audited


@pytest.mark.parametrize("mode", MODES)
def test_egf012_below_chance_probe_goes_negative_without_the_clamp(fault_run, mode):
    probe = verdict(fault_run("gate-no-clamp"), "EGF012", mode).evidence["probes"]["below-chance"]
    # the kernel's fp32 arithmetic on accuracy 0, previous gate 0, unclamped
    chance = np.float32(1) / np.float32(DIMS.AUXK)
    raw = (np.float32(0) - chance) / (np.float32(1) - chance)
    ema = np.float32(preset_config("ci").hyper.gate_ema)
    assert probe["alpha"] == float(ema * np.float32(0) + (np.float32(1) - ema) * raw) < 0


# ---- robustness: every fault of the catalogue, and runs with data missing ----
@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_every_fault_gives_a_well_formed_verdict(fault_run, fault):
    run = fault_run(fault.name)
    for code in CODES:
        for mode in MODES:
            v = verdict(run, code, mode)
            assert v.status in (PASS, FAIL, WARN)
            assert_well_formed(v)


@pytest.mark.parametrize("mode", MODES)
def test_egf011_catches_the_wrapper_path_without_its_label(fault_run, mode):
    """The wrapper's K = SH2 launches wired into a production site under ordinary labels are
    still the wrapper path: EGF011 reads the operands' widths, not the labels."""
    run = fault_run("wrapper-on-main")

    def unlabelled(trace):
        launches = [
            dataclasses.replace(x, label=x.label.removeprefix("backward_full_wrapper:"))
            for x in trace.launches
        ]
        return dataclasses.replace(trace, launches=launches)

    relabelled = dataclasses.replace(
        run, traces={name: unlabelled(t) for name, t in run.traces.items()}
    )
    assert not any(
        x.label.startswith("backward_full_wrapper:")
        for t in relabelled.traces.values()
        for x in t.launches
    )
    v = verdict(relabelled, "EGF011", mode)
    assert v.status == FAIL, v.summary
    first = v.evidence["failures"][0]
    assert first["kind"] == "k-sh2-gemm"
    assert first["columns"] == DIMS.SH2
    assert first["first"] == "backward_branch_dw[d=0]@main"
