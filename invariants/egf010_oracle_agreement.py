"""EGF010 oracle-agreement: every gradient and the post-step state agree with an independent
float64 torch-autograd model of the step (egf_audit.oracle)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NotRequired, TypedDict

from egf_audit.invariants.capture_oracle import (
    CaptureConfig,
    capture_dims,
    oracle_trace,
    unnamed_buffers,
)
from egf_audit.invariants.registry import Invariant, Verdict, failed, passed, undecided
from egf_audit.oracle.compare import OracleReport, compare_step
from egf_audit.oracle.tensor_checks import ABS_TOL, REL_TOL, TensorCheck
from egf_audit.trace.contract import ACCUMULATE_KERNEL, POLYAK_KERNEL, SCALE_KERNEL

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Trace

# The replays the oracle models as they are: the gate forced to 0.37 and to 1. The skip-scale
# replay removes the gate on purpose and the nonfinite replay injects dX values no model
# produces, so neither is a step of the trainer's math.
ORACLE_REPLAYS = ("/alpha=0.37", "/alpha=1")
MAX_LISTED = 6  # failing tensors / layers named in the summary
# a captured step that launched one of these has begun its backward: it must reach its Polyak
BACKWARD_KERNELS = (SCALE_KERNEL, ACCUMULATE_KERNEL)


class TensorFacts(TypedDict):
    """One tensor compared with the float64 model (the worst one, or one that disagrees)."""

    tensor: str  # "grad w_b0fc"
    max_err: float | str
    tol: float | str
    max_ref: NotRequired[float | str]
    note: NotRequired[str]  # why it could not be compared in full


class StepAgreement(TypedDict):
    """One step's comparison with the float64 model."""

    decisions: int
    near_ties: int
    near_tie_flips: int
    mismatches: int
    worst: NotRequired[TensorFacts]
    problems: NotRequired[list[str]]
    failing: NotRequired[list[TensorFacts]]
    mismatched_decisions: NotRequired[dict[str, int]]


def _number(x: float) -> float | str:
    """A JSON-safe, readable measured value."""
    return float(f"{x:.4g}") if math.isfinite(x) else str(x)


def _traces(run: AuditRun, mode: str) -> tuple[list[Trace], list[str]]:
    traces: list[Trace] = []
    problems: list[str] = []
    if mode not in run.traces:
        problems.append(f"no production trace for mode {mode}")
    else:
        traces.append(run.production(mode))
    replays = {s.name for s in run.scenarios.values() if s.mode == mode and s.kind == "replay"}
    for suffix in ORACLE_REPLAYS:
        name = f"{mode}{suffix}"
        if name in replays and name in run.traces:
            traces.append(run.traces[name])
        else:
            problems.append(f"no replay {name}")
    return traces, problems


def _failing(t: TensorCheck) -> TensorFacts:
    facts: TensorFacts = {
        "tensor": f"{t.kind} {t.name}",
        "max_err": _number(t.max_err),
        "tol": _number(t.tol),
        "max_ref": _number(t.max_ref),
    }
    if t.note:
        facts["note"] = t.note
    return facts


def _step_evidence(report: OracleReport) -> StepAgreement:
    worst = report.worst()
    out: StepAgreement = {
        "decisions": report.total("total"),
        "near_ties": report.total("near_ties"),
        "near_tie_flips": report.total("flips_in_band"),
        "mismatches": report.total("mismatches"),
    }
    if worst is not None:
        out["worst"] = {
            "tensor": f"{worst.kind} {worst.name}",
            "max_err": _number(worst.max_err),
            "tol": _number(worst.tol),
        }
    if report.problems:
        out["problems"] = report.problems
    failing = report.failing_tensors
    if failing:
        out["failing"] = [_failing(t) for t in failing]
    if report.mismatched_layers:
        out["mismatched_decisions"] = {d.layer: d.mismatches for d in report.mismatched_layers}
    return out


def check(run: AuditRun, mode: str) -> Verdict:
    traces, problems = _traces(run, mode)
    reports: list[OracleReport] = []
    for trace in traces:
        steps = trace.training_steps()
        if not steps:
            problems.append(f"{trace.scenario} recorded no training step")
        reports += [compare_step(trace, step, run.config) for step in steps]
    return agreement(reports, problems, len(traces))


def agreement(
    reports: list[OracleReport], problems: list[str], scenarios: int, **extra: object
) -> Verdict:
    """The verdict on the compared steps, the same for the rebuild and a capture: any problem,
    tensor out of tolerance or decision outside the near-tie band fails."""
    evidence: dict[str, object] = {
        "tolerance": (
            f"max|err| <= {ABS_TOL:g} + {REL_TOL:g} * max|ref| per tensor "
            f"(Adam v: {ABS_TOL**2:g} + {REL_TOL:g} * max|ref|)"
        ),
        "steps": {f"{r.scenario} step {r.step}": _step_evidence(r) for r in reports},
    }
    if problems:
        evidence["problems"] = problems
    evidence.update(extra)
    bad_tensors = sorted(
        {f"{t.kind} {t.name}" for r in reports for t in r.failing_tensors},
    )
    bad_layers = sorted({d.layer for r in reports for d in r.mismatched_layers})
    incomplete = [r for r in reports if r.problems]

    if problems or bad_tensors or bad_layers or incomplete:
        parts = []
        if problems or incomplete:
            parts.append(f"{len(problems) + len(incomplete)} step(s) or trace(s) lack inputs")
        if bad_tensors:
            listed = ", ".join(bad_tensors[:MAX_LISTED])
            more = (
                f" and {len(bad_tensors) - MAX_LISTED} more"
                if len(bad_tensors) > MAX_LISTED
                else ""
            )
            parts.append(
                f"{len(bad_tensors)} tensor(s) disagree with the float64 model: {listed}{more}"
            )
        if bad_layers:
            listed = ", ".join(bad_layers[:MAX_LISTED])
            parts.append(f"decisions differ outside the near-tie band in {listed}")
        return failed("; ".join(parts), **evidence)

    rows = sum(len(r.tensors) for r in reports)
    decisions = sum(r.total("total") for r in reports)
    return passed(
        f"{rows} tensor comparisons (gradients, params, Adam m/v, sn u/v, target) over "
        f"{len(reports)} steps of {scenarios} scenarios agree with the float64 model; "
        f"{decisions} ReLU/argmax decisions agree outside the near-tie band",
        **evidence,
    )


def check_capture(ct: Trace) -> Verdict:
    """The same comparison on a deep capture with values: each step the trainer ran, its
    checkpoints rebuilt from the memory history (invariants/capture_oracle.py). UNDECIDED where
    the capture is not deep or kept no values, or the layout does not name what the oracle
    reads; a byte the history cannot vouch for, or a step it cannot place, fails."""
    proc = ct.capture.process
    if not proc.deep:
        return undecided(
            "the capture is not deep: the oracle needs the step's tensors whole at its "
            "checkpoints (egf-audit capture --deep keeps a memory history)"
        )
    if not proc.values:
        return undecided(
            "the deep capture kept no values (EGF_CAPTURE_DEEP_VALUES_MAX=0, or a recorder from "
            "before values): where memory changed is known, not what it changed to"
        )
    dims = capture_dims(ct)
    lacking = unnamed_buffers(ct)
    if isinstance(dims, str) or lacking:
        shown = ", ".join(lacking[:MAX_LISTED]) + (" ..." if len(lacking) > MAX_LISTED else "")
        what = dims if isinstance(dims, str) else f"{len(lacking)} buffers it reads: {shown}"
        return undecided(f"the layout does not name what the oracle reads ({what})")
    steps = sorted({x.step for x in ct.kernels(POLYAK_KERNEL)})
    if not steps:
        return failed("no training step reached its polyak_ema: no step to compare")
    trace, problems, checked = oracle_trace(ct, steps)
    unfinished = [x for x in ct.launches if x.step > steps[-1] and x.name in BACKWARD_KERNELS]
    if unfinished:
        problems.append(
            f"step {steps[-1] + 1} ran its backward ({len(unfinished)} launches of "
            f"{' or '.join(BACKWARD_KERNELS)}) and reached no {POLYAK_KERNEL}: it cannot be "
            "compared, and a capture that ends in it is not judged by its earlier steps alone"
        )
    config = CaptureConfig(dims, ct.capture.hyper)
    reports = [compare_step(trace, step, config) for step in trace.training_steps()]
    return agreement(
        reports,
        problems,
        1,
        adam_t="the step's place in the process, from 1",
        snapshot_regions_agreeing=checked,
    )


INVARIANT = Invariant(
    code="EGF010",
    slug="oracle-agreement",
    message="The pipeline's gradients and post-step state agree with the float64 oracle.",
    what=(
        "Every gradient tensor in grad_buf, and the post-step params, Adam m/v, the spectral-norm "
        "vectors of w_b0fc and the target params, agree with an independent float64 torch-autograd "
        "model of the same step (trunk, aux softmax, the wire gated by a custom autograd Function, "
        "branches, dueling, TD/CQL/aux losses, Adam, the projection, Polyak) within "
        "max|err| <= 1e-6 + 1e-4 * max|ref| per tensor; and every ReLU mask and TD argmax of the "
        "pipeline is the float64 model's, except near-ties."
    ),
    why=(
        "The other invariants prove the wiring piece by piece: the right K, the right buffers, the "
        "gate in the right place. Only an end-to-end reference proves the pieces add up to the "
        "gradient of the loss the trainer means to minimise. It is written from the math alone "
        "and never calls the pipeline's code, so a wiring mistake cannot be copied into it."
    ),
    how=(
        "For every step of the mode's production run and of its alpha=0.37 and alpha=1 replays, "
        "the oracle reads only snapshots: state and batch at step_start, activations at "
        "after_forward, the gate ISV[393] and td_argmax at after_losses, grad_buf at "
        "after_backward, the updated state at before_polyak and step_end. (1) Decisions: each "
        "ReLU mask (activation > 0) and TD argmax of the pipeline against the float64 values. A "
        "disagreement is a near-tie, counted and never failed, when the float64 value lies "
        "closer to the kink or tie than the fp32 value can lie from it: for a ReLU input, the "
        "exactly computed effect of the layer's input difference (x32 - x64) W^T plus twice the "
        "proven fp32 rounding bound of the layer, gamma_{K+1} (|x32| |W|^T + |b|); for a Q "
        "value, |Q32 - Q64|. (2) Values: the float64 model, run with the pipeline's masks and "
        "argmaxes and the gate alpha the backward read, is differentiated by autograd; each "
        "grad_buf tensor is compared with its reference. (3) Update: float64 Adam (bias "
        "corrections 1 - beta^t), one power iteration from the stored u with the sigma_max "
        "projection, and Polyak are applied to the pipeline's OWN gradients and pre-step state, "
        "so a near-zero gradient of uncertain sign cannot flip an Adam step. Adam's v uses the "
        "floor 1e-12 (v holds squared gradients). A state table shaped unlike its parameter "
        "fails, with what exists compared."
    ),
    catches=(
        "Any wiring bug that changes what the step computes: a dW reading the target concat "
        "(skip-rebuild) or a K = SH2 dW that never writes the wire column (dw-k-sh2), a gradient "
        "written through the wrong base pointer, a gate applied to the wrong column or buffer, "
        "Adam state of the old shape (adam-state-sh2), a swapped Polyak factor "
        "(polyak-tau-swap), a spectral-norm vector of the old length."
    ),
    limits=(
        "The tolerance is per tensor (1e-6 + 1e-4 * max|ref|), so an error confined to a few "
        "small elements of a large tensor can pass; a decision that differs near a tie is "
        "counted, never failed. The model runs with the pipeline's own ReLU masks, argmaxes and "
        "the gate the backward read, so a wrong gate value is not seen here, and the skip-scale "
        "and non-finite replays are not modelled. On a capture it is decided from a deep "
        "capture with values (`egf-audit capture --deep`), whose memory history gives every "
        "buffer at the checkpoints, where the layout file names the buffers the oracle reads "
        "and the dims; otherwise UNDECIDED, with the reason. There the checkpoints are placed "
        "by the ABI kernels and the first write of the optimizer, the hyper-parameters are "
        "the step's defaults (gamma 0.99, Adam lr 1e-3, tau 0.005, ...) and Adam's step count "
        "is the step's place in the process (docs/capture.md)."
    ),
    example=(
        "Pre-B.10, backward_branch_dw for d = 0 used (save_h_s2, K = SH2) against w_b0fc's "
        "LDA = SH2 + 1: grad_buf[goff_w_b0fc..][:, SH2] stayed 0 while the float64 model's wire "
        "column of dW is sum_b d_hid[b] * wire[b], far past 1e-6 + 1e-4 * max|ref|; EGF010 names "
        "grad w_b0fc."
    ),
    check=check,
    capture=check_capture,
)
