"""The CI gate as a trainer repository meets it: one verdict in every output, a document that
changes only with the result, paths that agree across spellings, GitHub annotations on the
diff, outputs that never replace what a path points at, signals, and the pre-commit hook.

Fast tests reuse one recorded audit with a constant-verdict registry (as test_cli.py does);
those that need a real kernel or a real process say so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_fakes import CODES, DOC, invoke

from egf_audit.cli import commands
from egf_audit.invariants.registry import FAIL, WARN
from egf_audit.kernels import KERNELS

ROOT = Path(__file__).resolve().parents[1]
N = len(CODES)  # invariants in the registry
SCALE_FILE = next(k.file for k in KERNELS if k.name == "sp14_scale_wire_col")
VARIANTS = Path(__file__).parent / "kernel_variants"


def make_stale() -> None:
    text = DOC.read_text()
    DOC.write_text(text.replace("## Wire status", "## Wire status (edited)"))


# ---- 1. the document changes only when the result changes ----
def test_a_second_run_on_a_clean_clone_leaves_git_clean(tmp_path, monkeypatch):
    """The real audit twice in a git repository: `git diff --exit-code` is clean after the
    second, so regenerating the document never dirties a checkout or conflicts two PRs."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    monkeypatch.chdir(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    first = invoke("run", "--device", "cpu")
    assert first.exit_code == 0, first.output
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "audit"], check=True)
    second = invoke("run", "--device", "cpu")
    assert second.exit_code == 0, second.output
    diff = subprocess.run(["git", "diff", "--exit-code"], capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout
    assert invoke("run", "--device", "cpu", "--check").exit_code == 0


def test_timings_host_and_platform_go_to_stdout_and_json_not_the_document(fake):
    result = invoke("run", "--device", "cpu", "--json", "r.json")
    assert result.exit_code == 0
    run = json.loads(Path("r.json").read_text())["run"]
    assert set(run) >= {"host", "python", "platform", "timings_s", "picked"}
    assert f"(host {run['host']}, python {run['python']}" in result.stdout
    text = DOC.read_text()
    assert run["platform"] not in text and "timings_s" not in text


# ---- 2. paths relative to the repository root ----
def _kernels(folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copyfile(
        VARIANTS / "sp14_scale_wire_col" / "ok_grid_stride_if_else.cu", folder / SCALE_FILE
    )
    return folder


def test_kernels_dir_relative_dotted_and_absolute_give_the_same_document(fake, workdir):
    _kernels(workdir / "trainer" / "kernels")
    spellings = ["trainer/kernels", "./trainer/kernels", str(workdir / "trainer" / "kernels")]
    documents = []
    for spelling in spellings:
        assert invoke("run", "--device", "cpu", "--kernels", spelling).exit_code == 0
        documents.append(DOC.read_bytes())
        assert invoke("run", "--device", "cpu", "--kernels", spelling, "--check").exit_code == 0
    assert documents[0] == documents[1] == documents[2]
    text = documents[0].decode()
    assert f"| `sp14_scale_wire_col` | `trainer/kernels/{SCALE_FILE}` | kernels-dir |" in text
    assert "egf-audit run --kernels trainer/kernels --preset ci" in text
    assert str(workdir) not in text


def test_from_a_subfolder_the_document_names_paths_from_the_root(fake, workdir, monkeypatch):
    _kernels(workdir / "trainer" / "kernels")
    (workdir / "trainer" / "sub").mkdir()
    monkeypatch.chdir(workdir / "trainer" / "sub")
    out = "../../docs/dqn-wire-up-audit.md"
    assert invoke("run", "--device", "cpu", "--kernels", "../kernels", "--out", out).exit_code == 0
    text = (workdir / DOC).read_text()
    # the default --out spelled from the root is left out, as from the root
    assert (
        "egf-audit run --kernels trainer/kernels --preset ci --seed 0 --steps 2 --mode both\n"
        in text
    )


def test_the_stale_message_reproduces_every_option_that_shaped_the_document(fake, workdir):
    _kernels(workdir / "k")
    Path("c.toml").write_text('preset = "ci"\n[hyper]\ngamma = 0.98\n')
    options = ["--config", "c.toml", "--kernels", "k", "--seed", "3", "--steps", "1"]
    options += ["--mode", "live", "--out", "audit/doc.md"]
    assert invoke("run", "--device", "cpu", *options).exit_code == 0
    Path("audit/doc.md").write_text(Path("audit/doc.md").read_text().replace("## Terms", "## T"))
    result = invoke("run", "--device", "cpu", *options, "--check")
    assert result.exit_code == 1
    expected = (
        "egf-audit run --config c.toml --kernels k --preset ci --seed 3 --steps 1 --mode live "
        "--out audit/doc.md"
    )
    assert f"egf-audit: audit/doc.md is STALE: run `{expected}` and commit it" in result.stderr
    assert f"```sh\n{expected}\n```" in Path("audit/doc.md").read_text()


def test_a_document_an_editor_reformatted_is_stale_in_whitespace_only_and_says_where(
    fake, workdir, monkeypatch
):
    """Trailing spaces added by an editor change no source: the message says the difference is
    whitespace only and names the lines, never "made from other sources" or --kernels."""
    _kernels(workdir / "k")
    assert invoke("run", "--device", "cpu", "--kernels", "k").exit_code == 0
    lines = DOC.read_text().splitlines(keepends=True)
    sources = next(i for i, line in enumerate(lines) if line.startswith("**Sources:**"))
    for i in (sources, sources + 4):
        lines[i] = lines[i].replace("\n", "  \n")
    DOC.write_text("".join(lines))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(workdir / "summary.md"))
    result = invoke("run", "--device", "cpu", "--kernels", "k", "--check")
    assert result.exit_code == 1
    said = (
        f"differs from the regenerated audit in whitespace only (lines {sources + 1} and "
        f"{sources + 5} of the committed file: an editor or formatter changed them)"
    )
    stale = f"egf-audit: {DOC.as_posix()} is STALE: it {said}; the sources are the same: run "
    assert any(
        line.startswith(stale + "`egf-audit run --kernels k ") and line.endswith("and commit it")
        for line in result.stderr.splitlines()
    ), result.stderr
    assert "other sources" not in result.output and "pass --kernels" not in result.output
    assert f"file={DOC.as_posix()},line={sources + 1}::" in result.stdout
    # any other difference is still a plain stale document
    DOC.write_text(DOC.read_text().replace("## Wire status", "## Wire  status"))
    other = invoke("run", "--device", "cpu", "--kernels", "k", "--check")
    assert "whitespace only" in other.stderr  # a space inside a line is whitespace too
    DOC.write_text(DOC.read_text().replace("## Wire  status", "## Wire-status"))
    edited = invoke("run", "--device", "cpu", "--kernels", "k", "--check")
    assert edited.exit_code == 1 and "whitespace" not in edited.stderr


# ---- 3. one verdict everywhere ----
def test_a_stale_document_fails_in_json_junit_summary_and_the_last_line(fake, monkeypatch):
    summary = Path("summary.md")
    assert invoke("run", "--device", "cpu").exit_code == 0
    make_stale()
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = invoke("run", "--device", "cpu", "--check", "--json", "r.json", "--junit", "j.xml")
    assert result.exit_code == 1
    data = json.loads(Path("r.json").read_text())
    assert data["ok"] is False and data["invariants_ok"] is True and data["exit_code"] == 1
    assert data["document"] == {
        "path": "docs/dqn-wire-up-audit.md",
        "checked": True,
        "stale": True,
        "reason": "differs from the regenerated audit",
    }
    assert data["reasons"] == [
        "docs/dqn-wire-up-audit.md is STALE: it differs from the regenerated audit"
    ]
    suite = ET.parse("j.xml").getroot().find("testsuite")
    assert suite.get("failures") == "1" and suite.get("tests") == str(2 * N + 1)
    case = next(c for c in suite.iter("testcase") if c.get("name") == "document-current")
    assert case.find("failure").get("message") == (
        "docs/dqn-wire-up-audit.md is stale: it differs from the regenerated audit"
    )
    assert "-## Wire status (edited)" in case.find("failure").text
    last = result.stdout.splitlines()[-1]
    assert last.startswith(f"FAIL: docs/dqn-wire-up-audit.md is STALE (all {N} invariants hold")
    text = summary.read_text()
    assert text.startswith("## egf-audit: FAIL: docs/dqn-wire-up-audit.md is STALE")
    assert "<details><summary>stale diff</summary>" in text
    assert "```diff\n--- docs/dqn-wire-up-audit.md (committed)" in text
    assert "-## Wire status (edited)\n" in text


def test_a_current_document_has_a_passing_document_testcase(fake):
    assert invoke("run", "--device", "cpu").exit_code == 0
    assert invoke("run", "--device", "cpu", "--check", "--junit", "j.xml").exit_code == 0
    cases = {c.get("name"): c for c in ET.parse("j.xml").getroot().iter("testcase")}
    assert cases["document-current"].find("failure") is None


def test_a_failing_invariant_and_a_stale_document_say_both(fake):
    assert invoke("run", "--device", "cpu").exit_code == 0
    make_stale()
    fake({"EGF002": FAIL})
    result = invoke("run", "--device", "cpu", "--check")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == (
        f"FAIL: 2 of {2 * N} verdicts failed: EGF002[sentinel], EGF002[live]; "
        "docs/dqn-wire-up-audit.md is also STALE"
    )


# ---- 4. GitHub ----
def test_stale_annotation_points_at_the_documents_first_stale_line(fake, monkeypatch):
    assert invoke("run", "--device", "cpu").exit_code == 0
    make_stale()
    lineno = DOC.read_text().splitlines().index("## Wire status (edited)") + 1
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    result = invoke("run", "--device", "cpu", "--check", "--quiet")
    errors = [ln for ln in result.stdout.splitlines() if ln.startswith("::error")]
    assert errors == [
        "::error title=egf-audit --check,file=docs/dqn-wire-up-audit.md,"
        f"line={lineno}::docs/dqn-wire-up-audit.md is stale: it differs from the regenerated "
        "audit; run `egf-audit run --preset ci --seed 0 --steps 2 --mode both` from the "
        "repository root and commit the result"
    ]


def test_stale_line_near_the_end_is_the_committed_files_line(fake, monkeypatch):
    assert invoke("run", "--device", "cpu").exit_code == 0
    text = DOC.read_text().replace("## Reproduce", "## Reproduce (edited)")
    DOC.write_text(text)
    lineno = text.splitlines().index("## Reproduce (edited)") + 1
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    result = invoke("run", "--device", "cpu", "--check", "--quiet")
    assert f",line={lineno}::" in result.stdout


def test_a_failing_kernels_variant_is_annotated_on_its_file_and_line(workdir, monkeypatch):
    """The real audit of a trainer's scale kernel without its zero branch: EGF003 fails, and
    the annotation names the trainer's file and the line of its entry point."""
    folder = workdir / "trainer" / "kernels"
    folder.mkdir(parents=True)
    source = VARIANTS / "sp14_scale_wire_col" / "bad_no_zero_branch.cu"
    shutil.copyfile(source, folder / SCALE_FILE)
    lineno = next(
        i
        for i, line in enumerate(source.read_text().splitlines(), 1)
        if "sp14_scale_wire_col(" in line
    )
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    result = invoke("run", "--device", "cpu", "--kernels", "trainer/kernels", "--quiet")
    assert result.exit_code == 1
    egf003 = [ln for ln in result.stdout.splitlines() if ln.startswith("::error title=EGF003,")]
    assert len(egf003) == 2  # sentinel and live
    for line in egf003:
        assert line.startswith(
            f"::error title=EGF003,file=trainer/kernels/{SCALE_FILE},line={lineno}::"
        )


def test_bundled_kernels_give_no_file_to_annotate(fake, monkeypatch):
    fake({"EGF003": FAIL})
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    result = invoke("run", "--device", "cpu", "--quiet")
    errors = [ln for ln in result.stdout.splitlines() if ln.startswith("::error")]
    assert len(errors) == 2 and all("file=" not in ln for ln in errors)


def test_output_format_github_prints_annotations_outside_actions(fake):
    fake({"EGF005": FAIL, "EGF011": WARN})
    result = invoke("run", "--device", "cpu", "--output-format", "github")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert [ln.split("::")[1] for ln in lines[:-1]] == [
        "error title=EGF005",
        "error title=EGF005",
        "notice title=EGF011",
    ]
    assert lines[-1] == f"FAIL: 2 of {2 * N} verdicts failed: EGF005[sentinel], EGF005[live]"


def test_a_sanitizer_finding_fails_json_junit_and_the_last_line(fake, monkeypatch):
    """--sanitize findings decide the exit code, so every output says the same verdict."""
    finding = "compute-sanitizer memcheck: Invalid __global__ write of size 4 bytes in k"
    monkeypatch.setattr(commands.sanitize, "check_request", lambda device: None)
    monkeypatch.setattr(
        commands.sanitize,
        "sanitize",
        lambda req, config, backend: ({"memcheck": {"errors": 1}}, [finding]),
    )
    result = invoke("run", "--device", "cpu", "--sanitize", "--json", "r.json", "--junit", "j.xml")
    assert result.exit_code == 1
    data = json.loads(Path("r.json").read_text())
    assert data["ok"] is False and data["invariants_ok"] is True
    assert data["reasons"] == [finding]
    suite = ET.parse("j.xml").getroot().find("testsuite")
    assert suite.get("failures") == "1" and suite.get("tests") == str(2 * N + 1)
    case = next(c for c in suite.iter("testcase") if c.get("name") == "compute-sanitizer")
    assert case.find("failure").get("message") == finding
    last = result.stdout.splitlines()[-1]
    assert last.startswith(f"FAIL: compute-sanitizer reported 1 finding(s) (all {N} invariants")
