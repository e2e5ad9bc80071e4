"""What depends on the machine a run was made on: the device, the backend's libraries and
compiler, the measured evidence numbers (fp32 residues that move with the BLAS), the cuBLAS
witness. None of it is in the audit document, which must be the same bytes on every machine
(docs/ci-gate.md); `egf-audit run` prints it, the step summary shows it and `--json` holds it."""

from __future__ import annotations

import json
from collections.abc import Mapping

from egf_audit.reports.bindings import number
from egf_audit.reports.json_report import jsonable
from egf_audit.reports.markdown import code, table
from egf_audit.reports.model import AuditReport

EVIDENCE_CHARS = 400  # per verdict in the summary and on stdout; --json has all of it


def environment_rows(report: AuditReport) -> list[tuple[str, object]]:
    """(key, value) of the environment, nested keys joined with dots."""
    return _flatten(report.environment)


def evidence_rows(report: AuditReport) -> list[tuple[str, str, str]]:
    """(code, mode, evidence) of every verdict that carries measured evidence, shortened."""
    return [
        (r.code, r.mode, _evidence(r.verdict.evidence))
        for r in report.results
        if r.verdict.evidence
    ]


def environment_markdown(report: AuditReport) -> list[str]:
    """The environment, the measured evidence and the witness as markdown, for the step summary."""
    lines = [
        "### Environment",
        "",
        *table(["key", "value"], [[code(k), v] for k, v in environment_rows(report)]),
        "",
        "### Measured evidence",
        "",
    ]
    evidence = [[c, m, code(e)] for c, m, e in evidence_rows(report)]
    if evidence:
        lines += table(["code", "mode", "evidence"], evidence)
    else:
        lines.append("No verdict carried evidence.")
    return [*lines, *_witness(report)]


def _witness(report: AuditReport) -> list[str]:
    """cuBLAS's own account of the GEMMs (`--cublas-log`): it exists only on the CUDA backend,
    so it lives inside the environment block."""
    w = report.witness
    if w is None:
        return []
    lines = [
        "",
        f"### cuBLAS witness: {w['matched']} of {w['recorded']} GEMMs match",
        "",
        f"cuBLAS's API logger recorded {w['logged']} GEMM calls on the pipeline's cuBLAS handle; "
        "each was paired, in order, with the recorded SGEMM of the same index and compared on "
        "(transa, transb, m, n, k, lda, ldb, ldc).",
    ]
    if w.get("foreign"):
        lines.append(
            f"{w['foreign']} GEMM calls on other cuBLAS handles of the process (torch's own, "
            "for the float64 oracle's start-up) were logged too and are not the pipeline's."
        )
    if w["mismatches"]:
        rows = [
            [
                str(m["index"]),
                code(m["label"]),
                code(json.dumps(m["recorded"])),
                code(json.dumps(m["logged"])),
            ]
            for m in w["mismatches"]
        ]
        lines += ["", *table(["#", "launch", "recorded", "cuBLAS logged"], rows)]
    return lines


def _evidence(evidence: Mapping[str, object], limit: int = EVIDENCE_CHARS) -> str:
    text = json.dumps(jsonable(evidence), sort_keys=True)
    return text if len(text) <= limit else text[:limit] + " ... (whole in --json)"


def _flatten(value: Mapping[str, object], prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            out += _flatten(item, f"{name}.")
        else:
            out.append((name, number(item) if isinstance(item, float) else item))
    return out
