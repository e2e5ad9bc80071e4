"""Rich tables for the terminal: verdicts, the invariant list, the mutants kill matrix.

Every cell is a `Text`, never markup: summaries hold brackets (`[64, 49]`, `[d=0]`) that rich
would otherwise read as style tags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from egf_audit.invariants.registry import FAIL, PASS, WARN
from egf_audit.reports.model import AuditReport

if TYPE_CHECKING:
    from egf_audit.invariants.registry import Invariant
    from egf_audit.scenarios.mutants import MutantsResult

STATUS_STYLE = {PASS: ("pass", "green"), FAIL: ("FAIL", "bold red"), WARN: ("warn", "yellow")}


def status_text(status: str | None) -> Text:
    label, style = STATUS_STYLE.get(status or "", ("—", "dim"))
    return Text(label, style=style)


def verdict_table(report: AuditReport) -> Table:
    table = Table(title="egf-audit verdicts", title_justify="left")
    table.add_column("code", no_wrap=True)
    table.add_column("invariant", no_wrap=True)
    for mode in report.modes:
        table.add_column(mode, no_wrap=True)
    table.add_column("summary")
    for inv in report.invariants:
        cells = []
        summaries = []
        for mode in report.modes:
            r = report.result(inv.code, mode)
            cells.append(status_text(r.verdict.status if r else None))
            if r is not None and r.verdict.summary not in summaries:
                summaries.append(r.verdict.summary)
        table.add_row(Text(inv.code), Text(inv.slug), *cells, Text("; ".join(summaries)))
    return table


def invariants_table(invariants: tuple[Invariant, ...]) -> Table:
    table = Table(title="egf-audit invariants", title_justify="left")
    table.add_column("code", no_wrap=True)
    table.add_column("slug", no_wrap=True)
    table.add_column("message")
    for inv in invariants:
        table.add_row(Text(inv.code), Text(inv.slug), Text(inv.message))
    return table


def kill_matrix(result: MutantsResult) -> Table:
    """Fault x invariant: `x` where the invariant failed on the fault (caught it)."""
    table = Table(title=f"egf-audit kill matrix ({result.backend})", title_justify="left")
    table.add_column("fault", no_wrap=True)
    for code in result.codes:
        table.add_column(code.removeprefix("EGF"), justify="center", no_wrap=True)
    table.add_column("result", no_wrap=True)
    for fault in result.faults:
        marks = [
            Text("x", style="bold green") if c in fault.caught_by else Text("·", style="dim")
            for c in result.codes
        ]
        if not fault.applicable:
            outcome = Text("not applicable", style="dim")
        elif fault.survived:
            outcome = Text("SURVIVED", style="bold red")
        else:
            outcome = Text(f"caught by {len(fault.caught_by)}", style="green")
        table.add_row(Text(fault.name), *marks, outcome)
    return table
