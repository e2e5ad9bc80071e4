"""Compiling the CPU backend's shared libraries, and a build cache that cannot lie.

A build is cached as `<name>-<key>.so` beside `<name>-<key>.so.sha256`. The key hashes the whole
translation unit, every header it may include (the shim and any beside a `--kernels` source),
the compiler's identity and the flags; the sidecar records the key and the sha256 of the
library's own bytes. A library is used only when both match: a truncated, swapped or foreign
file is rebuilt (and stderr says so), never loaded. `<name>-<key>.so.lock` beside them lets one
process at a time look for and make that build, so parallel runs compile a kernel once. The
cache folder is `$EGF_AUDIT_CACHE`, else `~/.cache/egf-audit`; a folder that cannot be used is
one error line naming it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime.build_cache import CACHE_HINT, cache_dir

CXX_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]
CACHE_KIND = "cpu-kernels"  # the cache's folder for these builds (runtime/build_cache.py)


class KernelCompileError(AuditEnvironmentError):
    """A kernel source the host compiler refuses (exit 3 on the rebuild; capture --cpu refuses
    the kernels of that source by name instead)."""


STALE_BUILD_S = 3600  # a build folder this old belongs to a run that was killed


def _sweep_stale_builds(folder: Path) -> None:
    """Remove build folders left by a run killed mid-compile (SIGKILL skips every cleanup);
    a concurrent run's fresh folder is left alone."""
    now = time.time()
    for stale in folder.glob(".build-*"):
        with contextlib.suppress(OSError):
            if now - stale.stat().st_mtime > STALE_BUILD_S:
                shutil.rmtree(stale, ignore_errors=True)


def _usable_cache(folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass  # the folder takes a new file: builds can be written there
        _sweep_stale_builds(folder)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise AuditEnvironmentError(
            f"the kernel cache folder {folder} cannot be used ({reason}): {CACHE_HINT}"
        ) from None
    return folder


def compiler() -> list[str]:
    """The C++ compiler command: `$CXX` split as a shell would (`ccache g++` is two words),
    else g++ or c++ from PATH."""
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        words = shlex.split(cxx)
        if shutil.which(words[0]) is None:
            raise AuditEnvironmentError(
                f"CXX={cxx!r}: {words[0]!r} is not an executable on PATH; set CXX to a C++ "
                "compiler (g++) or unset it"
            )
        return words
    found = shutil.which("g++") or shutil.which("c++")
    if not found:
        raise AuditEnvironmentError(
            "the CPU backend needs a C++ compiler: install g++ or set CXX to one"
        )
    return [found]


@lru_cache(maxsize=8)
def compiler_id(cxx: tuple[str, ...]) -> str:
    try:
        out = subprocess.run([*cxx, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise AuditEnvironmentError(
            f"the C++ compiler {shlex.join(cxx)} cannot run: {exc}"
        ) from None
    if out.returncode != 0 or not out.stdout.strip():
        raise AuditEnvironmentError(
            f"the C++ compiler {shlex.join(cxx)} does not answer --version: set CXX to a C++ "
            "compiler (g++)"
        )
    return out.stdout.splitlines()[0]


def _first_error_lines(stderr: str, limit: int = 6) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln]
    return " | ".join((errors or lines)[:limit])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cached_build_ok(lib: Path, key: str) -> bool:
    """The library is there, and its sidecar names this key and the library's own bytes."""
    try:
        recorded = Path(f"{lib}.sha256").read_text(encoding="ascii").split()
        return recorded == [key, _sha256(lib)]
    except (OSError, UnicodeDecodeError):
        return False


def say(message: str) -> None:
    print(f"egf-audit: {message}", file=sys.stderr, flush=True)


def _disk_full(folder: Path) -> AuditEnvironmentError:
    return AuditEnvironmentError(
        f"no space left on the device under the kernel cache folder {folder}: free space there "
        f"or {CACHE_HINT} on another disk"
    )


@contextlib.contextmanager
def _one_builder(lib: Path) -> Iterator[None]:
    """Held while a process looks for and makes one build: another process (a parallel test
    worker, a second CI job on the same cache) that wants the same key waits and then finds it
    built, instead of compiling it again. An advisory lock, released when the holder exits
    however it exits; where the folder takes no lock (some network file systems), builds run
    side by side as before, each replacing the other's identical result."""
    try:
        fd = os.open(f"{lib}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def build_library(
    name: str,
    unit: str,
    headers: dict[str, str],
    display: str,
    extra_flags: tuple[str, ...] = (),
) -> Path:
    """The shared library for one translation unit, from the cache when an intact build of the
    same key is there, else compiled (headers written beside the unit, relative paths kept).
    `extra_flags` come after CXX_FLAGS (capture --cpu binds a library's symbols to itself)."""
    cxx = compiler()
    parts = [unit, compiler_id(tuple(cxx)), " ".join([*CXX_FLAGS, *extra_flags])]
    parts += [f"{n}\0{t}" for n, t in sorted(headers.items())]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    folder = _usable_cache(cache_dir(CACHE_KIND))
    lib = folder / f"{name}-{key}.so"
    with _one_builder(lib):
        return _cached_or_built(
            lib, key, folder, [*cxx, *CXX_FLAGS, *extra_flags], unit, headers, display
        )


def _cached_or_built(
    lib: Path,
    key: str,
    folder: Path,
    command: list[str],
    unit: str,
    headers: dict[str, str],
    display: str,
) -> Path:
    """`command`: the compiler and its flags, to which the output and the unit are added."""
    if lib.exists():
        if cached_build_ok(lib, key):
            return lib
        say(f"cached build {lib} does not match its recorded hash: rebuilding it")
    try:
        with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
            cpp = Path(tmp) / "unit.cpp"
            cpp.write_text(unit, encoding="utf-8")
            for header, text in headers.items():
                (Path(tmp) / header).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / header).write_text(text, encoding="utf-8")
            built = Path(tmp) / "lib.so"
            proc = subprocess.run(
                [*command, "-o", str(built), str(cpp)],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                if "No space left on device" in proc.stderr:
                    raise _disk_full(folder)
                raise KernelCompileError(
                    f"kernel {display} does not compile: {_first_error_lines(proc.stderr)}"
                )
            sidecar = Path(tmp) / "lib.so.sha256"
            sidecar.write_text(f"{key} {_sha256(built)}\n", encoding="ascii")
            # sidecar first: a reader between the two renames sees a mismatch and rebuilds
            os.replace(sidecar, f"{lib}.sha256")
            os.replace(built, lib)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _disk_full(folder) from None
        raise AuditEnvironmentError(
            f"the kernel cache folder {folder} cannot be used ({exc.strerror or exc}): {CACHE_HINT}"
        ) from None
    return lib


def load_library(
    name: str,
    unit: str,
    headers: dict[str, str],
    display: str,
) -> ctypes.CDLL:
    """`build_library`, loaded; a cached build the loader refuses is rebuilt once."""
    lib = build_library(name, unit, headers, display)
    try:
        return ctypes.CDLL(str(lib))
    except OSError as exc:
        say(f"cached build {lib} cannot be loaded ({exc}): rebuilding it")
    for stale in (lib, Path(f"{lib}.sha256")):
        stale.unlink(missing_ok=True)
    lib = build_library(name, unit, headers, display)
    try:
        return ctypes.CDLL(str(lib))
    except OSError as exc:
        raise AuditEnvironmentError(f"the build of {display} cannot be loaded: {exc}") from None
