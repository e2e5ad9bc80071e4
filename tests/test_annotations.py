"""Annotations where the reviewer looks: a failure in a trainer's kernel file is annotated on the
lines the pull request changed in it (git diff against --base / GITHUB_BASE_REF), else on the
kernel's entry line; EGF010 names the kernels that wrote the tensors the oracle disagrees with."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cli_fakes import invoke

from egf_audit.cli.changed_lines import changed_hunks, parse_hunks
from egf_audit.invariants.registry import FAIL
from egf_audit.kernels import KERNELS, bundled_source

ACCUMULATE = "accumulate_d_h_s2_from_concat_kernel.cu"
ADAM = "adam_update_kernel.cu"
VARIANTS = Path(__file__).parent / "kernel_variants"


def git(cwd: Path, *args: str) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    done = subprocess.run(
        ["git", *env_args, *args], cwd=cwd, capture_output=True, text=True, check=True
    )
    return done.stdout


def trainer_repo(root: Path) -> Path:
    """A trainer repository whose main branch holds its whole, correct kernel folder; the
    working branch is `pr`."""
    import shutil

    shutil.rmtree(root / ".git", ignore_errors=True)  # the workdir fixture's stand-in
    git(root, "init", "-q", "-b", "main")
    folder = root / "kernels"
    folder.mkdir()
    for spec in KERNELS:
        (folder / spec.file).write_text(bundled_source(spec.file))
    (root / "egf-audit.toml").write_text('kernels = "kernels"\ndevice = "cpu"\n')
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "trainer")
    git(root, "checkout", "-q", "-b", "pr")
    return folder


def pull_request_run(root: Path, monkeypatch):
    """`egf-audit run` as GitHub runs it on a pull request into main; it must fail."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_BASE_REF", "main")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(root / "summary.md"))
    result = invoke("run", "--quiet")
    assert result.exit_code == 1
    return result


def errors(stdout: str, title: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(f"::error title={title}")]


def test_parse_hunks_gives_new_lines_per_file(tmp_path):
    diff = (
        "diff --git a/k/a.cu b/k/a.cu\n--- a/k/a.cu\n+++ b/k/a.cu\n"
        "@@ -3 +3 @@\n-x\n+y\n@@ -10,0 +11,2 @@\n+p\n+q\n@@ -20,2 +21,0 @@\n-r\n-s\n"
    )
    assert parse_hunks(diff, tmp_path) == {
        (tmp_path / "k/a.cu").resolve(): [(3, 3), (11, 12), (21, 21)]
    }


def test_a_stride_bug_is_annotated_on_the_changed_lines(workdir, monkeypatch):
    folder = trainer_repo(workdir)
    bug = (VARIANTS / "accumulate_d_h_s2_from_concat" / "bad_flat_index_ignores_ld.cu").read_text()
    (folder / ACCUMULATE).write_text(bug)
    git(workdir, "commit", "-q", "-am", "faster accumulate")
    hunks, note = changed_hunks([folder / ACCUMULATE], "main")
    assert note is None
    spans = hunks[(folder / ACCUMULATE).resolve()]
    assert spans  # the diff really has lines
    result = pull_request_run(workdir, monkeypatch)
    found = errors(result.stdout, "EGF007")
    assert found
    first, last = spans[0]
    span = f",endLine={last}" if last != first else ""
    assert all(f"file=kernels/{ACCUMULATE},line={first}{span}::" in line for line in found)
    assert "changed by this pull request" in found[0]
    # the failure lines say it as plain text too
    assert f"EGF007[sentinel] is blamed on kernels/{ACCUMULATE}:{first}" in result.stderr


def test_without_a_base_the_annotation_sits_on_the_entry_line(workdir, monkeypatch):
    folder = trainer_repo(workdir)
    source = VARIANTS / "accumulate_d_h_s2_from_concat" / "bad_flat_index_ignores_ld.cu"
    (folder / ACCUMULATE).write_text(source.read_text())
    entry = next(
        i
        for i, line in enumerate(source.read_text().splitlines(), 1)
        if "accumulate_d_h_s2_from_concat(" in line
    )
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(workdir / "summary.md"))
    result = invoke("run", "--quiet")
    found = errors(result.stdout, "EGF007")
    assert found and all(f"file=kernels/{ACCUMULATE},line={entry}::" in line for line in found)
    missing = invoke("run", "--quiet", "--base", "no-such-branch")
    assert "--base no-such-branch: no such commit here" in missing.stderr
    assert errors(missing.stdout, "EGF007") == found


def test_an_oracle_disagreement_names_the_kernel_that_wrote_the_tensor(workdir, monkeypatch):
    """A wrong Adam moment: only the float64 oracle sees it (EGF010), and the annotation goes on
    adam_update's file, the kernel that wrote the disagreeing m/v/params."""
    folder = trainer_repo(workdir)
    text = (folder / ADAM).read_text()
    wrong = text.replace("(1.0f - beta1) * g;", "(1.0f - beta2) * g;")
    assert wrong != text
    (folder / ADAM).write_text(wrong)
    result = pull_request_run(workdir, monkeypatch)
    found = errors(result.stdout, "EGF010")
    assert found
    line = next(i for i, l in enumerate(wrong.splitlines(), 1) if "beta2) * g;" in l)
    assert all(f"file=kernels/{ADAM},line={line}::" in f for f in found)


def test_every_judged_kernel_exists_and_is_blamed_when_the_verdict_names_none(ci_audit_run):
    """The fallback map names real kernels; a failure that names no kernel is blamed on the
    kernel whose output its invariant judges."""
    from test_reports import make_report

    from egf_audit.invariants import Result
    from egf_audit.invariants.registry import failed
    from egf_audit.reports.blame import KERNEL_JUDGED_BY, blamed_kernels
    from egf_audit.reports.model import Gate
    from egf_audit.runtime.kernel_sources import load_kernel_set

    names = {spec.name for spec in KERNELS}
    assert set(KERNEL_JUDGED_BY.values()) <= names
    report = make_report(ci_audit_run, kernels=load_kernel_set())
    for code, kernel in KERNEL_JUDGED_BY.items():
        result = Result(code, "sentinel", failed("a failure that names no kernel"))
        assert blamed_kernels(Gate(report, "d.md"), result) == [kernel]


def test_plain_text_names_the_kernel_file_and_line_a_failure_is_blamed_on(fake, workdir):
    """Not only the annotations: the verdict output a user reads on a terminal (and, with
    --quiet, the failure lines) names the trainer's file and line for each failed verdict."""
    folder = workdir / "kernels"
    folder.mkdir()
    for spec in KERNELS:
        (folder / spec.file).write_text(bundled_source(spec.file))
    text = (folder / ACCUMULATE).read_text()
    entry = next(
        i for i, l in enumerate(text.splitlines(), 1) if "accumulate_d_h_s2_from_concat(" in l
    )
    fake({"EGF007": FAIL})
    said = f"kernels/{ACCUMULATE}:{entry} (the entry point of accumulate_d_h_s2_from_concat)"
    result = invoke("run", "--device", "cpu", "--kernels", "kernels")
    assert result.exit_code == 1
    for mode in ("sentinel", "live"):
        assert f"EGF007[{mode}] is blamed on {said}" in result.stdout.splitlines()
    quiet = invoke("run", "--device", "cpu", "--kernels", "kernels", "--quiet")
    lines = quiet.stderr.splitlines()
    failed_at = next(i for i, l in enumerate(lines) if l.startswith("EGF007[sentinel] failed:"))
    assert lines[failed_at + 1] == f"EGF007[sentinel] is blamed on {said}"
    # egf-audit's bundled kernel is no file of the trainer: nothing to name
    bundled = invoke("run", "--device", "cpu", "--out", "other.md")
    assert "is blamed on" not in bundled.output
