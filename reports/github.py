"""GitHub Actions output (GITHUB_ACTIONS=true, or `--output-format github`): workflow-command
annotations for stdout and the markdown of the step summary (`egf_audit.outputs.step_summary`
appends it to $GITHUB_STEP_SUMMARY).

An annotation carries `file=` and `line=` where a file is known, so GitHub shows it on the pull
request's diff: the trainer's own kernel file (under `--kernels`) for a failure that involves
that kernel, the document's first stale line for a stale document. EGF011's documented residual
is a warning that holds: one `::notice`, not one `::warning` per mode. An UNDECIDED verdict the
gate does not allow is an `::error` with the gate's reason; an allowed one is one `::notice` per
invariant, saying why it is allowed (never that it holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from egf_audit.invariants.registry import FAIL, WARN
from egf_audit.reports.blame import locations
from egf_audit.reports.environment import environment_markdown
from egf_audit.reports.markdown import code, table
from egf_audit.reports.model import STATUS_LABEL, AuditReport, CaptureReport, Gate
from egf_audit.reports.undecided_words import ALLOWED_UNDECIDED
from egf_audit.reports.wire_status import ROW_STATUS, wire_status
from egf_audit.reports.workflow import command

if TYPE_CHECKING:
    from egf_audit.invariants import Result

# the versions the step summary names, where the run info holds them
Version = Literal["python", "numpy", "torch", "cupy"]
VERSIONS: tuple[Version, ...] = ("python", "numpy", "torch", "cupy")


def annotation_commands(
    gate: Gate, changed: Mapping[str, Sequence[tuple[int, int]]] | None = None
) -> list[str]:
    """One ::error per failed verdict (one per blamed kernel file, at most three), one ::notice
    per invariant that warned (however many modes), one ::error on the document when it is
    stale. `changed`: the (first, last) lines a pull request changed, per file as shown."""
    changed = changed or {}
    report = gate.report
    lines = []
    for r in report.results:
        if r.verdict.status != FAIL:
            continue
        inv = report.invariant(r.code)
        slug, message = (inv.slug, inv.message) if inv else ("", "")
        text = f"[{r.mode}] {slug}: {message} ({r.verdict.summary})"
        located = locations(gate, r, changed)
        if not located:
            lines.append(command("error", text, title=r.code))
        for at in located:
            said = f"{text} [{at.file}: {at.changed}]" if at.changed else text
            span = at.end if at.end != at.line else None
            lines.append(
                command("error", said, title=r.code, file=at.file, line=at.line, endLine=span)
            )
    for problem in report.problems():
        lines.append(command("error", problem, title="egf-audit --capture"))
    for reason, r in zip(gate.undecided_reasons(), report.undecided_failing, strict=True):
        lines.append(command("error", reason, title=r.code))
    allowed: dict[str, list[Result]] = {}
    for r in report.undecided_allowed:
        allowed.setdefault(r.code, []).append(r)
    for code_, results in allowed.items():
        modes = " and ".join(r.mode for r in results)
        why = report.why_allowed(results[0]) if isinstance(report, CaptureReport) else ""
        text = f"{ALLOWED_UNDECIDED}, not held ({modes}; {why}): {results[0].verdict.summary}"
        lines.append(command("notice", text, title=code_))
    warned: dict[str, list[Result]] = {}
    for r in report.results:
        if r.verdict.status == WARN:
            warned.setdefault(r.code, []).append(r)
    for code_, results in warned.items():
        inv = report.invariant(code_)
        slug = inv.slug if inv else ""
        modes = " and ".join(r.mode for r in results)
        summary = results[0].verdict.summary
        text = f"{slug} (a documented residual, not a failure; {modes}): {summary}"
        lines.append(command("notice", text, title=code_))
    if gate.stale:
        lines.append(
            command(
                "error",
                f"{gate.document} is stale: it {gate.stale_reason}; run `{report.command}` "
                "from the repository root and commit the result",
                title="egf-audit --check",
                file=gate.document,
                line=gate.stale_line,
            )
        )
    return lines


def step_summary(gate: Gate) -> str:
    report = gate.report
    rows = [
        [
            inv.code,
            code(inv.slug),
            *[
                STATUS_LABEL[
                    report.shown_status(r) if (r := report.result(inv.code, m)) else "not run"
                ]
                for m in report.modes
            ],
        ]
        for inv in report.invariants
    ]
    wires = [] if isinstance(report, CaptureReport) else wire_status(report)
    wire_rows = [[w.wire, ROW_STATUS[w.status], ", ".join(w.codes)] for w in wires]
    lines = [f"## egf-audit: {gate.line()}", ""]
    lines += [f"- {reason}" for reason in gate.reasons()]
    if gate.reasons():
        lines.append("")
    if gate.stale:
        lines += [f"**{code(gate.document)} is STALE**: run `{report.command}` and commit it.", ""]
    lines += table(["code", "invariant", *report.modes], rows)
    if wire_rows:
        lines += ["", *table(["wire", "status", "proved by"], wire_rows)]
    info = report.run_info
    if info:
        versions = ", ".join(f"{k} {info[k]}" for k in VERSIONS if k in info)
        total = sum(info.get("timings_s", {}).values())
        lines += [
            "",
            f"Ran on {info.get('picked')} in {total:.1f} s: host {info.get('host')}, "
            f"{info.get('platform')}, {versions}.",
        ]
    if isinstance(report, AuditReport):  # what the document leaves out: it is per machine
        lines += ["", *environment_markdown(report)]
    if gate.stale and gate.diff:
        lines += [
            "",
            "<details><summary>stale diff</summary>",
            "",
            "```diff",
            *[line.rstrip("\n") for line in gate.diff],
            "```",
            "",
            "</details>",
        ]
    return "\n".join(lines) + "\n"
