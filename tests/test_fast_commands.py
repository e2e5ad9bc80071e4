"""Commands that print static text answer without importing torch, numpy or cupy (each costs a
second or more to import): every `--help`, `invariants`, `explain`, `config --example` and
`mutants --list`. Their time is measured in docs/ci-gate.md, not asserted here; what is
asserted is the cause.

The texts `invariants` and `explain` print are read from the invariant modules' source
(egf_audit.invariant_text); they must equal the imported registry's, entry by entry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from egf_audit import invariants
from egf_audit.invariant_text import TEXT_FIELDS, read_texts

HEAVY = ("torch", "numpy", "cupy")
COMMANDS = [
    ["--help"],
    ["--version"],
    ["run", "--help"],
    ["capture", "--help"],
    ["bench", "--help"],
    ["mutants", "--help"],
    ["config", "--help"],
    ["invariants", "--help"],
    ["explain", "--help"],
    ["invariants"],
    ["invariants", "--json"],
    ["explain", "EGF003"],
    ["explain", "gemm-k-matches-lda"],
    ["config", "--example"],
    ["mutants", "--list"],
]
PROBE = """
import sys
from egf_audit.cli.app import run_app
code = run_app(sys.argv[1:])
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")
sys.exit(code)
"""


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_static_commands_import_no_heavy_module(argv):
    done = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # it did print its text
    assert "HEAVY=\n" in done.stderr, done.stderr


def test_the_texts_read_from_source_equal_the_registry():
    texts = read_texts()
    assert [t.code for t in texts] == [inv.code for inv in invariants.INVARIANTS]
    for text, inv in zip(texts, invariants.INVARIANTS, strict=True):
        for name in TEXT_FIELDS:
            assert getattr(text, name) == getattr(inv, name), (inv.code, name)
        assert text.doc() == inv.doc()


def test_invariants_json_is_the_registry(capsys):
    from egf_audit.cli.explain import invariants_json

    data = json.loads(invariants_json())
    assert [d["code"] for d in data["invariants"]] == [i.code for i in invariants.INVARIANTS]
    assert data["invariants"][4]["limits"] == invariants.INVARIANTS[4].limits


def test_a_module_whose_text_is_not_a_literal_falls_back_to_the_registry(monkeypatch, tmp_path):
    """Never a wrong text: a module that computes a text makes the static reading give up, and
    the registry (slow, exact) answers."""
    from egf_audit import invariant_text

    (tmp_path / "egf001_x.py").write_text(
        "INVARIANT = Invariant(code='EGF001', slug='s', message=m, what='', why='', how='', "
        "catches='', limits='', example='')\n"
    )
    monkeypatch.setattr(invariant_text, "_folder", lambda: tmp_path)
    with pytest.raises(invariant_text.UnreadableText):
        invariant_text.read_texts()
    from egf_audit.cli import explain

    assert explain.invariant_texts()[0] == invariants.INVARIANTS[0].text()
