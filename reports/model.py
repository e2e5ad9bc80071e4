"""What every report renders: one finished audit, its verdicts, and where it ran.

Everything here except `environment` (and the numbers in each verdict's evidence) must be the
same on every backend; the renderers keep the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from egf_audit.invariants.registry import FAIL, PASS, WARN

if TYPE_CHECKING:
    from egf_audit.invariants import Result
    from egf_audit.invariants.registry import Invariant
    from egf_audit.runtime.audit_run import AuditRun
    from egf_audit.runtime.kernel_sources import KernelSet

NOT_RUN = "not run"
STATUS_LABEL = {PASS: "✅ pass", FAIL: "❌ fail", WARN: "⚠️ warn", NOT_RUN: "—"}


@dataclass(frozen=True)
class AuditReport:
    config: Any  # egf_audit.pipeline.config.Config: read, never imported
    modes: tuple[str, ...]
    steps: int
    invariants: tuple[Invariant, ...]  # the registry the verdicts came from, in code order
    results: tuple[Result, ...]
    kernels: KernelSet
    command: str  # reproduces the document; never names the device
    version: str
    environment: dict[str, Any] = field(default_factory=dict)  # what differs between backends
    run_info: dict[str, Any] = field(default_factory=dict)  # host, versions, timings: never in
    # the document, so re-running on an unchanged tree leaves it byte for byte the same
    run: AuditRun | None = None  # the traces; None in reports built without them
    witness: dict[str, Any] | None = None  # the cuBLAS witness (--cublas-log), device-dependent

    @property
    def witness_ok(self) -> bool:
        return self.witness is None or bool(self.witness["ok"])

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
    def ok(self) -> bool:
        """Every invariant holds; a warning counts as holding. (The cuBLAS witness decides the
        exit code on its own: see runner.run_audit.)"""
        return not self.failures

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

    def invariant(self, code: str) -> Invariant | None:
        return next((inv for inv in self.invariants if inv.code == code), None)


def verdict_line(report: AuditReport) -> str:
    """The overall verdict in one device-independent sentence."""
    modes = " and ".join(report.modes)
    if report.ok:
        line = f"PASS: all {len(report.invariants)} invariants hold in {modes}"
        if report.warnings:
            codes = ", ".join(sorted({r.code for r in report.warnings}))
            line += f" (warning, not a failure: {codes})"
        return line
    failed = [f"{r.code}[{r.mode}]" for r in report.failures]
    return f"FAIL: {len(failed)} of {len(report.results)} verdicts failed: " + ", ".join(failed)


@dataclass(frozen=True)
class Gate:
    """The one verdict of a run over everything that decides its exit code: the invariants,
    the cuBLAS witness and, with --check, whether the committed document is current. Every
    output (stdout's last line, JSON, JUnit, annotations, step summary) says this same verdict."""

    report: AuditReport
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
        )

    def reasons(self) -> list[str]:
        """Why the gate fails, one sentence each; [] when it passes."""
        out = [f"{r.code}[{r.mode}] failed: {r.verdict.summary}" for r in self.report.failures]
        if not self.report.witness_ok:
            out.append("the cuBLAS witness disagrees with the recorded SGEMMs")
        if self.stale:
            out.append(f"{self.document} is STALE: it {self.stale_reason}")
        out += list(self.sanitizer_failures)
        return out

    def line(self) -> str:
        """The last line of stdout: PASS or FAIL first, STALE named when it is."""
        invariants = verdict_line(self.report)
        if not self.report.ok:
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
