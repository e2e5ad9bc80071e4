"""EGF010: the float64 oracle against the pipeline on the CPU cpu_backend."""

from __future__ import annotations

import copy
import dataclasses
import re

import numpy as np
import pytest
import torch

from egf_audit.invariants.egf010_oracle_agreement import INVARIANT as EGF010
from egf_audit.invariants.egf010_oracle_agreement import MAX_LISTED, _number
from egf_audit.oracle import compare as oracle
from egf_audit.oracle import model, tensor_checks
from egf_audit.oracle.compare import compare_step
from egf_audit.pipeline.config import Config, preset_config
from egf_audit.pipeline.instance import Probes
from egf_audit.pipeline.step import MODES, SP14Pipeline
from egf_audit.scenarios.audit import Auditor
from egf_audit.scenarios.faults import FAULTS_BY_NAME
from egf_audit.trace.audit_run import AuditRun
from egf_audit.trace.contract import param_shapes

CI = preset_config("ci")
SHAPES = {
    "ci": CI.dims,
    "batch-1": dataclasses.replace(CI.dims, B=1),
    "sh2-1": dataclasses.replace(CI.dims, SH2=1),
    "odd-widths": dataclasses.replace(CI.dims, B=7, OBS=13, SH1=17, SH2=14, ADV=9, VALH=5),
}
PARAM_NAMES = [name for name, _, _ in param_shapes(CI.dims)]
PER_PARAM_KINDS = ("grad", "param", "adam_m", "adam_v", "target")


def recorded_steps(config: Config, cpu_backend, mode: str, steps: int = 2, alpha=None):
    pipe = SP14Pipeline(config, cpu_backend)
    pipe.initialize()
    for _ in range(steps):
        pipe.step(mode, Probes(force_alpha=alpha))
    pipe.release()
    return pipe.rec.trace


def expected_decisions(config: Config) -> int:
    """ReLU inputs of both nets plus one TD argmax per row and branch."""
    d = config.dims
    relu = d.B * (d.SH1 + d.SH2 + 4 * d.ADV + d.VALH)
    return 2 * relu + 4 * d.B


def failing_rows(verdict) -> set[str]:
    return {
        row["tensor"] for s in verdict.evidence["steps"].values() for row in s.get("failing", [])
    }


# ---- agreement on the clean wiring ----


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_gradient_and_update_agree(cpu_backend, shape, mode):
    config = Config("ci", 0, SHAPES[shape])
    trace = recorded_steps(config, cpu_backend, mode)
    assert trace.training_steps() == [0, 1]
    for step in (0, 1):  # step 1 starts from non-zero Adam state and a moved target
        report = compare_step(trace, step, config)
        assert report.problems == []
        covered = {(t.kind, t.name) for t in report.tensors}
        assert covered == {(k, n) for k in PER_PARAM_KINDS for n in PARAM_NAMES} | {
            ("sn", "u_b0fc"),
            ("sn", "v_b0fc"),
        }
        assert [(t.kind, t.name, t.max_err, t.tol) for t in report.failing_tensors] == []
        for t in report.tensors:
            assert t.tol == tensor_checks.tolerance(t.max_ref, t.kind)
        assert report.total("total") == expected_decisions(config)
        assert report.total("mismatches") == 0
        assert report.ok


def test_gated_wire_gradient_reaches_the_aux_head(cpu_backend):
    """With alpha = 1 the wire adds to the aux head's gradient, with alpha = 0 it adds nothing;
    the oracle follows the pipeline in both, so the gated path is really compared."""
    aux_grads = {}
    for alpha in (0.0, 1.0):
        trace = recorded_steps(CI, cpu_backend, "sentinel", steps=1, alpha=alpha)
        report = compare_step(trace, 0, CI)
        assert report.ok, report.failing_tensors
        grad = trace.snapshots[(0, "after_backward")]["grad_buf"]
        aux_grads[alpha] = trace.tensor(grad, "grad_buf", "w_aux").copy()
    assert np.abs(aux_grads[1.0] - aux_grads[0.0]).max() > 100 * tensor_checks.ABS_TOL


@pytest.mark.parametrize("mode", MODES)
def test_egf010_passes_on_the_clean_pipeline(ci_audit_run, mode):
    verdict = EGF010.verdict(ci_audit_run, mode)
    assert verdict.status == "pass", verdict.summary
    assert set(verdict.evidence["steps"]) == {
        f"{mode} step 0",
        f"{mode} step 1",
        f"{mode}/alpha=0.37 step 0",
        f"{mode}/alpha=1 step 0",
    }
    for step in verdict.evidence["steps"].values():
        assert step["mismatches"] == 0
        assert step["decisions"] == expected_decisions(CI)
    # printed outside the environment block: no measured float may appear in it
    assert re.search(r"\d\.\d|\de-\d", verdict.summary) is None


# ---- the oracle fails on faulted pipelines ----

FAULT_FAILURES = {
    # dW of w_b0fc reads the target concat; everything downstream uses the pipeline's own grads
    "skip-rebuild": {"grad w_b0fc"},
    # the wire column of dW w_b0fc is never written
    "dw-k-sh2": {"grad w_b0fc"},
    # every target tensor is blended with 1 - tau
    "polyak-tau-swap": {f"target {name}" for name in PARAM_NAMES},
    # the value-head dW lands in target_params instead of grad_buf
    "target-grad-leak": {"grad w_v1", "target w_v1"},
}


@pytest.mark.parametrize("fault", list(FAULT_FAILURES))
def test_egf010_fails_on_fault(cpu_backend, fault):
    wiring = FAULTS_BY_NAME[fault].wiring
    run = Auditor(CI, cpu_backend, wiring, steps=1).run(modes=("sentinel",))
    verdict = EGF010.verdict(run, "sentinel")
    assert verdict.failed
    assert failing_rows(verdict) == FAULT_FAILURES[fault]
    for row in sorted(FAULT_FAILURES[fault])[:MAX_LISTED]:
        assert row in verdict.summary


def test_egf010_names_the_first_wrong_decision_of_a_forward_fault(cpu_backend):
    """fwd-k-sh2 drops the wire column from the d = 0 forward SGEMM: b0_hid of both nets is
    the first layer whose fp32 value leaves its band; the layers below see correct inputs and
    the TD argmax is taken on the Q' the pipeline really computed."""
    wiring = FAULTS_BY_NAME["fwd-k-sh2"].wiring
    run = Auditor(CI, cpu_backend, wiring, steps=1).run(modes=("sentinel",))
    verdict = EGF010.verdict(run, "sentinel")
    assert verdict.failed
    layers = {
        layer
        for s in verdict.evidence["steps"].values()
        for layer in s.get("mismatched_decisions", {})
    }
    assert layers == {"online.b0_hid", "target.b0_hid"}
    assert "decisions differ outside the near-tie band in online.b0_hid, target.b0_hid" in (
        verdict.summary
    )


def test_egf010_fails_cleanly_on_adam_state_of_the_old_shape(cpu_backend):
    wiring = FAULTS_BY_NAME["adam-state-sh2"].wiring
    run = Auditor(CI, cpu_backend, wiring, steps=1).run(modes=("sentinel",))
    verdict = EGF010.verdict(run, "sentinel")
    assert verdict.failed
    required = {"adam_m w_b0fc", "adam_v w_b0fc", "param w_b0fc"}
    # the spectral norm then runs on a partly updated W; nothing outside w_b0fc may fail
    allowed = required | {"sn u_b0fc", "sn v_b0fc"}
    assert required <= failing_rows(verdict) <= allowed
    report = compare_step(run.production("sentinel"), 0, CI)
    shapes = {t.kind: t.note for t in report.failing_tensors if t.kind.startswith("adam")}
    dims = CI.dims
    note = f"shape {[dims.ADV, dims.SH2]}, reference {[dims.ADV, dims.SH2 + 1]}"
    assert shapes == {"adam_m": note, "adam_v": note}


# ---- decisions ----


def test_relu_decisions_exempt_only_near_ties():
    z = torch.tensor([-1.0, -1e-9, 1e-9, 2.0, 3.0], dtype=torch.float64)
    band = torch.full_like(z, 1e-8)
    pipeline_act = torch.tensor([0.0, 0.5, 0.0, 0.0, 3.0], dtype=torch.float32)
    check = oracle.relu_decisions("online.h_s1", z, band, pipeline_act)
    assert check == oracle.DecisionCheck(
        "online.h_s1", total=5, near_ties=2, flips_in_band=2, mismatches=1
    )


def test_argmax_decisions_exempt_only_near_ties():
    q = torch.tensor(
        [[1.0, 1.0 + 1e-9, 0.0], [0.0, 5.0, 1.0], [3.0, 1.0, 2.0], [0.0, 1.0, 2.0]],
        dtype=torch.float64,
    )
    band = torch.full_like(q, 1e-8)
    picked = torch.tensor([0, 0, 0, 7])  # a near-tie flip, a real flip, agreement, out of range
    check = oracle.argmax_decisions("td_argmax.b0", q, band, picked)
    assert check == oracle.DecisionCheck(
        "td_argmax.b0", total=4, near_ties=1, flips_in_band=1, mismatches=2
    )


def test_a_flipped_mask_far_from_the_kink_fails(ci_audit_run):
    trace = copy.copy(ci_audit_run.production("sentinel"))
    trace.snapshots = dict(trace.snapshots)
    forward = dict(trace.snapshots[(0, "after_forward")])
    h_s1 = forward["save_h_s1"].copy()
    h_s1[np.argmax(h_s1)] = 0.0  # the most clearly active unit reported as off
    forward["save_h_s1"] = h_s1
    trace.snapshots[(0, "after_forward")] = forward
    report = compare_step(trace, 0, CI)
    mismatches = {d.layer: d.mismatches for d in report.decisions}
    assert mismatches["online.h_s1"] == 1
    # the online layers below now see a different h_s1 than the pipeline did; the target net
    # is untouched
    assert all(n == 0 for layer, n in mismatches.items() if not layer.startswith("online."))
    assert not report.ok


@pytest.mark.parametrize("shift", [0.0, 1e-3])
def test_relu_band_covers_the_fp32_error(shift):
    """A layer computed in fp32 (any summation order torch picks) lies within the band of the
    float64 value, also when the float64 model's input differs from the fp32 input."""
    gen = torch.Generator().manual_seed(3)
    x32 = torch.randn(256, 1024, generator=gen).relu()
    w = torch.randn(64, 1024, generator=gen) / 32
    b = torch.randn(1, 64, generator=gen) / 10
    z32 = (x32 @ w.T + b).double()
    params = {"w_s2": w.double(), "b_s2": b.double()}
    x64 = x32.double() + shift * torch.randn(x32.shape, generator=gen, dtype=torch.float64)
    z64 = x64 @ params["w_s2"].T + params["b_s2"]
    band = model.relu_band(params, "h_s2", z64, x32.double())
    assert ((z32 - z64).abs() <= band).all()
    # a worst-case bound, yet a narrow one: at K = 1024 it exempts pre-activations within a few
    # tenths of a percent of a typical |z| (plus the measured input difference)
    assert band.median() < 5e-3 * z64.abs().median() + 100 * shift


# ---- the gate ----


def test_wire_gate_scales_the_gradient_and_closes_exactly_at_zero():
    wire = torch.tensor([0.25, -0.5, 0.75], dtype=torch.float64, requires_grad=True)
    upstream = torch.tensor([2.0, float("nan"), float("-inf")], dtype=torch.float64)
    out = model.WireGate.apply(wire, 0.0)
    assert torch.equal(out, wire.detach())
    (grad,) = torch.autograd.grad(out, wire, upstream)
    assert torch.equal(grad, torch.zeros(3, dtype=torch.float64))
    assert not torch.signbit(grad).any()  # +0.0, not -0.0
    out = model.WireGate.apply(wire, 0.37)
    (grad,) = torch.autograd.grad(out, wire, torch.tensor([2.0, -1.0, 4.0], dtype=torch.float64))
    assert torch.equal(grad, torch.tensor([0.74, -0.37, 1.48], dtype=torch.float64))


# ---- missing data never raises ----


def test_missing_snapshot_is_a_clean_failure(ci_audit_run):
    trace = copy.copy(ci_audit_run.production("sentinel"))
    trace.snapshots = {k: v for k, v in trace.snapshots.items() if k != (0, "after_backward")}
    report = compare_step(trace, 0, CI)
    assert not report.ok
    assert report.problems == ["no snapshot of grad_buf at after_backward (step 0) in sentinel"]
    run = dataclasses.replace(ci_audit_run, traces={**ci_audit_run.traces, "sentinel": trace})
    verdict = EGF010.verdict(run, "sentinel")
    assert verdict.failed
    assert verdict.evidence["steps"]["sentinel step 0"]["problems"] == report.problems


def test_an_empty_run_is_a_clean_failure():
    verdict = EGF010.verdict(AuditRun(CI, ("sentinel",), 1), "sentinel")
    assert verdict.failed
    assert verdict.evidence["problems"] == [
        "no production trace for mode sentinel",
        "no replay sentinel/alpha=0.37",
        "no replay sentinel/alpha=1",
    ]


def test_evidence_numbers_are_json_safe():
    assert _number(float("nan")) == "nan"
    assert _number(float("inf")) == "inf"
    assert _number(1.23456789e-7) == 1.235e-7


# ---- independence ----


def test_many_tensors_compared_at_once_as_one_by_one():
    """compare_many takes the same maxima as compare, NaN and the odd cases included."""
    ref = torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=torch.float64)
    close = (ref + 1e-9).float()
    nan_got = close.clone()
    nan_got[0, 1] = float("nan")
    nan_ref = ref.clone()
    nan_ref[1, 0] = float("nan")
    items = [
        ("a", "grad", ref, close),
        ("b", "grad", ref, nan_got),
        ("c", "adam_v", nan_ref, close),
        ("d", "param", ref, None),
        ("e", "param", ref, close.reshape(4, 1)),
        ("f", "grad", torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, 3)),
        ("g", "target", ref * 1e3, (ref * 1e3 + 1.0).float()),
    ]
    together = tensor_checks.compare_many(items)
    assert [repr(c) for c in together] == [repr(tensor_checks.compare(*i)) for i in items]
    assert [c.ok for c in together] == [True, False, False, False, False, True, False]


def test_whole_tables_and_tensor_by_tensor_report_the_same(ci_audit_run, monkeypatch):
    """A step compared over whole parameter tables (one pass, one read-back) reports exactly
    what it reports read tensor by tensor, as a table of another shape is read: the same rows
    in the same order, the same decisions."""
    trace = ci_audit_run.production("live")
    whole = [compare_step(trace, s, ci_audit_run.config) for s in trace.training_steps()]
    monkeypatch.setattr(oracle.StepSnapshots, "table", lambda *_args: None)
    by_tensor = [compare_step(trace, s, ci_audit_run.config) for s in trace.training_steps()]
    assert [repr(r) for r in whole] == [repr(r) for r in by_tensor]
    expected = [(k, n) for n in PARAM_NAMES for k in ("grad",)]
    expected += [(k, n) for n in PARAM_NAMES for k in ("adam_m", "adam_v")]
    expected += [("sn", "u_b0fc"), ("sn", "v_b0fc")]
    expected += [(k, n) for n in PARAM_NAMES for k in ("param", "target")]
    assert [(t.kind, t.name) for t in whole[0].tensors] == expected
    assert len(whole[0].decisions) == 2 * len(model.RELU_LAYERS) + 4
