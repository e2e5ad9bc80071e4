"""The gate installs without a package index: the composite action's shell steps, run as GitHub
runs them with the action's defaults, install egf-audit from the action's own checkout and gate a
trainer repository; pre-commit runs the hooks from this repository at a commit. Both read the
trainer's [tool.egf-audit] table, so neither is given any option.

The action's runner is a fresh venv that borrows this environment's packages
(tests/borrowed_site.py): its install step then installs egf-audit from the action's checkout
as on a runner, while torch is already there (a runner's own install of torch is pip's
business, not egf-audit's). The hook that builds pre-commit's own environment, torch included,
costs over a minute and runs nightly; the hook that uses the egf-audit on PATH runs in every
CI run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from borrowed_site import make_venv

from egf_audit.kernels import KERNELS, bundled_source

ROOT = Path(__file__).resolve().parents[1]
ACCUMULATE = "accumulate_d_h_s2_from_concat_kernel.cu"
BUG = (
    ROOT
    / "tests"
    / "kernel_variants"
    / "accumulate_d_h_s2_from_concat"
    / "bad_flat_index_ignores_ld.cu"
)
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def trainer_repo(root: Path, hook_config: str = "") -> Path:
    """A trainer repository: its kernels, its table, its committed audit document."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    kernels = root / "cuda" / "kernels"
    kernels.mkdir(parents=True)
    for spec in KERNELS:
        (kernels / spec.file).write_text(bundled_source(spec.file))
    (root / "pyproject.toml").write_text(
        '[project]\nname = "trainer"\n\n'
        '[tool.egf-audit]\nkernels = "cuda/kernels"\ndevice = "cpu"\n'
    )
    if hook_config:
        (root / ".pre-commit-config.yaml").write_text(hook_config)
    made = subprocess.run(
        [sys.executable, "-m", "egf_audit", "run", "--quiet"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "trainer with its audit")
    return root


def plant_stride_bug(root: Path) -> None:
    shutil.copyfile(BUG, root / "cuda" / "kernels" / ACCUMULATE)


# ---- the composite action ----
def _expand(text: str, values: dict[str, str]) -> str:
    """GitHub's `${{ expr }}` for the expressions action.yml's shell steps use."""

    def one(m: re.Match[str]) -> str:
        expr = m.group(1).strip()
        if expr not in values:
            raise KeyError(f"action.yml uses ${{{{ {expr} }}}}, which this test does not provide")
        return values[expr]

    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


def _shell_steps(values: dict[str, str]) -> dict[str, tuple[str, dict[str, str]]]:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    steps = {}
    for step in action["runs"]["steps"]:
        if step.get("shell") == "bash":
            env = {k: _expand(str(v), values) for k, v in step.get("env", {}).items()}
            steps[step["name"]] = (_expand(step["run"], values), env)
    return steps


def test_the_actions_steps_install_from_its_checkout_and_gate_with_the_table(tmp_path):
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    values = {f"inputs.{k}": str(v.get("default", "")) for k, v in action["inputs"].items()}
    values["inputs.torch-index"] = ""  # the runner's index: this machine has no network
    values["github.action_path"] = str(ROOT)  # the checkout `uses:` names
    values["steps.gate.outputs.exit-code"] = ""
    steps = _shell_steps(values)
    assert values["inputs.version"] == "" and values["inputs.args"] == ""

    venv = tmp_path / "runner"
    make_venv(venv)
    runner_env = {
        **{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_ACTIONS": "true",
    }

    def step(name: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
        script, env = steps[name]
        return subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=cwd,
            env={**runner_env, **env, **extra},
            capture_output=True,
            text=True,
            timeout=900,
        )

    repo = trainer_repo(tmp_path / "trainer")
    installed = step("Install egf-audit", repo)
    assert installed.returncode == 0, installed.stderr[-2000:]
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import egf_audit, sys; print(egf_audit.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv) in where  # installed into the runner's python, not this test's

    gate_name = next(name for name in steps if name.startswith("Audit"))
    outputs = tmp_path / "github_output"
    for summary, bug, code in (("ok.md", False, 0), ("bug.md", True, 1)):
        if bug:
            plant_stride_bug(repo)
        outputs.write_text("")
        gated = step(
            gate_name,
            repo / "cuda",  # any folder of the checkout
            GITHUB_OUTPUT=str(outputs),
            GITHUB_STEP_SUMMARY=str(tmp_path / summary),
        )
        assert gated.returncode == code, gated.stdout[-2000:] + gated.stderr[-2000:]
        assert outputs.read_text() == f"exit-code={code}\n"
        assert (repo / "egf-audit-junit.xml").exists() or (
            repo / "cuda" / "egf-audit-junit.xml"
        ).exists()
    assert f"file=cuda/kernels/{ACCUMULATE}" in gated.stdout


# ---- pre-commit, from this repository at a commit ----
@pytest.mark.parametrize(
    "hook",
    [
        "egf-audit-check-system",
        # its own environment: pre-commit installs egf-audit and torch (75 s on 2 cores)
        pytest.param("egf-audit-check", marks=pytest.mark.nightly),
    ],
)
def test_pre_commit_runs_the_hook_at_a_commit_with_no_args(tmp_path, hook):
    if shutil.which("pre-commit") is None:
        pytest.skip("pre-commit is not installed (the dev extra has it)")
    try:
        rev = git(ROOT, "rev-parse", "HEAD").strip()
    except subprocess.CalledProcessError:
        pytest.skip("not a git checkout of egf-audit")
    config = f"repos:\n  - repo: {ROOT}\n    rev: {rev}\n    hooks:\n      - id: {hook}\n"
    repo = trainer_repo(tmp_path / "trainer", config)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    if hook == "egf-audit-check-system":  # the egf-audit on PATH: this environment's
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"

    def pre_commit() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["pre-commit", "run", "--all-files"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )

    clean = pre_commit()
    assert clean.returncode == 0, clean.stdout[-3000:]
    assert "Passed" in clean.stdout
    plant_stride_bug(repo)
    caught = pre_commit()
    assert caught.returncode == 1, caught.stdout[-3000:]
    assert "Failed" in caught.stdout and "EGF007" in caught.stdout
