"""`--json`: the whole run for machines: verdicts with evidence, config, environment, kernels."""

from __future__ import annotations

import json
import math
from typing import Any

from egf_audit.reports.model import AuditReport, verdict_line

SCHEMA = "egf-audit/run/1"


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


def report_dict(report: AuditReport, exit_code: int, document: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "egf_audit_version": report.version,
        "ok": report.ok,
        "exit_code": exit_code,
        "verdict": verdict_line(report),
        "command": report.command,
        "config": report.config.as_dict(),
        "modes": list(report.modes),
        "steps": report.steps,
        "environment": jsonable(report.environment),
        "kernels": [
            {"name": s.spec.name, "path": s.path, "origin": s.origin, "sha256": s.sha256}
            for s in report.kernels.sources
        ],
        "kernels_ignored": list(report.kernels.ignored),
        "cublas_witness": report.witness,
        "invariants": [
            {
                "code": inv.code,
                "slug": inv.slug,
                "message": inv.message,
                "verdicts": {
                    mode: {
                        "status": r.verdict.status,
                        "summary": r.verdict.summary,
                        "evidence": jsonable(r.verdict.evidence),
                    }
                    for mode in report.modes
                    if (r := report.result(inv.code, mode)) is not None
                },
            }
            for inv in report.invariants
        ],
        "document": document,
    }


def render_json(report: AuditReport, exit_code: int, document: dict[str, Any]) -> str:
    return json.dumps(report_dict(report, exit_code, document), indent=2, allow_nan=False) + "\n"
