"""The trainer repository's [tool.egf-audit] table (auditor/cli/project.py): found from any
subfolder, paths relative to the file that names them, overridden by the command line, and a
repository that names its kernels is never audited from egf-audit's bundled ones."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_fakes import DOC, invoke

from egf_audit.cli.project import MAX_SETTINGS_BYTES, find_settings
from egf_audit.errors import UsageError
from egf_audit.kernels import KERNELS, bundled_source

VARIANTS = Path(__file__).parent / "kernel_variants"
ACCUMULATE = "accumulate_d_h_s2_from_concat_kernel.cu"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def trainer_kernels(folder: Path) -> Path:
    """A trainer's complete kernel folder: every ABI kernel, as the trainer ships it."""
    folder.mkdir(parents=True, exist_ok=True)
    for spec in KERNELS:
        (folder / spec.file).write_text(bundled_source(spec.file))
    return folder


# ---- finding the table ----
def test_the_nearest_table_is_found_from_a_subfolder_and_paths_are_its_own(workdir):
    write(
        workdir / "pyproject.toml",
        """
        [project]
        name = "trainer"
        [tool.egf-audit]
        kernels = "cuda/kernels"
        preset = "prod"
        device = "cpu"
        out = "audit/wire.md"
        """,
    )
    deep = workdir / "src" / "deep"
    deep.mkdir(parents=True)
    settings = find_settings(deep)
    assert settings.file == workdir / "pyproject.toml"
    assert settings.root == workdir
    assert settings.kernels == workdir / "cuda" / "kernels"
    assert settings.out == workdir / "audit" / "wire.md"
    assert (settings.preset, settings.device, settings.config, settings.capture) == (
        "prod",
        "cpu",
        None,
        None,
    )


def test_the_nearest_file_wins_and_a_pyproject_without_the_table_is_passed_over(workdir):
    write(workdir / "pyproject.toml", '[tool.egf-audit]\npreset = "prod"\n')
    write(workdir / "pkg" / "pyproject.toml", '[project]\nname = "pkg"\n')  # no table
    settings = find_settings(workdir / "pkg")
    assert settings.file == workdir / "pyproject.toml" and settings.preset == "prod"
    write(workdir / "pkg" / "egf-audit.toml", 'preset = "ci"\n')  # beside a table-less one
    settings = find_settings(workdir / "pkg")
    assert settings.file == workdir / "pkg" / "egf-audit.toml" and settings.preset == "ci"


def test_two_settings_files_side_by_side_are_refused_naming_both(workdir):
    """egf-audit.toml beside a pyproject.toml that has the table: neither silently wins (the
    user edits one and the other is read); exit 2, naming both, from any subfolder."""
    write(workdir / "pyproject.toml", '[tool.egf-audit]\npreset = "prod"\n')
    write(workdir / "egf-audit.toml", 'preset = "ci"\n')
    with pytest.raises(UsageError, match="two settings files"):
        find_settings(workdir)
    (workdir / "src").mkdir()
    os.chdir(workdir / "src")
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert (
        "egf-audit: error: two settings files: ../egf-audit.toml and the [tool.egf-audit] table "
        "of ../pyproject.toml; keep one"
    ) in result.stderr
    assert invoke("run", "--device", "cpu", "--isolated", "--out", "x.md").exit_code == 0


def test_the_search_stops_at_the_repository_root(tmp_path):
    """A checkout never picks up the settings of the folder it was cloned into."""
    write(tmp_path / "pyproject.toml", '[tool.egf-audit]\npreset = "prod"\n')
    repo = tmp_path / "clone"
    (repo / ".git").mkdir(parents=True)
    settings = find_settings(repo)
    assert settings.file is None and settings.root == repo
    assert find_settings(repo / ".git").file is None


def test_isolated_ignores_the_table(workdir):
    write(workdir / "egf-audit.toml", 'preset = "prod"\n')
    settings = find_settings(workdir, isolated=True)
    assert settings.file is None and settings.preset is None and settings.root == workdir


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[tool.egf-audit]\nkernel = "k"\n', "unknown key 'kernel'"),
        ("[tool.egf-audit]\npreset = 3\n", "preset must be a non-empty string, got 3"),
        ('[tool.egf-audit]\ndevice = "tpu"\n', "device must be one of auto, cuda, cpu, got 'tpu'"),
        ('[tool.egf-audit]\nkernels = ""\n', "kernels must be a non-empty string"),
        ('[tool.egf-audit]\ncapture = "c"\nkernels = "k"\n', "keep one way of gating"),
        ("[tool.egf-audit\n", "not valid TOML"),
        ('[tool]\negf-audit = "x"\n', "must be a table of settings"),
    ],
)
def test_a_bad_table_is_one_line_and_exit_2(workdir, text, said):
    write(workdir / "pyproject.toml", text)
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
        find_settings(workdir)
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and said in result.stderr


def test_an_oversized_settings_file_is_refused_unread(workdir):
    (workdir / "egf-audit.toml").write_bytes(b"#" * (MAX_SETTINGS_BYTES + 1))
    with pytest.raises(UsageError, match="a settings file may hold at most"):
        find_settings(workdir)


def test_a_fifo_as_settings_file_is_refused_without_blocking(workdir):
    os.mkfifo(workdir / "egf-audit.toml")
    done = subprocess.run(
        [sys.executable, "-m", "egf_audit", "run", "--device", "cpu"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "is a FIFO (named pipe), not a regular file" in done.stderr
    assert done.stderr.count("\n") == 1


# ---- what `run` does with it (recorded audit: fast) ----
def test_the_document_is_found_from_any_subfolder(fake, workdir):
    assert invoke("run", "--device", "cpu").exit_code == 0
    sub = workdir / "src" / "models"
    sub.mkdir(parents=True)
    os.chdir(sub)
    result = invoke("run", "--device", "cpu", "--check")
    assert result.exit_code == 0, result.output
    assert "up to date" in result.stderr
    assert not (sub / DOC).exists()


def test_table_values_apply_and_the_command_line_overrides_them(fake, workdir):
    trainer_kernels(workdir / "cuda" / "kernels")
    write(workdir / "pyproject.toml", '[tool.egf-audit]\nkernels = "cuda/kernels"\nout = "a.md"\n')
    sub = workdir / "tools"
    sub.mkdir()
    os.chdir(sub)
    assert invoke("run", "--device", "cpu").exit_code == 0
    text = (workdir / "a.md").read_text()
    assert "**Sources:** the trainer's folder `cuda/kernels/` (20 of 20 kernels)." in text
    assert "egf-audit run --kernels cuda/kernels" in text and "--out a.md" in text
    # the command line wins: another document, from the bundled kernels
    assert invoke("run", "--device", "cpu", "--isolated", "--out", "b.md").exit_code == 0
    assert (
        "**Sources:** egf-audit's bundled reference kernels (20 of 20)."
        in (sub / "b.md").read_text()
    )


def test_a_table_naming_an_incomplete_kernels_folder_is_refused(fake, workdir):
    folder = trainer_kernels(workdir / "k")
    (folder / ACCUMULATE).unlink()
    write(workdir / "egf-audit.toml", 'kernels = "k"\n')
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 2
    assert (
        f'kernels = "k" (egf-audit.toml): the folder lacks 1 of 20 kernel files ({ACCUMULATE})'
        in result.stderr
    )
    assert "never from egf-audit's bundled ones" in result.stderr


TABLE_VALUE_ERRORS = {
    # key = value: (exit code, what the error says after `key = "value" (its file): `)
    "kernels-missing": ("kernels", "nope", 3, "no such directory"),
    "kernels-a-file": ("kernels", "afile", 3, "is a file, not a directory"),
    "kernels-empty": ("kernels", "empty", 3, "holds no known kernel file"),
    "config-missing": ("config", "missing.toml", 2, "config file ../missing.toml does not exist"),
    "config-content": ("config", "bad.toml", 2, "unknown config key bogus"),
    "preset": ("preset", "huge", 2, "unknown preset 'huge' (choose from ci, prod)"),
    "device": ("device", "cuda", 3, "no usable GPU"),
    "capture": ("capture", "nocap", 2, "no such folder"),
    "out": ("out", "afile/x.md", 3, "cannot write ../afile/x.md"),
}


@pytest.mark.parametrize(
    ("key", "value", "code", "said"), TABLE_VALUE_ERRORS.values(), ids=TABLE_VALUE_ERRORS.keys()
)
def test_an_error_from_a_table_value_names_the_key_and_its_file(
    fake, workdir, monkeypatch, key, value, code, said
):
    from egf_audit.runtime import backends

    monkeypatch.setattr(backends, "cuda_usable", lambda: (False, "no CUDA driver"))
    (workdir / "afile").write_text("")
    (workdir / "empty").mkdir()
    (workdir / "bad.toml").write_text("bogus = 1\n")
    write(workdir / "pyproject.toml", f'[tool.egf-audit]\n{key} = "{value}"\n')
    (workdir / "src").mkdir()
    os.chdir(workdir / "src")
    result = invoke("run")
    assert result.exit_code == code, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("egf-audit: error:")]
    assert len(errors) == 1, result.stderr
    named = f'egf-audit: error: {key} = "{value}" ([tool.egf-audit] in ../pyproject.toml): '
    assert errors[0].startswith(named) and said in errors[0], errors[0]
    assert f"--{key}" not in errors[0]


def test_a_kernels_option_naming_a_file_says_it_is_a_file(workdir):
    (workdir / "afile").write_text("")
    result = invoke("run", "--device", "cpu", "--kernels", "afile")
    assert result.exit_code == 3
    assert "egf-audit: error: --kernels afile: is a file, not a directory" in result.stderr


def test_a_bare_check_against_a_trainer_document_says_the_sources_differ(fake, workdir):
    """The user who forgot --kernels (and has no table) is told what happened, not only to
    regenerate: that advice would replace the trainer's audit with egf-audit's own."""
    trainer_kernels(workdir / "kernels")
    assert invoke("run", "--device", "cpu", "--kernels", "kernels").exit_code == 0
    result = invoke("run", "--device", "cpu", "--check")
    assert result.exit_code == 1
    assert (
        "was made from other sources (the trainer's folder `kernels/` (20 of 20 kernels)) than "
        "this run audited (egf-audit's bundled reference kernels (20 of 20).)"
    ) in result.stderr
    assert "pass --kernels DIR or set kernels" in result.stderr


def test_capture_in_the_table_refuses_rebuild_options_naming_the_table(fake, workdir):
    write(workdir / "egf-audit.toml", 'capture = "captures/trainer"\n')
    result = invoke("run", "--kernels", "k")
    assert result.exit_code == 2
    assert 'capture = "captures/trainer" (egf-audit.toml)' in result.stderr
    assert "--isolated" in result.stderr


# ---- the whole story, real audits: a fresh trainer repository ----
def test_a_bare_check_from_any_folder_audits_the_trainers_kernels_and_catches_a_stride_bug(
    workdir,
):
    kernels = trainer_kernels(workdir / "cuda" / "kernels")
    write(
        workdir / "pyproject.toml", '[tool.egf-audit]\nkernels = "cuda/kernels"\ndevice = "cpu"\n'
    )
    (workdir / "src").mkdir()
    os.chdir(workdir / "src")
    made = invoke("run")
    assert made.exit_code == 0, made.output
    assert (workdir / DOC).exists()
    os.chdir(workdir / "cuda")
    assert invoke("run", "--check").exit_code == 0
    bug = VARIANTS / "accumulate_d_h_s2_from_concat" / "bad_flat_index_ignores_ld.cu"
    (kernels / ACCUMULATE).write_text(bug.read_text())
    caught = invoke("run", "--check")
    assert caught.exit_code == 1
    assert "EGF007" in caught.stdout.splitlines()[-1]


def test_capture_writes_to_the_tables_capture_folder_unless_told(workdir):
    missing = invoke("capture", "--", "true")
    assert missing.exit_code == 2
    assert "--out DIR is missing" in missing.stderr
    write(workdir / "egf-audit.toml", 'capture = "captures/trainer"\n')
    from egf_audit.cli import capture_cli

    assert capture_cli._settings_capture(find_settings()) == Path("captures/trainer")
    (workdir / "captures").mkdir()
    (workdir / "captures" / "trainer").write_text("")
    refused = invoke("capture", "--", "true")
    assert refused.exit_code == 2
    assert (
        'egf-audit: error: capture = "captures/trainer" (egf-audit.toml): is not a folder but a '
        "file;"
    ) in refused.stderr


def test_mutants_reads_the_table_too(workdir):
    """`mutants` audits the same sources as `run`: the table's kernels folder (here one that does
    not exist, so the command stops at once and says which folder it read)."""
    write(workdir / "egf-audit.toml", 'kernels = "no-such-kernels"\n')
    result = invoke("mutants", "--device", "cpu", "--only", "skip-scale")
    assert result.exit_code == 3
    assert 'kernels = "no-such-kernels" (egf-audit.toml): no such directory' in result.stderr
    isolated = invoke("mutants", "--device", "cpu", "--only", "no-such-fault", "--isolated")
    assert "no-such-kernels" not in isolated.stderr


# ---- under GitHub Actions: an error is an annotation and a step summary too ----
def test_a_settings_error_under_github_actions_is_annotated_on_its_line_and_summarised(
    workdir, monkeypatch
):
    """Exit 2 before any audit ran still tells the pull request why: one ::error on the
    settings file's line, and the step summary says the gate did not run."""
    text = '[project]\nname = "trainer"\n\n[tool.egf-audit]\npreset = "ci"\nkernel = "k"\n'
    write(workdir / "pyproject.toml", text)
    summary = workdir / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    (workdir / "src").mkdir()
    os.chdir(workdir / "src")
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 2
    message = "[tool.egf-audit] in ../pyproject.toml: unknown key 'kernel' (known: "
    annotation = "::error title=egf-audit (exit 2),file=pyproject.toml,line=6::" + message
    assert [line for line in result.stdout.splitlines() if line.startswith(annotation)]
    said = summary.read_text()
    assert said.startswith("## egf-audit: ERROR (exit 2), no audit ran\n")
    assert f"egf-audit: error: {message}" in said
    # a value the table gave: on its key's line, with the exit code of the error
    write(workdir / "pyproject.toml", text.replace('kernel = "k"', 'kernels = "nope"'))
    missing = invoke("run", "--device", "cpu")
    assert missing.exit_code == 3
    assert "::error title=egf-audit (exit 3),file=pyproject.toml,line=6::kernels = " in (
        missing.stdout
    )
    # a bad TOML line, and an error no file is to blame for
    write(workdir / "egf-audit.toml", 'preset = "ci"\ndevice = \n')
    (workdir / "pyproject.toml").unlink()
    bad = invoke("run")
    assert "::error title=egf-audit (exit 2),file=egf-audit.toml,line=2::" in bad.stdout
    (workdir / "egf-audit.toml").unlink()
    usage = invoke("run", "--mode", "sideways")
    assert "::error title=egf-audit (exit 2)::unknown mode 'sideways'" in usage.stdout
    assert summary.read_text().count("## egf-audit: ERROR (exit 2)") == 3


def test_a_usage_error_typer_finds_is_annotated_too(workdir, monkeypatch, capsys):
    from egf_audit.cli.app import run_app

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(workdir / "summary.md"))
    assert run_app(["run", "--no-such-option"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("::error title=egf-audit (exit 2)::No such option: --no-such-option")
    assert "No such option" in (workdir / "summary.md").read_text()


def test_no_error_annotation_outside_github_actions(workdir):
    write(workdir / "pyproject.toml", '[tool.egf-audit]\nkernel = "k"\n')
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 2 and "::error" not in result.output


# ---- what the table may write ----
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("out", "../outside-doc.md"),
        ("out", "docs/../../outside-doc.md"),
        ("out", "{outside}/outside-doc.md"),  # absolute
        ("out", "linked/outside-doc.md"),  # a folder of the repository linked outside it
        ("capture", "../outside-capture"),
    ],
)
def test_an_output_path_from_the_table_must_stay_inside_the_repository(workdir, key, value):
    """A pull request can change the table: a path it names for egf-audit to write must not
    leave the repository. Refused in one line (exit 2) before anything runs."""
    outside = workdir.parent / f"{workdir.name}-outside"
    outside.mkdir()
    (workdir / "linked").symlink_to(outside)
    value = value.format(outside=outside)
    write(workdir / "pyproject.toml", f'[tool.egf-audit]\n{key} = "{value}"\n')
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        f'egf-audit: error: {key} = "{value}" ([tool.egf-audit] in pyproject.toml): lies outside '
        "the repository"
    )
    assert not (workdir.parent / "outside-doc.md").exists() and not list(outside.iterdir())


def test_the_command_lines_out_may_name_any_path(fake, workdir):
    """What the user typed is theirs to choose: --out outside the repository is written."""
    elsewhere = workdir.parent / f"{workdir.name}-elsewhere" / "doc.md"
    write(workdir / "pyproject.toml", '[tool.egf-audit]\nout = "docs/audit.md"\n')
    result = invoke("run", "--device", "cpu", "--out", elsewhere)
    assert result.exit_code == 0, result.output
    assert elsewhere.exists()
