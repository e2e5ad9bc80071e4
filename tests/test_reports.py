"""The renderers: markdown escaping, operands without pointers, the wire-status table and the
timeline (also under faults), the document's --check comparison, JUnit, JSON and GitHub escaping
(writing files is tests/test_outputs.py's)."""

from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from egf_audit import invariants
from egf_audit.invariants import Result
from egf_audit.invariants.registry import FAIL, PASS, WARN, Verdict
from egf_audit.reports import workflow
from egf_audit.reports.bindings import operand
from egf_audit.reports.document import render_document, stale_diff
from egf_audit.reports.environment import environment_markdown
from egf_audit.reports.json_report import jsonable, render_json
from egf_audit.reports.junit import render_junit
from egf_audit.reports.markdown import cell, table
from egf_audit.reports.model import AuditReport, Gate
from egf_audit.reports.timeline import STEPS, site_timeline
from egf_audit.reports.wire_status import wire_status
from egf_audit.scenarios.audit import Auditor
from egf_audit.scenarios.faults import FAULTS_BY_NAME
from egf_audit.trace.model import Binding, Region

MODES = ("sentinel", "live")


def make_report(run, statuses=None, summary="fake summary", evidence=None, kernels=None):
    statuses = statuses or {}
    results = tuple(
        Result(inv.code, mode, Verdict(statuses.get(inv.code, PASS), summary, evidence or {}))
        for inv in invariants.INVARIANTS
        for mode in run.modes
    )
    return AuditReport(
        config=run.config,
        modes=run.modes,
        steps=run.steps,
        invariants=tuple(invariants.INVARIANTS),
        results=results,
        kernels=kernels,
        command="egf-audit run --preset ci --seed 0 --steps 2 --mode both",
        version="0.0-test",
        environment={"device": "cpu", "timings_s": {"scenarios": 0.25}},
        run=run,
    )


@pytest.fixture(scope="module")
def faulty_runs(ci_config, cpu_backend):
    """Sentinel-only audits with one fault each, for what the tables show under a bug."""
    return {
        name: Auditor(ci_config, cpu_backend, FAULTS_BY_NAME[name].wiring, steps=1).run(
            ("sentinel",)
        )
        for name in ("skip-scale", "fwd-k-sh2", "target-grad-leak")
    }


# ---- markdown ----
def test_table_cells_escape_pipes_and_fold_newlines():
    assert cell("a | b\nc") == "a \\| b c"
    assert cell("") == " "
    assert table(["x", "y"], [["1", "p|q"]]) == ["| x | y |", "|---|---|", "| 1 | p\\|q |"]


# ---- operands ----
LAYOUT = {
    "grad_buf": {"size": 2000, "tensors": {"w_s1": [0, 10, 10], "w_b0fc": [100, 32, 49]}},
    "sp14_d_dir_qaux_concat": {
        "size": 64 * 49,
        "tensors": {"sp14_d_dir_qaux_concat": [0, 64, 49]},
    },
}


def bind(buffer, offset, rows, width, ld, tensor, shape, pointer=123456789, ok=True):
    return Binding("A", pointer, "r", Region(buffer, offset, rows, width, ld), tensor, shape, ok)


@pytest.mark.parametrize(
    ("binding", "text"),
    [
        (
            bind("grad_buf", 100, 32, 49, 49, "w_b0fc", (100, 32, 49)),
            "grad_buf+goff_w_b0fc [32, 49]",
        ),
        (
            bind("grad_buf", 100, 32, 48, 49, "w_b0fc", (100, 32, 49)),
            "grad_buf+goff_w_b0fc [32, 49] [:, 0:48]",
        ),
        (
            bind("sp14_d_dir_qaux_concat", 48, 64, 1, 49, "sp14_d_dir_qaux_concat", (0, 64, 49)),
            "sp14_d_dir_qaux_concat [64, 49] [:, 48]",
        ),
        (
            bind("sp14_d_dir_qaux_concat", 0, 64, 48, 48, "sp14_d_dir_qaux_concat", (0, 64, 49)),
            "sp14_d_dir_qaux_concat [64, 49] (+0: 64 rows x 48, ld 48)",
        ),
        (bind("grad_buf", 0, 1, 2000, 2000, "w_s1", (0, 10, 10)), "grad_buf (whole buffer, 2000 "),
        (
            bind("grad_buf", 100, 32, 49, 49, "w_b0fc", (100, 32, 49), ok=False),
            "grad_buf+goff_w_b0fc [32, 49] OUT OF BOUNDS",
        ),
        (Binding("A", 0, "r", None, None, None, True), "null (0)"),
        (Binding("A", 987654321, "r", None, None, None, False), "pointer into no buffer"),
    ],
)
def test_operands_name_buffer_and_tensor_never_the_pointer(binding, text):
    rendered = operand(binding, LAYOUT)
    assert rendered.startswith(text)
    assert str(binding.pointer) not in rendered or binding.pointer == 0


# ---- wire status and timeline ----
def test_wire_status_rows_follow_the_seed_and_their_verdicts(ci_audit_run, kernel_set):
    report = make_report(ci_audit_run, {"EGF004": FAIL, "EGF011": WARN}, kernels=kernel_set)
    rows = {row.wire: row for row in wire_status(report)}
    assert list(rows) == [
        "Forward dispatch",
        "Backward dispatch",
        "dW unchanged",
        "Target net",
        "Wrapper path",
    ]
    assert rows["Forward dispatch"].status == PASS
    assert "k = 49 (SH2 + 1) against lda = 49" in rows["Forward dispatch"].measured
    assert rows["Backward dispatch"].status == FAIL  # EGF004 is one of its invariants
    assert rows["Backward dispatch"].measured.count("before the accumulate") == 2
    assert "C = grad_buf+goff_w_b0fc [32, 49]" in rows["dW unchanged"].measured
    assert "written by `polyak_ema` × 2" in rows["Target net"].measured
    assert rows["Wrapper path"].status == WARN
    assert rows["Wrapper path"].measured.startswith("0 launches of the wrapper path")
    assert "m = 48 (SH2: the wire column is dropped)" in rows["Wrapper path"].measured


def test_wire_status_shows_the_bug_a_fault_puts_back(faulty_runs, kernel_set):
    measured = {
        name: {row.wire: row.measured for row in wire_status(make_report(run, kernels=kernel_set))}
        for name, run in faulty_runs.items()
    }
    assert "cql: no `sp14_scale_wire_col` launch" in measured["skip-scale"]["Backward dispatch"]
    assert "k = 48 (SH2: the wire column is dropped)" in measured["fwd-k-sh2"]["Forward dispatch"]
    assert "backward_value_out_dw@cql" in measured["target-grad-leak"]["Target net"]


def test_timeline_numbers_every_backward_launch_in_the_seed_order(ci_audit_run):
    trace = ci_audit_run.traces["sentinel"]
    for site in ("cql", "main"):
        entries = site_timeline(trace, site)
        steps = [e.step for e in entries]
        assert steps == sorted(steps)
        assert set(steps) == set(STEPS)
        by_step = {n: [e.launch.label for e in entries if e.step == n] for n in STEPS}
        assert by_step[1] == [f"rebuild_online_concat@{site}"]
        assert by_step[2] == [f"zero_d_h_s2@{site}"]
        assert f"backward_branch_dx[d=0]@{site}" in by_step[3]
        assert by_step[4] == [f"sp14_scale_wire_col@{site}"]
        assert len(by_step[5]) == 4  # one accumulate per branch
        assert f"aux_wire_backward@{site}" in by_step[6]


def test_timeline_leaves_a_missing_step_empty(faulty_runs):
    entries = site_timeline(faulty_runs["skip-scale"].traces["sentinel"], "main")
    assert 4 not in {e.step for e in entries}


# ---- the document ----
def test_document_sections_and_sgemm_table(ci_audit_run, kernel_set):
    text = render_document(make_report(ci_audit_run, kernels=kernel_set))
    sgemms = [x for x in ci_audit_run.traces["sentinel"].sgemms() if x.step == 0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    sgemm_rows = [r for r in rows if r.count("|") == 16]
    assert len(sgemm_rows) == len(sgemms)
    assert "| 76 | `forward_branch_fc[d=0]@online` | T | N | 32 | 64 | 49 | 49 | 49 | 32 |" in text
    for heading in ("## Wire status", "## Data flow", "## Backward timeline", "## Reproduce"):
        assert heading in text
    assert "```mermaid" in text
    for source in kernel_set.sources:
        assert f"`{source.path}` | bundled | `{source.sha256}`" in text
    reproduce = text.split("## Reproduce", 1)[1]
    assert "egf-audit run --preset ci" in reproduce and "--device" not in reproduce.split("```")[1]
    assert text.endswith("\n") and not any(line != line.rstrip() for line in text.splitlines())


def test_machine_values_never_reach_the_document(ci_audit_run, kernel_set):
    """Device, versions, witness and measured evidence are per machine: two reports that differ
    only there render the same bytes, and the step summary's markdown holds them instead."""
    a = make_report(ci_audit_run, evidence={"max_err": 1.5e-7}, kernels=kernel_set)
    b = dataclasses.replace(
        a,
        environment={"device": "cuda", "gpu": "H200"},
        witness={"logged": 3, "recorded": 3, "matched": 3, "ok": True, "mismatches": []},
        results=tuple(
            dataclasses.replace(r, verdict=dataclasses.replace(r.verdict, evidence={"x": 2}))
            for r in a.results
        ),
    )
    assert render_document(a) == render_document(b)
    assert "1.5e-07" not in render_document(a) and "H200" not in render_document(b)
    assert '{"max_err": 1.5e-07}' in "\n".join(environment_markdown(a))
    summary_b = "\n".join(environment_markdown(b))
    assert "| `gpu` | H200 |" in summary_b
    assert "### cuBLAS witness: 3 of 3 GEMMs match" in summary_b


def test_stale_diff_is_empty_when_current_and_short_when_not():
    doc = "# t\n\nline\nA\n"
    assert stale_diff(doc, doc, "d.md") == []
    assert stale_diff(doc.replace("\n", "\r\n"), doc, "d.md") == []
    assert stale_diff(doc, doc.replace("A", "B"), "d.md") != []
    edited = doc.replace("line", "\n".join(f"other {i}" for i in range(200)))
    diff = stale_diff(edited, doc, "d.md", limit=10)
    assert diff[0] == "--- d.md (committed)\n"
    assert len(diff) == 11 and diff[-1].startswith("... ")


# ---- JUnit, JSON ----
def test_junit_survives_characters_xml_cannot_hold(ci_audit_run, kernel_set):
    report = make_report(
        ci_audit_run, {"EGF001": FAIL}, summary="bad \x00 byte & <tag>", kernels=kernel_set
    )
    root = ET.fromstring(render_junit(Gate(report, "d.md"), {"EGF001": 0.5}))
    case = next(c for c in root.iter("testcase") if c.get("name") == "EGF001[sentinel]")
    assert case.get("time") == "0.250"
    assert case.get("classname") == invariants.INVARIANTS[0].check.__module__
    # a NUL is shown as its escape (reports/controls.py), which XML can hold
    assert "bad \\x00 byte & <tag>" in case.find("failure").get("message")


def test_json_is_strict_with_nonfinite_and_numpy_evidence(ci_audit_run, kernel_set):
    evidence = {"nan": math.nan, "inf": np.float32("inf"), "n": np.int64(3), "v": np.arange(2)}
    assert jsonable(evidence) == {"nan": "nan", "inf": "inf", "n": 3, "v": [0, 1]}
    report = make_report(ci_audit_run, evidence=evidence, kernels=kernel_set)
    data = json.loads(render_json(Gate(report, "d.md"), 0))
    assert data["invariants"][0]["verdicts"]["sentinel"]["evidence"]["nan"] == "nan"


# ---- GitHub ----
def test_github_workflow_command_escaping():
    assert workflow.escape_data("100% done\r\nnext") == "100%25 done%0D%0Anext"
    assert workflow.escape_property("a:b,c%") == "a%3Ab%2Cc%25"
    line = workflow.command("error", "50% of rows", title="EGF001: k, lda")
    assert line == "::error title=EGF001%3A k%2C lda::50%25 of rows"
    # a line break or an ESC a trainer's name carried is shown escaped: one line, no control
    line = workflow.command("error", "50%\nof \x1b[2Jrows\u202e", title="EGF001\r")
    assert line == "::error title=EGF001\\x0d::50%25\\x0aof \\x1b[2Jrows\\u202e"
    assert workflow.command("warning", "plain") == "::warning::plain"


# ---- the verdict model ----
def test_a_warning_holds_a_failure_does_not(ci_audit_run, kernel_set):
    warned = make_report(ci_audit_run, {"EGF011": WARN}, kernels=kernel_set)
    assert warned.ok and warned.combined_status(("EGF001", "EGF011")) == WARN
    failed = make_report(ci_audit_run, {"EGF002": FAIL, "EGF011": WARN}, kernels=kernel_set)
    assert not failed.ok and [r.code for r in failed.failures] == ["EGF002", "EGF002"]
    assert failed.combined_status(("EGF002", "EGF011")) == FAIL
    assert failed.combined_status(("EGF999",)) == "not run"
