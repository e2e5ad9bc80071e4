"""`--junit`: JUnit XML as pytest writes it, one testcase per invariant per mode.

A failed verdict is a `<failure message=...>` carrying the invariant's one-line message and the
verdict's summary; its body adds the evidence. A warning is a passing testcase whose
`<system-out>` says why it warned, so CI dashboards show it without failing the build. An
UNDECIDED verdict that is not allowed is a `<failure type="InvariantUndecided">` with the gate's
reason; an allowed one is `<skipped>` with why it is allowed, and so is a "not applicable" one
with its reason. With
--check one more testcase, `document-current`, fails while the committed document is stale; with
compute-sanitizer findings that fail the gate, one more, `compute-sanitizer`, fails with them.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from egf_audit.invariants.registry import FAIL, NOT_APPLICABLE, UNDECIDED, WARN
from egf_audit.reports.controls import visible
from egf_audit.reports.json_report import jsonable
from egf_audit.reports.model import CaptureReport, Gate
from egf_audit.reports.undecided_words import ALLOWED_UNDECIDED, undecided_reason

# XML 1.0 cannot carry these characters at all, escaped or not.
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def clean(text: str) -> str:
    return _INVALID_XML.sub("?", text)


def shown(text: str) -> str:
    """Untrusted text (a summary, a finding that may quote a trainer's name) for the XML: every
    control, format and bidi character escaped (reports/controls.py), a line break too."""
    return visible(text)


def testcase_name(code: str, mode: str) -> str:
    return f"{code}[{mode}]"


DOCUMENT_CASE = "document-current"
SANITIZER_CASE = "compute-sanitizer"
CAPTURE_CASE = "capture-complete"  # run --capture: an incomplete capture, or no SP14 trainer


def render_junit(gate: Gate, seconds: dict[str, float] | None = None) -> str:
    """`seconds`: time each invariant's check took over all modes (split evenly per mode)."""
    report = gate.report
    seconds = seconds or {}
    problems = report.problems()
    extra = int(bool(gate.sanitizer_failures)) + int(bool(problems))
    suites = ET.Element("testsuites", name="egf-audit")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="egf-audit",
        errors="0",
        failures=str(
            len(report.failures) + len(report.undecided_failing) + int(gate.stale) + extra
        ),
        skipped=str(len(report.undecided_allowed) + len(report.not_applicable)),
        tests=str(len(report.results) + int(gate.checked) + extra),
        time=f"{sum(seconds.values()):.3f}",
    )
    modes_of = {r.code: sum(1 for q in report.results if q.code == r.code) for r in report.results}
    for r in report.results:
        inv = report.invariant(r.code)
        slug = inv.slug if inv else ""
        message = inv.message if inv else ""
        case = ET.SubElement(
            suite,
            "testcase",
            classname=clean(
                getattr(inv.check, "__module__", "egf_audit.invariants") if inv else ""
            ),
            name=testcase_name(r.code, r.mode),
            time=f"{seconds.get(r.code, 0.0) / max(modes_of[r.code], 1):.3f}",
        )
        evidence = json.dumps(jsonable(r.verdict.evidence), indent=2, sort_keys=True)
        summary = shown(r.verdict.summary)
        body = (
            f"{r.code} {slug} [{r.mode}]\n{message}\n\nsummary: {summary}\n"
            f"evidence: {evidence}\n\nSee `egf-audit explain {r.code}`."
        )
        status = report.shown_status(r)
        if status == FAIL:
            failure = ET.SubElement(
                case,
                "failure",
                message=clean(f"{message} ({summary})"),
                type="InvariantFailed",
            )
            failure.text = clean(body)
        elif status == WARN:
            out = ET.SubElement(case, "system-out")
            out.text = clean(f"warning: {body}")
        elif status == UNDECIDED:  # not allowed: nothing decided it, and that fails the gate
            section = report.section(r.mode) if isinstance(report, CaptureReport) else None
            reason = shown(undecided_reason(r, section["layout"] if section else None))
            failure = ET.SubElement(
                case, "failure", message=clean(reason), type="InvariantUndecided"
            )
            failure.text = clean(body)
        elif status == ALLOWED_UNDECIDED and isinstance(report, CaptureReport):
            why = shown(report.why_allowed(r))
            ET.SubElement(case, "skipped", message=clean(f"{ALLOWED_UNDECIDED} ({why}): {summary}"))
        elif status == NOT_APPLICABLE:
            ET.SubElement(case, "skipped", message=clean(summary))
    if problems:
        case = ET.SubElement(
            suite, "testcase", classname="egf_audit.capture", name=CAPTURE_CASE, time="0.000"
        )
        failure = ET.SubElement(
            case, "failure", message=clean(shown(problems[0])), type="CaptureIncomplete"
        )
        failure.text = clean("\n".join(shown(p) for p in problems))
    if gate.checked:
        _document_case(suite, gate)
    if gate.sanitizer_failures:
        case = ET.SubElement(
            suite, "testcase", classname="egf_audit.sanitize", name=SANITIZER_CASE, time="0.000"
        )
        failure = ET.SubElement(
            case,
            "failure",
            message=clean(gate.sanitizer_failures[0]),
            type="SanitizerFinding",
        )
        failure.text = clean("\n".join(gate.sanitizer_failures))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


def _document_case(suite: ET.Element, gate: Gate) -> None:
    case = ET.SubElement(
        suite, "testcase", classname="egf_audit.check", name=DOCUMENT_CASE, time="0.000"
    )
    if gate.stale:
        failure = ET.SubElement(
            case,
            "failure",
            message=clean(f"{gate.document} is stale: it {gate.stale_reason}"),
            type="DocumentStale",
        )
        failure.text = clean("".join(gate.diff))
