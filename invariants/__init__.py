"""The invariant registry: one flat list, in code order. Tests parametrize over it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from egf_audit.invariants.egf001_gemm_k_matches_lda import INVARIANT as EGF001
from egf_audit.invariants.egf002_dw_unaffected_by_scale import INVARIANT as EGF002
from egf_audit.invariants.egf003_wire_zero_under_sentinel import INVARIANT as EGF003
from egf_audit.invariants.egf004_wire_gated_proportional import INVARIANT as EGF004
from egf_audit.invariants.egf005_target_net_untouched import INVARIANT as EGF005
from egf_audit.invariants.egf006_online_concat_rebuilt import INVARIANT as EGF006
from egf_audit.invariants.egf007_d_h_s2_accumulation import INVARIANT as EGF007
from egf_audit.invariants.egf008_both_call_sites_gated import INVARIANT as EGF008
from egf_audit.invariants.egf009_state_shapes_grown import INVARIANT as EGF009
from egf_audit.invariants.egf010_oracle_agreement import INVARIANT as EGF010
from egf_audit.invariants.egf011_wrapper_path_residual import INVARIANT as EGF011
from egf_audit.invariants.egf012_gate_range_fail_closed import INVARIANT as EGF012
from egf_audit.invariants.egf013_kernel_effects_contained import INVARIANT as EGF013
from egf_audit.invariants.registry import FAIL, PASS, WARN, Invariant, Verdict

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun

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
    EGF013,
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
                verdict = inv.verdict(run, mode)
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
