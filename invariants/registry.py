"""The invariant entry and its verdict. Each invariant is one small frozen entry of the flat
`INVARIANTS` list (invariants/__init__.py): a stable code, a slug, a one-line message, the doc
text that `egf-audit explain`, the audit document and the JUnit failure all print (what it
proves, why, how, the bug it catches, its known limits, an example), and a check.

A check is a pure function of the finished `AuditRun` (traces, snapshots, config) and a mode. It
never learns which fault, if any, is active. An entry may also hold a capture check: the same
invariant judged on a capture of the trainer's own process, read as the same `Trace` type
(egf_audit.trace), with what only a capture holds on `Trace.captured`, and the same definitions
(tolerance, call-site model, verdict type); where a capture cannot show what the invariant
needs, `capture_undecidable` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from egf_audit.invariant_text import TEXT_FIELDS, InvariantText
from egf_audit.trace.model import Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.model import Trace

PASS, FAIL, WARN = "pass", "fail", "warn"
# a capture gave the check nothing to judge (documented per invariant: `capture_undecidable`
# and its capture check's docstring); never a rebuild verdict, never a pass, and it fails the
# gate unless allowed (invariants/undecided.py)
UNDECIDED = "undecided"
# an invariant about the SP14 wiring, on a captured process that is no SP14 trainer: neither
# held nor undecided (`not_applicable` below); the summary opens with these words too
NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class Verdict:
    """`summary` is printed outside the document's environment block, so it must be the same
    on every backend: counts, shapes, labels and bitwise facts, never a measured float.
    Measured values (max errors, ulps, magnitudes) go into `evidence`, which the document
    prints inside the environment block and `--json` exports whole. Where another module reads
    a key of the evidence, the check declares that part as a TypedDict beside itself and builds
    it through that type (`SiteFinding` below, EGF001's `OffendingLaunches`), so a key renamed
    on either side is a type error."""

    status: str  # PASS, FAIL, WARN (EGF011 only); UNDECIDED or NOT_APPLICABLE (a capture only)
    summary: str  # one line, device-independent (see above)
    evidence: dict[str, Any] = field(default_factory=dict)  # JSON-serialisable numbers/strings

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass(frozen=True)
class Invariant(InvariantText):
    """An invariant: its texts (code, slug, message, What / Why / How / Bug / Known limits /
    Example, declared once in egf_audit.invariant_text) and its checks."""

    check: Callable[[AuditRun, str], Verdict]
    # ---- test directives, read by the tests that parametrize over INVARIANTS ----
    holds_as: str = PASS  # a correct pipeline's status: PASS, or WARN for a documented residual
    reads: tuple[str, ...] = ("launches", "snapshots")  # what of a trace the check needs
    # ---- the same invariant on a capture of the trainer's process ----
    capture: Callable[[Trace], Verdict] | None = None
    capture_undecidable: str = ""  # why a capture cannot decide it, when `capture` is None
    # its capture check needs no SP14 name, so it judges any captured process (one that
    # launched no ABI kernel too); every other invariant is not applicable to such a process
    any_process: bool = False

    def __post_init__(self) -> None:
        if not self.limits.strip():
            raise ValueError(f"{self.code}: an invariant states its known limits")

    def verdict(self, run: AuditRun, mode: str) -> Verdict:
        """The check's verdict; data it needs but the run lacks (`Missing`, the trace's one
        missing-data convention) is a FAIL that names what was missing."""
        try:
            return self.check(run, mode)
        except Missing as exc:
            return failed(f"missing data: {exc}", missing=str(exc))

    def capture_verdict(self, ct: Trace) -> Verdict:
        """The capture check's verdict, with the same missing-data convention; UNDECIDED with
        `capture_undecidable` where the invariant has no capture check."""
        if not ct.capture.sp14 and not self.any_process:
            return not_applicable(
                "the process launched none of the SP14 ABI kernels: this invariant is about "
                "the SP14 wiring"
            )
        if self.capture is None:
            return undecided(self.capture_undecidable or "no capture check exists for it")
        try:
            return self.capture(ct)
        except Missing as exc:
            return failed(f"missing data: {exc}", missing=str(exc))

    def text(self) -> InvariantText:
        """The texts alone (what `egf-audit explain` reads without importing the checks)."""
        return InvariantText(**{name: getattr(self, name) for name in TEXT_FIELDS})


def passed(summary: str, **evidence: Any) -> Verdict:
    return Verdict(PASS, summary, evidence)


def failed(summary: str, **evidence: Any) -> Verdict:
    return Verdict(FAIL, summary, evidence)


class SiteFinding(TypedDict):
    """What a per-site check (EGF003, EGF004) found wrong at one call site of one step: where,
    and its problems in words. Each check's finding adds its measurements to these keys."""

    scenario: str
    step: int
    site: str
    problems: list[str]


def site_and_problem(finding: Mapping[str, Any]) -> str:
    """A per-site finding in words: where (scenario, step, @site) and its first problem."""
    at = f"{finding['scenario']} step {finding['step']} @{finding['site']}"
    return f"{at}: {finding['problems'][0]}"


def failed_at_sites(
    findings: Sequence[Mapping[str, Any]],
    evidence: Mapping[str, Any],
    *,
    says: Callable[[Mapping[str, Any]], str] = site_and_problem,
    counted: str = "site checks fail",
    listed: str = "failing_sites",
) -> Verdict | None:
    """The verdict of a check that judges call sites one by one (EGF003, EGF004, EGF006) and
    found some failing; None when it found none. Each finding names its scenario, step and
    site: the summary says what the first one found (`says`) and how many failed (`counted`),
    the evidence keeps the first whole and lists all as scenario@step:site under `listed`, then
    the check's own `evidence`."""
    if not findings:
        return None
    first = findings[0]
    where = [f"{f['scenario']}@{f['step']}:{f['site']}" for f in findings]
    return failed(
        f"{says(first)} ({len(findings)} {counted})", first=first, **{listed: where}, **evidence
    )


def warned(summary: str, **evidence: Any) -> Verdict:
    return Verdict(WARN, summary, evidence)


def undecided(summary: str, **evidence: Any) -> Verdict:
    return Verdict(UNDECIDED, summary, evidence)


def not_applicable(reason: str) -> Verdict:
    """An invariant about the SP14 wiring, on a captured process that is no SP14 trainer:
    NOT_APPLICABLE (nothing of it to judge: never a pass, and no undecided that the gate would
    fail), its summary opening "not applicable: " and its evidence saying so."""
    return Verdict(NOT_APPLICABLE, f"{NOT_APPLICABLE}: {reason}", {"not_applicable": True})


def failed_with(problems: list[str], **evidence: Any) -> Verdict:
    """FAIL naming the first problem found and how many there are (the capture checks'
    findings are sentences); every problem up to MAX_PROBLEMS is kept in the evidence."""
    return failed(
        f"{problems[0]} ({len(problems)} findings)",
        problems=problems[:MAX_PROBLEMS],
        problems_total=len(problems),
        **evidence,
    )


MAX_PROBLEMS = 40
