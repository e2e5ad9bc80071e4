"""The commands around `run`: mutants' machine-readable outputs, `invariants --json`,
`config --example` and docs/config.md, the pre-commit hook, and the document's self-contained
text and per-stage wire status."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from cli_fakes import CODES, DOC, fake_mutants, invoke
from test_reports import make_report

from egf_audit import invariants
from egf_audit.cli.config_example import config_keys, documented_keys, example_toml, key_tables
from egf_audit.invariants.registry import FAIL, PASS
from egf_audit.pipeline.config import ConfigError, config_from_mapping
from egf_audit.reports.data_flow import data_flow
from egf_audit.reports.document import render_document
from egf_audit.reports.wire_status import wire_status
from egf_audit.scenarios.audit import Auditor
from egf_audit.scenarios.faults import FAULTS, FAULTS_BY_NAME

ROOT = Path(__file__).resolve().parents[1]


# ---- mutants ----
def test_mutants_junit_and_json_carry_a_schema(workdir, monkeypatch):
    fake_mutants(monkeypatch, {"skip-scale": ()})
    result = invoke("mutants", "--device", "cpu", "--junit", "m.xml", "--json", "m.json")
    assert result.exit_code == 1
    data = json.loads(Path("m.json").read_text())
    assert data["schema"] == "egf-audit/mutants/1" and data["ok"] is False
    assert data["survivors"] == ["skip-scale"]
    suite = ET.parse("m.xml").getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {f.name for f in FAULTS} | set(CODES)
    assert cases["skip-scale"].find("failure").get("message") == (
        "fault skip-scale survived: no invariant failed on it"
    )
    assert cases["EGF001"].find("failure") is None
    assert cases["EGF002"].find("failure").get("message") == "EGF002 caught no fault"
    assert suite.get("failures") == str(1 + len(CODES) - 1)


@pytest.mark.parametrize("fmt", ["json", "junit"])
def test_mutants_output_format_puts_only_that_on_stdout(workdir, monkeypatch, fmt):
    fake_mutants(monkeypatch, {})
    result = invoke("mutants", "--device", "cpu", "--only", "dw-k-sh2", "--output-format", fmt)
    assert result.exit_code == 0
    if fmt == "json":
        assert json.loads(result.stdout)["faults"][0]["name"] == "dw-k-sh2"
    else:
        assert ET.fromstring(result.stdout).find("testsuite").get("tests") == "1"


def test_mutants_list_names_every_fault():
    result = invoke("mutants", "--list")
    assert result.exit_code == 0
    for fault in FAULTS:
        assert fault.name in result.stdout


# ---- invariants, explain, config ----
def test_invariants_json_lists_every_invariant_with_its_text():
    result = invoke("invariants", "--json")
    data = json.loads(result.stdout)
    assert data["schema"] == "egf-audit/invariants/1"
    assert [i["code"] for i in data["invariants"]] == CODES
    egf003 = data["invariants"][2]
    assert egf003["slug"] == "wire-zero-under-sentinel" and egf003["what"]
    keys = ["code", "slug", "message", "what", "why", "how", "catches", "limits", "example"]
    assert all(list(i) == keys for i in data["invariants"])


def test_config_example_names_every_key_and_loads_as_the_ci_preset():
    result = invoke("config", "--example")
    assert result.exit_code == 0
    assert result.stdout == example_toml()
    assert documented_keys() == config_keys()
    cfg = config_from_mapping(tomllib.loads(result.stdout))
    assert cfg.dims.SH2 == 48 and cfg.hyper.gamma == 0.99


def test_docs_config_md_embeds_the_example_and_the_key_tables_word_for_word():
    text = (ROOT / "docs" / "config.md").read_text()
    assert f"```toml\n{example_toml()}```" in text
    assert key_tables() in text
    dims, hyper = config_keys()
    for key in dims:
        assert f"| `dims.{key}` |" in text
    for key in hyper:
        assert f"| `hyper.{key}` |" in text


@pytest.mark.parametrize(
    ("table", "key", "accepted", "refused"),
    [
        ("hyper", "beta1", 0.0, 1.0),
        ("hyper", "beta2", 0.999999, 1.0),
        ("hyper", "gamma", 1.0, 1.01),
        ("hyper", "eps", 1.2e-38, 1e-39),
        ("dims", "AUXK", 3, 2),
        ("dims", "N_ISV", 394, 393),
    ],
)
def test_documented_ranges_are_the_validators(table, key, accepted, refused):
    """Edges of the ranges docs/config.md states: the documented end is accepted, one step
    past it refused."""
    config_from_mapping({table: {key: accepted}})
    with pytest.raises(ConfigError, match=f"{table}.{key}"):
        config_from_mapping({table: {key: refused}})


# ---- the pre-commit hook ----
def test_the_pre_commit_hook_runs_the_check_as_pre_commit_would(workdir, fake):
    """pre-commit runs `entry` plus `args` with no file names (pass_filenames: false) from the
    repository root, in an environment where the package is installed; `pre-commit try-workdir`
    itself needs a package index to build that environment, so this runs the same command."""
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "egf-audit-check")
    assert hook["language"] == "python" and hook["pass_filenames"] is False
    argv = [*shlex.split(hook["entry"]), "--device", "cpu"]  # `args:` of a trainer's config
    assert argv[:3] == ["egf-audit", "run", "--check"]
    assert re.search(hook["files"], "trainer/kernels/sp14_scale_wire_col_kernel.cu")
    assert re.search(hook["files"], "docs/dqn-wire-up-audit.md")
    assert not re.search(hook["files"], "trainer/model.py")
    missing = invoke(*argv[1:])
    assert missing.exit_code == 1  # no document yet: stale
    assert invoke("run", "--device", "cpu").exit_code == 0
    assert invoke(*argv[1:]).exit_code == 0
    DOC.write_text(DOC.read_text().replace("## Terms", "## Terms (edited)"))
    stale = invoke(*argv[1:])
    assert stale.exit_code == 1
    assert stale.stdout.splitlines()[-1].startswith("FAIL: docs/dqn-wire-up-audit.md is STALE")


def test_the_hook_entry_is_the_installed_console_script():
    """`entry` must name the script pyproject installs, or pre-commit finds no command."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert shlex.split(hooks[0]["entry"])[0] in pyproject["project"]["scripts"]


def test_the_action_installs_runs_the_gate_and_uploads_the_junit():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    scripts = " ".join(s.get("run", "") for s in steps)
    assert "pip install" in scripts and "egf-audit run --check" in scripts
    assert "--junit" in scripts
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in steps)


def test_help_is_import_light():
    """`egf-audit --help` must not import torch or numpy (they cost seconds)."""
    code = (
        "import sys\n"
        "from egf_audit.cli.app import run_app\n"
        "assert run_app(['--help']) == 0\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


# ---- the document ----
@pytest.fixture(scope="module")
def dx_fault_run(ci_config, cpu_backend):
    wiring = FAULTS_BY_NAME["dx-k-sh2"].wiring
    return Auditor(ci_config, cpu_backend, wiring, steps=1).run(("sentinel",))


def test_a_backward_bug_breaks_the_backward_row_not_the_forward_one(dx_fault_run, kernel_set):
    results = invariants.evaluate(dx_fault_run, codes=("EGF001",))
    assert results[0].verdict.status == FAIL
    statuses = {"EGF001": FAIL}
    report = make_report(dx_fault_run, statuses, kernels=kernel_set)
    report = report.__class__(
        **{
            **report.__dict__,
            "results": tuple(r if r.code != "EGF001" else results[0] for r in report.results),
        }
    )
    rows = {row.wire: row.status for row in wire_status(report)}
    assert rows["Forward dispatch"] == PASS
    assert rows["Backward dispatch"] == FAIL
    assert rows["dW unchanged"] == PASS
    diagram = "\n".join(data_flow(report))
    assert "cql: m = 48 of 49: BROKEN, the wire column is dropped" in diagram
    assert 'concat -- "k = 49" --> fc0' in diagram
    assert "linkStyle" in diagram


def test_the_clean_diagram_shows_measured_widths_and_no_broken_edge(ci_audit_run, kernel_set):
    diagram = "\n".join(data_flow(make_report(ci_audit_run, kernels=kernel_set)))
    assert 'concat -- "k = 49" --> fc0' in diagram
    assert '"cql: m = 49; main: m = 49"' in diagram
    assert "BROKEN" not in diagram.split("```mermaid")[1] and "linkStyle" not in diagram


def test_the_document_defines_its_terms_and_names_checkpoints(ci_audit_run, kernel_set):
    text = render_document(make_report(ci_audit_run, kernels=kernel_set))
    for term in ("**the wire**", "**the sentinel**", "**B.8**", "**B.9**", "**B.10**", "**B.11**"):
        assert text.count(term) == 1
    assert "{site}" not in text
    assert "main:after_scale" in text
    assert "seed's" not in text and "SPEC" not in text
    egf010 = invariants.INVARIANTS_BY_CODE["EGF010"].message
    assert "agree" in egf010 and "disagree" not in egf010
