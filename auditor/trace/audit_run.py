"""What a finished audit hands to the invariants: the scenarios that ran and their traces.

The scenarios themselves are built and run by egf_audit.scenarios; this is only the record of
them, so the invariants and the reports can read it without importing the code that ran it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egf_audit.trace.config_view import ConfigView
from egf_audit.trace.model import Trace


@dataclass(frozen=True)
class Scenario:
    name: str
    mode: str | None  # "sentinel", "live", or None for mode-independent diagnostics
    kind: str  # "production", "replay", "diagnostic", "probe"
    force_alpha: float | None = None
    skip_scale: bool = False
    inject_nonfinite: bool = False


@dataclass
class AuditRun:
    """Everything an invariant may read."""

    config: ConfigView  # egf_audit.pipeline.config.Config, read through its protocol
    modes: tuple[str, ...]
    steps: int
    traces: dict[str, Trace] = field(default_factory=dict)
    scenarios: dict[str, Scenario] = field(default_factory=dict)

    def production(self, mode: str) -> Trace:
        return self.traces[mode]

    def for_mode(self, mode: str, kind: str | None = None) -> list[tuple[Scenario, Trace]]:
        return [
            (s, self.traces[s.name])
            for s in self.scenarios.values()
            if s.mode == mode and (kind is None or s.kind == kind)
        ]

    def of_kind(self, kind: str) -> list[tuple[Scenario, Trace]]:
        return [(s, self.traces[s.name]) for s in self.scenarios.values() if s.kind == kind]
