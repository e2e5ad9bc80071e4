"""`run --capture` is the rebuild's gate: the same output rules, verdict type and renderers, and
the options that mean nothing for a capture refused. Built on copies of the committed clean
capture (tests/data/capture/clean)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from egf_audit.cli.app import app

DATA = Path(__file__).parent / "data" / "capture"


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def capture(tmp_path) -> Path:
    folder = tmp_path / "capture"
    shutil.copytree(DATA / "clean", folder)
    return folder


@pytest.mark.parametrize(
    "option",
    [
        ["--mode", "live"],
        ["--device", "cpu"],
        ["--preset", "prod"],
        ["--steps", "2"],
        ["--kernels", "kernels"],
        ["--sanitize"],
        ["--launch-timeout", "3"],
    ],
    ids=lambda o: o[0],
)
def test_an_option_that_shapes_the_rebuild_is_refused_with_a_capture(capture, tmp_path, option):
    result = _invoke("run", "--capture", str(capture), "--out", str(tmp_path / "d.md"), *option)
    assert result.exit_code == 2, result.output
    assert f"{option[0]} shapes the rebuild and means nothing for --capture" in result.output
    assert not (tmp_path / "d.md").exists()


def test_an_output_inside_the_capture_folder_is_refused(capture):
    before = sorted(p.name for p in capture.iterdir())
    for option in ("--out", "--json", "--junit", "--trace"):
        extra = [] if option == "--out" else ["--out", str(capture.parent / "d.md")]
        result = _invoke("run", "--capture", str(capture), *extra, option, str(capture / "x"))
        assert result.exit_code == 2, result.output
        assert "lies inside the capture folder" in result.output
    assert sorted(p.name for p in capture.iterdir()) == before


def test_two_outputs_on_one_path_are_refused(capture, tmp_path):
    same = str(tmp_path / "same")
    out = str(tmp_path / "d.md")
    args = ["--out", out, "--json", same, "--junit", same]
    result = _invoke("run", "--capture", str(capture), *args)
    assert result.exit_code == 2
    assert "--json and --junit both write" in result.output
    assert not Path(same).exists() and not Path(out).exists()


def test_stdout_carries_the_json_and_the_human_part_goes_to_stderr(capture, tmp_path):
    runner = CliRunner()
    args = ["run", "--capture", str(capture), "--out", str(tmp_path / "d.md")]
    result = runner.invoke(app, [*args, "--output-format", "json"])
    doc = json.loads(result.stdout)
    assert doc["schema"] == "egf-audit/capture/2"
    assert doc["exit_code"] == result.exit_code == (0 if doc["ok"] else 1)
    assert doc["sections"] == ["process 1"]
    codes = [inv["code"] for inv in doc["invariants"]]
    assert codes == sorted(codes) and len(codes) == 13
    result = runner.invoke(app, [*args, "--json", "-"])
    assert json.loads(result.stdout)["verdict"] == doc["verdict"]


def test_a_stale_check_names_stale_on_the_last_line(capture, tmp_path):
    doc = tmp_path / "trainer-audit.md"
    assert _invoke("run", "--capture", str(capture), "--out", str(doc)).exit_code in (0, 1)
    doc.write_text(doc.read_text() + "edited by hand\n")
    result = _invoke("run", "--capture", str(capture), "--out", str(doc), "--check")
    assert result.exit_code == 1
    assert "STALE" in result.stdout.strip().splitlines()[-1]


def test_the_document_is_the_same_for_another_capture_of_the_same_code(capture, tmp_path):
    other = tmp_path / "elsewhere" / "another-name"
    shutil.copytree(capture, other)
    (events,) = other.glob("events-*")
    pid = events.name.split("-")[1].split(".")[0]
    for old in other.glob(f"*-{pid}.*"):  # another process id for the same run
        old.rename(other / old.name.replace(f"-{pid}.", "-9917."))
    docs = []
    out = tmp_path / "trainer-audit.md"
    for folder in (capture, other):
        _invoke("run", "--capture", str(folder), "--out", str(out))
        docs.append(out.read_bytes())
    assert docs[0] == docs[1]
    text = docs[0].decode()
    assert f"{pid}" not in text and "another-name" not in text  # no pid, no folder name
    assert "0x7f" not in text and "139730" not in text  # no device address


def test_names_from_the_layout_file_are_escaped_in_the_document(capture, tmp_path):
    raw = json.loads(gzip.decompress((capture / "layout.json.gz").read_bytes()))
    evil = "obs|<img src=x onerror=alert(1)>`[x](y)"
    raw["buffers"][evil] = raw["buffers"].pop("obs")
    (capture / "layout.json.gz").write_bytes(gzip.compress(json.dumps(raw).encode()))
    out = tmp_path / "d.md"
    _invoke("run", "--capture", str(capture), "--out", str(out))
    text = out.read_text()
    assert evil not in text and not re.search(r"(?<!\\)<img", text)  # no live HTML
    assert "obs\\|\\<img src=x onerror=alert(1)\\>\\`\\[x\\](y)" in text


def test_a_capture_cut_off_mid_line_fails_as_incomplete_naming_the_line(capture, tmp_path):
    (events,) = capture.glob("events-*.jsonl.gz")
    lines = gzip.decompress(events.read_bytes())
    events.write_bytes(gzip.compress(lines[:-30]))  # the exit event, cut short
    result = _invoke("run", "--capture", str(capture), "--out", str(tmp_path / "d.md"))
    assert result.exit_code == 1
    number = lines.count(b"\n")
    assert f"{events.name} line {number} is cut off mid-write" in result.stdout.splitlines()[-1]
    assert "Traceback" not in result.output


def test_a_trainer_that_died_of_a_signal_fails_as_incomplete(tmp_path):
    result = _invoke("run", "--capture", str(DATA / "killed"), "--out", str(tmp_path / "d.md"))
    assert result.exit_code == 1
    last = result.stdout.strip().splitlines()[-1]
    assert "the captured command died of signal 9 (SIGKILL) (manifest.json)" in last


def test_run_capture_prints_nothing_on_stderr_but_its_own_lines(tmp_path):
    """A real process, warnings on as Python shows them by default: a library's warning (torch's
    'The given NumPy array is not writable' for the capture's read-only snapshot arrays) is
    noise in every CI log, and hides the lines that matter."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    argv = ["run", "--capture", str(DATA / "clean"), "--out", str(tmp_path / "d.md")]
    done = subprocess.run(
        [sys.executable, "-m", "egf_audit", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    foreign = [line for line in done.stderr.splitlines() if not line.startswith("egf-audit: ")]
    assert foreign == []


LLMC = DATA / "llmc" / "recorded"
NO_TRAINER = (
    "FAIL: no process is an SP14 trainer: none of the ABI kernels (sp14_dir_concat_qaux, "
    "sp14_scale_wire_col, accumulate_d_h_s2_from_concat, polyak_ema) was launched in the 1 "
    "recorded process (a program that is no SP14 trainer by design is audited with --trainer "
    "generic)"
)


@pytest.mark.parametrize(
    ("folder", "line"),
    [
        (
            LLMC / "llmc-planted",
            NO_TRAINER + "; of the 2 verdicts that need no SP14 name, 1 failed: EGF001[process 1]",
        ),
        (
            LLMC / "llmc",
            NO_TRAINER + "; of the 2 verdicts that need no SP14 name, 1 holds and 1 cannot be "
            "decided from this capture (EGF013)",
        ),
    ],
    ids=["planted", "clean"],
)
def test_the_verdict_line_of_a_program_that_is_no_sp14_trainer_says_one_thing(
    tmp_path, folder, line
):
    """Not "1 of 13 verdicts failed" beside "no SP14 trainer": the 11 SP14 invariants are not
    applicable to it, so the line counts only the verdicts it could get."""
    result = _invoke("run", "--capture", str(folder), "--out", str(tmp_path / "d.md"))
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == line
