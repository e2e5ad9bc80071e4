"""The command line through typer's CliRunner: every exit code, the document's determinism and
--check, the CI outputs, and the other commands.

Most tests swap in a fake invariant registry (the real entries with a constant check) and reuse
one recorded audit, so they are fast and do not depend on which invariants pass. The tests under
"the real audit, end to end" run everything for real: the clean audit must pass.

Long on purpose: every command and exit code of the command line shares the fakes above; the
CI conventions and the plain command functions have files of their own.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_fakes import CODES, DOC, REAL_INVARIANTS, fake_mutants, fake_registry, invoke

from egf_audit import invariants
from egf_audit.invariants.registry import FAIL, WARN
from egf_audit.scenarios.audit import mode_scenarios
from egf_audit.scenarios.faults import FAULTS, FAULTS_BY_NAME

MODES = ("sentinel", "live")


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("egf-audit: error:")]


def assert_one_line_error(result, code: int, fragment: str) -> None:
    assert result.exit_code == code, result.output
    errors = error_lines(result)
    assert len(errors) == 1, result.stderr
    assert fragment in errors[0]
    assert "Traceback" not in result.output


# ---- help and the small commands ----
@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]])
def test_help_documents_the_exit_codes(args):
    result = invoke(*args)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for fragment in ("Exit codes", "0 every invariant holds", "1 an invariant failed", "2 bad"):
        assert fragment in text
    assert "3 environment or internal error" in text


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("egf-audit ")


def test_invariants_lists_every_code_and_slug():
    result = invoke("invariants")
    assert result.exit_code == 0
    for inv in REAL_INVARIANTS:
        assert inv.code in result.stdout
        assert inv.slug in result.stdout


def test_explain_raw_prints_the_invariants_doc_any_case():
    result = invoke("explain", "egf005", "--raw")
    assert result.exit_code == 0
    assert result.stdout == invariants.INVARIANTS_BY_CODE["EGF005"].doc()


@pytest.mark.parametrize("name", ["EGF003", "wire-zero-under-sentinel"])
def test_explain_renders_markdown_by_code_or_slug(name):
    result = invoke("explain", name)
    assert result.exit_code == 0
    inv = invariants.INVARIANTS_BY_CODE["EGF003"]
    assert result.stdout.splitlines()[0].strip() == f"{inv.code} {inv.slug}"
    assert "What it proves" in result.stdout
    assert "## What it proves" not in result.stdout  # rendered, not raw markdown


def test_explain_unknown_code_is_usage_error():
    assert_one_line_error(invoke("explain", "EGF999"), 2, "unknown invariant 'EGF999'")


# ---- exit code 2: bad usage or config, nothing written ----
USAGE_CASES = {
    "unknown preset": ([], ["--preset", "huge"], "unknown preset 'huge'"),
    "malformed TOML": (["dims = ["], ["--config", "bad.toml"], "is not valid TOML"),
    "zero dimension": (["[dims]", "B = 0"], ["--config", "bad.toml"], "dims.B must be >= 1"),
    "negative dimension": (
        ["[dims]", "SH2 = -3"],
        ["--config", "bad.toml"],
        "dims.SH2 must be >= 1",
    ),
    "missing config file": ([], ["--config", "missing.toml"], "does not exist"),
    "unknown device": ([], ["--device", "tpu"], "unknown device 'tpu'"),
    "unknown mode": ([], ["--mode", "all"], "unknown mode 'all'"),
    "zero steps": ([], ["--steps", "0"], "--steps must be at least 1"),
}


@pytest.mark.parametrize("case", USAGE_CASES.values(), ids=USAGE_CASES.keys())
def test_bad_usage_or_config_exits_2_in_one_line_and_writes_nothing(workdir, case):
    toml, args, fragment = case
    if toml:
        (workdir / "bad.toml").write_text("\n".join(toml) + "\n")
    result = invoke("run", "--device", "cpu", *args)
    assert_one_line_error(result, 2, fragment)
    assert not (workdir / "docs").exists()


def test_unknown_fault_is_usage_error(workdir):
    result = invoke("mutants", "--device", "cpu", "--only", "no-such-fault")
    assert_one_line_error(result, 2, "unknown fault 'no-such-fault'")


# ---- exit code 3: environment and internal errors, nothing written ----
def test_device_cuda_without_gpu_exits_3_and_writes_nothing(workdir, monkeypatch):
    monkeypatch.setattr("egf_audit.runtime.backends.cuda_usable", lambda: (False, "no CUDA device"))
    result = invoke("run", "--device", "cuda")
    assert_one_line_error(result, 3, "--device cuda asked for, but no usable GPU")
    assert not (workdir / "docs").exists()


def test_output_path_that_cannot_be_created_exits_3_without_partial_file(fake, workdir):
    (workdir / "blocker").write_text("a file where a folder should be\n")
    result = invoke("run", "--device", "cpu", "--out", "blocker/sub/audit.md")
    assert_one_line_error(result, 3, "cannot write blocker/sub/audit.md")
    assert sorted(p.name for p in workdir.iterdir()) == [".git", "blocker"]


def test_unwritable_second_output_leaves_existing_document_untouched(fake, workdir):
    assert invoke("run", "--device", "cpu").exit_code == 0
    before = DOC.read_bytes()
    fake({"EGF003": FAIL})  # the next document would differ
    (workdir / "blocker").write_text("x\n")
    result = invoke("run", "--device", "cpu", "--json", "blocker/r.json")
    assert_one_line_error(result, 3, "cannot write blocker/r.json")
    assert DOC.read_bytes() == before
    assert [p.name for p in DOC.parent.iterdir()] == [DOC.name]  # no temporary left


def test_kernel_that_does_not_compile_exits_3_naming_the_file(workdir):
    bundled = Path(__file__).resolve().parents[1] / "kernels" / "sp14_scale_wire_col_kernel.cu"
    broken = workdir / "mine"
    broken.mkdir()
    # the entry point's signature is kept (it passes the ABI check); the body does not compile
    source = bundled.read_text().rstrip().rstrip("}") + " this is not C++ }\n"
    (broken / bundled.name).write_text(source)
    result = invoke("run", "--device", "cpu", "--kernels", broken)
    assert_one_line_error(result, 3, "sp14_scale_wire_col_kernel.cu")
    assert not (workdir / "docs").exists()


def test_crashed_check_exits_3_with_traceback_only_under_debug(fake, workdir, monkeypatch):
    def crash(run, mode):
        raise ZeroDivisionError("division by zero")

    registry = list(fake_registry())
    registry[0] = dataclasses.replace(registry[0], check=crash)
    monkeypatch.setattr(invariants, "INVARIANTS", tuple(registry))
    result = invoke("run", "--device", "cpu")
    assert_one_line_error(result, 3, "EGF001 (sentinel) crashed: ZeroDivisionError")
    assert not (workdir / "docs").exists()
    debug = invoke("run", "--device", "cpu", "--debug")
    assert debug.exit_code == 3
    assert "Traceback" in debug.stderr


def test_unexpected_internal_error_exits_3(fake, monkeypatch):
    def broken(report):
        raise RuntimeError("renderer exploded")

    monkeypatch.setattr("egf_audit.reports.document.render_document", broken)
    result = invoke("run", "--device", "cpu")
    assert_one_line_error(result, 3, "internal error: RuntimeError: renderer exploded")


# ---- exit codes 0 and 1, the document, --quiet ----
def test_passing_run_writes_document_and_prints_the_verdict_table(fake):
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 0, result.output
    for code in CODES:
        assert code in result.stdout
    assert f"PASS: all {len(CODES)} invariants hold" in result.stdout
    assert f"wrote {DOC}" in result.stderr
    text = DOC.read_text()
    assert "**Verdict:** PASS" in text
    assert "; device cpu; backend.backend cpu; backend.device " in result.stdout  # never in the doc
    assert "environment" not in text.lower().split("## terms")[1]


def test_warning_counts_as_holding(fake):
    fake({"EGF011": WARN})
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 0
    assert "warning, not a failure: EGF011" in DOC.read_text()


def test_failing_run_still_writes_the_document_and_exits_1(fake):
    fake({"EGF003": FAIL})
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 1
    text = DOC.read_text()
    verdicts = 2 * len(CODES)
    assert (
        f"**Verdict:** FAIL: 2 of {verdicts} verdicts failed: EGF003[sentinel], EGF003[live]"
        in (text)
    )
    assert "| Backward dispatch | ❌ broken |" in text


@pytest.mark.parametrize(("statuses", "code"), [({}, 0), ({"EGF007": FAIL}, 1)])
def test_quiet_changes_the_output_never_the_exit_code(fake, statuses, code):
    fake(statuses)
    loud = invoke("run", "--device", "cpu")
    quiet = invoke("run", "--device", "cpu", "--quiet")
    assert loud.exit_code == quiet.exit_code == code
    assert len(loud.stdout.splitlines()) > 12
    assert quiet.stdout == loud.stdout.splitlines()[-1] + "\n"  # only the verdict line
    assert ("EGF007[sentinel] failed" in quiet.stderr) == bool(statuses)


def test_one_mode_audits_only_that_mode(fake):
    result = invoke("run", "--device", "cpu", "--mode", "live", "--junit", "j.xml")
    assert result.exit_code == 0
    names = {case.get("name") for case in ET.parse("j.xml").getroot().iter("testcase")}
    assert names == {f"{code}[live]" for code in CODES}
    assert "| code | invariant | live | summary |" in DOC.read_text()


# ---- --check ----
def test_check_passes_on_a_fresh_document_and_fails_on_an_edited_one(fake):
    assert invoke("run", "--device", "cpu").exit_code == 0
    fresh = invoke("run", "--device", "cpu", "--check")
    assert fresh.exit_code == 0, fresh.output
    assert "is up to date" in fresh.stderr

    text = DOC.read_text()
    DOC.write_text(text.replace("## Wire status", "## Wire status (edited)"))
    stale = invoke("run", "--device", "cpu", "--check")
    assert stale.exit_code == 1
    assert f"{DOC.as_posix()} is STALE: run `egf-audit run --preset ci --seed 0" in stale.stderr
    assert "-## Wire status (edited)" in stale.stderr  # the unified diff
    assert "+## Wire status" in stale.stderr
    assert "Wire status (edited)" in DOC.read_text()  # --check never writes


def test_check_compares_every_line_of_the_document(fake):
    """The document holds nothing per machine, so --check has nothing to skip: a line edited
    anywhere, the last one included, is stale."""
    assert invoke("run", "--device", "cpu").exit_code == 0
    text = DOC.read_text()
    DOC.write_text(text.rstrip("\n") + " (made on another GPU)\n")
    result = invoke("run", "--device", "cpu", "--check")
    assert result.exit_code == 1
    assert "STALE" in result.stderr


def test_check_of_a_missing_document_is_stale(fake):
    result = invoke("run", "--device", "cpu", "--check")
    assert result.exit_code == 1
    assert "does not exist" in result.stderr
    assert not DOC.exists()


def test_check_fails_when_an_invariant_fails_even_if_current(fake):
    fake({"EGF001": FAIL})
    assert invoke("run", "--device", "cpu").exit_code == 1
    result = invoke("run", "--device", "cpu", "--check")
    assert result.exit_code == 1
    assert "is up to date" in result.stderr


# ---- CI outputs ----
def test_junit_has_one_testcase_per_invariant_per_mode(fake):
    fake({"EGF002": FAIL, "EGF011": WARN}, summary="column 48 <b> & 'x'")
    result = invoke("run", "--device", "cpu", "--junit", "j.xml")
    assert result.exit_code == 1
    suite = ET.parse("j.xml").getroot().find("testsuite")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases) == {f"{code}[{mode}]" for code in CODES for mode in MODES}
    assert suite.get("tests") == str(2 * len(CODES)) and suite.get("failures") == "2"
    failure = cases["EGF002[sentinel]"].find("failure")
    message = invariants.INVARIANTS_BY_CODE["EGF002"].message
    assert failure.get("message") == f"{message} (column 48 <b> & 'x': fail)"
    assert '"measured": 0.5' in failure.text
    warned = cases["EGF011[live]"]
    assert warned.find("failure") is None
    assert "column 48 <b> & 'x': warn" in warned.find("system-out").text
    assert cases["EGF001[live]"].find("failure") is None


def test_json_carries_verdicts_evidence_config_environment_kernels(fake):
    fake({"EGF004": FAIL})
    assert invoke("run", "--device", "cpu", "--json", "r.json").exit_code == 1
    data = json.loads(Path("r.json").read_text())
    assert data["ok"] is False and data["exit_code"] == 1
    assert data["config"]["dims"]["SH2"] == 48
    assert data["environment"]["device"] == "cpu"
    assert {k["name"] for k in data["kernels"]} >= {"sp14_scale_wire_col", "polyak_ema"}
    assert all(len(k["sha256"]) == 64 for k in data["kernels"])
    egf004 = next(i for i in data["invariants"] if i["code"] == "EGF004")
    assert egf004["verdicts"]["live"] == {
        "status": "fail",
        "gate_status": "fail",
        "summary": "fake verdict: fail",
        "evidence": {"measured": 0.5, "mode": "live"},
    }
    assert data["document"] == {
        "path": DOC.as_posix(),
        "checked": False,
        "stale": False,
        "reason": None,
    }
    assert data["run"]["backend"] == "cpu"
    assert data["run"]["picked"] == "cpu (--device cpu)"


def test_github_annotations_and_step_summary(fake, workdir, monkeypatch):
    summary = workdir / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    fake({"EGF005": FAIL, "EGF011": WARN}, summary="100% of\nrows")
    result = invoke("run", "--device", "cpu", "--quiet")
    assert result.exit_code == 1
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error")]
    notices = [line for line in result.stdout.splitlines() if line.startswith("::notice")]
    assert len(errors) == 2 and len(notices) == 1  # the residual once, not once per mode
    assert notices[0].startswith("::notice title=EGF011::wrapper-path-residual (a documented")
    assert "::warning" not in result.stdout
    assert errors[0].startswith("::error title=EGF005::[sentinel] target-net-untouched: ")
    assert errors[0].endswith("(100%25 of\\x0arows: fail)")  # a line break shown escaped
    assert "## egf-audit: FAIL" in summary.read_text()


def test_no_annotations_outside_github_actions(fake):
    fake({"EGF005": FAIL})
    result = invoke("run", "--device", "cpu")
    assert "::error" not in result.stdout


# ---- mutants ----
def test_mutants_one_real_fault_is_caught(workdir):
    result = invoke(
        "mutants", "--device", "cpu", "--steps", 1, "--only", "fwd-k-sh2", "--json", "m.json"
    )
    data = json.loads(Path("m.json").read_text())
    assert [f["name"] for f in data["faults"]] == ["fwd-k-sh2"]
    expected = FAULTS_BY_NAME["fwd-k-sh2"].expected
    assert data["faults"][0]["caught_by"] == list(expected)
    assert data["faults"][0]["expected"] == list(expected)
    assert result.exit_code == 0, result.output
    assert "fwd-k-sh2" in result.stdout


def test_mutants_every_fault_caught_and_every_invariant_used_exits_0(workdir, monkeypatch):
    codes = iter(CODES * 2)
    fake_mutants(monkeypatch, {f.name: (next(codes),) for f in FAULTS})
    result = invoke("mutants", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert f"every one of {len(FAULTS)} faults was caught" in result.stdout


def test_mutants_survivor_exits_1(workdir, monkeypatch):
    fake_mutants(monkeypatch, {"skip-scale": ()})
    result = invoke("mutants", "--device", "cpu", "--only", "skip-scale", "--only", "fwd-k-sh2")
    assert result.exit_code == 1
    assert "fault skip-scale survived" in result.stderr


def test_mutants_idle_invariant_exits_1_only_when_every_fault_ran(workdir, monkeypatch):
    fake_mutants(monkeypatch, {})  # EGF001 catches everything, the others nothing
    full = invoke("mutants", "--device", "cpu", "--json", "m.json")
    assert full.exit_code == 1
    assert "EGF012 caught no fault" in full.stderr
    assert json.loads(Path("m.json").read_text())["idle_invariants"] == CODES[1:]
    assert invoke("mutants", "--device", "cpu", "--only", "dw-k-sh2").exit_code == 0


# ---- bench ----
def test_bench_passes_its_options_and_returns_its_exit_code(monkeypatch):
    seen = {}

    def bench_command(**kwargs):
        seen.update(kwargs)
        return 1

    fake_module = types.ModuleType("egf_audit.bench.run")
    fake_module.bench_command = bench_command
    monkeypatch.setitem(sys.modules, "egf_audit.bench.run", fake_module)
    result = invoke(
        "bench", "--device", "cpu", "--batch", "64", "--batch", "128", "--repeats", 3, "--profile"
    )
    assert result.exit_code == 1
    assert seen == {
        "device": "cpu",
        "batch_sizes": [64, 128],
        "repeats": 3,
        "warmup": None,
        "json_out": None,
        "markdown_out": None,
        "kernels_dir": None,
        "profile": True,
    }


def test_bench_without_its_module_exits_3(monkeypatch):
    monkeypatch.setitem(sys.modules, "egf_audit.bench.run", None)
    assert_one_line_error(invoke("bench"), 3, "no egf_audit.bench.run module")


# ---- the real audit, end to end ----
REAL_ARGS = ("run", "--device", "cpu", "--json", "r.json", "--junit", "j.xml", "--trace", "t.jsonl")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The whole audit for real, once: registry, scenarios, document and every output."""
    root = tmp_path_factory.mktemp("real")
    (root / ".git").mkdir()  # a repository root, as the workdir fixture's
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for name, value in (("NO_COLOR", "1"), ("TERM", "dumb"), ("COLUMNS", "120")):
            mp.setenv(name, value)
        mp.delenv("GITHUB_ACTIONS", raising=False)
        result = invoke(*REAL_ARGS)
    return root, result


def test_real_run_passes_and_says_so_everywhere(real):
    root, result = real
    data = json.loads((root / "r.json").read_text())
    failed = [
        (i["code"], mode)
        for i in data["invariants"]
        for mode, v in i["verdicts"].items()
        if v["status"] == FAIL
    ]
    assert failed == []  # the bundled kernels and the production wiring hold everywhere
    assert result.exit_code == 0, result.output
    assert data["exit_code"] == 0 and data["ok"] is True
    assert (root / DOC).exists()


def test_two_runs_with_the_same_inputs_write_the_same_bytes(real, workdir):
    """Nothing that changes from run to run (timings, host) is in the document, so a second
    run on the same machine leaves a committed document as it was."""
    root, first = real
    second = invoke(*REAL_ARGS)
    assert second.exit_code == first.exit_code
    a, b = (root / DOC).read_bytes(), DOC.read_bytes()
    assert a == b
    for key in (b"platform", b"python", b"timings_s", b"host", b"torch 2", b"compiler"):
        assert key not in a


def test_real_junit_has_one_testcase_per_invariant_per_mode(real):
    root, _ = real
    names = [case.get("name") for case in ET.parse(root / "j.xml").getroot().iter("testcase")]
    assert sorted(names) == sorted(f"{inv.code}[{m}]" for inv in REAL_INVARIANTS for m in MODES)


def test_real_trace_holds_every_scenario_and_the_document_no_pointer(real):
    root, _ = real
    records = [json.loads(line) for line in (root / "t.jsonl").read_text().splitlines()]
    headers = [r["scenario"] for r in records if r["type"] == "trace"]
    assert len(headers) == sum(len(mode_scenarios(m)) for m in MODES) + 2
    pointers = {str(b["pointer"]) for r in records if r["type"] == "launch" for b in r["bindings"]}
    pointers = {p for p in pointers if len(p) >= 6}  # raw addresses, not small numbers
    assert pointers
    document = (root / DOC).read_text()
    assert not [p for p in pointers if p in document]


@pytest.mark.gpu
def test_document_made_on_the_gpu_is_the_cpus_byte_for_byte(workdir, monkeypatch):
    documents = {}
    for device in ("cuda", "cpu"):
        (workdir / device / ".git").mkdir(parents=True)  # two checkouts of one repository
        monkeypatch.chdir(workdir / device)
        result = invoke("run", "--device", device)
        assert result.exit_code == 0, result.output  # the clean audit holds on both
        documents[device] = (workdir / device / DOC).read_text()
    assert documents["cuda"] == documents["cpu"]
