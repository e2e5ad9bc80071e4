"""The audit document, `docs/dqn-wire-up-audit.md`.

Every byte of it is a function of the audited sources, the config, the seed and egf-audit's
version only, so a document made on a GPU passes `--check` on a CPU runner and every
contributor's machine regenerates the same file. What depends on the machine (the device, the
compiler and library versions, measured fp32 residues, timings) is never written here:
reports/environment.py renders it for stdout and the step summary, and `--json` holds it.
"""

from __future__ import annotations

import difflib
import posixpath

from egf_audit.reports.bindings import SGEMM_ARGS, number, operand, operands, scalar_args
from egf_audit.reports.data_flow import data_flow
from egf_audit.reports.glossary import glossary
from egf_audit.reports.markdown import code, table
from egf_audit.reports.model import STATUS_LABEL, AuditReport, verdict_line
from egf_audit.reports.timeline import SITE_TITLES, STEPS, site_timeline
from egf_audit.reports.wire_status import ROW_STATUS, reference_mode, reference_trace, wire_status
from egf_audit.trace.model import Launch, Trace

TITLE = "# SP14 DQN wire-up audit"


def render_document(report: AuditReport) -> str:
    sections = [
        _header(report),
        glossary(),
        _invariants(report),
        _wire_status(report),
        data_flow(report),
        _sgemms(report),
        _timeline(report),
        _kernels(report),
        _configuration(report),
        _reference(report),
        _reproduce(report),
    ]
    return "\n\n".join("\n".join(s).rstrip() for s in sections) + "\n"


# ---- the --check comparison ----
def stale_diff(committed: str, regenerated: str, path: str, limit: int = 60) -> list[str]:
    """A unified diff (at most `limit` lines) of the committed document against the regenerated
    one; [] when current. CRLF in the committed file counts as LF (a checkout with
    core.autocrlf is not stale)."""
    old = committed.replace("\r\n", "\n").splitlines(keepends=True)
    new = regenerated.splitlines(keepends=True)
    lines = [
        line if line.endswith("\n") else line + "\n"
        for line in difflib.unified_diff(
            old, new, fromfile=f"{path} (committed)", tofile=f"{path} (regenerated)", n=1
        )
    ]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... {len(lines) - limit} more diff lines\n"]
    return lines


def first_stale_line(committed: str, regenerated: str) -> int | None:
    """The committed file's first line (1-based) that differs, for an annotation on the pull
    request's diff; None when current."""
    old = committed.replace("\r\n", "\n").splitlines()
    new = regenerated.splitlines()
    index = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
    if index is None:
        if len(old) == len(new):
            return None
        index = min(len(old), len(new))
    return min(index, max(len(old) - 1, 0)) + 1


def whitespace_only_lines(committed: str, regenerated: str, most: int = 3) -> list[int] | None:
    """The committed file's first `most` lines (1-based) that differ, when the two documents
    differ in whitespace only (trailing spaces, a space inside a line, blank lines: what an
    editor's reformatting does); None when anything else differs, or nothing does."""
    old = committed.replace("\r\n", "\n")
    if old == regenerated or "".join(old.split()) != "".join(regenerated.split()):
        return None
    old_lines, new_lines = old.splitlines(), regenerated.splitlines()
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    lines: list[int] = []
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag != "equal":  # an insert is shown at the committed line it goes before
            lines += range(i1 + 1, max(i2, i1 + 1) + 1)
    clipped = sorted({min(n, max(len(old_lines), 1)) for n in lines})
    return clipped[:most]


def committed_sources(committed: str) -> str | None:
    """The committed document's sources line (what it was made from), None if it has none."""
    for line in committed.splitlines():
        if line.startswith(SOURCES_LABEL):
            return line[len(SOURCES_LABEL) :]
    return None


# ---- sections ----
def _header(report: AuditReport) -> list[str]:
    cfg = report.config
    return [
        TITLE,
        "",
        f"<!-- Written by egf-audit {report.version}. `egf-audit run` rewrites this file and "
        "`egf-audit run --check` fails while it is stale; do not edit it by hand. -->",
        "",
        f"**Verdict:** {verdict_line(report)}",
        "",
        SOURCES_LABEL + sources_line(report),
        "",
        f"Audited the SP14 pipeline at preset {code(cfg.preset)}, seed {cfg.seed}, "
        f"{report.steps} training step{'s' * (report.steps != 1)} a run, "
        f"modes {' and '.join(report.modes)}; every launch recorded, "
        f"{len(report.invariants)} invariants proved from the recording. "
        "The terms below define the trainer's names. The measured numbers behind each verdict "
        "depend on the machine and are not written here: `egf-audit run` prints them and "
        "`--json` holds them.",
    ]


SOURCES_LABEL = "**Sources:** "


def sources_line(report: AuditReport) -> str:
    """Which kernel sources were audited, in words, at the top: a document made from
    egf-audit's own reference kernels must not pass for a trainer's (`--check` compares it)."""
    folders: dict[str, int] = {}
    bundled = 0
    for s in report.kernels.sources:
        if s.origin == "kernels-dir":
            folder = posixpath.dirname(s.path) or "."
            folders[folder] = folders.get(folder, 0) + 1
        else:
            bundled += 1  # "fault:<name>" sources exist only inside the audit's own scenarios
    total = len(report.kernels.sources)
    parts = [
        f"the trainer's folder {code(folder + '/')} ({n} of {total} kernels)"
        for folder, n in sorted(folders.items())
    ]
    if bundled:
        parts.append(f"egf-audit's bundled reference kernels ({bundled} of {total})")
    return " and ".join(parts) + "."


def _summary(report: AuditReport, code_: str) -> str:
    summaries = []
    for mode in report.modes:
        r = report.result(code_, mode)
        if r is not None:
            summaries.append((mode, r.verdict.summary))
    if len({s for _, s in summaries}) == 1:
        return summaries[0][1]
    return "; ".join(f"{mode}: {s}" for mode, s in summaries)


def _status(report: AuditReport, code_: str, mode: str) -> str:
    r = report.result(code_, mode)
    return STATUS_LABEL[r.verdict.status if r else "not run"]


def _invariants(report: AuditReport) -> list[str]:
    rows = [
        [
            inv.code,
            code(inv.slug),
            *[_status(report, inv.code, m) for m in report.modes],
            _summary(report, inv.code),
        ]
        for inv in report.invariants
    ]
    lines = ["## Invariants", "", *table(["code", "invariant", *report.modes, "summary"], rows)]
    if report.failures:
        lines += ["", "Failed:", ""]
        for r in report.failures:
            inv = report.invariant(r.code)
            slug, message = (inv.slug, inv.message) if inv else ("", "")
            lines.append(f"- **{r.code}[{r.mode}]** {code(slug)}: {message} ({r.verdict.summary})")
    return lines


def _wire_status(report: AuditReport) -> list[str]:
    mode = reference_mode(report)
    rows = [
        [row.wire, ROW_STATUS[row.status], row.measured, ", ".join(row.codes)]
        for row in wire_status(report)
    ]
    return [
        "## Wire status",
        "",
        "What the B.10 change claims for each stage of the wire, measured: a row's status is "
        "the verdict of the invariants about that stage (EGF001 counts only for the SGEMMs of "
        f"the stage); the evidence is from the launches of step 0 of the {mode} production run.",
        "",
        *table(["wire", "status", "measured", "proved by"], rows),
    ]


def _sgemms(report: AuditReport) -> list[str]:
    trace = reference_trace(report)
    head = ["## SGEMMs of one step", ""]
    if trace is None:
        return [*head, "No trace was recorded."]
    launches = [x for x in trace.sgemms() if x.step == 0]
    rows = [
        [
            x.index,
            code(x.label),
            *[number(x.args[k]) for k in SGEMM_ARGS],
            *[_bound(x, role, trace) for role in ("A", "B", "C")],
        ]
        for x in launches
    ]
    return [
        *head,
        f"All {len(launches)} SGEMMs of step 0 of the {reference_mode(report)} production run, "
        "in launch order, with their cuBLAS (column-major) arguments as passed and the tensor "
        "each pointer resolved to. `#` is the launch's index in the run's trace.",
        "",
        *table(["#", "label", *SGEMM_ARGS, "A", "B", "C"], rows),
    ]


def _bound(x: Launch, role: str, trace: Trace) -> str:
    try:
        return operand(x.binding(role), trace.layout)
    except KeyError:
        return "—"


def _timeline(report: AuditReport) -> list[str]:
    trace = reference_trace(report)
    lines = ["## Backward timeline", ""]
    if trace is None:
        return [*lines, "No trace was recorded."]
    lines += [
        f"Step 0 of the {reference_mode(report)} production run, per call site, numbered as "
        "the trainer's backward orchestration since B.10:",
        "",
        *[f"{n}. {text}" for n, text in STEPS.items()],
    ]
    for site, title in SITE_TITLES.items():
        entries = site_timeline(trace, site)
        lines += ["", f"### {title} (`@{site}`)", ""]
        if entries is None:
            lines.append("This call site recorded no backward checkpoints.")
            continue
        rows = []
        for n in STEPS:
            mine = [e.launch for e in entries if e.step == n]
            if not mine:
                rows.append([n, "—", "no launch", "", "", ""])
            for x in mine:
                rows.append(
                    [
                        n,
                        x.index,
                        code(x.label),
                        scalar_args(x),
                        "; ".join(operands(x, trace.layout, "w")),
                        "; ".join(operands(x, trace.layout, "r")),
                    ]
                )
        lines += table(["step", "#", "launch", "arguments", "writes", "reads"], rows)
    return lines


def _kernels(report: AuditReport) -> list[str]:
    rows = [
        [code(s.spec.name), code(s.path), s.origin, code(s.sha256)] for s in report.kernels.sources
    ]
    lines = ["## Kernel sources audited", "", *table(["kernel", "path", "origin", "sha256"], rows)]
    headers = report.kernels.headers()
    if headers:
        lines += ["", "Headers beside them, which any of them may include (found as with `-I`):"]
        lines += ["", *table(["header", "sha256"], [[code(p), code(h)] for p, h in headers])]
    if report.kernels.ignored:
        names = ", ".join(code(n) for n in report.kernels.ignored)
        lines += ["", f"Ignored (no kernel of that name): {names}."]
    return lines


def _configuration(report: AuditReport) -> list[str]:
    cfg = report.config.as_dict()
    dims = [
        [code(k), ", ".join(map(str, v)) if isinstance(v, list | tuple) else v]
        for k, v in cfg["dims"].items()
    ]
    hyper = [[code(k), number(v)] for k, v in cfg["hyper"].items()]
    return [
        "## Configuration",
        "",
        f"Preset {code(cfg['preset'])}, seed {cfg['seed']}.",
        "",
        *table(["dimension", "value"], dims),
        "",
        *table(["hyper-parameter", "value"], hyper),
    ]


def _reference(report: AuditReport) -> list[str]:
    lines = ["## Invariant reference", "", "The same text as `egf-audit explain CODE`."]
    for inv in report.invariants:
        lines += [
            "",
            f"### {inv.code} {inv.slug}",
            "",
            inv.message,
            "",
            f"**What it proves.** {inv.what}",
            "",
            f"**Why it matters.** {inv.why}",
            "",
            f"**How it is measured.** {inv.how}",
            "",
            f"**Bug it catches.** {inv.catches}",
            "",
            f"**Known limits.** {inv.limits}",
            "",
            f"**Example.** {inv.example}",
        ]
    return lines


def _reproduce(report: AuditReport) -> list[str]:
    return [
        "## Reproduce",
        "",
        "```sh",
        report.command,
        "```",
        "",
        "Run it from the project root (the folder of the settings file, else the repository "
        "root): the paths in this document are relative to it. The device is left to "
        "`--device auto` (CUDA when a GPU works, else the CPU); the document is the same bytes "
        "on either, and on every machine. `egf-audit run --check` with the same options fails "
        "while this file is stale.",
    ]
