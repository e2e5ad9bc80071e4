"""`egf-audit bench --profile`, the audit's half: where one audit's own time goes, measured on the
command a pull request runs, `egf-audit run`, each time in a fresh process.

On the `prod` preset on CUDA and `ci` on the CPU (the presets whose bounds the targets set), in
an empty folder (--isolated: no settings table applies), after one priming run that fills the
kernel caches:

1. AUDIT_RUNS plain runs: the median wall time, the median of each phase the run reports in its
   JSON (config, kernels, backend, scenarios, invariants; the rest is Python's start-up, the
   imports, the document and the outputs) and each invariant's median from its JUnit XML;
2. one run with runtime/costs.py's collector (COSTS_VARIABLE): each scenario's span, and each
   kind of work of the instrumented launches (the launches themselves, shadow copies, stray-write
   comparisons, guard scans, snapshots, read-backs) timed apart between device
   synchronisations. The synchronisations stop queued work from overlapping: these figures add
   up to more than the plain run's scenarios, and say where the work is, not what it costs there.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from egf_audit.bench.report import Unavailable
from egf_audit.errors import one_line
from egf_audit.runtime.costs import COSTS_VARIABLE

AUDIT_PRESET = {"cuda": "prod", "cpu": "ci"}
AUDIT_RUNS = 5
# "torch": what is left of torch's import and CUDA warm-up when the scenarios end (they run
# beside the backend and the scenarios: cli/beside.py); absent from runs made before it
PHASES = ("config", "kernels", "backend", "scenarios", "torch", "invariants")
REST = "start-up, imports, document, outputs"


@dataclass
class AuditProfile:
    device: str
    preset: str
    argv: list[str]
    seconds: list[float]  # wall time of each plain run
    phases: dict[str, list[float]]  # per phase, its seconds in each plain run
    invariants: dict[str, list[float]]  # per invariant (every mode), its seconds in each run
    profiled: dict[str, Any] = field(default_factory=dict)  # the collector's JSON

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    def phase_s(self, name: str) -> float | None:
        values = self.phases.get(name)
        return statistics.median(values) if values else None

    @property
    def phases_s(self) -> float:
        """The audit's own work as the run times it (its JSON's phases), each phase's median
        summed: the whole command less Python's start-up, the imports, the document and the
        outputs."""
        return sum(self.phase_s(p) or 0.0 for p in PHASES)

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "preset": self.preset,
            "argv": self.argv,
            "median_s": self.median_s,
            "phases_sum_s": self.phases_s,
            "seconds": self.seconds,
            "phases_median_s": {p: self.phase_s(p) for p in self.phases},
            "phases_s": self.phases,
            "invariants_median_s": {k: statistics.median(v) for k, v in self.invariants.items()},
            "profiled": self.profiled,
        }


def _junit_seconds(path: Path) -> dict[str, float]:
    """Each invariant's time over its modes, from the run's JUnit XML (`EGF001[sentinel]`)."""
    out: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        code = case.get("name", "").split("[", 1)[0]
        out[code] = out.get(code, 0.0) + float(case.get("time", "0"))
    return out


def profile_audit(
    device: str, runs: int = AUDIT_RUNS, kernels_dir: str | os.PathLike | None = None
) -> AuditProfile | Unavailable:
    preset = AUDIT_PRESET[device]
    argv = ["egf-audit", "run", "--device", device, "--preset", preset, "--isolated", "--quiet"]
    argv += ["--out", "audit.md", "--json", "audit.json", "--junit", "audit.xml"]
    argv += ["--kernels", str(Path(kernels_dir).resolve())] if kernels_dir else []
    with tempfile.TemporaryDirectory(prefix="egf-audit-bench-") as folder:
        here = Path(folder)
        profile = AuditProfile(device, preset, argv, [], {p: [] for p in PHASES}, {})
        # the priming run, the plain runs, then the profiled one
        for i in range(runs + 2):
            env = {**os.environ, "NO_COLOR": "1"}
            env.pop(COSTS_VARIABLE, None)
            if i == runs + 1:
                env[COSTS_VARIABLE] = str(here / "costs.json")
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "egf_audit", *argv[1:]],
                cwd=here,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            wall = time.perf_counter() - start
            if done.returncode not in (0, 1):  # 1: an invariant failed, still a whole audit
                why = (done.stderr.strip().splitlines() or ["no output"])[-1]
                return Unavailable(f"`{' '.join(argv)}` exited {done.returncode}: {one_line(why)}")
            if i == runs + 1:
                profile.profiled = json.loads((here / "costs.json").read_text())
            elif i > 0:
                profile.seconds.append(wall)
                timings = json.loads((here / "audit.json").read_text())["run"]["timings_s"]
                for p in PHASES:
                    if p in timings:
                        profile.phases[p].append(float(timings[p]))
                for code, s in _junit_seconds(here / "audit.xml").items():
                    profile.invariants.setdefault(code, []).append(s)
        return profile


# ---- rendering ----


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "—"


def tables(p: AuditProfile) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows): the command by phase, its invariants, and the profiled run's
    scenarios and kinds of work."""
    command = " ".join(p.argv)
    rows = [[n, _s(p.phase_s(n)), _share(p.phase_s(n) or 0.0, p.median_s)] for n in PHASES
            if p.phase_s(n) is not None]  # fmt: skip
    rest = p.median_s - p.phases_s
    rows += [["the audit's phases together", _s(p.phases_s), _share(p.phases_s, p.median_s)]]
    rows += [[REST, _s(rest), _share(rest, p.median_s)], ["whole command", _s(p.median_s), ""]]
    out = [
        (
            f"`{command}` on {p.device}: median of {len(p.seconds)} warm runs, each phase's median",
            ["phase", "seconds", "share"],
            rows,
        )
    ]
    medians = {k: statistics.median(v) for k, v in p.invariants.items()}
    total = sum(medians.values())
    out.append(
        (
            f"Its invariants phase by invariant (every mode; medians, {total:.3f} s together)",
            ["invariant", "seconds", "share"],
            [[k, _s(v), _share(v, total)] for k, v in medians.items()],
        )
    )
    scenarios = p.profiled.get("scenarios", {})
    total = sum(scenarios.values())
    out.append(
        (
            f"One more run, profiled: its scenarios ({total:.3f} s together; every kind of work "
            "timed apart between synchronisations)",
            ["scenario", "seconds", "share"],
            [[k, _s(v), _share(v, total)] for k, v in scenarios.items()],
        )
    )
    seconds, counts = p.profiled.get("seconds", {}), p.profiled.get("counts", {})
    out.append(
        (
            "The profiled run's instrumented launches by kind of work",
            ["kind of work", "count", "seconds", "share"],
            [[k, str(counts.get(k, 0)), _s(v), _share(v, total)] for k, v in seconds.items()],
        )
    )
    return out


def rich_tables(profile: AuditProfile | Unavailable | None) -> list[Table]:
    if profile is None:
        return []
    if isinstance(profile, Unavailable):
        return [Table(title=f"audit profile unavailable: {profile.reason}")]
    out = []
    for title, headers, rows in tables(profile):
        table = Table(title=title, title_justify="left")
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        out.append(table)
    return out


def markdown(profile: AuditProfile | Unavailable | None) -> str:
    if profile is None:
        return ""
    lines = ["", "### Where an audit's time goes (`--profile`)", ""]
    if isinstance(profile, Unavailable):
        return "\n".join([*lines, f"Audit profile unavailable: {profile.reason}", ""])
    for title, headers, rows in tables(profile):
        lines += [title + ":", "", "| " + " | ".join(headers) + " |"]
        lines.append("| --- |" + " ---: |" * (len(headers) - 1))
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines.append("")
    return "\n".join(lines)
