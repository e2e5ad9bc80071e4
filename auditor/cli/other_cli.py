"""The typer commands besides `run`: mutants, invariants, explain, config, bench."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from egf_audit.cli.options import (
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
from egf_audit.cli.progress import progress_for
from egf_audit.cli.project import find_settings, given, setting
from egf_audit.errors import UsageError


@with_help()
def mutants(
    ctx: typer.Context,
    device: Device = "auto",
    preset: Preset = None,
    config: ConfigFile = None,
    seed: Seed = None,
    steps: Steps = 2,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Run only this fault (repeatable); --list names every fault.",
            metavar="NAME",
        ),
    ] = None,
    list_faults: Annotated[
        bool,
        typer.Option("--list", help="List the faults with their bugs and exit.", metavar=""),
    ] = False,
    json_out: JsonOut = None,
    junit: JunitOut = None,
    output_format: OutputFormat = "text",
    kernels: KernelsDir = None,
    launch_timeout: LaunchTimeout = None,
    isolated: Isolated = False,
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """Prove every invariant can fail: the audit once per fault, and the kill matrix.

    Exits 1 when a fault survives (no invariant fails on it) or, when every fault ran, when
    an invariant caught no fault. Options not given come from the [tool.egf-audit] table, as
    for `run`.
    """
    stdout, stderr = consoles()
    if list_faults:
        from egf_audit.cli.fault_list import fault_list  # no torch: the list is static text
        from egf_audit.scenarios.faults import FAULTS

        stdout.print(fault_list(FAULTS))
        raise typer.Exit(0)
    with exit_codes(debug):
        settings = find_settings(isolated=isolated)
    supplied = [k for k in ("device", "preset", "config", "kernels") if not given(ctx, k)]
    with exit_codes(debug), settings.naming(supplied):
        check_output_format(output_format)
        from egf_audit.cli import other_commands

        with progress_for(stderr, quiet) as progress:
            outcome = other_commands.run_mutants(
                device=setting(ctx, settings, "device", device),
                preset=setting(ctx, settings, "preset", preset),
                config_path=setting(ctx, settings, "config", config),
                seed=seed,
                steps=steps,
                only=only,
                kernels_dir=setting(ctx, settings, "kernels", kernels),
                json_out=json_out,
                junit_out=junit,
                output_format=output_format,
                progress=progress,
                launch_timeout_s=launch_timeout,
            )
    from egf_audit.cli.tables import kill_matrix

    result = outcome.result
    for payload in outcome.stdout:
        stdout.file.write(payload)
    text = output_format == "text"
    if text and not quiet:
        stdout.print(kill_matrix(result))
    problems = [f"fault {name} survived: no invariant failed on it" for name in result.survivors]
    if outcome.all_faults:
        problems += [f"{code} caught no fault" for code in result.idle_invariants]
    problems += [
        f"fault {name}: {', '.join(codes)} expected to catch it but did not"
        for name, codes in result.missed.items()
    ]
    for problem in problems:
        stderr.print(Text(f"egf-audit: {problem}"), soft_wrap=True)
    if output_format == "github":
        for problem in problems:
            stdout.file.write(f"::error title=egf-audit mutants::{problem}\n")
    if text:
        ran = [f for f in result.faults if f.applicable]
        line = (
            f"FAIL: {len(problems)} problem(s) in the kill matrix"
            if problems
            else f"PASS: every one of {len(ran)} faults was caught"
        )
        skipped = [f.name for f in result.faults if not f.applicable]
        if skipped:
            line += f"; not applicable to these kernel sources: {', '.join(skipped)}"
        stdout.print(Text(line), soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


@with_help()
def list_invariants(
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the invariants as JSON.", metavar="")
    ] = False,
) -> None:
    """List the invariants: code, slug and one-line message."""
    stdout, _ = consoles()
    from egf_audit.cli import explain as texts

    if json_out:
        stdout.file.write(texts.invariants_json())
        return
    stdout.print(texts.invariants_table())


@with_help()
def explain(
    name: Annotated[
        str,
        typer.Argument(
            help="An invariant code or slug, e.g. EGF003 or wire-zero-under-sentinel.",
            metavar="CODE|SLUG",
        ),
    ],
    raw: Annotated[
        bool, typer.Option("--raw", help="Print the markdown source as is.", metavar="")
    ] = False,
) -> None:
    """Print an invariant's full text: what it proves, why, how it is measured, the bug."""
    stdout, _ = consoles()
    with exit_codes(debug=False):
        from egf_audit.cli import explain as texts

        text = texts.explain(name)
    if raw:
        stdout.file.write(text)
    else:
        from rich.markdown import Markdown  # markdown-it and pygments: only `explain` needs them

        stdout.print(Markdown(text))


@with_help()
def config(
    example: Annotated[
        bool,
        typer.Option(
            "--example", help="Print an example config with every key and its range.", metavar=""
        ),
    ] = False,
) -> None:
    """The TOML config of `--config`: `--example` prints every key with its range (the same as
    docs/config.md)."""
    with exit_codes(debug=False):
        from egf_audit.cli.config_example import example_toml

        if not example:
            raise UsageError("config: add --example to print an example config with every key")
        sys.stdout.write(example_toml())


@with_help()
def bench(
    device: Device = "auto",
    batch: Annotated[
        list[int] | None,
        typer.Option(
            "--batch",
            help="Batch size to time (repeatable; default 256 1024 4096 16384 65536 on cuda, "
            "smaller on cpu).",
            metavar="B",
        ),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option("--repeats", help="Timed repeats per batch size (default: the bench's)."),
    ] = None,
    warmup: Annotated[
        int | None, typer.Option("--warmup", help="Untimed warm-up runs (default: the bench's).")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the results as JSON here.")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Write the results as a markdown table here.")
    ] = None,
    kernels: KernelsDir = None,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Also show where the plain step's GPU time goes, kernel by kernel (cuda), and "
            "where an audit's own time goes: by phase, invariant, scenario and kind of work.",
        ),
    ] = False,
    debug: Debug = False,
) -> None:
    """Time the plain (unrecorded) pipeline step at several batch sizes."""
    with exit_codes(debug):
        from egf_audit.cli import other_commands

        code = other_commands.bench(
            device=device,
            batch_sizes=batch,
            repeats=repeats,
            warmup=warmup,
            json_out=json_out,
            markdown_out=markdown,
            kernels_dir=kernels,
            profile=profile,
        )
    raise typer.Exit(code)
