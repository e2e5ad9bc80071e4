"""One document for every machine: regenerating it with another compiler, another kernel cache
and another BLAS threading gives the same bytes (measured here, not promised), while what does
differ between machines reaches stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FAKE_CXX = """#!/bin/sh
# a compiler that reports another version and compiles with the real one
if [ "$1" = "--version" ]; then echo "g++ (Imaginary Toolchain) 99.1.0"; exit 0; fi
exec {real} "$@"
"""


def _audit(folder: Path, env: dict[str, str]) -> tuple[bytes, str]:
    (folder / ".git").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "egf_audit", "run", "--device", "cpu"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return (folder / "docs" / "dqn-wire-up-audit.md").read_bytes(), done.stdout


@pytest.fixture(scope="module")
def default_audit(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, str]:
    """The document and stdout of a plain `egf-audit run --device cpu` in a fresh folder."""
    base = {k: v for k, v in os.environ.items() if k not in ("CXX", "EGF_AUDIT_CACHE")}
    return _audit(tmp_path_factory.mktemp("default") / "repo", base)


def test_the_committed_document_is_what_the_bundled_kernels_give_today(default_audit):
    """docs/dqn-wire-up-audit.md is generated, never edited: a change to an invariant's text,
    a kernel or the renderers that does not regenerate it makes .ci/run's gate fail after the
    whole test run; here it fails at once, with the first line that differs."""
    committed = (Path(__file__).resolve().parents[1] / "docs" / "dqn-wire-up-audit.md").read_bytes()
    fresh, _ = default_audit
    if fresh != committed:
        pairs = zip(committed.decode().splitlines(), fresh.decode().splitlines(), strict=False)
        line = next((i for i, (a, b) in enumerate(pairs, 1) if a != b), None)
        raise AssertionError(
            f"docs/dqn-wire-up-audit.md is stale from line {line}: run `egf-audit run` "
            "(--device cpu) at the repository root and commit it"
        )


def test_another_toolchain_and_cache_regenerate_the_same_bytes(tmp_path, default_audit):
    import shutil

    real = shutil.which("g++") or shutil.which("c++")
    assert real is not None
    fake = tmp_path / "fake-cxx"
    fake.write_text(FAKE_CXX.format(real=real))
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("CXX", "EGF_AUDIT_CACHE")}
    first, first_out = default_audit
    other = {
        **base,
        "CXX": str(fake),
        "EGF_AUDIT_CACHE": str(tmp_path / "fresh-cache"),  # every kernel compiled anew
        "OMP_NUM_THREADS": "1",  # the BLAS sums in another order
        "MKL_NUM_THREADS": "1",
    }
    second, second_out = _audit(tmp_path / "two", other)
    assert first == second
    assert "Imaginary Toolchain" in second_out and "Imaginary Toolchain" not in first_out
    assert any((tmp_path / "fresh-cache").rglob("*.so"))  # the fresh cache was really used
    import torch

    assert b"Imaginary" not in second and torch.__version__.encode() not in second
