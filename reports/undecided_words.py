"""The words of an UNDECIDED verdict that fails the gate (invariants/undecided.py), one line each,
the same in every output (the gate's reasons: stdout, JSON, JUnit, annotations, step summary).

EGF001 gets a line of its own: the GEMMs it could not judge are named (a few, then how many
more), with what decides them: a layout file where the names were inferred, the layout file's
names where it left their buffers out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from egf_audit.invariants import Result

ALLOWED_UNDECIDED = "allowed undecided"  # the shown status of an allowed UNDECIDED verdict
GEMMS_NAMED = 3  # EGF001's line names this many GEMMs, then "and N more"


def _gemm(facts: dict[str, Any]) -> str:
    return f"launch {facts.get('launch')} (step {facts.get('step')}, {facts.get('label')})"


def undecided_reason(r: Result, layout: str | None) -> str:
    """Why an UNDECIDED verdict fails the gate. `layout`: what named the section's pointers
    ("file" or "inferred"; None in the rebuild)."""
    at = f"{r.code}[{r.mode}]"
    evidence = r.verdict.evidence
    gemms = evidence.get("undecided_gemms")
    if r.code == "EGF001" and isinstance(gemms, list) and gemms:
        total = int(evidence.get("undecided_total", len(gemms)))
        named = ", ".join(_gemm(g) for g in gemms[:GEMMS_NAMED] if isinstance(g, dict))
        more = f" and {total - GEMMS_NAMED} more" if total > GEMMS_NAMED else ""
        if layout == "inferred":
            how = "by inference (no layout file)"
            decides = "a layout file naming the trainer's buffers decides them (docs/capture.md)"
        else:
            how = "with the layout file"
            decides = "naming their buffers in the layout file decides them (docs/capture.md)"
        return (
            f"{at} is undecided {how}, which fails the gate: {total} GEMMs could not be judged: "
            f"{named}{more}; {decides}"
        )
    return (
        f"{at} is undecided, which fails the gate: {r.verdict.summary} (where that is "
        f"intended, allow it with --allow-undecided {r.code}; docs/ci-gate.md)"
    )
