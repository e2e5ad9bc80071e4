"""The plain function behind `egf-audit run --capture DIR`: the capture's verdicts through the
rebuild's gate, renderers and output handling. Nothing here prints.

The same rules as `run`: two outputs on one path are refused (exit 2) before anything is read,
`-` is stdout, `--output-format` picks what stdout carries, every file is staged and replaced
together, `--check` compares the committed document and names it STALE. One more: no output
may lie inside the capture folder (a capture is evidence; nothing replaces a file in it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from egf_audit import __version__
from egf_audit.cli.capture_audit import CaptureAudit, ProcessAudit, audit_capture
from egf_audit.cli.delivery import Deliveries, RunOutcome, deliver, document_gate
from egf_audit.cli.outputs import check_distinct, gate_outputs, is_stdout
from egf_audit.cli.paths import document_base, shown
from egf_audit.errors import UsageError
from egf_audit.invariants import INVARIANTS, Result
from egf_audit.reports.capture_document import capture_step_summary, render_capture_document
from egf_audit.reports.model import CaptureReport, CaptureSection

DEFAULT_CAPTURE_OUT = Path("docs/trainer-audit.md")


@dataclass(frozen=True)
class CaptureRequest:
    folder: Path
    out: Path = DEFAULT_CAPTURE_OUT
    check: bool = False
    json_out: Path | None = None
    junit_out: Path | None = None
    trace_out: Path | None = None
    output_format: str = "text"
    use_layout: bool = True
    allow_undecided: frozenset[str] = frozenset()  # codes allowed UNDECIDED beside the mode's
    trainer: str = "sp14"  # "generic": a program that is no SP14 trainer by design
    root: Path | None = None  # what the document's paths are relative to (None: see paths.py)

    @property
    def base(self) -> Path:
        return self.root or document_base(self.out)

    def outputs(self) -> dict[str, Path | str | None]:
        return gate_outputs(
            self.out, self.json_out, self.junit_out, self.trace_out, self.output_format
        )

    def command(self) -> str:
        """The document's own command: the capture folder named by its role, never by where
        this capture happens to lie (the next capture of the same code lies elsewhere), and
        --out relative to the repository root, as the rebuild's document spells it."""
        out = shown(self.out, self.base)
        spelled = "" if Path(out) == DEFAULT_CAPTURE_OUT else f" --out {out}"
        if self.trainer != "sp14":
            spelled += f" --trainer {self.trainer}"
        if self.allow_undecided:
            spelled += f" --allow-undecided {','.join(sorted(self.allow_undecided))}"
        return f"egf-audit run --capture CAPTURE_DIR{spelled}"


def _refuse_outputs_inside(req: CaptureRequest) -> None:
    folder = os.path.realpath(req.folder)
    for option, path in req.outputs().items():
        if path is None or is_stdout(path):
            continue
        where = os.path.realpath(path)
        if where == folder or where.startswith(folder + os.sep):
            raise UsageError(
                f"{option} {path} lies inside the capture folder {req.folder}: a capture is "
                "evidence, and nothing replaces a file in it; write the output elsewhere"
            )


def _section(p: ProcessAudit) -> CaptureSection:
    ct = p.trace
    return {
        "section": p.section,
        "launches": len(ct.launches),
        "gemms": sum(1 for _ in ct.sgemms()),
        "steps": len(ct.site_steps()),
        "sites": len(ct.call_sites()),
        "layout": "file" if ct.capture.layout.from_file else "inferred",
        "layout_note": p.layout_note,
        "mode": p.mode,
        "naming": ct.capture.layout.naming(),
        "gemms_not_judged": [
            f"launch {i} (step {ct.launches[i].step}, {ct.launches[i].label})"
            for i in p.unresolved_gemms
        ],
    }


def capture_report(
    audit: CaptureAudit, command: str, given: frozenset[str] = frozenset()
) -> CaptureReport:
    results = tuple(
        Result(code, p.section, verdict) for p in audit.processes for code, verdict in p.verdicts
    )
    return CaptureReport(
        invariants=tuple(INVARIANTS),
        modes=tuple(p.section for p in audit.processes),
        results=results,
        sections=tuple(_section(p) for p in audit.processes),
        incomplete=tuple(audit.incomplete),
        missing=tuple(audit.missing),
        not_audited=tuple(audit.not_audited),
        allowed={p.section: p.allowed for p in audit.processes},
        allowed_given=given,
        trainer=audit.trainer,
        command=command,
        version=__version__,
        run_info={
            "capture": str(audit.folder),
            "pids": {p.section: p.trace.capture.process.pid for p in audit.processes},
        },
    )


def run_capture_audit(req: CaptureRequest) -> RunOutcome:
    check_distinct(req.outputs())
    _refuse_outputs_inside(req)
    audit = audit_capture(req.folder, req.use_layout, req.allow_undecided, req.trainer)
    report = capture_report(audit, req.command(), req.allow_undecided)
    document = render_capture_document(report)
    gate = document_gate(report, document, req.out, req.check, req.base)
    outcome = RunOutcome(gate, document, exit_code=0 if gate.ok else 1)
    outcome.typed_out = req.out.as_posix()
    if gate.stale:
        outcome.advice = (
            f"run `egf-audit run --capture {req.folder.as_posix()} --out "
            f"{shown(req.out, Path.cwd())}` and commit it"
        )
    deliver(
        outcome,
        Deliveries(req.out, req.check, req.json_out, req.junit_out, req.trace_out),
        lambda: [line for p in audit.processes for line in p.trace.to_jsonl()],
        req.output_format,
        capture_step_summary,
    )
    return outcome
