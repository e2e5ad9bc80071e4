"""The contract a trainer agrees to ships with egf-audit and is what the docs cite: its tables
are the code's (tests/contract_doc.py draws them), the wheel carries it, and no doc or message
of the package cites a "SPEC" that no user has."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from pathlib import Path

from contract_doc import DOC, REGIONS, ROOT, render

SOURCES = ("py", "c", "h", "cu")
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


def _tracked(*patterns: str) -> list[Path]:
    """The repository's files of these patterns: what git tracks (a developer's build/ or
    scratch folders are not the repository), else every match below the root."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *patterns],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for pattern in patterns for p in ROOT.glob(pattern) if ".venv" not in str(p)]
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_doc_or_package_source_cites_a_spec():
    """The docs once cited "the SPEC" and its sections, a file no user has: they cite
    kernels/CONTRACT.md (or a doc) instead, and so do the package's sources (the recorder's C
    and kernel sources included: a user reads them too)."""
    files = _tracked("*.md")
    files += _tracked(*(f"{top}/*.{ext}" for top in PACKAGE_FOLDERS for ext in SOURCES))
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
