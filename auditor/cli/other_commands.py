"""The plain functions behind `mutants`, `invariants`, `explain`, `config` and `bench`. Like
commands.py they print nothing; the CLI turns their errors into exit codes."""

from __future__ import annotations

import importlib
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from egf_audit import __version__
from egf_audit.cli.outputs import STDOUT, Outputs, check_distinct
from egf_audit.cli.progress import NullProgress, Progress
from egf_audit.cli.validate import check_device, check_launch_timeout, check_steps
from egf_audit.errors import AuditEnvironmentError
from egf_audit.pipeline.config import check_run_memory, load_config
from egf_audit.runtime.kernel_sources import load_kernel_set
from egf_audit.scenarios import mutants
from egf_audit.scenarios.faults import FAULTS

MUTANTS_SCHEMA = "egf-audit/mutants/1"


@dataclass
class MutantsOutcome:
    result: mutants.MutantsResult
    all_faults: bool
    exit_code: int
    stdout: list[str] = field(default_factory=list)


def mutants_json(outcome: MutantsOutcome) -> str:
    data = {
        "schema": MUTANTS_SCHEMA,
        "egf_audit_version": __version__,
        "ok": outcome.exit_code == 0,
        "exit_code": outcome.exit_code,
        **outcome.result.as_dict(),
        "all_faults_ran": outcome.all_faults,
    }
    return json.dumps(data, indent=2) + "\n"


def mutants_junit(outcome: MutantsOutcome) -> str:
    """One testcase per fault (it fails when the fault survived or an invariant expected to
    catch it did not) and, when every fault ran, one per invariant (it fails when the invariant
    caught no fault)."""
    result = outcome.result
    suite = ET.Element("testsuite", name="egf-audit-mutants", errors="0")
    failures = skipped = 0
    for fault in result.faults:
        case = ET.SubElement(suite, "testcase", classname="egf_audit.mutants", name=fault.name)
        if not fault.applicable:
            ET.SubElement(case, "skipped", message=fault.note or "not applicable")
            skipped += 1
        elif fault.survived:
            ET.SubElement(
                case, "failure", message=f"fault {fault.name} survived: no invariant failed on it"
            )
            failures += 1
        elif fault.missed:
            expected = ", ".join(fault.missed)
            message = f"fault {fault.name}: {expected} expected to catch it but did not"
            ET.SubElement(case, "failure", message=message)
            failures += 1
        else:
            out = ET.SubElement(case, "system-out")
            out.text = f"caught by {', '.join(fault.caught_by)}"
    if outcome.all_faults:
        for code in result.codes:
            case = ET.SubElement(suite, "testcase", classname="egf_audit.invariants", name=code)
            if code in result.idle_invariants:
                ET.SubElement(case, "failure", message=f"{code} caught no fault")
                failures += 1
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("tests", str(len(suite)))
    suites = ET.Element("testsuites", name="egf-audit")
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


def run_mutants(
    device: str = "auto",
    preset: str | None = None,
    config_path: Path | None = None,
    seed: int | None = None,
    steps: int = 2,
    only: list[str] | None = None,
    kernels_dir: Path | None = None,
    json_out: Path | None = None,
    junit_out: Path | None = None,
    output_format: str = "text",
    progress: Progress | None = None,
    launch_timeout_s: float | None = None,
) -> MutantsOutcome:
    """`egf-audit mutants`: the audit once per fault. Exit 1 when a fault survives or, when
    every fault ran, an invariant caught none."""
    progress = progress or NullProgress()
    check_device(device)
    check_steps(steps)
    check_launch_timeout(launch_timeout_s)
    stdout_format = STDOUT if output_format in ("json", "junit") else None
    check_distinct(
        {
            "--json": json_out,
            "--junit": junit_out,
            f"--output-format {output_format}": stdout_format,
        }
    )
    faults = mutants.select_faults(only)  # an unknown name is a UsageError before any work
    config = load_config(config_path, preset, seed)
    check_run_memory(config.dims, steps)
    kernels = load_kernel_set(kernels_dir)
    progress.plan(len(faults))
    result = mutants.run_mutants(
        config,
        device,
        kernels,
        faults,
        steps=steps,
        progress=progress.step,
        launch_timeout_s=launch_timeout_s,
    )
    all_faults = {f.name for f in faults} == {f.name for f in FAULTS}
    outcome = MutantsOutcome(result, all_faults, 0 if result.ok(all_faults) else 1)
    outputs = Outputs()
    outputs.add(json_out, mutants_json(outcome))
    outputs.add(junit_out, mutants_junit(outcome))
    if output_format == "json":
        outputs.add(STDOUT, mutants_json(outcome))
    elif output_format == "junit":
        outputs.add(STDOUT, mutants_junit(outcome))
    outputs.write()
    outcome.stdout = outputs.stdout
    return outcome


# ---- bench ----
def bench(
    device: str = "auto",
    batch_sizes: list[int] | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    json_out: Path | None = None,
    markdown_out: Path | None = None,
    kernels_dir: Path | None = None,
    profile: bool = False,
) -> int:
    """`egf-audit bench`, delegated to egf_audit.bench, which validates its own options and
    returns the exit code. Imported only when asked for. None = let the bench choose."""
    try:
        module = importlib.import_module("egf_audit.bench.run")
    except ModuleNotFoundError as exc:
        if exc.name != "egf_audit.bench.run":
            raise  # something the bench imports is missing: an unexpected error, exit 3
        raise AuditEnvironmentError(
            "egf-audit bench is not available: this installation has no egf_audit.bench.run module"
        ) from None
    code = module.bench_command(
        device=device,
        batch_sizes=list(batch_sizes) if batch_sizes else None,
        repeats=repeats,
        warmup=warmup,
        json_out=json_out,
        markdown_out=markdown_out,
        kernels_dir=kernels_dir,
        profile=profile,
    )
    return int(code)
