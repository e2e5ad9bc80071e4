"""The stand-ins for CUPTI, the driver, the runtime, cuBLAS and cuBLASLt that the recorder's
host tests run it over (tests/recorder_host/fake_*.c), each built as a shared library with the
soname of the library it stands in for, into one folder: put it first on LD_LIBRARY_PATH (the
recorder finds libcupti by its RUNPATH, which LD_LIBRARY_PATH overrides) or link against it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from egf_audit.capture.build import _compiler, find_toolkit

HOST = Path(__file__).parent / "recorder_host"
STAND_INS = {
    "fake_cuda.c": "libcuda.so.1",
    "fake_cupti.c": "libcupti.so.13",
    "fake_cudart.c": "libcudart.so.13",
    "fake_cublas.c": "libcublas.so.13",
    "fake_cublaslt.c": "libcublasLt.so.13",
}
STRICT = ["-O1", "-Wall", "-Wextra", "-Werror"]


def includes() -> list[str]:
    return [f"-I{i}" for i in find_toolkit().include]


def build_stand_ins(folder: Path) -> Path:
    """Every stand-in built into `folder` (created); AuditEnvironmentError without the toolkit's
    headers."""
    folder.mkdir(parents=True, exist_ok=True)
    versions = ["-Wl,--version-script", str(HOST / "fake_cupti.map")]  # as libcupti's symbols
    for source, soname in STAND_INS.items():
        command = [_compiler(), *STRICT, "-shared", "-fPIC", *includes(), "-o"]
        command += [str(folder / soname), f"-Wl,-soname,{soname}", str(HOST / source)]
        command += versions if "cupti" in source else []
        subprocess.run(command, check=True, capture_output=True, text=True)
    return folder


def link_flags(folder: Path, *sonames: str) -> list[str]:
    """Linker flags that make a program load the named stand-ins of `folder` (all by default)."""
    names = sonames or tuple(STAND_INS.values())
    loaded = [f"-l:{name}" for name in names]
    return [f"-L{folder}", f"-Wl,-rpath,{folder}", "-Wl,--no-as-needed", *loaded]
