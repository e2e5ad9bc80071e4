"""Every hostile capture of tests/data/capture/hostile.py gets its documented outcome: refused
(exit 2, one line, no traceback) or failed (exit 1), within 60 s and 2 GB, every file that
existed before unchanged, and, for names with control or bidi characters, those characters
shown escaped in the document, the JSON, the JUnit XML and the GitHub annotations.

Each case runs in a forked child (its time and peak memory are its own, a hang is killed at 60
s) through the real entries: `run --capture` through the typer app (CliRunner, in process),
`capture` through its plain function with the recorder stood in for (no GPU here), and a few
through `python -m egf_audit` as a separate process. CI runs SAMPLE (a few of each class, about
20 s); the `hostile_all` marker, deselected by default (pyproject.toml's addopts), runs them all:

    python -m pytest -m hostile_all tests/test_capture_hostile.py -n 2

With HOSTILE_REPORT=FILE, each case appends what it measured (exit code, seconds, peak RSS).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 - imported here once, so a forked case does not import it again
from typer.testing import CliRunner

from egf_audit.capture import command
from egf_audit.cli.app import app
from egf_audit.errors import AuditEnvironmentError, UsageError

HERE = Path(__file__).parent
LIMIT_S = 60.0
LIMIT_RSS = 2 << 30  # bytes


def _load_hostile():
    path = HERE / "data" / "capture" / "hostile.py"
    spec = importlib.util.spec_from_file_location("capture_hostile", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations there
    spec.loader.exec_module(module)
    return module


hostile = _load_hostile()
CASES = hostile.CASES
# a fixed sample for every pull request: each class, the issue's own examples among them
SAMPLE = (
    "1-layout-deleted/polyak-tau-swap",
    "1-layout-foreign/dw-k-sh2",
    "1-snapshots-deleted/clean",
    "1-events-deleted/two-processes/trainer",
    "1-process-added/clean",
    "1-cut-after-step-0-closed/clean",
    "1-stray-values-2024.binary-report.xlsx/clean",
    "2-snapshots-flip-0.5/clean",
    "2-snapshots-crc/dw-k-sh2",
    "3-alloc-at-4096/clean",
    "3-alloc-overlapping/clean",
    "3-cublas-A-0x0xzz/clean",
    "3-lt-batch-2-62/runtime/recorded/rt-gemm-lt",
    "3-layout-tensors-overlap/clean",
    "3-layout-tensor-axes-product-2-41/llmc/recorded/llmc",
    "3-layout-tensor-9-axes/llmc/recorded/llmc",
    "4-two-processes-launcher-no-exit/two-processes",
    "4-two-processes-launcher-cut-mid-line/two-processes",
    "5-buffer-name-esc-sgr/dw-k-sh2",
    "5-buffer-name-rlo/dw-k-sh2",
    "6-layout-gzip-bomb/clean",
    "6-layout-fifo/clean",
    "6-layout-deep-json/clean",
    "6-layout-tau-10-400/clean",
    "6-scale-rows-2-31/clean",
    "6-30000-allocations-and-memsets/dw-k-sh2",
    "7-out-values-report-xlsx",
    "7-out-manifest-of-another-program",
    "7-command-plants-trace.jsonl-link",
    "7-command-plants-manifest.json-link",
)
THROUGH_A_PROCESS = ("1-layout-deleted/clean", "6-events-fifo/clean", "4-launcher-no-exit/clean")


def _params(names: tuple[str, ...] | None):
    """The cases named (CI's sample), or every case, marked hostile_all."""
    for case in CASES:
        if names is None:
            yield pytest.param(case, id=case.name, marks=pytest.mark.hostile_all)
        elif case.name in names:
            yield pytest.param(case, id=case.name)


def test_the_sample_names_cases_of_every_class():
    by_name = {c.name: c for c in CASES}
    assert set(SAMPLE) <= set(by_name) and set(THROUGH_A_PROCESS) <= set(by_name)
    assert {by_name[n].klass for n in SAMPLE} == set(range(1, 8))
    assert len(CASES) >= 1000


# ---- one case, in a child process ----
def _digest(path: Path) -> str:
    """A file's sha256, read a MiB at a time (a case's 2 GiB sparse file is never held whole)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path) -> dict[str, str]:
    """Every file under `root` (links as what they point at, special files by their kind)."""
    found: dict[str, str] = {}
    for folder, dirs, names in os.walk(root):
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            path = Path(folder) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = "link to " + os.readlink(path)
            elif path.is_file():
                found[key] = _digest(path)
            else:
                found[key] = "special"
    return found


def _run_capture(case, folder, out: Path) -> tuple[int, str]:
    args = ["run", "--capture", str(folder.path), "--out", str(out / "trainer-audit.md")]
    args += ["--json", str(out / "r.json"), "--junit", str(out / "r.xml")]
    if case.names:
        args += ["--output-format", "github"]
    result = CliRunner().invoke(app, args, env={"NO_COLOR": "1", "COLUMNS": "200"})
    return result.exit_code, result.output


def _capture(case, folder, out: Path) -> tuple[int, str]:
    lib = out / "libegf_capture_recorder.so"
    lib.write_bytes(b"a stand-in: no toolkit, no GPU here")
    command.build_recorder = lambda: lib
    command.CDLL = lambda path: None
    cmd, layout = hostile.command_line(case, folder, sys.executable)
    try:
        command.run_capture(cmd, folder.path, layout)
    except UsageError as exc:
        return 2, f"egf-audit: error: {exc}"
    except AuditEnvironmentError as exc:
        return 3, f"egf-audit: error: {exc}"
    except Exception as exc:  # a bug of egf-audit: the contract says exit 2
        return 3, f"egf-audit: error: internal error: {type(exc).__name__}: {exc}"
    return 0, "captured"


def run_case(case, tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "case"
    root.mkdir()
    folder = hostile.build(case, root)
    out = tmp_path / "out"
    out.mkdir()
    before = _files(root)
    read, write = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: run the case, report, and leave without running pytest's exit
        os.close(read)
        code, output = 3, ""
        try:
            runner = _capture if case.command else _run_capture
            code, output = runner(case, folder, out)
        except BaseException as exc:  # anything here is the case's result
            output = f"egf-audit: error: internal error: {type(exc).__name__}: {exc}"
        with os.fdopen(write, "w") as report:
            json.dump({"code": code, "output": output}, report)
        os._exit(0)
    os.close(write)
    status = rusage = None
    while time.perf_counter() - start < LIMIT_S:
        done, status, rusage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.wait4(pid, 0)
        os.close(read)
        pytest.fail(f"{case.name}: still running after {LIMIT_S:.0f} s")
    seconds = time.perf_counter() - start
    with os.fdopen(read) as report:
        text = report.read()
    assert text, f"{case.name}: the child died (status {status}) without a result"
    result = json.loads(text)
    result |= {"seconds": seconds, "rss": rusage.ru_maxrss * 1024, "before": before}
    result |= {"after": _files(root), "out": out, "root": root}
    return result


def _hidden(text: str) -> list[str]:
    return sorted({c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")})


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _assert_names_escaped(case, result: dict[str, Any]) -> None:
    """No raw control, format or bidi character in any output; the escaped name in each."""
    out: Path = result["out"]
    document = (out / "trainer-audit.md").read_text(encoding="utf-8")
    assert _hidden(document.replace("\n", "")) == [], "the document"
    assert "evil" in document and "\\" in document
    data = json.loads((out / "r.json").read_text(encoding="utf-8"))
    assert not [s for s in _strings(data) if _hidden(s)], "the JSON's strings"
    assert any("evil" in s for s in _strings(data))
    junit = ET.parse(out / "r.xml").getroot()
    texts = [v for e in junit.iter() for v in (*e.attrib.values(), e.text or "")]
    assert not [t for t in texts if _hidden(t.replace("\n", ""))], "the JUnit XML"
    annotations = [line for line in result["output"].splitlines() if line.startswith("::")]
    assert annotations and not [a for a in annotations if _hidden(a)], "the annotations"


def _judge(case, result: dict[str, Any]) -> None:
    code, output = result["code"], result["output"]
    if report := os.environ.get("HOSTILE_REPORT"):  # one line a case: what the run measured
        line = {"case": case.name, "class": case.klass, "expected": case.expected, "code": code}
        line |= {"seconds": round(result["seconds"], 3), "rss": result["rss"]}
        with open(report, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    assert "Traceback" not in output and "internal error" not in output, output[-2000:]
    assert code == case.expected, (
        f"{case.name}: exit {code}, expected {case.expected}\n{output[-2000:]}"
    )
    if code == 2:
        errors = [line for line in output.splitlines() if line.startswith("egf-audit: error:")]
        assert len(errors) == 1, output[-2000:]
    assert result["seconds"] <= LIMIT_S
    assert result["rss"] <= LIMIT_RSS, f"{result['rss'] / 2**30:.2f} GiB peak"
    before, after = result["before"], result["after"]
    changed = sorted(k for k in before if after.get(k) != before[k])
    if case.command and code != 0:  # a refused capture leaves --out and the user's files alone
        assert not changed, changed
    if not case.command:  # run --capture writes nothing into the capture or beside it
        assert after == before, sorted(set(after) ^ set(before)) or changed
    if case.command and case.name.startswith("7-out-"):
        assert "ran" not in after, "the command ran: --out must be refused before it runs"
    if case.names:
        _assert_names_escaped(case, result)


@pytest.mark.parametrize("case", list(_params(SAMPLE)))
def test_a_sampled_hostile_capture_gets_its_documented_outcome(case, tmp_path):
    _judge(case, run_case(case, tmp_path))


@pytest.mark.parametrize("case", list(_params(None)))
def test_every_hostile_capture_gets_its_documented_outcome(case, tmp_path):
    _judge(case, run_case(case, tmp_path))


@pytest.mark.parametrize("name", THROUGH_A_PROCESS)
def test_through_the_console_entry_a_hostile_capture_is_one_line(name, tmp_path):
    case = hostile.BY_NAME[name]
    folder = hostile.build(case, tmp_path / "case")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "egf_audit",
            "run",
            "--capture",
            str(folder.path),
            "--out",
            str(tmp_path / "doc.md"),
        ],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert result.returncode == case.expected, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    if case.expected == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
