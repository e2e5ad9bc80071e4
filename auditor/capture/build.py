"""Build the recorder on first use, cached by hash like the CPU kernels: one shared library from
its units (UNITS, egf_capture_recorder.c first; egf_capture_recorder.c says what each holds) and
the header between them, compiled and linked by one compiler call.

The toolkit is found from CUDA_HOME / CUDA_PATH, then nvcc's folder, then the NVIDIA CUPTI wheel,
then where the dynamic loader knows libcupti from. The library links against libcupti alone;
the driver's entry points are looked up in the process's own libcuda at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime.build_cache import cache_dir

HERE = Path(__file__).parent
UNITS = (
    "egf_capture_recorder.c",
    "rec_launch.c",
    "rec_gemm.c",
    "rec_snapshot.c",
    "rec_kernels.c",
    "rec_deep.c",
    "rec_guard.c",
    "rec_writer.c",
    "rec_device.c",
)
HEADERS = ("recorder.h",)
SOURCES = tuple(HERE / name for name in UNITS)  # what the compiler is given
TEXTS = (*SOURCES, *(HERE / name for name in HEADERS))  # what the cache key hashes
C_FLAGS = ["-O2", "-shared", "-fPIC", "-Wall"]
LIBS = ["-lcupti", "-ldl", "-lpthread"]
CACHE_KIND = "capture"  # the cache's folder for the recorder (runtime/build_cache.py)


@dataclass(frozen=True)
class Toolkit:
    include: tuple[Path, ...]  # folders holding cupti.h and cuda.h
    lib: Path  # folder holding libcupti.so


def _roots() -> list[Path]:
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots += [Path(nvcc).parent.parent, Path(nvcc).resolve().parent.parent]
    for module in ("nvidia.cuda_cupti", "nvidia.cu13", "nvidia.cuda_runtime"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec and spec.submodule_search_locations:
            roots += [Path(p) for p in spec.submodule_search_locations]
    roots += _ldconfig_roots()
    return list(dict.fromkeys(roots))


def _ldconfig_roots() -> list[Path]:
    """Toolkit roots above the libcupti the dynamic loader knows (`ldconfig -p`)."""
    ldconfig = shutil.which("ldconfig")
    if not ldconfig:
        return []
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    libs = [
        Path(line.split("=>")[-1].strip()) for line in out.splitlines() if "libcupti.so" in line
    ]
    return [lib.parent.parent for lib in libs]


def _candidates(root: Path, sub: str) -> list[Path]:
    found = [root / sub, root / "extras" / "CUPTI" / sub]
    targets = root / "targets"
    if targets.is_dir():
        found += [t / sub for t in sorted(targets.iterdir())]
    return found


def find_toolkit() -> Toolkit:
    """The include and library folders for the build; AuditEnvironmentError naming what is
    missing when CUPTI or cuda.h cannot be found."""
    includes: list[Path] = []
    lib: Path | None = None
    for root in _roots():
        for inc in _candidates(root, "include"):
            if (inc / "cupti.h").exists() or (inc / "cuda.h").exists():
                includes.append(inc)
        for sub in ("lib64", "lib"):
            for folder in _candidates(root, sub):
                if lib is None and any(folder.glob("libcupti.so*")):
                    lib = folder
    has = {name: any((i / name).exists() for i in includes) for name in ("cupti.h", "cuda.h")}
    missing = [name for name, ok in has.items() if not ok] + ([] if lib else ["libcupti.so"])
    if missing or lib is None:
        raise AuditEnvironmentError(
            f"capture needs CUPTI and the CUDA driver headers: {', '.join(missing)} not found "
            "(set CUDA_HOME to the CUDA toolkit, or install the nvidia-cuda-cupti wheel)"
        )
    return Toolkit(tuple(dict.fromkeys(includes)), lib)


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise AuditEnvironmentError("capture builds its recorder with a C compiler; none found")
    return cc


@lru_cache(maxsize=4)
def _compiler_id(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    return (out.stdout.splitlines() or ["unknown"])[0]


def build_command(cc: str, toolkit: Toolkit, out: Path) -> list[str]:
    includes = [f"-I{i}" for i in toolkit.include]
    rpath = f"-Wl,-rpath,{toolkit.lib}"
    sources = [str(path) for path in SOURCES]
    return [cc, *C_FLAGS, *includes, "-o", str(out), *sources, f"-L{toolkit.lib}", *LIBS, rpath]


def source_key() -> list[str]:
    """Every unit's and header's name and text: a change to any of them is a new build."""
    return [f"{path.name}\0{path.read_text(encoding='utf-8')}" for path in TEXTS]


def build_recorder() -> Path:
    """The recorder's shared library, compiled once per distinct (sources and header, flags,
    compiler, toolkit) and reused from the cache after that."""
    toolkit = find_toolkit()
    cc = _compiler()
    placeholder = build_command(cc, toolkit, Path("OUT"))
    key = hashlib.sha256(
        "\0".join([*source_key(), _compiler_id(cc), " ".join(placeholder)]).encode()
    ).hexdigest()[:24]
    out_dir = cache_dir(CACHE_KIND)
    lib = out_dir / f"egf_capture_recorder-{key}.so"
    if lib.exists():
        return lib
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AuditEnvironmentError(f"cannot create the cache {out_dir}: {exc.strerror}") from None
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        built = Path(tmp) / "lib.so"
        proc = subprocess.run(
            build_command(cc, toolkit, built), capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            errors = [ln for ln in proc.stderr.splitlines() if "error" in ln] or [proc.stderr]
            raise AuditEnvironmentError(
                f"the capture recorder does not compile: {' | '.join(errors[:4]).strip()}"
            )
        os.replace(built, lib)  # atomic: a concurrent build sees the whole library or none
    return lib
