"""The bench report rendered: a rich table and the targets for the terminal, JSON (schema
egf-audit-bench/1) and markdown for docs/benchmarks.md."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from egf_audit.bench.report import (
    SCHEMA,
    BenchReport,
    Measured,
    Row,
    SgemmReference,
    Timing,
    Unavailable,
    achieved_tflops,
    bound_text,
    evaluate_targets,
    measured_text,
    ratio,
)

# ---- formatting ----


def _ms(m: Measured) -> str:
    if isinstance(m, Timing):
        v = m.median_ms
        text = f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 10 else f"{v:.3f}"
        return text + ("" if m.finite else " ⚠")
    if isinstance(m, Unavailable):
        return "unavailable"  # the reason is listed under the table
    return "n/a"


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


COLUMNS = (
    "B",
    "plain",
    "instr",
    "torch",
    "graph",
    "plain/torch",
    "graph/torch",
    "instr/plain",
    "GFLOP",
    "TFLOP/s",
    "of SGEMM",
)
TIMES = "plain, instr(umented), torch (eager), graph: median ms per step; GFLOP per step"


def remarks(report: BenchReport) -> list[str]:
    """What a reader must know about single cells: why something is unavailable, a graph replay
    that does not reproduce the eager step, a state that went non-finite (⚠)."""
    out = []
    for r in report.rows:
        for name, m in (
            ("plain", r.plain),
            ("instrumented", r.instrumented),
            ("torch eager", r.torch_eager),
            ("graph", r.graph),
        ):
            if isinstance(m, Unavailable):
                out.append(f"B={r.B}: {name}: unavailable ({m.reason})")
            elif isinstance(m, Timing):
                if not m.finite:
                    out.append(f"B={r.B}: {name}: the state after the timed steps is non-finite")
                check = m.extra.get("check")
                if check and not check.startswith("bitwise equal"):
                    out.append(f"B={r.B}: {name}: replay {check}")
    return out


def row_cells(row: Row, sgemm: SgemmReference) -> list[str]:
    basis, timing = row.pipeline_basis()
    rate = achieved_tflops(row, timing)
    return [
        str(row.B),
        _ms(row.plain),
        _ms(row.instrumented),
        _ms(row.torch_eager),
        _ms(row.graph),
        _x(ratio(row.plain, row.torch_eager)),
        _x(ratio(row.graph, row.torch_eager)),
        _x(ratio(row.instrumented, row.plain)),
        f"{row.flops / 1e9:.2f}",
        _num(rate, ".2f") + ("" if basis == "graph" else "ᵖ"),
        _num(None if rate is None else rate / sgemm.tflops, ".0%"),
    ]


def sgemm_line(report: BenchReport) -> str:
    s = report.sgemm
    return (
        f"large SGEMM {s.m}×{s.n}×{s.k} fp32 (same cublas path): {s.tflops:.2f} TFLOP/s, "
        f"median {s.timing.median_ms:.3f} ms of {len(s.timing.samples_ms)}"
    )


RATE_NOTE = "TFLOP/s: step GFLOP over the graph replay time (ᵖ: over the plain step time)"


def rich_table(report: BenchReport) -> Table:
    # remarks carry exception text: escape it, or rich would read `[...]` in it as markup
    caption = "\n".join([TIMES, sgemm_line(report), RATE_NOTE, *map(escape, remarks(report))])
    table = Table(
        title=(
            f"egf-audit bench — {report.device} ({report.device_name}), "
            f"{report.settings.get('widths', 'prod')} widths"
        ),
        caption=caption,
        caption_justify="left",
    )
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="right" if i != 0 else "left")
    for row in report.rows:
        table.add_row(*row_cells(row, report.sgemm))
    return table


TARGETS_NOTE = "the pipeline's set for one H200, the audit's per backend"


def targets_table(report: BenchReport) -> Table:
    table = Table(title=f"targets ({TARGETS_NOTE})")
    for name in ("target", "at", "bound", "measured", "status"):
        table.add_column(name)
    for t in evaluate_targets(report):
        status = f"{t['status']} ({t['note']})"
        style = {"met": "green", "missed": "red"}.get(t["status"], "yellow")
        table.add_row(t["target"], t["at"], bound_text(t), measured_text(t), f"[{style}]{status}")
    return table


def to_json(report: BenchReport) -> dict[str, Any]:
    rows = []
    for r in report.rows:
        basis, timing = r.pipeline_basis()
        rows.append(
            {
                "B": r.B,
                "plain": r.plain.as_dict(),
                "instrumented": r.instrumented.as_dict(),
                "torch_eager": r.torch_eager.as_dict(),
                "graph": r.graph.as_dict() if r.graph is not None else None,
                "ratios": {
                    "plain_over_torch": ratio(r.plain, r.torch_eager),
                    "graph_over_torch": ratio(r.graph, r.torch_eager),
                    "instrumented_over_plain": ratio(r.instrumented, r.plain),
                },
                "step_flops": r.flops,
                "step_gflop": r.flops / 1e9,
                "flops_by_phase": r.flops_by_phase,
                "achieved_tflops": {
                    "plain": achieved_tflops(r, r.plain),
                    "graph": achieved_tflops(r, r.graph),
                },
                "rate_basis": basis,
                "fraction_of_sgemm": achieved_tflops(r, timing) / report.sgemm.tflops,
                # torch runs one backward where the pipeline runs one per call site, so its
                # step does about the FLOPs of the pipeline's step minus the CQL site's backward
                "torch_step_flops_estimate": r.flops - r.flops_by_phase.get("backward_cql", 0),
            }
        )
    return {
        "schema": SCHEMA,
        "command": report.command,
        "device": report.device,
        "device_name": report.device_name,
        "settings": report.settings,
        "environment": report.environment,
        "sgemm_reference": {
            "m": report.sgemm.m,
            "n": report.sgemm.n,
            "k": report.sgemm.k,
            "tflops": report.sgemm.tflops,
            **report.sgemm.timing.as_dict(),
        },
        "rows": rows,
        "profiles": [p.as_dict() for p in report.profiles],
        "audit_profile": report.audit.as_dict() if report.audit is not None else None,
        "remarks": remarks(report),
        "targets": evaluate_targets(report),
    }


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def to_markdown(report: BenchReport) -> str:
    s = report.settings
    lines = [
        f"## `egf-audit bench` on {report.device} ({report.device_name})",
        "",
        "Made by:",
        "",
        "```sh",
        report.command,
        "```",
        "",
        _md_row(list(COLUMNS)),
        _md_row(["---:"] * len(COLUMNS)),
        *(_md_row(row_cells(r, report.sgemm)) for r in report.rows),
        "",
        f"{TIMES}. Reference: {sgemm_line(report)}. {RATE_NOTE}.",
        "",
        *(f"- {line}" for line in remarks(report)),
        *([""] if remarks(report) else []),
        f"### Targets ({TARGETS_NOTE})",
        "",
        _md_row(["target", "at", "bound", "measured", "status"]),
        _md_row(["---", "---", "---", "---:", "---"]),
    ]
    for t in evaluate_targets(report):
        cells = [t["target"], t["at"], bound_text(t), measured_text(t)]
        lines.append(_md_row([*cells, f"**{t['status']}** ({t['note']})"]))
    lines += ["", "### How it was measured", ""]
    lines += [f"- {note}" for note in s.get("notes", [])]
    env = ", ".join(f"{k} {v}" for k, v in report.environment.items() if isinstance(v, str))
    lines += ["", f"Environment: {env}.", ""]
    return "\n".join(lines)
