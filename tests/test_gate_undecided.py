"""The gate fails on what it could not decide (issue 30, items 4 and 5): an UNDECIDED invariant
fails `run --capture` unless its mode cannot decide it (invariants/undecided.py) or the user
allows it (`--allow-undecided`, `allow-undecided` in the settings table); every output says the
same; `--trainer generic` passes a program that is no SP14 trainer by design where what needs no
SP14 name holds, the SP14 invariants "not applicable"."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_fakes import invoke

from egf_audit.cli import capture_audit as audit_module
from egf_audit.cli.capture_audit import TRAINERS, audit_capture
from egf_audit.cli.gate_options import TRAINERS as OPTION_TRAINERS
from egf_audit.errors import UsageError
from egf_audit.invariants.registry import UNDECIDED
from egf_audit.invariants.undecided import REBUILD, STRUCTURALLY_UNDECIDED

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "capture"
LLMC = DATA / "llmc" / "recorded"
INFERRED_FAILING = ["EGF001[process 1]", "EGF002[process 1]", "EGF009[process 1]"]


@pytest.fixture(scope="module")
def inferred(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clean stand-in's capture as one made without --layout: no layout file."""
    folder = tmp_path_factory.mktemp("inferred") / "clean"
    shutil.copytree(DATA / "clean", folder)
    (folder / "layout.json.gz").unlink()
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["layout"] = None
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


# ---- docs/capture.md's table is the code's ----
def test_the_documented_table_of_what_is_allowed_undecided_is_the_codes():
    text = (ROOT / "docs" / "capture.md").read_text()
    region = text.split("<!-- BEGIN allowed-undecided")[1].split("<!-- END allowed-undecided")[0]
    rows = [line.split(" | ") for line in region.splitlines() if line.startswith("| ")][1:]
    documented: dict[str, dict[str, str]] = {}
    for mode, code, why in ((r[0][2:], r[1], r[2].removesuffix(" |")) for r in rows):
        mode = mode.split(" (")[0]
        documented.setdefault(mode, {})
        if code != "none":
            documented[mode][code] = why
    assert documented == STRUCTURALLY_UNDECIDED
    assert STRUCTURALLY_UNDECIDED[REBUILD] == {}


def test_the_two_lists_of_trainers_agree():
    assert TRAINERS == OPTION_TRAINERS == ("sp14", "generic")


# ---- an inferred capture with an undecided EGF001 fails, in every output ----
def test_an_inferred_capture_fails_on_its_undecided_egf001_in_one_line(inferred, tmp_path):
    result = invoke("run", "--capture", inferred, "--out", tmp_path / "d.md", "--quiet")
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1] == (
        "FAIL: trainer process: 3 undecided and not allowed: " + ", ".join(INFERRED_FAILING)
    )
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("egf-audit: EGF001")]
    assert "EGF001[process 1] is undecided by inference (no layout file)" in line
    named = re.findall(r"launch \d+ \(step \d+, sgemm\)", line)
    assert len(named) == 3 and "and 210 more" in line
    assert "a layout file naming the trainer's buffers decides them" in line


def test_json_junit_annotations_and_step_summary_say_the_same(inferred, tmp_path):
    js, xml, summary = tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "summary.md"
    result = invoke(
        "run", "--capture", inferred, "--out", tmp_path / "d.md", "--json", js, "--junit", xml,
        "--output-format", "github",
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
    )  # fmt: skip
    assert result.exit_code == 1
    data = json.loads(js.read_text())
    assert data["ok"] is False and data["invariants_ok"] is False
    assert data["undecided_not_allowed"] == INFERRED_FAILING
    assert data["allowed_undecided"] == ["EGF010[process 1]", "EGF013[process 1]"]
    gate = {i["code"]: i["verdicts"]["process 1"]["gate_status"] for i in data["invariants"]}
    assert gate["EGF001"] == "undecided" and gate["EGF010"] == "allowed undecided"
    assert gate["EGF003"] == "pass"
    assert sum("undecided by inference" in r for r in data["reasons"]) == 1
    junit = xml.read_text()
    assert junit.count('type="InvariantUndecided"') == 3
    assert 'failures="3"' in junit and 'skipped="2"' in junit
    assert junit.count('<skipped message="allowed undecided (a capture cannot decide it') == 2
    errors = [x for x in result.stdout.splitlines() if x.startswith("::error")]
    assert [x.split("::")[1] for x in errors] == [f"error title={c}" for c in INFERRED_CODES]
    notices = [x for x in result.stdout.splitlines() if x.startswith("::notice")]
    assert len(notices) == 2 and all("allowed undecided, not held" in x for x in notices)
    written = summary.read_text()
    assert "3 undecided and not allowed" in written and "undecided by inference" in written
    assert "❓ undecided" in written and "➖ allowed undecided" in written


INFERRED_CODES = ["EGF001", "EGF002", "EGF009"]


def test_allowing_the_undecided_ones_passes_and_lists_them_as_allowed_not_held(inferred, tmp_path):
    js = tmp_path / "r.json"
    result = invoke(
        "run", "--capture", inferred, "--out", tmp_path / "d.md", "--json", js,
        "--allow-undecided", "EGF001,EGF002", "--allow-undecided", " EGF009",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "PASS: trainer process: 8 verdicts hold in process 1; 5 allowed undecided "
        "(EGF001, EGF002, EGF009, EGF010, EGF013)"
    )
    data = json.loads(js.read_text())
    assert data["undecided_not_allowed"] == [] and len(data["allowed_undecided"]) == 5
    assert "--allow-undecided EGF001,EGF002,EGF009" in data["command"]
    # allowing one of them is not allowing all
    result = invoke(
        "run", "--capture", inferred, "--out", tmp_path / "d.md", "--allow-undecided", "EGF002"
    )
    assert result.exit_code == 1
    assert "2 undecided and not allowed: EGF001[process 1], EGF009[process 1]" in result.stdout


def test_a_deep_capture_allows_nothing_by_default():
    """deep/clean kept no values: EGF010 undecided, which a deep capture cannot excuse."""
    audit = audit_capture(DATA / "deep" / "clean")
    (process,) = audit.processes
    assert process.mode == "capture --deep" and process.allowed == frozenset()
    assert process.undecided_failing == ["EGF010"] and not audit.ok
    assert audit_capture(DATA / "deep" / "clean", allow=frozenset({"EGF010"})).ok


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--allow-undecided", "EGF099"], "--allow-undecided: 'EGF099' is no invariant's code"),
        (["--allow-undecided", "EGF010,,EGF013"], "has an empty code"),
        (["--allow-undecided", "egf010"], "'egf010' is no invariant's code"),
        (["--allow-undecided", "EGF010\u202e\nEGF013"], "is no invariant's code"),
        (["--allow-undecided", "x" * 5000], "is no invariant's code"),
        (["--trainer", "SP14"], "--trainer: 'SP14' is no kind of trainer (choose from sp14, gen"),
        (["--trainer", ""], "--trainer: '' is no kind of trainer"),
    ],
)
def test_a_hostile_option_value_is_one_line_and_exit_2(args, words, tmp_path):
    result = invoke("run", "--capture", DATA / "clean", "--out", tmp_path / "d.md", *args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("egf-audit: error: ") and words in line and len(line) < 300
    assert not (tmp_path / "d.md").exists()


@pytest.mark.parametrize("args", [["--trainer", "generic"], ["--allow-undecided", "EGF010"]])
def test_the_rebuild_refuses_what_shapes_only_a_captures_gate(args):
    result = invoke("run", "--device", "cpu", *args)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "the rebuild runs the SP14 step itself and decides every invariant" in line


def test_the_rebuild_allows_nothing_undecided(fake):
    """The rebuild never returns UNDECIDED; if a check ever did, the gate would fail it."""
    fake({"EGF004": UNDECIDED})
    result = invoke("run", "--device", "cpu", "--json", "r.json")
    assert result.exit_code == 1
    data = json.loads(Path("r.json").read_text())
    assert data["undecided_not_allowed"] == ["EGF004[sentinel]", "EGF004[live]"]
    assert "2 undecided and not allowed" in data["verdict"]


# ---- the settings table ----
def _table(workdir: Path, text: str) -> None:
    (workdir / ".git").mkdir(exist_ok=True)
    (workdir / "pyproject.toml").write_text("[tool.egf-audit]\n" + text)


def test_the_table_s_trainer_and_allow_undecided_shape_the_capture_gate(workdir, inferred):
    _table(workdir, 'trainer = "generic"\nallow-undecided = ["EGF001", "EGF002,EGF009"]\n')
    result = invoke("run", "--capture", LLMC / "llmc", "--out", "d.md")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith("PASS: generic program: 1 verdict holds")
    result = invoke("run", "--capture", inferred, "--out", "d.md")
    assert result.exit_code == 0, result.output
    # the command line overrides the table's trainer
    result = invoke("run", "--capture", LLMC / "llmc", "--out", "d.md", "--trainer", "sp14")
    assert result.exit_code == 1 and "no process is an SP14 trainer" in result.stdout


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('trainer = "other"\n', "trainer: 'other' is no kind of trainer"),
        ("trainer = 3\n", "trainer: 3 is no kind of trainer"),
        ('allow-undecided = "EGF010"\n', "allow-undecided must be a list of codes"),
        ('allow-undecided = ["EGF0100"]\n', "allow-undecided: 'EGF0100' is no invariant's code"),
        ("allow-undecided = [10]\n", "allow-undecided: 10 is not a string of codes"),
        ('allow_undecided = ["EGF010"]\n', "unknown key 'allow_undecided'"),
    ],
)
def test_a_bad_table_value_names_the_key_and_the_file(workdir, text, words):
    _table(workdir, text)
    result = invoke("run", "--capture", DATA / "clean", "--out", "d.md")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert "[tool.egf-audit] in pyproject.toml" in line and words in line


# ---- --trainer generic ----
def test_a_generic_program_shows_not_applicable_as_its_own_status(tmp_path):
    js, xml, doc = tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "d.md"
    result = invoke(
        "run", "--capture", LLMC / "llmc", "--out", doc, "--json", js, "--junit", xml,
        "--trainer", "generic",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "PASS: generic program: 1 verdict holds in process 1; 1 allowed undecided (EGF013); "
        "11 not applicable (SP14 invariants)"
    )
    data = json.loads(js.read_text())
    assert data["trainer"] == "generic" and len(data["not_applicable"]) == 11
    statuses = {i["code"]: i["verdicts"]["process 1"]["status"] for i in data["invariants"]}
    assert statuses["EGF005"] == "not applicable" and statuses["EGF001"] == "pass"
    junit = xml.read_text()
    assert 'skipped="12"' in junit and 'failures="0"' in junit
    assert junit.count('<skipped message="not applicable: ') == 11
    assert doc.read_text().count("⚪ not applicable") == 22  # the table and the findings
    assert "--trainer generic" in data["command"]


def test_the_planted_llmc_fails_as_a_generic_program(tmp_path):
    result = invoke(
        "run", "--capture", LLMC / "llmc-planted", "--out", tmp_path / "d.md", "-q",
        "--trainer", "generic",
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == (
        "FAIL: generic program: 1 of 13 verdicts failed: EGF001[process 1]"
    )


def test_a_generic_capture_with_nothing_to_judge_fails(monkeypatch):
    """No process ran a GEMM or an ABI kernel: the generic checks judged nothing, and that is
    no pass."""
    monkeypatch.setattr(audit_module, "gemm_count", lambda proc: 0)
    monkeypatch.setattr(audit_module, "abi_launches", lambda proc: 0)
    audit = audit_capture(DATA / "not-a-trainer", trainer="generic")
    assert audit.processes == [] and not audit.ok
    assert audit.missing[0].startswith("no process ran a cuBLAS GEMM or an ABI kernel")


def test_audit_capture_refuses_an_unknown_trainer():
    with pytest.raises(UsageError, match="trainer 'SP14': choose from sp14, generic"):
        audit_capture(DATA / "not-a-trainer", trainer="SP14")


def test_a_capture_asked_for_deep_allows_nothing_even_where_its_recorder_recorded_none(tmp_path):
    """--deep was asked for (the manifest) and the recorder did not record deep: incomplete, and
    EGF010 and EGF013 are not excused as a plain capture's would be."""
    folder = tmp_path / "clean"
    shutil.copytree(DATA / "clean", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["deep"] = True
    (folder / "manifest.json").write_text(json.dumps(manifest))
    audit = audit_capture(folder)
    (process,) = audit.processes
    assert not process.trace.capture.process.deep and process.mode == "capture --deep"
    assert process.allowed == frozenset() and process.undecided_failing == ["EGF010", "EGF013"]
    assert not audit.ok
