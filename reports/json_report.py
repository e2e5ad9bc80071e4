"""`--json`: the whole run for machines: verdicts with evidence, config, environment, kernels.
Every string in it, keys too, is visible text (reports/controls.py): a control or bidi character
a trainer's file carried is an escape in the decoded JSON, not the character itself."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from egf_audit.reports.controls import visible
from egf_audit.reports.model import CaptureReport, Gate

if TYPE_CHECKING:
    from egf_audit.reports.model import AuditReport

SCHEMA = "egf-audit/run/2"  # 2: ok/verdict are the gate's (a stale document fails), run info
CAPTURE_SCHEMA = "egf-audit/capture/2"  # 2: the rebuild's verdict type, one section a process


def jsonable(value: Any) -> Any:
    """Evidence as strict JSON: numpy scalars and arrays unwrapped, tuples as lists, non-finite
    floats as the strings "nan", "inf", "-inf" (JSON has no literal for them)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalar or array
        return jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _verdicts(report: AuditReport | CaptureReport) -> list[dict[str, Any]]:
    return [
        {
            "code": inv.code,
            "slug": inv.slug,
            "message": inv.message,
            "verdicts": {
                mode: {
                    "status": r.verdict.status,
                    # what the gate made of it: "allowed undecided" where an UNDECIDED verdict
                    # is allowed, else the status itself ("undecided" then fails the gate)
                    "gate_status": report.shown_status(r),
                    "summary": r.verdict.summary,
                    "evidence": jsonable(r.verdict.evidence),
                }
                for mode in report.modes
                if (r := report.result(inv.code, mode)) is not None
            },
        }
        for inv in report.invariants
    ]


def _document(gate: Gate) -> dict[str, Any]:
    return {
        "path": gate.document,
        "checked": gate.checked,
        "stale": gate.stale,
        "reason": gate.stale_reason or None,
    }


def _gate_head(gate: Gate, schema: str, exit_code: int) -> dict[str, Any]:
    """What every JSON report opens with: the gate's one verdict, the rebuild's or a capture's."""
    return {
        "schema": schema,
        "egf_audit_version": gate.report.version,
        "ok": gate.ok,
        "exit_code": exit_code,
        "verdict": gate.line(),
        "reasons": gate.reasons(),
        "invariants_ok": gate.report.ok,
        "undecided_not_allowed": [f"{r.code}[{r.mode}]" for r in gate.report.undecided_failing],
        "allowed_undecided": [f"{r.code}[{r.mode}]" for r in gate.report.undecided_allowed],
        "command": gate.report.command,
    }


def capture_report_dict(gate: Gate, report: CaptureReport, exit_code: int) -> dict[str, Any]:
    return _gate_head(gate, CAPTURE_SCHEMA, exit_code) | {
        "sections": list(report.modes),
        "incomplete": list(report.incomplete),
        "missing": list(report.missing),
        "not_audited": list(report.not_audited),
        "trainer": report.trainer,
        "not_applicable": [f"{r.code}[{r.mode}]" for r in report.not_applicable],
        "processes": jsonable(list(report.sections)),
        "run": jsonable(report.run_info),
        "invariants": _verdicts(report),
        "document": _document(gate),
    }


def report_dict(gate: Gate, exit_code: int) -> dict[str, Any]:
    report = gate.report
    if isinstance(report, CaptureReport):
        return capture_report_dict(gate, report, exit_code)
    return _gate_head(gate, SCHEMA, exit_code) | {
        "config": report.config.as_dict(),
        "modes": list(report.modes),
        "steps": report.steps,
        "environment": jsonable(report.environment),
        "run": jsonable(report.run_info),
        "kernels": [
            {"name": s.spec.name, "path": s.path, "origin": s.origin, "sha256": s.sha256}
            for s in report.kernels.sources
        ],
        "kernel_headers": [{"path": p, "sha256": h} for p, h in report.kernels.headers()],
        "kernels_ignored": list(report.kernels.ignored),
        "cublas_witness": report.witness,
        "invariants": _verdicts(report),
        "document": _document(gate),
    }


def shown(value: Any) -> Any:
    """Every string of a JSON value, keys too, as visible text."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {shown(k): shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shown(v) for v in value]
    return value


def render_json(gate: Gate, exit_code: int) -> str:
    return json.dumps(shown(report_dict(gate, exit_code)), indent=2, allow_nan=False) + "\n"
