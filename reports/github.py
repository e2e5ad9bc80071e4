"""GitHub Actions output, used when GITHUB_ACTIONS=true: workflow-command annotations on stdout
and a markdown summary appended to $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

import os
from pathlib import Path

from egf_audit.invariants.registry import FAIL, WARN
from egf_audit.reports.markdown import code, table
from egf_audit.reports.model import STATUS_LABEL, AuditReport, verdict_line
from egf_audit.reports.wire_status import ROW_STATUS, wire_status

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub's limit for one step's summary, in bytes


def in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    """A workflow command's message: %, CR and LF would end or corrupt the command."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (title=, file=) also may not hold the `:` and `,` that delimit them."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, **properties: str | None) -> str:
    props = ",".join(f"{k}={escape_property(v)}" for k, v in properties.items() if v)
    return f"::{level}{' ' + props if props else ''}::{escape_data(message)}"


def annotations(report: AuditReport, stale_path: str | None = None) -> list[str]:
    """One ::error per failed verdict, one ::warning per warning, one ::error for a stale
    document."""
    lines = []
    for r in report.results:
        if r.verdict.status not in (FAIL, WARN):
            continue
        inv = report.invariant(r.code)
        slug, message = (inv.slug, inv.message) if inv else ("", "")
        level = "error" if r.verdict.status == FAIL else "warning"
        text = f"[{r.mode}] {slug}: {message} ({r.verdict.summary})"
        lines.append(command(level, text, title=r.code))
    if stale_path is not None:
        lines.append(
            command(
                "error",
                f"{stale_path} is stale: run `egf-audit run` and commit the result",
                title="egf-audit --check",
                file=stale_path,
            )
        )
    return lines


def step_summary(report: AuditReport, stale_path: str | None = None) -> str:
    rows = [
        [
            inv.code,
            code(inv.slug),
            *[
                STATUS_LABEL[r.verdict.status if (r := report.result(inv.code, m)) else "not run"]
                for m in report.modes
            ],
        ]
        for inv in report.invariants
    ]
    wires = [[w.wire, ROW_STATUS[w.status], ", ".join(w.codes)] for w in wire_status(report)]
    lines = [f"## egf-audit: {verdict_line(report)}", ""]
    if stale_path is not None:
        lines += [f"**{code(stale_path)} is stale**: run `egf-audit run` and commit it.", ""]
    lines += table(["code", "invariant", *report.modes], rows)
    lines += ["", *table(["wire", "status", "proved by"], wires)]
    return "\n".join(lines) + "\n"


def append_step_summary(text: str, path: str | None = None) -> None:
    """Append to $GITHUB_STEP_SUMMARY, cut to what GitHub accepts. Raises OSError."""
    target = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    file = Path(target)
    room = STEP_SUMMARY_LIMIT - (file.stat().st_size if file.exists() else 0) - 1
    data = text.encode("utf-8")[: max(room, 0)].decode("utf-8", "ignore").encode("utf-8")
    with file.open("ab") as f:
        f.write(data + b"\n")
