"""`egf-audit mutants`: the audit once per fault, and the kill matrix (fault x invariant).

The run fails when a fault survives (no invariant fails on it), when an invariant the fault's
catalogue entry expects to catch it does not (`Fault.expected`), or when an invariant is the
catcher of no fault (an invariant that never fails proves nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.invariants import FAIL, INVARIANTS, evaluate
from egf_audit.pipeline.config import Config
from egf_audit.runtime.backends import select_backend
from egf_audit.runtime.kernel_sources import KernelSet
from egf_audit.scenarios.audit import Auditor
from egf_audit.scenarios.faults import FAULTS, FAULTS_BY_NAME, Fault


@dataclass(frozen=True)
class FaultResult:
    name: str
    summary: str
    caught_by: tuple[str, ...]  # codes that failed in any mode
    applicable: bool = True  # False: a kernel patch whose target code was replaced (--kernels)
    note: str = ""
    expected: tuple[str, ...] = ()  # the catalogue's Fault.expected

    @property
    def survived(self) -> bool:
        return self.applicable and not self.caught_by

    @property
    def missed(self) -> tuple[str, ...]:
        """Expected catchers that did not fail on the fault."""
        if not self.applicable:
            return ()
        return tuple(c for c in self.expected if c not in self.caught_by)


@dataclass
class MutantsResult:
    backend: str
    faults: list[FaultResult] = field(default_factory=list)
    codes: tuple[str, ...] = tuple(inv.code for inv in INVARIANTS)

    @property
    def survivors(self) -> list[str]:
        return [f.name for f in self.faults if f.survived]

    @property
    def idle_invariants(self) -> list[str]:
        """Codes that caught no fault (only meaningful when every fault ran)."""
        caught = {c for f in self.faults for c in f.caught_by}
        return [c for c in self.codes if c not in caught]

    @property
    def missed(self) -> dict[str, tuple[str, ...]]:
        return {f.name: f.missed for f in self.faults if f.missed}

    def ok(self, all_faults: bool) -> bool:
        return (
            not self.survivors and not self.missed and (not all_faults or not self.idle_invariants)
        )

    def as_dict(self) -> dict:
        return {
            "backend": self.backend,
            "invariants": list(self.codes),
            "faults": [
                {
                    "name": f.name,
                    "summary": f.summary,
                    "caught_by": list(f.caught_by),
                    "expected": list(f.expected),
                    "applicable": f.applicable,
                    "note": f.note,
                }
                for f in self.faults
            ],
            "survivors": self.survivors,
            "idle_invariants": self.idle_invariants,
            "missed": {name: list(codes) for name, codes in self.missed.items()},
        }


def select_faults(only: list[str] | None) -> list[Fault]:
    if not only:
        return list(FAULTS)
    unknown = [n for n in only if n not in FAULTS_BY_NAME]
    if unknown:
        raise UsageError(
            f"unknown fault {unknown[0]!r} (`egf-audit mutants --list` names every fault)"
        )
    return [FAULTS_BY_NAME[n] for n in only]


def run_mutants(
    config: Config,
    device: str,
    kernels: KernelSet,
    faults: list[Fault],
    steps: int = 2,
    modes: tuple[str, ...] = ("sentinel", "live"),
    progress: Callable[[str], None] | None = None,
    launch_timeout_s: float | None = None,
) -> MutantsResult:
    say = progress or (lambda _m: None)
    clean_backend = select_backend(device, kernels, launch_timeout_s)
    result = MutantsResult(backend=clean_backend.name)
    for fault in faults:
        say(f"fault {fault.name}")
        try:
            faulty_kernels = fault.apply_kernels(kernels)
        except AuditEnvironmentError as exc:
            result.faults.append(
                FaultResult(fault.name, fault.summary, (), False, str(exc), fault.expected)
            )
            continue
        backend = (
            select_backend(device, faulty_kernels, launch_timeout_s)
            if fault.patch
            else clean_backend
        )
        run = Auditor(config, backend, fault.wiring, steps=steps).run(modes)
        caught = tuple(sorted({r.code for r in evaluate(run) if r.verdict.status == FAIL}))
        result.faults.append(
            FaultResult(fault.name, fault.summary, caught, expected=fault.expected)
        )
    return result
