"""Conventions of the CLI that a CI gate's users rely on: outputs (`-`, symlinks, devices,
FIFOs, two outputs on one path, all-or-nothing), signals, one-line usage errors, output at any
terminal width, machine-readable mutants and invariants, config docs and the pre-commit hook.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_fakes import CODES, DOC, invoke

from egf_audit.cli.app import run_app
from egf_audit.cli.options import handle_termination_signals
from egf_audit.errors import exception_line, one_line
from egf_audit.invariants.registry import FAIL

ROOT = Path(__file__).resolve().parents[1]
N = len(CODES)  # invariants in the registry


def no_temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".tmp", ".bak")))


# ---- outputs ----
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--json", "docs/dqn-wire-up-audit.md"], "--out and --json both write"),
        (["--json", "x", "--junit", "x"], "--json and --junit both write x"),
        (["--json", "-", "--trace", "-"], "--json and --trace both write stdout"),
        (["--json", "-", "--output-format", "json"], "--json and --output-format json both"),
    ],
)
def test_two_outputs_on_one_path_exit_2_before_anything_runs(fake, extra, message):
    result = invoke("run", "--device", "cpu", *extra)
    assert result.exit_code == 2
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("egf-audit: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "config" not in result.stderr.replace(errors[0], "")  # no progress: nothing ran
    assert not DOC.exists() and not Path("x").exists()


def test_a_symlink_to_the_document_is_the_same_path(fake, workdir):
    DOC.parent.mkdir()
    os.symlink("dqn-wire-up-audit.md", "docs/link.json")
    assert invoke("run", "--device", "cpu", "--json", "docs/link.json").exit_code == 2


def test_json_dash_prints_only_json_on_stdout(fake):
    result = invoke("run", "--device", "cpu", "--json", "-")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["schema"] == "egf-audit/run/2"
    assert result.stderr.splitlines()[-1].startswith(f"PASS: all {N} invariants hold")
    assert DOC.exists()


@pytest.mark.parametrize("option", ["--junit", "--trace"])
def test_junit_and_trace_dash_go_to_stdout(fake, option):
    result = invoke("run", "--device", "cpu", option, "-")
    assert result.exit_code == 0
    if option == "--junit":
        assert ET.fromstring(result.stdout).find("testsuite").get("tests") == str(2 * N)
    else:
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert lines[0]["type"] == "trace" and lines[0]["scenario"] == "sentinel"


def test_output_format_json_and_junit(fake):
    as_json = invoke("run", "--device", "cpu", "--output-format", "json")
    assert json.loads(as_json.stdout)["exit_code"] == 0
    as_junit = invoke("run", "--device", "cpu", "--output-format", "junit")
    assert ET.fromstring(as_junit.stdout).tag == "testsuites"


def test_a_symlink_output_is_written_through_and_stays_a_link(fake, workdir):
    Path("real.json").write_text("old\n")
    os.symlink("real.json", "link.json")
    assert invoke("run", "--device", "cpu", "--json", "link.json").exit_code == 0
    assert os.path.islink("link.json") and os.readlink("link.json") == "real.json"
    assert json.loads(Path("real.json").read_text())["ok"] is True
    assert no_temporaries(workdir) == []


def test_a_device_node_is_written_in_place(fake):
    assert invoke("run", "--device", "cpu", "--json", "/dev/null").exit_code == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_dev_stdout_is_written_in_place_not_replaced(tmp_path):
    """A real process whose stdout is a pipe: /dev/stdout is a link to it, and stays one."""
    (tmp_path / ".git").mkdir()
    args = ["run", "--device", "cpu", "--mode", "sentinel", "--json", "/dev/stdout", "-q"]
    done = subprocess.run(
        [sys.executable, "-m", "egf_audit", *args], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    json_text, verdict = done.stdout.rsplit("}\n", 1)
    assert json.loads(json_text + "}")["ok"] is True
    assert verdict.startswith("PASS: all ") and " invariants hold in sentinel" in verdict
    assert os.path.islink("/dev/stdout")


def test_a_fifo_is_written_in_place(fake, workdir):
    os.mkfifo("pipe")
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(Path("pipe").read_bytes()))
    reader.start()
    result = invoke("run", "--device", "cpu", "--junit", "pipe")
    reader.join(timeout=30)
    assert result.exit_code == 0
    assert stat.S_ISFIFO(os.stat("pipe").st_mode)
    assert ET.fromstring(received[0]).tag == "testsuites"


def test_an_output_that_is_a_directory_leaves_every_file_as_it_was(fake, workdir):
    assert invoke("run", "--device", "cpu", "--junit", "j.xml").exit_code == 0
    before = DOC.read_bytes(), Path("j.xml").read_bytes()
    fake({"EGF001": FAIL})  # the next document and JUnit would differ
    Path("adir").mkdir()
    result = invoke("run", "--device", "cpu", "--junit", "j.xml", "--json", "adir")
    assert result.exit_code == 3
    assert "cannot write adir: it is a directory" in result.stderr
    assert (DOC.read_bytes(), Path("j.xml").read_bytes()) == before
    assert no_temporaries(workdir) == [] and no_temporaries(DOC.parent) == []


def test_a_replace_that_fails_puts_back_every_file_already_replaced(fake, workdir, monkeypatch):
    assert invoke("run", "--device", "cpu", "--junit", "j.xml").exit_code == 0
    before = DOC.read_bytes(), Path("j.xml").read_bytes()
    fake({"EGF001": FAIL})
    real_replace = os.replace
    calls = []

    def second_replace_fails(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", second_replace_fails)
    result = invoke("run", "--device", "cpu", "--junit", "j.xml")
    assert result.exit_code == 3 and "No space left on device" in result.stderr
    assert (DOC.read_bytes(), Path("j.xml").read_bytes()) == before
    assert no_temporaries(workdir) == [] and no_temporaries(DOC.parent) == []


# ---- signals ----
@pytest.mark.parametrize(
    ("sig", "code", "name"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")]
)
def test_a_signal_while_outputs_are_staged_leaves_no_temporary(
    fake,
    workdir,
    monkeypatch,
    sig,
    code,
    name,
):
    assert invoke("run", "--device", "cpu").exit_code == 0
    before = DOC.read_bytes()
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    handle_termination_signals()
    real_replace = os.replace

    def signalled_replace(src, dst):
        os.kill(os.getpid(), sig)  # the runner cancels the job right now
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", signalled_replace)
    try:
        result = invoke("run", "--device", "cpu", "--json", "r.json")
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert result.exit_code == code
    assert result.stderr.splitlines()[-1] == f"egf-audit: error: interrupted ({name})"
    assert "Traceback" not in result.output
    assert DOC.read_bytes() == before and not Path("r.json").exists()
    assert no_temporaries(workdir) == [] and no_temporaries(DOC.parent) == []


def test_sigterm_to_a_real_run_is_one_line_143_and_leaves_no_temporary(tmp_path):
    """A real process, killed while it compiles kernels into an empty cache."""
    cache = tmp_path / "cache"
    (tmp_path / ".git").mkdir()
    env = {**os.environ, "EGF_AUDIT_CACHE": str(cache), "NO_COLOR": "1", "COLUMNS": "120"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "egf_audit", "run", "--device", "cpu"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:
        if "compiling kernels" in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 143
    assert rest.splitlines()[-1] == "egf-audit: error: interrupted (SIGTERM)"
    assert "Traceback" not in rest
    leftovers = (
        [p.name for p in cache.rglob("*") if p.name.startswith("tmp")] if cache.exists() else []
    )
    assert leftovers == []
    assert not (tmp_path / "docs").exists() or no_temporaries(tmp_path / "docs") == []


def test_ctrl_c_while_torch_imports_is_one_line(tmp_path):
    """A KeyboardInterrupt raised by the import of torch itself, as Ctrl-C during it would."""
    script = (
        "import sys\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "sys.argv = ['egf-audit', 'run', '--device', 'cpu']\n"
        "from egf_audit.entry import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    # torch is imported beside the backend and the scenarios (cli/beside.py): the progress
    # lines of what ran meanwhile come first, then the one line, and no traceback
    assert done.returncode == 130
    assert done.stderr.endswith("egf-audit: error: interrupted (Ctrl-C)\n"), done.stderr
    assert "Traceback" not in done.stderr and "torch" not in done.stderr + done.stdout
    assert all(line.startswith("egf-audit: ") for line in done.stderr.splitlines())


# ---- usage errors and widths ----
@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["run", "--bogus"], "No such option: --bogus"),
        (["run", "--steps", "many"], "Invalid value for '--steps'"),
        (["explain"], "Missing argument 'CODE|SLUG'"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_typer_usage_errors_are_one_line_exit_2(argv, fragment, capsys):
    assert run_app(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("egf-audit: error: ")
    assert fragment in err and "╭" not in err


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("  kernel x\n\n  does not compile \n", "kernel x | does not compile"),
        ("\n ", "(no message)"),
    ],
)
def test_an_error_message_is_put_on_one_line(message, line):
    assert one_line(message) == line


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (
            RuntimeError("CUDA error: out of memory\n  at frame 3\n"),
            "RuntimeError: CUDA error: out of memory",
        ),
        (ValueError(""), "ValueError"),
    ],
)
def test_a_bench_reason_is_the_exception_type_and_first_line(exc, line):
    assert exception_line(exc) == line


@pytest.mark.parametrize("columns", ["0", "40", "200"])
def test_a_failing_run_is_whole_at_any_width(fake, monkeypatch, columns):
    fake({"EGF007": FAIL}, summary="d_h_s2 differs at row 3 by 0.5")
    monkeypatch.setenv("COLUMNS", columns)
    result = invoke("run", "--device", "cpu")
    assert result.exit_code == 1
    out = result.stdout
    assert (
        out.splitlines()[-1]
        == f"FAIL: 2 of {2 * N} verdicts failed: EGF007[sentinel], EGF007[live]"
    )
    for code in CODES:
        assert code in out
    assert "d_h_s2 differs at row 3 by 0.5" in " ".join(out.split())
    assert "…" not in out


def test_a_passing_run_prints_a_short_labelled_table(fake):
    result = invoke("run", "--device", "cpu")
    assert len(result.stdout.splitlines()) <= 20
    assert "fake verdict: pass" not in result.stdout  # a pass needs no summary here


def test_auto_names_the_backend_it_picked(fake, monkeypatch):
    monkeypatch.setattr("egf_audit.runtime.backends.cuda_usable", lambda: (False, "no CUDA device"))
    monkeypatch.setattr("egf_audit.cli.commands.cuda_usable", lambda: (False, "no CUDA device"))
    result = invoke("run", "--json", "r.json")
    picked = "cpu (picked by --device auto: no usable GPU: no CUDA device)"
    assert "egf-audit: [4/" in result.stderr and f"] backend: {picked}" in result.stderr
    assert json.loads(Path("r.json").read_text())["run"]["picked"] == picked


def test_cuda_without_cupy_names_the_extra_to_install(workdir, monkeypatch):
    monkeypatch.setattr("egf_audit.runtime.backends.cuda_usable", lambda: (False, "no cupy"))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda name, *a: None if name == "cupy" else real(name, *a)
    )
    result = invoke("run", "--device", "cuda")
    assert result.exit_code == 3
    assert "pip install 'egf-audit[cuda13]' (CUDA 13) or 'egf-audit[cuda12]'" in result.stderr


def test_bench_batch_0_names_the_real_option():
    result = invoke("bench", "--device", "cpu", "--batch", "0")
    assert result.exit_code == 2
    assert "egf-audit: error: --batch must be an integer >= 1, got 0" in result.stderr
