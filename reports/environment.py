"""The document's environment block: what depends on the backend it was made on (the device,
the backend's libraries, the measured evidence numbers, the cuBLAS witness). `--check` ignores
everything between ENV_BEGIN and ENV_END, so a document made on a GPU is current on a CPU."""

from __future__ import annotations

import json
from collections.abc import Mapping

from egf_audit.reports.bindings import number
from egf_audit.reports.json_report import jsonable
from egf_audit.reports.markdown import code, table
from egf_audit.reports.model import AuditReport

ENV_BEGIN = "<!-- egf-audit:env:begin -->"
ENV_END = "<!-- egf-audit:env:end -->"
EVIDENCE_CHARS = 400  # per verdict in the document; --json has all of it


def environment_block(report: AuditReport) -> list[str]:
    env = report.environment
    rows = [[code(k), v] for k, v in _flatten(env)]
    evidence = [
        [r.code, r.mode, code(_evidence(r.verdict.evidence))]
        for r in report.results
        if r.verdict.evidence
    ]
    lines = [
        ENV_BEGIN,
        "## Environment",
        "",
        "What depends on the backend this document was made on. `egf-audit run --check` ignores "
        "everything between the environment markers, so a document made on a GPU is current "
        "on a CPU runner. Timings, host and platform are not written here (they change on every "
        "run): `egf-audit run` prints them and `--json` holds them.",
        "",
        *table(["key", "value"], rows),
        "",
        "### Measured evidence",
        "",
    ]
    if evidence:
        lines += table(["code", "mode", "evidence"], evidence)
    else:
        lines.append("No verdict carried evidence.")
    return [*lines, *_witness(report), ENV_END]


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
        f"cuBLAS's API logger recorded {w['logged']} GEMM calls; each was paired, in order, with "
        "the recorded SGEMM of the same index and compared on (transa, transb, m, n, k, lda, ldb, "
        "ldc).",
    ]
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
