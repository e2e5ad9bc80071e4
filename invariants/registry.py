"""The invariant entry and its verdict. Each invariant is one small frozen entry of the flat
`INVARIANTS` list (invariants/__init__.py): a stable code, a slug, a one-line message, the doc
text that `egf-audit explain`, the audit document and the JUnit failure all print, and a check.

A check is a pure function of the finished `AuditRun` (traces, snapshots, config) and a mode.
It never learns which fault, if any, is active.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from egf_audit.audit import AuditRun

PASS, FAIL, WARN = "pass", "fail", "warn"


@dataclass(frozen=True)
class Verdict:
    """`summary` is printed outside the document's environment block, so it must be the same
    on every backend: counts, shapes, labels and bitwise facts, never a measured float.
    Measured values (max errors, ulps, magnitudes) go into `evidence`, which the document
    prints inside the environment block and `--json` exports whole."""

    status: str  # PASS, FAIL or WARN (EGF011 only)
    summary: str  # one line, device-independent (see above)
    evidence: dict[str, Any] = field(default_factory=dict)  # JSON-serialisable numbers/strings

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass(frozen=True)
class Invariant:
    code: str  # "EGF001"
    slug: str  # "gemm-k-matches-lda"
    message: str  # one line, shown when it fails
    what: str  # What it proves
    why: str  # Why it matters
    how: str  # How it is measured
    catches: str  # The bug it catches
    example: str  # a concrete failing wiring, as the seed would describe it
    check: Callable[[AuditRun, str], Verdict]

    def doc(self) -> str:
        """The whole text, as `egf-audit explain CODE` prints it."""
        return (
            f"{self.code} {self.slug}\n\n{self.message}\n\n"
            f"## What it proves\n{self.what}\n\n## Why it matters\n{self.why}\n\n"
            f"## How it is measured\n{self.how}\n\n## Bug it catches\n{self.catches}\n\n"
            f"## Example\n{self.example}\n"
        )


def passed(summary: str, **evidence: Any) -> Verdict:
    return Verdict(PASS, summary, evidence)


def failed(summary: str, **evidence: Any) -> Verdict:
    return Verdict(FAIL, summary, evidence)


def warned(summary: str, **evidence: Any) -> Verdict:
    return Verdict(WARN, summary, evidence)
