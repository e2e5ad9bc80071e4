"""A name a trainer's file carries is shown, never obeyed: every renderer calls one helper,
reports/controls.py's `visible`, which writes control, format and bidi characters as escapes.
Run on a committed capture whose failing verdict quotes a tensor's name, that name made hostile,
the document, the JSON, the JUnit XML and the GitHub annotations hold no raw one of them."""

from __future__ import annotations

import gzip
import json
import shutil
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from egf_audit.cli.app import app
from egf_audit.reports.controls import visible
from egf_audit.reports.github import command
from egf_audit.reports.markdown import cell, code, text

DATA = Path(__file__).parent / "data" / "capture"
HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Cs")


def _hidden(value: str) -> list[str]:
    return [c for c in value if unicodedata.category(c) in HIDDEN]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b[31mb", "a\\x1b[31mb"),
        ("bel\x07", "bel\\x07"),
        ("nul\x00", "nul\\x00"),
        ("del\x7f", "del\\x7f"),
        ("rlo\u202egnp.exe", "rlo\\u202egnp.exe"),
        ("lri\u2066x\u2069", "lri\\u2066x\\u2069"),
        ("zw\u200bsp", "zw\\u200bsp"),
        ("line\u2028sep", "line\\u2028sep"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("lone\ud800", "lone\\ud800"),
        ("c1\x9b31m", "c1\\x9b31m"),
        ("tab\tand\nline", "tab\\x09and\\x0aline"),
        ("plain ascii, and ünïcode", "plain ascii, and ünïcode"),
        ("a back\\slash stays", "a back\\slash stays"),
    ],
)
def test_visible_escapes_every_control_format_and_bidi_character(raw, shown):
    assert visible(raw) == shown
    assert not _hidden(visible(raw))


def test_the_markdown_helpers_show_names_escaped_on_one_line():
    name = "d_h_s2\x1b[2J\u202e\nnext"
    assert text(name) == "d\\_h\\_s2\\\\x1b\\[2J\\\\u202e next"
    assert cell(name) == "d_h_s2\\x1b[2J\\u202e next"
    assert code(name) == "`d_h_s2\\x1b[2J\\u202e\\x0anext`"


def test_a_workflow_command_shows_a_name_escaped():
    line = command("error", "wrote buf\x1b[31m\u202e", title="EGF013")
    assert line == "::error title=EGF013::wrote buf\\x1b[31m\\u202e"


@pytest.mark.parametrize("chars", ["\x1b[31m", "\x07", "\x00", "\u202e", "\u2066", "\n", "\ud800"])
def test_every_output_of_run_capture_shows_a_hostile_name_escaped(tmp_path, chars):
    """The GEMM probe's short-K GEMM fails EGF001 naming its tensor: with that tensor renamed,
    the name reaches the verdict's summary, and so every output."""
    folder = tmp_path / "capture"
    shutil.copytree(DATA / "runtime" / "recorded" / "probe-k-short", folder)
    path = folder / "layout.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    tensors = doc["buffers"]["acts"]["tensors"]
    tensors[f"W{chars}evil"] = tensors.pop("W")
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    out = tmp_path / "out"
    args = ["run", "--capture", str(folder), "--out", str(out / "d.md")]
    args += ["--json", str(out / "r.json"), "--junit", str(out / "r.xml")]
    result = CliRunner().invoke(app, [*args, "--output-format", "github"])
    assert result.exit_code == 1, result.output  # EGF001 fails, whatever the tensor's name
    document = (out / "d.md").read_text()
    assert "evil" in document and not _hidden(document.replace("\n", ""))
    strings = json.dumps(json.loads((out / "r.json").read_text()), ensure_ascii=False)
    assert "evil" in strings and not _hidden(strings)
    junit = ET.parse(out / "r.xml").getroot()
    attributes = [v for e in junit.iter() for v in e.attrib.values()]
    assert any("evil" in v for v in attributes)
    assert not [v for v in attributes if _hidden(v)]
    annotations = [line for line in result.output.splitlines() if line.startswith("::")]
    assert any("evil" in a for a in annotations) and not [a for a in annotations if _hidden(a)]
