"""What `egf-audit bench` measured, and its three renderings: a rich table, JSON, Markdown.

A measurement is a `Timing` (per-step samples in ms; the report uses the median), or
`Unavailable` with the reason (a graph capture that failed, torch without CUDA), or None where
it does not apply (no CUDA graph on the CPU). The targets are the H200 figures the benchmark
exists to check; each reports met / missed and by how much, or why it was not measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

SCHEMA = "egf-audit-bench/1"


@dataclass
class Timing:
    samples_ms: list[float]
    finite: bool = True  # the state after the timed steps holds no NaN/Inf
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    def as_dict(self) -> dict[str, Any]:
        return {
            "median_ms": self.median_ms,
            "min_ms": min(self.samples_ms),
            "max_ms": max(self.samples_ms),
            "samples_ms": self.samples_ms,
            "finite": self.finite,
            **self.extra,
        }


@dataclass
class Unavailable:
    reason: str  # one line, shown in the table
    detail: str = ""  # the traceback, kept in the JSON for debugging

    def as_dict(self) -> dict[str, Any]:
        return {"unavailable": self.reason, "detail": self.detail}


Measured = Timing | Unavailable | None


@dataclass
class Row:
    B: int
    plain: Timing
    instrumented: Timing
    torch_eager: Timing | Unavailable
    graph: Measured
    flops: int  # 2*m*n*k summed over every SGEMM of one pipeline step
    flops_by_phase: dict[str, int]

    def pipeline_basis(self) -> tuple[str, Timing]:
        """The pipeline time the achieved rate is taken from: the graph replay where measured
        (it shows what the GPU does without Python launch overhead), else the plain step."""
        if isinstance(self.graph, Timing):
            return "graph", self.graph
        return "plain", self.plain


@dataclass
class SgemmReference:
    m: int
    n: int
    k: int
    timing: Timing

    @property
    def tflops(self) -> float:
        return 2.0 * self.m * self.n * self.k / (self.timing.median_ms * 1e-3) / 1e12


@dataclass
class BenchReport:
    device: str  # backend name: "cuda" or "cpu"
    device_name: str
    command: str
    settings: dict[str, Any]
    environment: dict[str, Any]
    sgemm: SgemmReference
    rows: list[Row]
    profiles: list[Any] = field(default_factory=list)  # bench_profile.StepProfile or Unavailable
    audit: Any = None  # audit_profile.AuditProfile or Unavailable (--profile), else None


def ratio(a: Measured, b: Measured) -> float | None:
    if isinstance(a, Timing) and isinstance(b, Timing) and b.median_ms > 0:
        return a.median_ms / b.median_ms
    return None


@overload
def achieved_tflops(row: Row, timing: Timing) -> float: ...
@overload
def achieved_tflops(row: Row, timing: Measured) -> float | None: ...
def achieved_tflops(row: Row, timing: Measured) -> float | None:
    if not isinstance(timing, Timing):
        return None
    return row.flops / (timing.median_ms * 1e-3) / 1e12


# ---- targets ----


EVERY_B = 0  # a Target's B: judged at every batch size of the run, each its own entry


@dataclass(frozen=True)
class Target:
    key: str
    text: str
    B: int  # the batch size it is judged at, or EVERY_B
    bound: float
    kind: str  # "le": value <= bound; "ge": value >= bound
    unit: str
    value: Callable[[Row, SgemmReference], float | None]


def _sgemm_fraction(row: Row, sgemm: SgemmReference) -> float | None:
    rate = achieved_tflops(row, row.pipeline_basis()[1])
    return None if rate is None else rate / sgemm.tflops


TARGETS: tuple[Target, ...] = (
    Target(
        "plain_vs_torch", "plain step / torch eager", 4096, 1.0, "le", "×",
        lambda r, s: ratio(r.plain, r.torch_eager),
    ),
    Target(
        "graph_vs_torch", "graph replay / torch eager", 4096, 0.5, "le", "×",
        lambda r, s: ratio(r.graph, r.torch_eager),
    ),
    Target(
        "instrumented_vs_plain", "instrumented / plain", EVERY_B, 1.5, "le", "×",
        lambda r, s: ratio(r.instrumented, r.plain),
    ),
    Target(
        "sgemm_fraction", "achieved / large-SGEMM TFLOP/s", 65536, 0.5, "ge", "",
        _sgemm_fraction,
    ),
)  # fmt: skip


@dataclass(frozen=True)
class AuditTarget:
    """A bound on the audit's own time (`--profile`, bench/audit_profile.py), for one backend."""

    key: str
    text: str
    device: str
    preset: str
    bound: float
    kind: str
    unit: str
    value: Callable[[Any], float | None]  # of an audit_profile.AuditProfile


def _invariants_waited(profile: Any) -> float | None:
    """The invariants phase as the user waits for it: what was left of torch's import and
    warm-up when the scenarios ended (a run made before they moved beside the scenarios has no
    "torch" phase: its wait was inside the invariants phase) and the checks themselves."""
    invariants = profile.phase_s("invariants")
    return None if invariants is None else invariants + (profile.phase_s("torch") or 0.0)


AUDIT_TARGETS: tuple[AuditTarget, ...] = (
    # the whole command as the user waits for it: Python's start-up, the imports, the CUDA
    # context, the phases, the document and the outputs (the phases alone met 5 s while the
    # command took 9-10 s)
    AuditTarget(
        "audit_prod_cuda", "`egf-audit run --preset prod`, whole command (warm, median)",
        "cuda", "prod", 5.0, "le", " s", lambda p: p.median_s,
    ),
    AuditTarget(
        "audit_prod_invariants", "its invariants phase, the wait for torch included (median)",
        "cuda", "prod", 1.0, "le", " s", _invariants_waited,
    ),
    AuditTarget(
        "audit_ci_cpu", "`egf-audit run` (ci) on the CPU, whole command (warm, median)",
        "cpu", "ci", 2.5, "le", " s", lambda p: p.median_s,
    ),
)  # fmt: skip


def _judged(entry: dict[str, Any], value: float, bound: float, kind: str) -> dict[str, Any]:
    # margin > 0: inside the bound by that fraction of it; < 0: outside by that much
    margin = (bound - value) / bound if kind == "le" else (value - bound) / bound
    met = margin >= 0
    entry.update(value=value, margin=margin, status="met" if met else "missed")
    entry["note"] = (
        f"{abs(margin):.0%} {'inside' if met else 'outside'} the bound"
        if abs(margin) >= 0.005
        else "at the bound"
    )
    return entry


def evaluate_targets(report: BenchReport) -> list[dict[str, Any]]:
    rows = {r.B: r for r in report.rows}
    out = []
    judged = [(t, b) for t in TARGETS for b in ([*rows] or [EVERY_B] if t.B == EVERY_B else [t.B])]
    for t, b in judged:
        entry: dict[str, Any] = {
            "key": t.key,
            "target": t.text,
            "B": b,
            "at": f"B={b}" if b != EVERY_B else "every B",
            "bound": t.bound,
            "kind": t.kind,
            "unit": t.unit,
            "value": None,
        }
        row = rows.get(b)
        value = t.value(row, report.sgemm) if row else None
        if report.device != "cuda":  # the pipeline's bounds are an H200's figures
            entry.update(status="not measured", note="a bound for the GPU: bench --device cuda")
        elif row is None:
            entry.update(status="not measured", note=f"B={b} is not in this run")
        elif value is None:
            entry.update(status="not measured", note="a measurement it needs is unavailable")
        else:
            _judged(entry, value, t.bound, t.kind)
            if t.key == "sgemm_fraction":
                entry["note"] += f"; from the {row.pipeline_basis()[0]} step time"
        out.append(entry)
    for a in AUDIT_TARGETS:
        entry = {
            "key": a.key,
            "target": a.text,
            "at": f"{a.preset} on {a.device}",
            "bound": a.bound,
            "kind": a.kind,
            "unit": a.unit,
            "value": None,
        }
        audit = report.audit
        value = None if audit is None or isinstance(audit, Unavailable) else a.value(audit)
        if audit is None:
            entry.update(status="not measured", note="measured by --profile")
        elif report.device != a.device:
            entry.update(
                status="not measured",
                note=f"a bound for the {a.device} backend: bench --device {a.device} --profile",
            )
        elif value is None:
            entry.update(status="not measured", note="a measurement it needs is unavailable")
        else:
            _judged(entry, value, a.bound, a.kind)
        out.append(entry)
    return out


def bound_text(t: dict[str, Any]) -> str:
    return f"{'≤' if t['kind'] == 'le' else '≥'} {t['bound']:g}{t['unit']}"


def measured_text(t: dict[str, Any]) -> str:
    return "—" if t["value"] is None else f"{t['value']:.2f}{t['unit']}"
