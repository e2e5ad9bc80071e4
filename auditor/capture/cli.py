"""The plain functions behind `egf-audit capture` and `egf-audit run --capture`. They print
results to stdout and notes to stderr and return the exit code; errors propagate as UsageError
(2) and AuditEnvironmentError (3) for the command line to turn into one line."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from egf_audit.reports import github
from egf_audit.reports.atomic import OutputBatch
from egf_audit.reports.document import stale_diff

from .audit import audit_capture, render_json, render_junit, render_markdown, verdict_line
from .checks import FAIL
from .command import DEFAULT_SNAPSHOT, run_capture

DOCUMENT = "trainer-audit.md"  # inside the capture folder unless --out names another


def capture(
    command: list[str],
    out: Path,
    layout: Path | None,
    snapshot: list[str] | None,
    values_max: int | None,
) -> int:
    kernels = tuple(snapshot) if snapshot else DEFAULT_SNAPSHOT
    if kernels == ("none",):
        kernels = ()
    outcome = run_capture(command, out, layout, kernels, values_max)
    for p in outcome.processes:
        mark = " (audited)" if p["audited"] else ""
        typer.echo(
            f"process {p['pid']}{mark}: {p['kernels']} kernel launches, {p['gemms']} GEMMs, "
            f"{p['memsets']} memsets, {p['copies']} copies, {p['snapshots']} snapshot regions"
        )
    typer.echo(f"{shlex.join(command)} exited {outcome.exit_code} after {outcome.wall_s:.2f} s")
    typer.echo(f"egf-audit: wrote {out}", err=True)
    # a command killed by signal N exits 128 + N, as a shell reports it
    return outcome.exit_code if outcome.exit_code >= 0 else 128 - outcome.exit_code


def gate(
    folder: Path,
    out: Path | None,
    check: bool,
    json_out: Path | None,
    junit_out: Path | None,
    quiet: bool,
) -> int:
    audit = audit_capture(folder)
    document = render_markdown(audit)
    out = out or folder / DOCUMENT
    code = 0 if audit.ok else 1
    batch = OutputBatch()
    with batch:
        if check:
            committed = out.read_text(encoding="utf-8") if out.exists() else ""
            diff = stale_diff(committed, document, out.as_posix())
            if diff:
                typer.echo(f"egf-audit: {out.as_posix()} is stale", err=True)
                typer.echo("".join(diff), err=True, nl=False)
                code = 1
        else:
            batch.add(out, document)
        if json_out is not None:
            batch.add(json_out, render_json(audit))
        if junit_out is not None:
            batch.add(junit_out, render_junit(audit))
        batch.commit()
    in_github = github.in_github_actions()
    for line in audit.missing:
        typer.echo(f"egf-audit: {line}", err=True)
        if in_github:
            typer.echo(github.command("error", line, title="trainer process"))
    for v in audit.verdicts:
        if v.status == FAIL:
            typer.echo(f"{v.code} failed: {v.summary}", err=True)
            if in_github:
                typer.echo(github.command("error", v.summary, title=f"{v.code} (trainer process)"))
        elif not quiet:
            typer.echo(f"{v.code} {v.status}: {v.summary}")
    typer.echo(verdict_line(audit))
    if in_github:
        try:
            github.append_step_summary(document)
        except OSError as exc:
            typer.echo(f"egf-audit: warning: cannot append the step summary: {exc}", err=True)
    return code
