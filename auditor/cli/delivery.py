"""Every output of a gate, the rebuild's (`run`) and a capture's (`run --capture`) alike: the
document checked against the committed one (`--check`: stale, and why), every file staged and
replaced together, what goes to stdout, GitHub annotations and the step summary. Nothing here
renders a verdict (reports/ does) or decides one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from egf_audit.cli.outputs import STDOUT, Outputs
from egf_audit.cli.paths import shown
from egf_audit.errors import AuditEnvironmentError
from egf_audit.outputs.step_summary import append_step_summary
from egf_audit.reports import github
from egf_audit.reports.blame import blame_lines
from egf_audit.reports.document import (
    committed_sources,
    first_stale_line,
    stale_diff,
    whitespace_only_lines,
)
from egf_audit.reports.json_report import render_json
from egf_audit.reports.junit import render_junit
from egf_audit.reports.model import AuditReport, CaptureReport, Gate
from egf_audit.reports.workflow import in_github_actions

WHITESPACE_ONLY = "in whitespace only"  # a stale reason that is an editor's, not the sources'


@dataclass
class RunOutcome:
    gate: Gate
    document: str
    exit_code: int
    written: list[Path] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)  # `-` outputs and --output-format text
    annotations: list[str] = field(default_factory=list)  # GitHub workflow commands, for stdout
    # per failed verdict (code, mode): "EGF007[sentinel] is blamed on FILE:LINE (...)"
    blamed: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # one-line warnings that change no exit code
    advice: str = ""  # for a stale document: the command that brings it up to date
    typed_out: str = ""  # --out as typed, for messages to the user who typed it

    @property
    def report(self) -> AuditReport | CaptureReport:
        return self.gate.report


def annotating(output_format: str) -> bool:
    return in_github_actions() or output_format == "github"


def _read_committed(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditEnvironmentError(f"cannot read {path}: {exc}") from None


def document_gate(
    report: AuditReport | CaptureReport, document: str, out: Path, check: bool, base: Path
) -> Gate:
    """The gate of a rendered document: with `check`, whether the committed one at `out` is
    current (the rebuild's and the capture's documents alike)."""
    shown_out = shown(out, base)
    if not check:
        return Gate(report, shown_out)
    committed = _read_committed(out)
    if committed is None:
        return Gate(
            report,
            shown_out,
            checked=True,
            stale=True,
            stale_reason="does not exist",
            diff=(f"{shown_out} does not exist\n",),
        )
    diff = stale_diff(committed, document, shown_out)
    if not diff:
        return Gate(report, shown_out, checked=True)
    was, now = committed_sources(committed), committed_sources(document)
    reason = "differs from the regenerated audit"
    spaces = whitespace_only_lines(committed, document)
    if spaces:  # an editor's reformatting: the sources are the same
        many = len(spaces) > 1
        where = ", ".join(map(str, spaces[:-1])) + " and " * many + str(spaces[-1])
        reason += (
            f" {WHITESPACE_ONLY} (line{'s' * many} {where} of the committed file: an editor "
            f"or formatter changed {'them' if many else 'it'})"
        )
    elif was is not None and now is not None and was != now:
        reason = f"was made from other sources ({was.rstrip('.')}) than this run audited ({now})"
    return Gate(
        report,
        shown_out,
        checked=True,
        stale=True,
        stale_reason=reason,
        diff=tuple(diff),
        stale_line=first_stale_line(committed, document),
    )


@dataclass(frozen=True)
class Deliveries:
    """Where a gate's outputs go (None: not asked for; `-`: stdout)."""

    out: Path
    check: bool
    json_out: Path | None
    junit_out: Path | None
    trace_out: Path | None


def deliver(
    outcome: RunOutcome,
    to: Deliveries,
    trace_lines: Callable[[], list[str]],
    output_format: str,
    step_summary: Callable[[Gate], str],
    seconds: dict[str, float] | None = None,
    changed: dict[str, list[tuple[int, int]]] | None = None,
) -> None:
    """Write every output of a gate, the rebuild's or a capture's. Every file output is staged
    before any is replaced: one that cannot be written (exit 3) leaves all existing files as
    they were. `-` outputs are printed after the files."""
    gate = outcome.gate
    outputs = Outputs()
    if not to.check:
        outputs.add(to.out, outcome.document, option="out")
    json_text = render_json(gate, outcome.exit_code)
    junit_text = render_junit(gate, seconds)
    outputs.add(to.json_out, json_text)
    outputs.add(to.junit_out, junit_text)
    if to.trace_out is not None:
        outputs.add(to.trace_out, "\n".join(trace_lines()) + "\n")
    if output_format == "json":
        outputs.add(STDOUT, json_text)
    elif output_format == "junit":
        outputs.add(STDOUT, junit_text)
    outcome.written = outputs.write()
    outcome.stdout = outputs.stdout
    if annotating(output_format):
        outcome.annotations = github.annotation_commands(gate, changed)
    outcome.blamed = blame_lines(gate, changed)
    if in_github_actions():
        try:
            append_step_summary(step_summary(gate))
        except OSError as exc:
            # the summary is a courtesy to the reader of the job; it never changes the verdict
            outcome.notes.append(f"could not append to GITHUB_STEP_SUMMARY: {exc}")
