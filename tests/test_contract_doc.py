"""The contract a trainer agrees to ships with egf-audit and is what the docs cite: its tables
are the code's (tests/contract_doc.py draws them), the wheel carries it, and no doc or message
of the package cites a "SPEC" that no user has."""

from __future__ import annotations

import fnmatch
import re
import tomllib

from contract_doc import DOC, REGIONS, ROOT, render

PACKAGE_FOLDERS = ("auditor", "invariants", "reports", "kernels")


def test_every_table_of_the_contract_is_the_codes():
    text = DOC.read_text(encoding="utf-8")
    assert render(text) == text, "run `python tests/contract_doc.py --write`"
    for name in REGIONS:
        assert f"<!-- BEGIN {name}:" in text


def test_the_wheel_carries_the_contract_beside_the_kernels():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["egf_audit.kernels"]
    for name in ("CONTRACT.md", "README.md"):
        assert any(fnmatch.fnmatch(name, p) for p in patterns), name


def test_no_doc_or_package_source_cites_a_spec():
    """The docs once cited "the SPEC" and its sections, a file no user has: they cite
    kernels/CONTRACT.md (or a doc) instead."""
    files = [p for p in ROOT.rglob("*.md") if not {".venv", ".git"} & set(p.parts)]
    files = [p for p in files if not any(part.startswith(".venv") for part in p.parts)]
    files += [p for top in PACKAGE_FOLDERS for p in (ROOT / top).rglob("*.py")]
    citing = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bSPEC\b", line)
    ]
    assert citing == []


def test_every_doc_that_names_the_contract_links_a_file_that_exists():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]*CONTRACT\.md)\)", doc.read_text()):
            assert (doc.parent / target).resolve() == DOC, (doc.name, target)
