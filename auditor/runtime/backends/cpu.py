"""The CPU backend: the same kernels/*.cu sources, compiled by the host C++ compiler behind
kernels/cpu_shim.h into one shared library per source (cached by hash), launched through ctypes;
SGEMMs through torch on `as_strided` views that honour m, n, k and the leading dimensions
exactly, so a `k = lda - 1` call drops the last column here just as cuBLAS does on the GPU.
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from egf_audit.errors import AuditEnvironmentError
from egf_audit.kernels import SHIM_HEADER, KernelSpec, bundled_dir
from egf_audit.runtime.kernel_sources import KernelSet, KernelSource
from egf_audit.runtime.memory import ELEMENT_BYTES, BufferSpec

CXX_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]
_CTYPES = {"int": ctypes.c_int, "float": ctypes.c_float, "long long": ctypes.c_longlong}
_DTYPES = {"f32": torch.float32, "i32": torch.int32}


def cache_dir() -> Path:
    root = os.environ.get("EGF_AUDIT_CACHE") or Path.home() / ".cache" / "egf-audit"
    return Path(root) / "cpu-kernels"


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise AuditEnvironmentError("the CPU backend needs a C++ compiler (g++) and none was found")
    return cxx


@lru_cache(maxsize=1)
def _compiler_id(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return (out.stdout.splitlines() or ["unknown"])[0]


def launcher_source(source: KernelSource) -> str:
    """One translation unit: the shim, the kernel source (with #line so errors name the kernel
    file), a compile-time check of the entry point's exact type, and a grid loop."""
    spec = source.spec
    params = ", ".join(f"{t} {n}" for n, t in spec.params)
    types = ", ".join(t for _, t in spec.params)
    names = ", ".join(n for n, _ in spec.params)
    return (
        f'#include "{SHIM_HEADER}"\n#include <type_traits>\n'
        f'#line 1 "{source.path}"\n{source.text}\n'
        f'#line 1 "egf-audit-launcher-{spec.name}.cpp"\n'
        f"static_assert(std::is_same<decltype(&{spec.name}), void (*)({types})>::value,\n"
        f'  "entry point {spec.name} must be: void {spec.name}({params})");\n'
        f'extern "C" void egf_launch(unsigned int blocks, unsigned int threads, {params}) {{\n'
        "  gridDim = {blocks, 1, 1};\n  blockDim = {threads, 1, 1};\n"
        "  for (unsigned int bx = 0; bx < blocks; ++bx) {\n    blockIdx = {bx, 0, 0};\n"
        "    for (unsigned int tx = 0; tx < threads; ++tx) {\n      threadIdx = {tx, 0, 0};\n"
        f"      {spec.name}({names});\n    }}\n  }}\n}}\n"
    )


def _first_error_lines(stderr: str, limit: int = 6) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln]
    picked = errors or lines
    return " | ".join(picked[:limit])


def compile_kernel(source: KernelSource) -> Path:
    """The shared library for one kernel source, compiled once per distinct source."""
    cxx = _compiler()
    shim = (bundled_dir() / SHIM_HEADER).read_text(encoding="utf-8")
    unit = launcher_source(source)
    key = hashlib.sha256(
        "\0".join([unit, shim, _compiler_id(cxx), " ".join(CXX_FLAGS)]).encode()
    ).hexdigest()[:24]
    out_dir = cache_dir()
    lib = out_dir / f"{source.spec.name}-{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        cpp = Path(tmp) / "unit.cpp"
        cpp.write_text(unit, encoding="utf-8")
        (Path(tmp) / SHIM_HEADER).write_text(shim, encoding="utf-8")
        built = Path(tmp) / "lib.so"
        proc = subprocess.run(
            [cxx, *CXX_FLAGS, "-o", str(built), str(cpp)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise AuditEnvironmentError(
                f"kernel {source.path} does not compile: {_first_error_lines(proc.stderr)}"
            )
        os.replace(built, lib)  # atomic: a concurrent run sees the whole library or none
    return lib


class CpuBackend:
    name = "cpu"

    def __init__(self, kernel_set: KernelSet):
        # The audit's GEMMs are small and many: a multi-threaded pool costs more in wake-ups than
        # it saves, and spinning threads starve other processes on a small CI machine.
        torch.set_num_threads(1)
        self._buffers: dict[int, torch.Tensor] = {}  # by base pointer
        self._bases: list[int] = []
        self._kernels: dict[str, Any] = {}
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            libs = list(pool.map(compile_kernel, kernel_set.sources))
        for source, lib in zip(kernel_set.sources, libs, strict=True):
            fn = ctypes.CDLL(str(lib)).egf_launch
            fn.restype = None
            fn.argtypes = [ctypes.c_uint, ctypes.c_uint] + [
                ctypes.c_void_p if t.endswith("*") else _CTYPES[t] for _, t in source.spec.params
            ]
            self._kernels[source.spec.name] = fn

    # ---- memory ----
    def alloc(self, spec: BufferSpec) -> int:
        tensor = torch.zeros(spec.size, dtype=_DTYPES[spec.dtype])
        base = tensor.data_ptr()
        self._buffers[base] = tensor
        bisect.insort(self._bases, base)
        return base

    def free(self, ptr: int) -> None:
        del self._buffers[ptr]
        self._bases.remove(ptr)

    def _locate(self, ptr: int) -> tuple[torch.Tensor, int]:
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0:
            raise AuditEnvironmentError(f"pointer {ptr:#x} lies in no allocation")
        base = self._bases[i]
        return self._buffers[base], (ptr - base) // ELEMENT_BYTES

    def _view(self, ptr: int, size: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
        buf, offset = self._locate(ptr)
        return torch.as_strided(buf, size, stride, offset)

    def read(self, ptr: int) -> np.ndarray:
        return self._buffers[ptr].numpy().copy()

    def snapshot(self, ptrs: Sequence[int]) -> list[np.ndarray]:
        return [self.read(p) for p in ptrs]  # host memory is where the buffers live

    def to_host(self, copy: np.ndarray) -> np.ndarray:
        return copy

    def upload(self, ptr: int, values: np.ndarray, stride: int = 1) -> None:
        buf, _ = self._locate(ptr)
        src = torch.from_numpy(np.ascontiguousarray(values).astype(buf.numpy().dtype).ravel())
        self._view(ptr, (src.numel(),), (stride,)).copy_(src)

    def memset_zero(self, ptr: int, count: int) -> None:
        self._view(ptr, (count,), (1,)).zero_()

    def sgemm(self, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) -> None:
        # Column-major operands as strided views: op(A) is m x k, op(B) is k x n, C is m x n.
        op_a = self._view(a, (m, k), (1, lda) if transa == "N" else (lda, 1))
        op_b = self._view(b, (k, n), (1, ldb) if transb == "N" else (ldb, 1))
        out = self._view(c, (m, n), (1, ldc))
        product = torch.mm(op_a, op_b)
        if alpha != 1.0:
            product = product * alpha
        if beta == 0.0:  # cuBLAS semantics: C is not read when beta == 0
            out.copy_(product)
        else:
            out.copy_(product + (out * beta if beta != 1.0 else out))

    def launch(self, spec: KernelSpec, blocks: int, threads: int, args: list[Any]) -> None:
        self._kernels[spec.name](blocks, threads, *args)

    def synchronize(self) -> None:
        pass

    def info(self) -> dict[str, str]:
        return {
            "backend": "cpu",
            "device": platform.processor() or platform.machine(),
            "compiler": _compiler_id(_compiler()),
            "torch": torch.__version__,
        }
