"""The plain function behind `egf-audit capture`. It prints results to stdout and notes to
stderr and returns the exit code; errors propagate as UsageError (2) and AuditEnvironmentError
(3) for the command line to turn into one line. (`run --capture` is cli/capture_commands.py.)"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from egf_audit.errors import UsageError

from .command import DEFAULT_SNAPSHOT, run_capture


def capture(
    command: list[str],
    out: Path,
    layout: Path | None,
    snapshot: list[str] | None,
    values_max: int | None,
    deep: bool = False,
    deep_values_max: int | None = None,
    cpu: bool = False,
    kernels: Path | None = None,
) -> int:
    snapshots = tuple(snapshot) if snapshot else DEFAULT_SNAPSHOT
    if snapshots == ("none",):
        snapshots = ()
    if deep_values_max is not None and not deep:
        raise UsageError("--deep-values-max bounds what --deep keeps: give --deep with it")
    if deep_values_max is not None and deep_values_max < 0:
        raise UsageError(f"--deep-values-max {deep_values_max}: a byte count, 0 or more")
    if kernels is not None and not cpu:
        raise UsageError("--kernels names the kernel sources --cpu compiles: give --cpu with it")
    if cpu:
        from .cpu_capture import run_cpu_capture

        outcome = run_cpu_capture(
            command, out, kernels, layout, snapshots, values_max, deep, deep_values_max
        )
    else:
        outcome = run_capture(command, out, layout, snapshots, values_max, deep, deep_values_max)
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
