"""`egf-audit capture`: the typer command. The recorder, its build and the capture checks live
in egf_audit.capture and load when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from egf_audit.cli.options import SETTINGS_TABLE, Debug, exit_codes, with_help
from egf_audit.cli.project import ProjectSettings, find_settings, near
from egf_audit.errors import UsageError

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


@with_help()
def capture(
    command: Annotated[list[str], typer.Argument(help="The trainer's command, after --.")],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help=f"The capture folder (default: capture in the {SETTINGS_TABLE} table).",
            metavar="DIR",
        ),
    ] = None,
    layout: Annotated[
        Path | None,
        typer.Option(
            "--layout",
            help="Where the command writes its layout file (docs/capture.md).",
            metavar="FILE",
        ),
    ] = None,
    snapshot: Annotated[
        list[str] | None,
        typer.Option(
            "--snapshot",
            help="Snapshot around this kernel (repeatable; 'none': no snapshots).",
            metavar="KERNEL",
        ),
    ] = None,
    values_max: Annotated[
        int | None,
        typer.Option(
            "--values-max", help="Keep at most this many values of a snapshot region.", metavar="N"
        ),
    ] = None,
    deep: Annotated[
        bool,
        typer.Option(
            "--deep",
            help="Compare every allocation after every launch (smoke tests at small shapes).",
        ),
    ] = False,
    deep_values_max: Annotated[
        int | None,
        typer.Option(
            "--deep-values-max",
            help="With --deep: keep the bytes of every change up to this many in all "
            "(default 1 GiB; 0 keeps none, and EGF010 is then undecided).",
            metavar="BYTES",
        ),
    ] = None,
    cpu: Annotated[
        bool,
        typer.Option(
            "--cpu",
            help="Without a GPU: run the command on egf-audit's CUDA libraries for the CPU "
            "(docs/capture.md).",
        ),
    ] = False,
    kernels: Annotated[
        Path | None,
        typer.Option(
            "--kernels",
            help="With --cpu: the folder of the trainer's kernel sources (.cu) its launches run.",
            metavar="DIR",
        ),
    ] = None,
    debug: Debug = False,
) -> None:
    """Run the trainer's own command with egf-audit's recorder injected (CUPTI) and write its
    launches, GEMMs and snapshots to --out; then `egf-audit run --capture DIR` audits it.
    With --cpu the command runs without a GPU, on egf-audit's own CUDA libraries.

    Exits with the command's own exit code; 2 on bad usage, or when --cpu refused a call it
    does not model; 3 when CUPTI, cuda.h or a usable GPU is missing (the CUDA driver is asked),
    the recorder did not load, or the command recorded no launch."""
    with exit_codes(debug):
        # the table's capture folder, unless --out names one: an error about it names the key
        settings = find_settings() if out is None else ProjectSettings(root=Path.cwd())
        if out is None:
            out = _settings_capture(settings)
    with exit_codes(debug), settings.naming(["capture"], option_key={"out": "capture"}):
        from egf_audit.capture import cli

        code = cli.capture(
            command, out, layout, snapshot, values_max, deep, deep_values_max, cpu, kernels
        )
    raise typer.Exit(code)


def _settings_capture(settings: ProjectSettings) -> Path:
    if settings.capture is None:
        raise UsageError(
            '--out DIR is missing: name the capture folder, or set capture = "DIR" in the '
            "[tool.egf-audit] table of pyproject.toml"
        )
    return near(settings.capture)
