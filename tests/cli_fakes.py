"""Stand-ins for the CLI tests: the session's recorded audit instead of a new one, and the real
invariant registry with constant verdicts the test picks (the `fake` fixture in conftest.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from typer.testing import CliRunner

from egf_audit import invariants
from egf_audit.cli.app import app
from egf_audit.invariants.registry import PASS, Verdict
from egf_audit.scenarios import mutants as mutants_module
from egf_audit.scenarios.mutants import FaultResult, MutantsResult
from egf_audit.trace.audit_run import AuditRun

REAL_INVARIANTS = invariants.INVARIANTS
CODES = [inv.code for inv in REAL_INVARIANTS]
DOC = Path("docs/dqn-wire-up-audit.md")


def invoke(*args: object, env: dict[str, str] | None = None):
    """`egf-audit ARGS` in this process (click's runner: stdout and stderr kept apart)."""
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def fake_registry(statuses: dict[str, str] | None = None, summary: str = "fake verdict"):
    """The real entries (codes, slugs, texts) with a constant check."""
    statuses = statuses or {}

    def constant(status: str):
        def check(run, mode):
            return Verdict(status, f"{summary}: {status}", {"measured": 0.5, "mode": mode})

        return check

    return tuple(
        dataclasses.replace(inv, check=constant(statuses.get(inv.code, PASS)))
        for inv in REAL_INVARIANTS
    )


class RecordedAuditor:
    """Stands in for Auditor: hands back the session's recorded run instead of re-running."""

    def __init__(self, recorded: AuditRun):
        self.recorded = recorded

    def __call__(self, config, backend, steps=2, progress=None) -> RecordedAuditor:
        return self

    def run(self, modes: tuple[str, ...]) -> AuditRun:
        return dataclasses.replace(self.recorded, modes=tuple(modes))


def fake_mutants(monkeypatch, caught: dict[str, tuple[str, ...]]) -> None:
    """`mutants` without running any: each fault caught by `caught[name]` (default EGF001)."""

    def run_mutants(
        config,
        device,
        kernels,
        faults,
        steps=2,
        modes=("sentinel", "live"),
        progress=None,
        launch_timeout_s=None,
    ):
        result = MutantsResult(backend="cpu", codes=tuple(CODES))
        for f in faults:
            result.faults.append(FaultResult(f.name, f.summary, caught.get(f.name, ("EGF001",))))
        return result

    monkeypatch.setattr(mutants_module, "run_mutants", run_mutants)
