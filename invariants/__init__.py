"""The invariant registry: one flat list, in code order. Tests parametrize over it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .egf001 import INVARIANT as EGF001
from .egf002 import INVARIANT as EGF002
from .egf003 import INVARIANT as EGF003
from .egf004 import INVARIANT as EGF004
from .egf005 import INVARIANT as EGF005
from .egf006 import INVARIANT as EGF006
from .egf007 import INVARIANT as EGF007
from .egf008 import INVARIANT as EGF008
from .egf009 import INVARIANT as EGF009
from .egf010 import INVARIANT as EGF010
from .egf011 import INVARIANT as EGF011
from .egf012 import INVARIANT as EGF012
from .registry import FAIL, PASS, WARN, Invariant, Verdict

if TYPE_CHECKING:
    from egf_audit.audit import AuditRun

INVARIANTS: tuple[Invariant, ...] = (
    EGF001,
    EGF002,
    EGF003,
    EGF004,
    EGF005,
    EGF006,
    EGF007,
    EGF008,
    EGF009,
    EGF010,
    EGF011,
    EGF012,
)
INVARIANTS_BY_CODE = {inv.code: inv for inv in INVARIANTS}


class CheckCrashed(RuntimeError):
    """An invariant's check raised: a bug in egf-audit itself (exit 3), never a verdict."""


@dataclass(frozen=True)
class Result:
    code: str
    mode: str
    verdict: Verdict


def evaluate(run: AuditRun, codes: tuple[str, ...] | None = None) -> list[Result]:
    """Every invariant (or those in `codes`) for every mode of the run, in code order."""
    results = []
    for inv in INVARIANTS:
        if codes is not None and inv.code not in codes:
            continue
        for mode in run.modes:
            try:
                verdict = inv.check(run, mode)
            except Exception as exc:
                raise CheckCrashed(
                    f"{inv.code} ({mode}) crashed: {type(exc).__name__}: {exc}"
                ) from exc
            results.append(Result(inv.code, mode, verdict))
    return results


__all__ = [
    "FAIL",
    "INVARIANTS",
    "INVARIANTS_BY_CODE",
    "PASS",
    "WARN",
    "CheckCrashed",
    "Invariant",
    "Result",
    "Verdict",
    "evaluate",
]
