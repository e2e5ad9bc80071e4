"""The recorder's units build as shipped and stay clean: the shipped compiler call (build.py's
build_command) with `-Wall -Wextra -Werror` added compiles every unit without one warning, and
`-Wmissing-prototypes` holds every function one unit gives another to recorder.h; the library
exports InitializeInjection and cublasLtMatmul alone (a trainer's own `note` or `snapshot_region`
is never called by the recorder, nor the recorder's by the trainer); every C file and header in
the recorder's folder is a unit or the header build.py compiles and hashes into the cache key,
and ships in the wheel as package data."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from egf_audit.capture.build import (
    HEADERS,
    HERE,
    SOURCES,
    UNITS,
    _compiler,
    build_command,
    build_recorder,
    find_toolkit,
    source_key,
)
from egf_audit.errors import AuditEnvironmentError

ROOT = Path(__file__).resolve().parents[1]
# CI's warnings on top of the shipped -Wall (the shipped build stays as it is: a user's newer
# compiler may warn where this one does not, and must still build the recorder)
CI_WARNINGS = ["-Wextra", "-Wmissing-prototypes", "-Werror"]


@pytest.fixture(scope="module")
def toolkit():
    try:
        return find_toolkit()
    except AuditEnvironmentError as exc:
        pytest.skip(f"no CUDA toolkit headers to build the recorder with: {exc}")


def _strict_command(toolkit, out: Path) -> list[str]:
    command = build_command(_compiler(), toolkit, out)
    assert "-Wall" in command
    at = command.index("-o")
    return [*command[:at], *CI_WARNINGS, *command[at:]]


def test_every_unit_compiles_without_a_warning(toolkit, tmp_path):
    done = subprocess.run(
        _strict_command(toolkit, tmp_path / "lib.so"), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    assert (tmp_path / "lib.so").is_file()


@pytest.mark.parametrize(
    "planted",
    [
        "int rec_planted(int unused);\nint rec_planted(int unused) { return 0; }\n",  # -Wextra
        "int rec_planted(void) { return 0; }\n",  # -Wmissing-prototypes
    ],
    ids=["unused-parameter", "no-prototype"],
)
def test_a_warning_fails_the_strict_build(toolkit, tmp_path, monkeypatch, planted):
    """The check can fail: a unit that the shipped flags compile silently fails under CI's."""
    folder = tmp_path / "units"
    shutil.copytree(HERE, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    unit = folder / "rec_device.c"
    unit.write_text(unit.read_text(encoding="utf-8") + planted, encoding="utf-8")
    monkeypatch.setattr("egf_audit.capture.build.SOURCES", tuple(folder / n for n in UNITS))
    shipped = build_command(_compiler(), toolkit, folder / "lib.so")
    done = subprocess.run(shipped, capture_output=True, text=True)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    strict = subprocess.run(_strict_command(toolkit, folder / "lib.so"), capture_output=True)
    assert strict.returncode != 0


def test_the_library_exports_its_two_entry_points_alone(toolkit, tmp_path, monkeypatch):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm here")
    monkeypatch.setenv("EGF_AUDIT_CACHE", str(tmp_path))
    lib = build_recorder()
    listed = subprocess.run(
        [nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in listed.splitlines() if line.split()[1:2] != ["w"]}
    assert exported == {"InitializeInjection", "cublasLtMatmul"}


def test_every_c_file_and_header_is_built_hashed_and_shipped():
    on_disk = {p.name for p in HERE.iterdir() if p.suffix in (".c", ".h")}
    assert on_disk == {*UNITS, *HEADERS}
    assert [p.name for p in SOURCES] == list(UNITS) and UNITS[0] == "egf_capture_recorder.c"
    assert [key.split("\0", 1)[0] for key in source_key()] == [*UNITS, *HEADERS]
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = settings["tool"]["setuptools"]["package-data"]["egf_audit.capture"]
    unshipped = [n for n in on_disk if not any(fnmatch.fnmatch(n, pat) for pat in patterns)]
    assert unshipped == []


def test_a_change_to_the_header_is_a_new_build(tmp_path, monkeypatch):
    """The cache key hashes the header too: an edit to recorder.h alone changes it."""
    before = source_key()
    folder = tmp_path / "units"
    shutil.copytree(HERE, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    header = folder / "recorder.h"
    header.write_text(header.read_text(encoding="utf-8") + "// edited\n", encoding="utf-8")
    texts = (*(folder / name for name in UNITS), *(folder / name for name in HEADERS))
    monkeypatch.setattr("egf_audit.capture.build.TEXTS", texts)
    after = source_key()
    assert after[:-1] == before[:-1] and after[-1] != before[-1]


def test_the_docs_name_every_unit():
    """docs/design.md's row of auditor/capture/ and docs/capture.md's "How it works" name each
    unit and the header (the module-table test reads `.py` files alone)."""
    from test_design_doc import DESIGN, rows

    (row,) = rows(DESIGN.read_text(encoding="utf-8"))["auditor/capture/"]
    capture_doc = (ROOT / "docs" / "capture.md").read_text(encoding="utf-8")
    how = capture_doc.split("\n## How it works\n", 1)[1].split("\n## ", 1)[0]
    for name in (*UNITS, *HEADERS):
        assert f"`{name}`" in row, name
        assert f"`{name}`" in how, name
