"""The CPU build cache cannot lie, and environment faults are one line naming what to fix (issue
11, Deliver 4 and 7): a truncated, swapped or unrecorded build is rebuilt (stderr says so), never
loaded; an unusable cache folder, HOME or CXX is one error line, exit 3; no temporary folder is
left behind. Builds here are one-function units, compiled in a private cache per test.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from egf_audit.capture import build as capture_build
from egf_audit.cli.app import app
from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime.backends import cpu_build
from egf_audit.runtime.build_cache import cache_dir

TERMINAL = {"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"}


def unit(answer: int, tag: Path) -> str:
    # the tag keeps each test's library path its own: the loader would reuse a loaded path
    return f'// {tag}\nextern "C" int egf_answer() {{ return {answer}; }}\n'


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EGF_AUDIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "cpu-kernels"


def leftovers(folder: Path) -> list[str]:
    """What a build left beside its library, its sidecar and its lock (cpu_build._one_builder)."""
    kept = (".so", ".so.sha256", ".so.lock")
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(kept))


def test_a_build_is_recorded_with_its_key_and_bytes_and_reused(cache, tmp_path):
    lib = cpu_build.build_library("answer", unit(1, tmp_path), {}, "answer")
    assert cpu_build.cached_build_ok(lib, lib.stem.split("-")[-1])
    mtime = lib.stat().st_mtime_ns
    assert cpu_build.build_library("answer", unit(1, tmp_path), {}, "answer") == lib
    assert lib.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert leftovers(cache) == []


@pytest.mark.parametrize("damage", ["truncate", "drop-record", "bad-record"])
def test_a_damaged_build_is_rebuilt_and_said_so(damage, cache, tmp_path, capsys):
    lib = cpu_build.build_library("answer", unit(7, tmp_path), {}, "answer")
    if damage == "truncate":
        lib.write_bytes(lib.read_bytes()[:100])
    elif damage == "drop-record":
        Path(f"{lib}.sha256").unlink()
    else:
        Path(f"{lib}.sha256").write_text("0" * 24 + " " + "0" * 64 + "\n")
    loaded = cpu_build.load_library("answer", unit(7, tmp_path), {}, "answer")
    assert loaded.egf_answer() == 7
    assert f"cached build {lib} does not match its recorded hash: rebuilding it" in (
        capsys.readouterr().err
    )
    assert leftovers(cache) == []


def test_a_swapped_build_is_never_loaded(cache, tmp_path, capsys):
    """Another unit's library (and its record) under this unit's name: the record names the
    other key, so it is rebuilt; loading it would run other code than the document names."""
    mine = cpu_build.build_library("answer", unit(1, tmp_path), {}, "answer")
    other = cpu_build.build_library("answer", unit(2, tmp_path), {}, "answer")
    shutil.copyfile(other, mine)
    shutil.copyfile(f"{other}.sha256", f"{mine}.sha256")
    assert cpu_build.load_library("answer", unit(1, tmp_path), {}, "answer").egf_answer() == 1
    assert "rebuilding" in capsys.readouterr().err


def test_a_compile_error_leaves_no_temporary_folder(cache, tmp_path):
    with pytest.raises(AuditEnvironmentError, match="does not compile"):
        cpu_build.build_library("broken", "int broken( {", {}, "broken.cu")
    assert leftovers(cache) == []


# ---- environment faults: one line naming what to fix ----
def one_error_line(result) -> str:
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("egf-audit: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def run_cpu(tmp_path, **env):
    args = ["run", "--device", "cpu", "--out", str(tmp_path / "audit.md")]
    return CliRunner().invoke(app, args, env={**TERMINAL, **env})


def test_a_cache_folder_that_cannot_be_made_names_it_and_the_variable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    line = one_error_line(run_cpu(tmp_path, EGF_AUDIT_CACHE=str(blocker)))
    assert f"{blocker}/cpu-kernels" in line and "EGF_AUDIT_CACHE" in line
    assert not (tmp_path / "audit.md").exists()


def test_an_unwritable_home_names_the_folder_and_the_variable(tmp_path, monkeypatch):
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.delenv("EGF_AUDIT_CACHE", raising=False)
    line = one_error_line(run_cpu(tmp_path, HOME=str(home)))
    assert str(home) in line and "EGF_AUDIT_CACHE" in line


@pytest.mark.parametrize("kind", [cpu_build.CACHE_KIND, capture_build.CACHE_KIND])
def test_both_builds_share_one_cache_home(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("EGF_AUDIT_CACHE", str(tmp_path))
    assert cache_dir(kind) == tmp_path / kind
    monkeypatch.delenv("EGF_AUDIT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir(kind) == tmp_path / "home" / ".cache" / "egf-audit" / kind


def test_no_home_folder_at_all_is_one_environment_error(monkeypatch):
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("EGF_AUDIT_CACHE", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    with pytest.raises(AuditEnvironmentError, match="no home folder for the capture cache: set"):
        cache_dir(capture_build.CACHE_KIND)


def test_a_read_only_cache_folder_names_it(tmp_path):
    folder = tmp_path / "ro" / "cpu-kernels"
    folder.mkdir(parents=True)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        probe = folder / "probe"
        try:
            probe.write_text("")
        except PermissionError:
            pass
        else:
            pytest.skip("this user writes into read-only folders (root)")
        line = one_error_line(run_cpu(tmp_path, EGF_AUDIT_CACHE=str(tmp_path / "ro")))
        assert str(folder) in line and "EGF_AUDIT_CACHE" in line
    finally:
        folder.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("cxx", ["egf-no-such-compiler", "egf-no-such-wrapper g++"])
def test_a_cxx_that_is_no_compiler_names_cxx(cxx, tmp_path):
    line = one_error_line(run_cpu(tmp_path, EGF_AUDIT_CACHE=str(tmp_path / "c"), CXX=cxx))
    assert f"CXX={cxx!r}" in line and cxx.split()[0] in line


def test_no_compiler_at_all_says_what_to_install(tmp_path):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    env = {"EGF_AUDIT_CACHE": str(tmp_path / "c"), "CXX": "", "PATH": str(empty)}
    line = one_error_line(run_cpu(tmp_path, **env))
    assert "install g++ or set CXX" in line


def test_a_build_folder_left_by_a_killed_run_is_swept(cache, tmp_path):
    cache.mkdir(parents=True)
    stale, fresh = cache / ".build-killed", cache / ".build-running"
    for folder in (stale, fresh):
        (folder / "unit.cpp").parent.mkdir()
        (folder / "unit.cpp").write_text("")
    old = stale.stat().st_mtime - cpu_build.STALE_BUILD_S - 60
    os.utime(stale, (old, old))
    cpu_build.build_library("answer", unit(5, tmp_path), {}, "answer")
    assert not stale.exists() and fresh.exists()


def test_a_wrapper_in_cxx_is_two_words_not_one_program(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "env g++")  # a wrapper the way `ccache g++` is one
    monkeypatch.setenv("EGF_AUDIT_CACHE", str(tmp_path / "c"))
    assert cpu_build.compiler()[1:] == ["g++"]
    assert cpu_build.load_library("answer", unit(3, tmp_path), {}, "a").egf_answer() == 3


def test_a_full_disk_is_named_not_blamed_on_the_kernel(tmp_path, monkeypatch):
    """The compiler reports ENOSPC when the cache's disk is full; simulated by a compiler that
    says so (filling a real disk is not a test)."""
    fake = tmp_path / "full-disk-g++"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo "fake g++ 1"; exit 0; fi\n'
        'echo "fatal error: error writing to /x/ccA.s: No space left on device" >&2; exit 1\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("EGF_AUDIT_CACHE", str(tmp_path / "c"))
    with pytest.raises(AuditEnvironmentError) as caught:
        cpu_build.build_library("answer", unit(4, tmp_path), {}, "kernels/polyak_ema_kernel.cu")
    message = str(caught.value)
    assert "no space left" in message and str(tmp_path / "c") in message
    assert "polyak_ema" not in message


def test_a_second_process_wanting_the_same_build_waits_for_it_and_reuses_it(
    cache, tmp_path, monkeypatch
):
    """Two test workers, or two jobs on one cache, ask for the same kernel at once: the second
    waits for the first's build and loads it instead of compiling it again. The compiler here
    logs each compile and takes a second, so the two requests overlap."""
    import shutil
    import subprocess
    import sys
    import textwrap

    log = tmp_path / "compiles.log"
    slow = tmp_path / "slow-cxx"
    real = shutil.which("g++") or shutil.which("c++")
    slow.write_text(
        f'#!/bin/sh\ncase "$*" in *--version*) ;; *) echo compile >> {log}; sleep 1;; esac\n'
        f'exec {real} "$@"\n'
    )
    slow.chmod(0o755)
    monkeypatch.setenv("CXX", str(slow))
    script = textwrap.dedent(
        f"""
        from egf_audit.runtime.backends import cpu_build
        print(cpu_build.build_library("answer", {unit(1, tmp_path)!r}, {{}}, "answer"))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1]
    assert log.read_text().split() == ["compile"]  # compiled once, for both
