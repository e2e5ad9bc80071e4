"""What every report renders: one finished audit, its verdicts, and where it ran.

Everything here except `environment` (and the numbers in each verdict's evidence) must be the
same on every backend; the renderers keep the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from egf_audit.invariants.registry import FAIL, NOT_APPLICABLE, PASS, UNDECIDED, WARN
from egf_audit.invariants.undecided import CAPTURE, why_allowed
from egf_audit.reports.undecided_words import ALLOWED_UNDECIDED, undecided_reason

if TYPE_CHECKING:
    from egf_audit.invariants import Result
    from egf_audit.invariants.registry import Invariant
    from egf_audit.runtime.cublas_witness import WitnessDict
    from egf_audit.runtime.kernel_sources import KernelSet
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.buffers import NamedBuffer
    from egf_audit.trace.config_view import ConfigView

NOT_RUN = "not run"
STATUS_LABEL = {
    PASS: "✅ pass",
    FAIL: "❌ fail",
    WARN: "⚠️ warn",
    UNDECIDED: "❓ undecided",  # fails the gate: nothing decided it
    ALLOWED_UNDECIDED: "➖ allowed undecided",  # the mode cannot decide it, or the user allowed it
    NOT_APPLICABLE: "⚪ not applicable",
    NOT_RUN: "—",
}


class RunInfo(TypedDict, total=False):
    """Where and how fast a run went: never in the document (it changes on every run); stdout,
    `--json` and the step summary carry it. The rebuild writes the keys down to `timings_s`
    (`torch` and `cupy` when loaded), a capture `capture` and `pids`."""

    backend: str
    picked: str  # the device as the backend names it
    host: str
    python: str
    platform: str
    numpy: str
    torch: str
    cupy: str
    timings_s: dict[str, float]
    capture: str  # the capture folder
    pids: dict[str, int]  # section -> process id


class CaptureSection(TypedDict):
    """One audited process of a capture, as the capture document and `--json` show it."""

    section: str  # "process 1"
    launches: int
    gemms: int
    steps: int
    sites: int
    layout: str  # "file" or "inferred": what named the pointers
    layout_note: str  # why the layout file was not used for it, if it was not
    mode: str  # "capture" or "capture --deep" (invariants/undecided.py): what it can decide
    naming: list[NamedBuffer]
    gemms_not_judged: list[str]  # GEMMs with operands no buffer name covers


class _Verdicts:
    """What every report answers from its results, the rebuild's and the capture's alike."""

    results: tuple[Result, ...]
    invariants: tuple[Invariant, ...]

    def result(self, code: str, mode: str) -> Result | None:
        for r in self.results:
            if r.code == code and r.mode == mode:
                return r
        return None

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.verdict.status == FAIL]

    @property
    def warnings(self) -> list[Result]:
        return [r for r in self.results if r.verdict.status == WARN]

    @property
    def undecided(self) -> list[Result]:
        return [r for r in self.results if r.verdict.status == UNDECIDED]

    def allowed_in(self, mode: str) -> frozenset[str]:
        """The codes that may stay UNDECIDED in `mode`: none in the rebuild, which decides
        every invariant (invariants/undecided.py)."""
        return frozenset()

    def shown_status(self, r: Result) -> str:
        """The status every output shows: the verdict's, ALLOWED_UNDECIDED for an allowed
        UNDECIDED one (never shown as held)."""
        allowed = r.verdict.status == UNDECIDED and r.code in self.allowed_in(r.mode)
        return ALLOWED_UNDECIDED if allowed else r.verdict.status

    @property
    def undecided_allowed(self) -> list[Result]:
        return [r for r in self.results if self.shown_status(r) == ALLOWED_UNDECIDED]

    @property
    def undecided_failing(self) -> list[Result]:
        """UNDECIDED and not allowed: each fails the gate."""
        return [r for r in self.results if self.shown_status(r) == UNDECIDED]

    @property
    def not_applicable(self) -> list[Result]:
        return [r for r in self.results if r.verdict.status == NOT_APPLICABLE]

    @property
    def ok(self) -> bool:
        """Every invariant holds or is allowed undecided; a warning counts as holding. (The
        gate adds the rest: the cuBLAS witness, a stale document, what makes a capture
        incomplete.)"""
        return not self.failures and not self.undecided_failing

    def invariant(self, code: str) -> Invariant | None:
        return next((inv for inv in self.invariants if inv.code == code), None)


@dataclass(frozen=True)
class AuditReport(_Verdicts):
    config: ConfigView  # egf_audit.pipeline.config.Config, read through its protocol
    modes: tuple[str, ...]
    steps: int
    invariants: tuple[Invariant, ...]  # the registry the verdicts came from, in code order
    results: tuple[Result, ...]
    kernels: KernelSet
    command: str  # reproduces the document; never names the device
    version: str
    environment: dict[str, Any] = field(default_factory=dict)  # what differs between backends
    # host, versions, timings: never in the document, so re-running on an unchanged tree leaves it
    # byte for byte the same
    run_info: RunInfo = field(default_factory=lambda: RunInfo())
    run: AuditRun | None = None  # the traces; None in reports built without them
    witness: WitnessDict | None = None  # the cuBLAS witness (--cublas-log), device-dependent

    @property
    def witness_ok(self) -> bool:
        return self.witness is None or bool(self.witness["ok"])

    def combined_status(self, codes: tuple[str, ...]) -> str:
        """One status over several invariants and every mode run: fail beats warn beats pass;
        NOT_RUN when any of them has no verdict (a registry without that code)."""
        statuses = []
        for code in codes:
            found = [r.verdict.status for r in self.results if r.code == code]
            if not found:
                return NOT_RUN
            statuses += found
        for status in (FAIL, WARN):
            if status in statuses:
                return status
        return PASS

    def problems(self) -> list[str]:
        """What fails the gate beyond the verdicts: nothing, for the rebuild."""
        return []


@dataclass(frozen=True)
class CaptureReport(_Verdicts):
    """What `run --capture` renders: the verdicts of every audited process of one capture, in
    the rebuild's `Result` type, one section ("process 1", ...) where the rebuild has a mode.
    Nothing here names a process id or an address: two captures of the same code give the
    same document."""

    invariants: tuple[Invariant, ...]
    modes: tuple[str, ...]  # the audited processes' sections
    results: tuple[Result, ...]
    sections: tuple[CaptureSection, ...]  # per section: launches, sites, layout, naming, GEMMs
    incomplete: tuple[str, ...] = ()  # what makes the capture incomplete: fails the gate
    missing: tuple[str, ...] = ()  # no process is an SP14 trainer: fails the gate
    not_audited: tuple[str, ...] = ()  # processes with no ABI launch
    # section -> the codes that may stay UNDECIDED there (its mode's default and the user's)
    allowed: dict[str, frozenset[str]] = field(default_factory=dict)
    allowed_given: frozenset[str] = frozenset()  # what --allow-undecided / the table added
    trainer: str = "sp14"  # "generic": a program that is no SP14 trainer by design
    command: str = "egf-audit run --capture DIR"
    version: str = ""
    run_info: RunInfo = field(default_factory=lambda: RunInfo())  # the folder, pids: not in the doc
    witness: WitnessDict | None = None  # a capture has no cuBLAS witness
    kernels: KernelSet | None = None  # the trainer's sources are not read by a capture

    @property
    def witness_ok(self) -> bool:
        return True

    def allowed_in(self, mode: str) -> frozenset[str]:
        return self.allowed.get(mode, frozenset())

    def section(self, mode: str) -> CaptureSection | None:
        return next((s for s in self.sections if s["section"] == mode), None)

    def why_allowed(self, r: Result) -> str:
        """Why an allowed UNDECIDED verdict may stay undecided, in words."""
        section = self.section(r.mode)
        mode = section["mode"] if section else CAPTURE
        return why_allowed(r.code, mode, self.allowed_given) or "allowed"

    def problems(self) -> list[str]:
        return [*self.missing, *self.incomplete]


def verdict_line(report: AuditReport | CaptureReport) -> str:
    """The overall verdict in one device-independent sentence."""
    if isinstance(report, CaptureReport):
        return _capture_line(report)
    modes = " and ".join(report.modes)
    if report.ok:
        line = f"PASS: all {len(report.invariants)} invariants hold in {modes}"
        if report.warnings:
            codes = ", ".join(sorted({r.code for r in report.warnings}))
            line += f" (warning, not a failure: {codes})"
        return line
    failed = [f"{r.code}[{r.mode}]" for r in report.failures]
    line = f"FAIL: {len(failed)} of {len(report.results)} verdicts failed: " + ", ".join(failed)
    return line + _undecided_part(report)


def _undecided_part(report: AuditReport | CaptureReport) -> str:
    """ "; N undecided and not allowed: CODE[mode], ..." where any is, else ""."""
    failing = [f"{r.code}[{r.mode}]" for r in report.undecided_failing]
    return f"; {len(failing)} undecided and not allowed: {', '.join(failing)}" if failing else ""


def _who(report: CaptureReport) -> str:
    """A generic program where the SP14 invariants did not apply; an SP14 process audited
    under --trainer generic is still judged, and named, as a trainer."""
    generic = report.trainer == "generic" and bool(report.not_applicable)
    return "generic program" if generic else "trainer process"


def _capture_line(report: CaptureReport) -> str:
    problems = report.problems()
    if report.missing:
        return _no_trainer_line(report)
    if problems or report.failures or report.undecided_failing:
        parts = []
        if report.failures:
            failed = ", ".join(f"{r.code}[{r.mode}]" for r in report.failures)
            parts.append(
                f"{len(report.failures)} of {len(report.results)} verdicts failed: {failed}"
            )
        if report.undecided_failing:
            parts.append(_undecided_part(report).removeprefix("; "))
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            parts.append(f"{problems[0]}{more}")
        return f"FAIL: {_who(report)}: " + "; ".join(parts)
    held = sum(r.verdict.status in (PASS, WARN) for r in report.results)
    held_words = "1 verdict holds" if held == 1 else f"{held} verdicts hold"
    line = f"PASS: {_who(report)}: {held_words} in {' and '.join(report.modes)}"
    if allowed := report.undecided_allowed:
        codes = ", ".join(sorted({r.code for r in allowed}))
        line += f"; {len(allowed)} allowed undecided ({codes})"
    if report.not_applicable:
        line += f"; {len(report.not_applicable)} not applicable (SP14 invariants)"
    return line


def _no_trainer_line(report: CaptureReport) -> str:
    """A capture in which no process is an SP14 trainer: that is the verdict, and the count is
    of the verdicts such a process can get (those that need no SP14 name), never of all 13,
    most of which are not applicable to it."""
    generic = [r for r in report.results if (inv := report.invariant(r.code)) and inv.any_process]
    failed = [f"{r.code}[{r.mode}]" for r in generic if r.verdict.status == FAIL]
    undecided = sorted({r.code for r in generic if r.verdict.status == UNDECIDED})
    held = len(generic) - len(failed) - sum(r.verdict.status == UNDECIDED for r in generic)
    problems = report.problems()
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    line = f"FAIL: {problems[0]}{more}; of the {len(generic)} verdicts that need no SP14 name, "
    if failed:
        return line + f"{len(failed)} failed: {', '.join(failed)}"
    line += f"{held} hold{'s' * (held == 1)}"
    if undecided:
        count = len(generic) - held
        line += f" and {count} cannot be decided from this capture ({', '.join(undecided)})"
    return line


@dataclass(frozen=True)
class Gate:
    """The one verdict of a run over everything that decides its exit code: the invariants,
    the cuBLAS witness and, with --check, whether the committed document is current. Every
    output (stdout's last line, JSON, JUnit, annotations, step summary) says this same verdict."""

    report: AuditReport | CaptureReport
    document: str  # the document's path, relative to the repository root
    checked: bool = False  # --check compared the committed document
    stale: bool = False
    stale_reason: str = ""  # "differs from the regenerated audit", "does not exist"
    diff: tuple[str, ...] = ()  # the stale part, unified diff lines
    stale_line: int | None = None  # the committed file's first line that differs
    sanitizer_failures: tuple[str, ...] = ()  # --sanitize: findings that fail the gate

    @property
    def ok(self) -> bool:
        return (
            self.report.ok
            and self.report.witness_ok
            and not self.stale
            and not self.sanitizer_failures
            and not self.report.problems()
        )

    def undecided_reasons(self) -> list[str]:
        """Why each UNDECIDED verdict that is not allowed fails the gate, in the order of
        `report.undecided_failing`."""
        report = self.report
        return [
            undecided_reason(r, section["layout"] if section else None)
            for r in report.undecided_failing
            for section in [report.section(r.mode) if isinstance(report, CaptureReport) else None]
        ]

    def reasons(self) -> list[str]:
        """Why the gate fails, one sentence each; [] when it passes."""
        out = list(self.report.problems())
        out += [f"{r.code}[{r.mode}] failed: {r.verdict.summary}" for r in self.report.failures]
        out += self.undecided_reasons()
        if not self.report.witness_ok:
            out.append("the cuBLAS witness disagrees with the recorded SGEMMs")
        if self.stale:
            out.append(f"{self.document} is STALE: it {self.stale_reason}")
        out += list(self.sanitizer_failures)
        return out

    def line(self) -> str:
        """The last line of stdout: PASS or FAIL first, STALE named when it is."""
        invariants = verdict_line(self.report)
        if not self.report.ok or self.report.problems():
            return invariants + (f"; {self.document} is also STALE" if self.stale else "")
        if self.stale:
            return f"FAIL: {self.document} is STALE ({invariants.removeprefix('PASS: ')})"
        if not self.report.witness_ok:
            return f"FAIL: the cuBLAS witness disagrees ({invariants.removeprefix('PASS: ')})"
        if self.sanitizer_failures:
            return (
                f"FAIL: compute-sanitizer reported {len(self.sanitizer_failures)} finding(s) "
                f"({invariants.removeprefix('PASS: ')})"
            )
        return invariants
