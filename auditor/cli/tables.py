"""Rich tables for the terminal: verdicts, the invariant list, the mutants kill matrix (the
fault list is `fault_list.py`'s: it loads no invariant, so no torch).

Every cell is a `Text`, never markup: summaries hold brackets (`[64, 49]`, `[d=0]`) that rich
would otherwise read as style tags. Below NARROW columns a table would drop or crush columns,
so the same content is printed as lines that the terminal wraps, never cuts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from egf_audit.cli.options import NARROW
from egf_audit.invariants.registry import FAIL, NOT_APPLICABLE, PASS, UNDECIDED, WARN
from egf_audit.reports.model import AuditReport, CaptureReport
from egf_audit.reports.undecided_words import ALLOWED_UNDECIDED

if TYPE_CHECKING:
    from egf_audit.scenarios.mutants import MutantsResult

STATUS_STYLE = {
    PASS: ("pass", "green"),
    FAIL: ("FAIL", "bold red"),
    WARN: ("warn", "yellow"),
    UNDECIDED: ("UNDECIDED", "bold red"),  # fails the gate
    ALLOWED_UNDECIDED: ("allowed undecided", "dim"),
    NOT_APPLICABLE: ("not applicable", "dim"),
}


def status_text(status: str | None) -> Text:
    label, style = STATUS_STYLE.get(status or "", ("—", "dim"))
    return Text(label, style=style)


def _notes(report: AuditReport | CaptureReport, code: str) -> list[str]:
    """What a verdict that did not simply pass says, labelled by its modes; a pass says
    nothing here (its summary is in the document), which keeps a passing run's table short."""
    by_summary: dict[str, list[str]] = {}
    for mode in report.modes:
        r = report.result(code, mode)
        if r is not None and r.verdict.status != PASS:
            by_summary.setdefault(r.verdict.summary, []).append(mode)
    return [f"{' and '.join(modes)}: {summary}" for summary, modes in by_summary.items()]


def verdict_table(report: AuditReport | CaptureReport) -> Table:
    table = Table(title="egf-audit verdicts", title_justify="left")
    table.add_column("code", no_wrap=True)
    table.add_column("invariant", no_wrap=True)
    for mode in report.modes:
        table.add_column(mode, no_wrap=True)
    table.add_column("why it did not pass", overflow="fold")
    for inv in report.invariants:
        cells = []
        for mode in report.modes:
            r = report.result(inv.code, mode)
            cells.append(status_text(report.shown_status(r) if r else None))
        notes = "\n".join(_notes(report, inv.code))
        table.add_row(Text(inv.code), Text(inv.slug), *cells, Text(notes))
    return table


def verdict_lines(report: AuditReport | CaptureReport) -> list[Text]:
    """The verdict table as lines, for narrow terminals."""
    lines = [Text("egf-audit verdicts")]
    for inv in report.invariants:
        line = Text(f"{inv.code} {inv.slug}:")
        for mode in report.modes:
            r = report.result(inv.code, mode)
            line += Text(f" {mode} ") + status_text(report.shown_status(r) if r else None)
        lines.append(line)
        lines += [Text(f"  {note}") for note in _notes(report, inv.code)]
    return lines


def print_verdicts(console: Console, report: AuditReport | CaptureReport) -> None:
    if console.width < NARROW:
        for line in verdict_lines(report):
            console.print(line, soft_wrap=True)
    else:
        console.print(verdict_table(report))


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
