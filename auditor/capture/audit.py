"""`egf-audit run --capture DIR`: decide every invariant a capture can decide, and render it.

Outputs mirror `run`: a markdown document (its section "Trainer process"), `--json`, `--junit`
(an undecidable invariant is a skipped testcase with its reason), `--check`. Exit 0 when no
decided invariant fails; 1 when one fails or the process was no SP14 trainer at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from egf_audit.errors import UsageError
from egf_audit.invariants import INVARIANTS, INVARIANTS_BY_CODE
from egf_audit.runtime.contract import ACCUMULATE_KERNEL, CONCAT_KERNEL, POLYAK_KERNEL, SCALE_KERNEL

from .checks import FAIL, PASS, UNDECIDED, CaptureVerdict, decide
from .command import audited_process
from .convert import CaptureTrace, to_trace
from .events import read_capture
from .layout import infer_layout, layout_in, load_layout_file

ABI_KERNELS = (CONCAT_KERNEL, SCALE_KERNEL, ACCUMULATE_KERNEL, POLYAK_KERNEL)
CODES = sorted({inv.code for inv in INVARIANTS} | {"EGF013"})


@dataclass
class CaptureAudit:
    folder: Path
    capture: CaptureTrace
    verdicts: list[CaptureVerdict]
    missing: list[str] = field(default_factory=list)  # what makes it no SP14 trainer

    @property
    def ok(self) -> bool:
        return not self.missing and not any(v.status == FAIL for v in self.verdicts)

    @property
    def unresolved_gemms(self) -> list[int]:
        return [
            x.index
            for x in self.capture.trace.sgemms()
            if not x.bindings or any(b.region is None for b in x.bindings)
        ]


def audit_capture(folder: Path, use_layout: bool = True) -> CaptureAudit:
    """Read a capture folder and decide. `use_layout=False` ignores a layout file (inference)."""
    folder = Path(folder)
    procs = read_capture(folder)
    if not procs:
        raise UsageError(f"--capture {folder}: no recorder events in it (events-<pid>.jsonl)")
    proc = audited_process(procs)
    layout_path = layout_in(folder)
    inferred = infer_layout(proc)
    layout = load_layout_file(layout_path) if use_layout and layout_path else inferred
    layout.dims = {**inferred.dims, **layout.dims}  # a file without SH2: the concat's sh2
    ct = to_trace(proc, layout, scenario=f"capture/{folder.name}")
    seen = {r.name for r in proc.kernels()}
    missing = [f"no {k} launch" for k in ABI_KERNELS if k not in seen]
    if len(missing) < len(ABI_KERNELS):
        missing = []  # a trainer with a fault may lack one kernel; the checks say which
    else:
        gemms = sum(r.kind in ("sgemm", "gemm") for r in proc.records)
        missing = [
            f"process {proc.pid} is no SP14 trainer: none of the ABI kernels "
            f"({', '.join(ABI_KERNELS)}) was launched; it recorded {len(proc.kernels())} kernel "
            f"launches and {gemms} cuBLAS GEMMs"
        ]
    return CaptureAudit(folder, ct, decide(ct, CODES), missing)


def verdict_line(audit: CaptureAudit) -> str:
    counts = {s: sum(v.status == s for v in audit.verdicts) for s in (PASS, FAIL, UNDECIDED)}
    word = "PASS" if audit.ok else "FAIL"
    return (
        f"trainer process: {word}: {counts[PASS]} hold, {counts[FAIL]} fail, "
        f"{counts[UNDECIDED]} cannot be decided from a capture"
    )


def render_markdown(audit: CaptureAudit) -> str:
    ct = audit.capture
    lines = [
        "# Trainer process audit",
        "",
        "## Trainer process",
        "",
        f"Capture `{audit.folder.name}`, process {ct.process.pid}: "
        f"{len(ct.trace.launches)} launches, {len(ct.sites)} call sites, "
        f"layout {'from the trainer' if ct.layout.from_file else 'inferred'}.",
        "",
        f"**{verdict_line(audit)}**",
        "",
        *[f"- {m}" for m in audit.missing],
        "",
        "| code | invariant | verdict | evidence |",
        "|---|---|---|---|",
    ]
    for v in audit.verdicts:
        slug = (
            INVARIANTS_BY_CODE[v.code].slug
            if v.code in INVARIANTS_BY_CODE
            else "kernel-effects-contained"
        )
        lines.append(f"| {v.code} | {slug} | {v.status} | {v.summary.replace('|', '/')} |")
    lines += [
        "",
        "### Buffers and how they were named",
        "",
        "| buffer | elements | named by |",
        "|---|---|---|",
    ]
    for row in ct.layout.naming():
        lines.append(f"| `{row['buffer']}` | {row['elements']} | {row['named_by']} |")
    unresolved = audit.unresolved_gemms
    lines += [
        "",
        f"### GEMMs left unresolved: {len(unresolved)} of {sum(1 for _ in ct.trace.sgemms())}",
        "",
    ]
    for i in unresolved[:40]:
        x = ct.trace.launches[i]
        a = x.args
        shape = ", ".join(
            f"{k}={a.get(k)}" for k in ("transa", "transb", "m", "n", "k", "lda", "ldb", "ldc")
        )
        lines.append(f"- launch {i} (step {x.step}, {x.label}): {shape}")
    return "\n".join(lines).rstrip() + "\n"


def render_json(audit: CaptureAudit) -> str:
    doc = {
        "capture": audit.folder.name,
        "ok": audit.ok,
        "missing": audit.missing,
        "layout": "file" if audit.capture.layout.from_file else "inferred",
        "naming": audit.capture.layout.naming(),
        "unresolved_gemms": audit.unresolved_gemms,
        "results": [
            {"code": v.code, "status": v.status, "summary": v.summary, "evidence": v.evidence}
            for v in audit.verdicts
        ],
    }
    return json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n"


def render_junit(audit: CaptureAudit) -> str:
    failures = sum(v.status == FAIL for v in audit.verdicts) + bool(audit.missing)
    skipped = sum(v.status == UNDECIDED for v in audit.verdicts)
    cases = []
    if audit.missing:
        cases.append(
            '  <testcase classname="egf-audit.capture" name="trainer-process">'
            f"<failure message={quoteattr(audit.missing[0])}/></testcase>"
        )
    for v in audit.verdicts:
        body = ""
        if v.status == FAIL:
            body = f"<failure message={quoteattr(v.summary)}>{escape(v.summary)}</failure>"
        elif v.status == UNDECIDED:
            body = f"<skipped message={quoteattr(v.summary)}/>"
        cases.append(f'  <testcase classname="egf-audit.capture" name="{v.code}">{body}</testcase>')
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'<testsuite name="egf-audit capture" tests="{len(cases)}" failures="{failures}" '
        f'skipped="{skipped}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )
