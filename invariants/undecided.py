"""Which UNDECIDED verdicts the gate lets pass. An invariant nothing decided is no proof that it
holds, so an UNDECIDED verdict fails the gate unless it is allowed: by default only what the
audit's mode structurally cannot decide (below), plus the codes the user names
(`run --capture DIR --allow-undecided CODE[,CODE]`, or `allow-undecided = [...]` in the
`[tool.egf-audit]` table). Every output lists an allowed one as "allowed undecided", never as
held. A NOT_APPLICABLE verdict (an SP14 invariant on a process that is no SP14 trainer) is
neither: it never fails the gate and never counts as held.

docs/capture.md's table of what is allowed undecided is tested against `STRUCTURALLY_UNDECIDED`
(tests/test_gate_undecided.py), so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable

from egf_audit.invariants.registry import UNDECIDED, Verdict

REBUILD, CAPTURE, DEEP_CAPTURE = "rebuild", "capture", "capture --deep"
# mode -> {code: why that mode cannot decide it}. The rebuild decides every invariant (it runs
# the step itself, with every snapshot and the oracle), and a deep capture records every
# allocation around every launch: both allow nothing by default.
STRUCTURALLY_UNDECIDED: dict[str, dict[str, str]] = {
    REBUILD: {},
    CAPTURE: {
        "EGF010": "the oracle needs each step's tensors whole at its checkpoints, which only a "
        "--deep capture's memory history keeps",
        "EGF013": "a launch's effects are seen only by comparing every allocation around it, "
        "which only --deep records",
    },
    DEEP_CAPTURE: {},
}


def capture_mode(deep: bool) -> str:
    """A capture's mode as the table names it: deep where --deep was asked for or recorded."""
    return DEEP_CAPTURE if deep else CAPTURE


def allowed_by_default(mode: str) -> frozenset[str]:
    return frozenset(STRUCTURALLY_UNDECIDED[mode])


def why_allowed(code: str, mode: str, given: Iterable[str]) -> str:
    """Why `code` may stay undecided in `mode`: the mode's structural reason, else the user's
    allowance; "" where it is not allowed."""
    if code in STRUCTURALLY_UNDECIDED[mode]:
        return f"a {mode} cannot decide it: {STRUCTURALLY_UNDECIDED[mode][code]}"
    if code in set(given):
        return "allowed by --allow-undecided (or allow-undecided in the settings table)"
    return ""


def not_allowed(verdicts: Iterable[tuple[str, Verdict]], allowed: frozenset[str]) -> list[str]:
    """The codes whose verdict is UNDECIDED and not allowed: each fails the gate."""
    return [code for code, v in verdicts if v.status == UNDECIDED and code not in allowed]
