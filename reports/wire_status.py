"""The seed's "Wire status" table, filled from what the audit measured.

Each row's status comes from the verdicts of the invariants about that stage only: EGF001
judges every SGEMM of the step, so a row counts its failure only when an offending launch
belongs to the row's stage (`dx-k-sh2`, a backward bug, breaks "Backward dispatch", not
"Forward dispatch"). The "measured" text comes from the launches of the reference trace (step 0
of the production run), so it names the SGEMM arguments and operands that were really used.
Both are the same on every backend.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from egf_audit.invariants.egf001_gemm_k_matches_lda import names_offenders
from egf_audit.invariants.registry import FAIL, PASS, WARN
from egf_audit.reports.bindings import operand
from egf_audit.reports.model import NOT_RUN, AuditReport
from egf_audit.trace.contract import (
    NON_PIPELINE_PREFIXES,
    SITES,
    TARGET_FORWARD_BEGIN,
    TARGET_FORWARD_END,
    WRAPPER_PREFIX,
    WRAPPER_SCENARIO,
)
from egf_audit.trace.model import Launch, Trace

ROW_STATUS = {
    PASS: "✅ holds",
    FAIL: "❌ broken",
    WARN: "⚠️ residual (diagnostic only)",
    NOT_RUN: "— not measured",
}


@dataclass(frozen=True)
class Proof:
    """An invariant that proves a stage; `launches`: for an invariant over every launch of the
    step (EGF001), the label prefixes of this stage's launches (empty: the whole verdict)."""

    code: str
    launches: tuple[str, ...] = ()
    scope: str = ""  # how the document names the part that counts: "forward SGEMMs"

    @property
    def name(self) -> str:
        return f"{self.code} ({self.scope})" if self.scope else self.code


FORWARD = Proof("EGF001", ("forward_",), "forward SGEMMs")
BACKWARD_DX = Proof(
    "EGF001",
    ("backward_branch_dx", "sp14_scale_wire_col", "accumulate_d_h_s2_from_concat"),
    "dX, scale and accumulate launches",
)
BACKWARD_DW = Proof("EGF001", ("backward_branch_dw",), "dW SGEMMs")
STAGES: tuple[tuple[str, tuple[Proof, ...]], ...] = (
    ("Forward dispatch", (FORWARD,)),
    (
        "Backward dispatch",
        (BACKWARD_DX, Proof("EGF003"), Proof("EGF004"), Proof("EGF007"), Proof("EGF008")),
    ),
    ("dW unchanged", (BACKWARD_DW, Proof("EGF002"), Proof("EGF006"))),
    ("Target net", (Proof("EGF005"),)),
    ("Wrapper path", (Proof("EGF011"),)),
)


@dataclass(frozen=True)
class WireRow:
    wire: str
    status: str  # PASS, FAIL, WARN or NOT_RUN
    measured: str
    proofs: tuple[Proof, ...]

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.proofs)


def _offends_stage(evidence: Mapping[str, object], prefixes: tuple[str, ...]) -> bool:
    """Whether a failed verdict over every launch (EGF001's) names one of this stage's
    launches. A failure that names none (no SGEMM recorded at all) counts against every stage."""
    labels: list[str] = []
    if names_offenders(evidence):
        labels = [*evidence["offending_sgemm_labels"], *evidence["offending_launch_labels"]]
    if not labels:
        return True
    return any(label.startswith(prefixes) for label in labels)


def proof_status(report: AuditReport, proof: Proof) -> str:
    statuses = []
    for mode in report.modes:
        r = report.result(proof.code, mode)
        if r is None:
            return NOT_RUN
        status = r.verdict.status
        if status == FAIL and proof.launches:
            status = FAIL if _offends_stage(r.verdict.evidence, proof.launches) else PASS
        statuses.append(status)
    if not statuses:
        return NOT_RUN
    for status in (FAIL, WARN):
        if status in statuses:
            return status
    return PASS


def stage_status(report: AuditReport, proofs: tuple[Proof, ...]) -> str:
    statuses = [proof_status(report, p) for p in proofs]
    for status in (NOT_RUN, FAIL, WARN):
        if status in statuses:
            return status
    return PASS


def reference_mode(report: AuditReport) -> str | None:
    """The production run whose step 0 the document shows: sentinel when it ran."""
    if report.run is None or not report.modes:
        return None
    return "sentinel" if "sentinel" in report.modes else report.modes[0]


def reference_trace(report: AuditReport) -> Trace | None:
    mode = reference_mode(report)
    if mode is None or report.run is None:
        return None
    return report.run.traces.get(mode)


def first(trace: Trace, label: str, step: int = 0) -> Launch | None:
    return next((x for x in trace.launches if x.label == label and x.step == step), None)


def width_note(value: int, sh2: int) -> str:
    """What an SGEMM width means against the d = 0 concat width SH2 + 1."""
    if value == sh2 + 1:
        return f"{value} (SH2 + 1)"
    if value == sh2:
        return f"{value} (SH2: the wire column is dropped)"
    return str(value)


def _operand(launch: Launch, role: str, trace: Trace) -> str:
    try:
        return operand(launch.binding(role), trace.layout)
    except KeyError:
        return f"no operand {role}"


def forward_dispatch(trace: Trace, sh2: int) -> str:
    label = "forward_branch_fc[d=0]@online"
    x = first(trace, label)
    if x is None:
        return f"no `{label}` launch recorded"
    return (
        f"`{label}`: k = {width_note(x.args['k'], sh2)} against lda = {x.args['lda']}; "
        f"A = {_operand(x, 'A', trace)}, B = {_operand(x, 'B', trace)}"
    )


def backward_dispatch(trace: Trace) -> str:
    parts = []
    for site in SITES:
        scale = first(trace, f"sp14_scale_wire_col@{site}")
        dx = first(trace, f"backward_branch_dx[d=0]@{site}")
        acc = first(trace, f"accumulate_d_h_s2_from_concat[d=0]@{site}")
        if scale is None:
            parts.append(f"{site}: no `sp14_scale_wire_col` launch (ungated)")
            continue
        target = _operand(scale, "dx_concat", trace)
        where = f"× ISV[{scale.args.get('isv_index')}]"
        if dx is not None and acc is not None and dx.index < scale.index < acc.index:
            order = "after the d = 0 dX SGEMM, before the accumulate"
        else:
            order = "NOT between the d = 0 dX SGEMM and the accumulate"
        parts.append(f"{site}: `sp14_scale_wire_col` on {target} {where}, {order}")
    return "; ".join(parts)


def dw(trace: Trace, sh2: int) -> str:
    parts = []
    for site in SITES:
        x = first(trace, f"backward_branch_dw[d=0]@{site}")
        if x is None:
            parts.append(f"{site}: no d = 0 dW SGEMM recorded")
            continue
        scale = first(trace, f"sp14_scale_wire_col@{site}")
        before = (
            "before the wire scale"
            if scale is None or x.index < scale.index
            else ("AFTER the wire scale")
        )
        parts.append(
            f"{site}: m = {width_note(x.args['m'], sh2)}, ldc = {x.args['ldc']}, "
            f"C = {_operand(x, 'C', trace)} from A = {_operand(x, 'A', trace)}, {before}"
        )
    return "; ".join(parts)


def target_net(trace: Trace) -> str:
    writers: Counter[str] = Counter()
    for x in trace.launches:
        if x.kind == "checkpoint" or x.step < 0 or x.label.startswith(NON_PIPELINE_PREFIXES):
            continue
        if x.writes_to("target_params"):
            writers[x.label] += 1
    steps = len([s for s in trace.steps if s >= 0])
    if not writers:
        written = "nothing writes `target_params`"
    else:
        written = "`target_params` is written by " + ", ".join(
            f"`{label}` × {n}" for label, n in sorted(writers.items())
        )
    try:
        begin = trace.checkpoint_index(0, TARGET_FORWARD_BEGIN)
        end = trace.checkpoint_index(0, TARGET_FORWARD_END)
    except KeyError:
        return f"{written} over {steps} steps; no target-forward checkpoints recorded"
    window = [x for x in trace.launches[begin + 1 : end] if x.kind != "checkpoint"]
    backward = [x for x in window if "backward" in x.label]
    return (
        f"{written} over {steps} steps; the target forward ran {len(window)} launches, "
        f"{len(backward)} of them backward"
    )


def wrapper_path(report: AuditReport, sh2: int) -> str:
    run = report.run
    assert run is not None
    production = sum(
        1
        for mode in report.modes
        if mode in run.traces
        for x in run.traces[mode].launches
        if x.label.startswith(WRAPPER_PREFIX)
    )
    text = f"{production} launches of the wrapper path in the production runs"
    diag = run.traces.get(WRAPPER_SCENARIO)
    label = f"{WRAPPER_PREFIX}backward_branch_dw[d=0]@wrapper"
    x = first(diag, label) if diag is not None else None
    if x is None or diag is None:
        return f"{text}; no diagnostic wrapper call recorded"
    return (
        f"{text}; the diagnostic call's d = 0 dW SGEMM has m = {width_note(x.args['m'], sh2)} "
        f"against ldc = {x.args['ldc']}, A = {_operand(x, 'A', diag)}"
    )


def wire_status(report: AuditReport) -> list[WireRow]:
    trace = reference_trace(report)
    sh2 = report.config.dims.SH2
    measures: dict[str, Callable[[Trace], str]] = {
        "Forward dispatch": lambda t: forward_dispatch(t, sh2),
        "Backward dispatch": backward_dispatch,
        "dW unchanged": lambda t: dw(t, sh2),
        "Target net": target_net,
        "Wrapper path": lambda _t: wrapper_path(report, sh2),
    }
    out = []
    for wire, proofs in STAGES:
        measured = measures[wire](trace) if trace is not None else "no trace recorded"
        out.append(WireRow(wire, stage_status(report, proofs), measured, proofs))
    return out
