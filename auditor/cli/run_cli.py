"""`egf-audit run`: the typer command and what it prints.

stdout ends with the one verdict line of the run (PASS, or FAIL naming failed invariants and a
STALE document), whatever the terminal's width; every line before it is whole at any width.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from egf_audit.cli.options import (
    EXIT_CODES,
    ConfigFile,
    Debug,
    Device,
    Isolated,
    JsonOut,
    JunitOut,
    KernelsDir,
    LaunchTimeout,
    OutputFormat,
    Preset,
    Quiet,
    Seed,
    Steps,
    check_output_format,
    consoles,
    exit_codes,
    with_help,
)
from egf_audit.cli.outputs import STDOUT
from egf_audit.cli.progress import progress_for
from egf_audit.cli.project import ProjectSettings, find_settings, given, near, setting

if TYPE_CHECKING:
    from egf_audit.cli.delivery import RunOutcome
    from egf_audit.reports.model import AuditReport, CaptureReport

DEFAULT_OUT = Path("docs/dqn-wire-up-audit.md")  # the same as commands.DEFAULT_OUT


@with_help(EXIT_CODES)
def run(
    ctx: typer.Context,
    device: Device = "auto",
    preset: Preset = None,
    config: ConfigFile = None,
    seed: Seed = None,
    steps: Steps = 2,
    mode: Annotated[
        str,
        typer.Option("--mode", help="Gate modes to audit: sentinel, live or both.", metavar="MODE"),
    ] = "both",
    out: Annotated[Path, typer.Option("--out", help="The audit document.")] = DEFAULT_OUT,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Regenerate the document in memory and fail (exit 1, with a diff) when the "
            "file at --out differs outside its environment block. Writes no document.",
            metavar="",
        ),
    ] = False,
    json_out: JsonOut = None,
    junit: JunitOut = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace", help="Write every scenario's launches as JSON lines here, or - for stdout."
        ),
    ] = None,
    output_format: OutputFormat = "text",
    kernels: KernelsDir = None,
    cublas_log: Annotated[
        bool,
        typer.Option(
            "--cublas-log",
            help="Also log every GEMM with cuBLAS's own API logger and match the log one-to-one "
            "with the recorded SGEMMs (CUDA only); a mismatch fails the run.",
            metavar="",
        ),
    ] = False,
    capture: Annotated[
        Path | None,
        typer.Option(
            "--capture",
            help="Audit a capture of the trainer's own process (egf-audit capture) instead of "
            "the rebuild; --out then defaults to docs/trainer-audit.md (docs/capture.md).",
            metavar="DIR",
        ),
    ] = None,
    trainer: Annotated[
        str | None,
        typer.Option(
            "--trainer",
            help="With --capture: sp14 (default; the gate fails when no process is an SP14 "
            "trainer) or generic (a program that is no SP14 trainer by design: the checks that "
            "need no SP14 name decide, the SP14 invariants are not applicable).",
            metavar="sp14|generic",
        ),
    ] = None,
    allow_undecided: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-undecided",
            help="With --capture: let these invariants stay undecided without failing the gate "
            "(repeatable, or a comma list); by default only what the capture's mode cannot "
            "decide is allowed (EGF010 and EGF013 without --deep).",
            metavar="CODE[,CODE]",
        ),
    ] = None,
    launch_timeout: LaunchTimeout = None,
    isolated: Isolated = False,
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="Place a failure (its annotation under GitHub Actions or --output-format "
            "github, and its 'is blamed on' line) on the lines of the trainer's kernel file "
            "changed since this ref (default: GITHUB_BASE_REF), else on the kernel's entry line.",
            metavar="REF",
        ),
    ] = None,
    sanitize: Annotated[
        bool,
        typer.Option(
            "--sanitize",
            help="Also run the audit again under compute-sanitizer (memcheck, initcheck; CUDA "
            "only) and put its findings in the document; a memcheck error, or an initcheck "
            "error in an audited kernel, fails the run.",
            metavar="",
        ),
    ] = False,
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """Run the audit and write the audit document (the main job and the PR gate).

    Rebuilds the SP14 pipeline at the preset's shapes, runs every scenario with each launch
    recorded, proves every invariant in each mode, and writes --out. A run whose invariants
    fail still writes the document and exits 1. With GITHUB_ACTIONS=true it also prints
    workflow annotations and appends a summary to GITHUB_STEP_SUMMARY.

    Options not given here come from the [tool.egf-audit] table of the nearest pyproject.toml
    (or egf-audit.toml), found from any subfolder of the repository (docs/ci-gate.md).
    """
    stdout, stderr = consoles()
    with exit_codes(debug):
        settings = find_settings(isolated=isolated)
    if not given(ctx, "capture"):
        capture = settings.capture
    root = settings.root if settings.file is not None else None
    # the options the settings file supplied: an error about one names its key and the file
    from_settings = frozenset(
        key
        for key in ("device", "preset", "config", "kernels", "out", "capture")
        if not given(ctx, key) and getattr(settings, key) is not None
    )
    if capture is not None:
        with exit_codes(debug), settings.naming(from_settings):
            check_output_format(output_format)
            refuse_for_capture(ctx, settings)
            from egf_audit.cli import capture_commands
            from egf_audit.cli.gate_options import allowed_option, trainer_option

            allowed = settings.allow_undecided or frozenset()
            if allow_undecided:  # the command line's codes add to the table's
                allowed |= allowed_option(allow_undecided)

            default_out = settings.out or settings.root / capture_commands.DEFAULT_CAPTURE_OUT
            capture_request = capture_commands.CaptureRequest(
                folder=near(capture),
                out=out if given(ctx, "out") else near(default_out),
                root=root,
                check=check,
                json_out=json_out,
                junit_out=junit,
                trace_out=trace,
                output_format=output_format,
                allow_undecided=allowed,
                trainer=trainer_option(
                    trainer if trainer is not None else settings.trainer or "sp14"
                ),
            )
            outcome = capture_commands.run_capture_audit(capture_request)
        _finish(outcome, stdout, stderr, quiet, output_format, json_out, junit, trace)
    with exit_codes(debug), settings.naming(from_settings):
        check_output_format(output_format)
        refuse_for_rebuild(ctx)
        from egf_audit.cli import commands  # torch, numpy and the pipeline load here

        request = commands.RunRequest(
            device=setting(ctx, settings, "device", device),
            preset=setting(ctx, settings, "preset", preset),
            config_path=setting(ctx, settings, "config", config),
            seed=seed,
            steps=steps,
            mode=mode,
            out=out if given(ctx, "out") else near(settings.out or settings.root / DEFAULT_OUT),
            check=check,
            json_out=json_out,
            junit_out=junit,
            trace_out=trace,
            kernels_dir=setting(ctx, settings, "kernels", kernels),
            kernels_only=settings.kernels is not None,
            root=root,
            from_settings=from_settings,
            base_ref=base,
            cublas_log=cublas_log,
            output_format=output_format,
            launch_timeout_s=launch_timeout,
            sanitize=sanitize,
        )
        with progress_for(stderr, quiet) as progress:
            outcome = commands.run_audit(request, progress)
    _finish(outcome, stdout, stderr, quiet, output_format, json_out, junit, trace)


# options of `run` that shape the rebuild only: with --capture they would mean nothing, so
# they are refused (exit 2) rather than silently ignored
REBUILD_ONLY = (
    "device",
    "preset",
    "config",
    "seed",
    "steps",
    "mode",
    "kernels",
    "cublas_log",
    "launch_timeout",
    "sanitize",
    "base",
)


def refuse_for_capture(ctx: typer.Context, settings: ProjectSettings) -> None:
    from egf_audit.errors import UsageError

    named = [name for name in REBUILD_ONLY if given(ctx, name)]
    if named:
        flags = ", ".join("--" + name.replace("_", "-") for name in named)
        source = "" if given(ctx, "capture") else f" ({settings.spelled('capture')})"
        error = UsageError(
            f"{flags} shape{'s' * (len(named) == 1)} the rebuild and mean{'s' * (len(named) == 1)} "
            f"nothing for --capture{source} (the capture recorded the trainer as it ran): leave "
            f"{'it' if len(named) == 1 else 'them'} out"
            + (", or --isolated to ignore the settings file" if source else "")
        )
        raise settings.at(error, "capture") if source else error


# options of `run` that shape a capture's gate only: the rebuild runs the SP14 step itself and
# decides every invariant of it, so nothing in it is undecided and it is an SP14 trainer
CAPTURE_ONLY = ("trainer", "allow_undecided")


def refuse_for_rebuild(ctx: typer.Context) -> None:
    """--trainer or --allow-undecided without --capture: exit 2 rather than silently ignored
    (the table's `trainer` and `allow-undecided` wait for a `run --capture`)."""
    from egf_audit.errors import UsageError

    named = [name for name in CAPTURE_ONLY if given(ctx, name)]
    if named:
        flags = " and ".join("--" + name.replace("_", "-") for name in named)
        raise UsageError(
            f"{flags} shape{'s' * (len(named) == 1)} the gate of run --capture DIR: the rebuild "
            "runs the SP14 step itself and decides every invariant, so nothing in it is allowed "
            "undecided (docs/ci-gate.md)"
        )


def _finish(outcome, stdout, stderr, quiet, output_format, json_out, junit, trace) -> None:
    # stdout carrying JSON, JUnit or a trace must parse: the human part goes to stderr then
    machine = output_format in ("json", "junit") or STDOUT in map(str, (json_out, junit, trace))
    table = not quiet and output_format != "github"  # github: the annotations and the verdict
    _print_run(outcome, stdout, stderr, quiet, table, human=stderr if machine else stdout)
    raise typer.Exit(outcome.exit_code)


def _print_run(
    outcome: RunOutcome,
    stdout: Console,
    stderr: Console,
    quiet: bool,
    table: bool,
    human: Console,
) -> None:
    """`human`: where the verdict table and line go, stdout unless stdout carries JSON or
    JUnit. GitHub annotations go there too (the runner reads workflow commands on either)."""
    from egf_audit.cli.tables import print_verdicts
    from egf_audit.reports.model import AuditReport

    gate = outcome.gate
    report = gate.report

    def err(line: str) -> None:
        stderr.print(Text(line), soft_wrap=True)

    for note in outcome.notes:
        err(f"egf-audit: warning: {note}")
    for line in outcome.annotations:
        human.file.write(line + "\n")
    for payload in outcome.stdout:
        stdout.file.write(payload)
    for path in outcome.written:
        if not quiet:
            err(f"egf-audit: wrote {path.as_posix()}")
    if report.witness is not None:
        w = report.witness
        line = (
            f"cuBLAS witness: {w['matched']} of {w['recorded']} GEMMs match ({w['logged']} logged)"
        )
        if not report.witness_ok:
            err(f"egf-audit: {line}: FAIL")
        else:
            human.print(Text(line), soft_wrap=True)
    if gate.checked:
        if gate.stale:
            err(f"egf-audit: {outcome.typed_out} is STALE: {outcome.advice}")
            if not quiet:
                stderr.file.write("".join(gate.diff))
        elif not quiet:
            err(f"egf-audit: {outcome.typed_out} is up to date")
    for problem in report.problems():
        err(f"egf-audit: {problem}")
    for reason in gate.undecided_reasons():  # an undecided invariant fails: say which and why
        err(f"egf-audit: {reason}")
    if quiet:
        for r in report.failures:
            err(f"{r.code}[{r.mode}] failed: {r.verdict.summary}")
            for line in outcome.blamed.get((r.code, r.mode), []):
                err(line)
    info = report.run_info
    if table and isinstance(report, AuditReport):
        _print_evidence(human, report)
    if table:  # the trainer's file and line of each failure (the annotations carry them too)
        for lines in outcome.blamed.values():
            for line in lines:
                human.print(Text(line), soft_wrap=True)
    if table:
        print_verdicts(human, report)
    if table and "timings_s" in info:
        timings = info.get("timings_s", {})
        human.print(
            Text(
                f"ran on {info.get('picked', '?')} in {sum(timings.values()):.1f} s "
                f"(host {info.get('host', '?')}, python {info.get('python', '?')}, "
                f"{info.get('platform', '?')}{_environment(report)})"
            ),
            soft_wrap=True,
        )
    human.print(Text(gate.line()), soft_wrap=True)  # always the last line


def _print_evidence(human: Console, report: AuditReport) -> None:
    """What the document leaves out because it depends on this machine: the measured evidence
    behind each verdict that did not pass (every verdict's is in --json and the step summary;
    printing all 26 would bury the table)."""
    from egf_audit.reports.environment import evidence_rows

    shown = {(r.code, r.mode) for r in report.results if r.verdict.status != "pass"}
    for code, mode, evidence in evidence_rows(report):
        if (code, mode) in shown:
            human.print(Text(f"evidence {code}[{mode}]: {evidence}"), soft_wrap=True)


def _environment(report: AuditReport | CaptureReport) -> str:
    """The backend's versions (compiler, torch, GPU), which the document leaves out."""
    from egf_audit.reports.environment import environment_rows
    from egf_audit.reports.model import AuditReport

    if not isinstance(report, AuditReport):
        return ""
    return "".join(f"; {key} {value}" for key, value in environment_rows(report))
