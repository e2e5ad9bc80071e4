"""The CPU backend: the same kernels/*.cu sources, compiled by the host C++ compiler behind
kernels/cpu_shim.h into one shared library per source (cached by hash), launched through ctypes
in a forked worker process (cpu_worker.py) so that a kernel that crashes, exits or hangs becomes a
verdict; SGEMMs through torch on `as_strided` views that honour m, n, k and the leading
dimensions exactly, so a `k = lda - 1` call drops the last column here just as cuBLAS does on the
GPU. Every buffer sits behind a canary zone, inside 8 GiB of inaccessible address space on each
side (guarded_memory.py).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import platform
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from egf_audit.errors import AuditEnvironmentError
from egf_audit.kernels import SHIM_HEADER, KernelSpec, bundled_dir
from egf_audit.runtime.backends import guarded_memory
from egf_audit.runtime.backends.cpu_build import compiler, compiler_id, load_library
from egf_audit.runtime.backends.cpu_worker import KernelWorker, argument_format, reap_stopped
from egf_audit.runtime.backends.worker_process import DEFAULT_LAUNCH_TIMEOUT_S
from egf_audit.runtime.kernel_sources import KernelSet, KernelSource
from egf_audit.runtime.memory import BufferSpec
from egf_audit.trace.buffers import ELEMENT_BYTES
from egf_audit.trace.gemm_rules import GemmRefused, GemmShape, invalid_value

_CTYPES: dict[str, type[ctypes._SimpleCData[Any]]] = {
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "long long": ctypes.c_longlong,
}


def launcher_source(source: KernelSource) -> str:
    """One translation unit: the shim, the kernel source (with #line so errors name the kernel
    file), a compile-time check of the entry point's exact type, and a grid loop."""
    spec = source.spec
    params = ", ".join(f"{t} {n}" for n, t in spec.params)
    types = ", ".join(t for _, t in spec.params)
    names = ", ".join(n for n, _ in spec.params)
    return (
        f'#include "{SHIM_HEADER}"\n#include <type_traits>\n'
        f'#line 1 "{source.path}"\n{source.code}\n'
        f'#line 1 "egf-audit-launcher-{spec.name}.cpp"\n'
        f"static_assert(std::is_same<decltype(&{spec.name}), void (*)({types})>::value,\n"
        f'  "entry point {spec.name} must be: void {spec.name}({params})");\n'
        f'extern "C" void egf_launch(unsigned int blocks, unsigned int threads, {params}) {{\n'
        "  gridDim = {blocks, 1, 1};\n  blockDim = {threads, 1, 1};\n"
        "  for (unsigned int bx = 0; bx < blocks; ++bx) {\n    blockIdx = {bx, 0, 0};\n"
        "    for (unsigned int tx = 0; tx < threads; ++tx) {\n      threadIdx = {tx, 0, 0};\n"
        f"      {spec.name}({names});\n    }}\n  }}\n}}\n"
    )


def compile_kernel(source: KernelSource) -> ctypes.CDLL:
    """The loaded shared library for one kernel source (built once per distinct source)."""
    shim = (bundled_dir() / SHIM_HEADER).read_text(encoding="utf-8")
    # the headers are compiled from the copies read with the source, beside the unit
    headers = {**dict(source.headers), SHIM_HEADER: shim}  # the shim wins over a namesake
    return load_library(source.spec.name, launcher_source(source), headers, source.path)


class CpuBackend:
    name = "cpu"

    def __init__(self, kernel_set: KernelSet, launch_timeout_s: float = DEFAULT_LAUNCH_TIMEOUT_S):
        # The audit's GEMMs are small and many: a multi-threaded pool costs more in wake-ups than
        # it saves, and spinning threads starve other processes on a small CI machine.
        torch.set_num_threads(1)
        self._buffers: dict[int, torch.Tensor] = {}  # by base pointer
        self._guarded: dict[int, guarded_memory.GuardedBuffer] = {}
        self._bases: list[int] = []
        self._index: dict[str, int] = {}
        # Kernels egf-audit does not ship (a --kernels source, a fault's patch) run in the
        # worker; the bundled ones are egf-audit's own, proved by every clean audit, and run
        # in-process: a round trip per launch would double the cost of every audit.
        self._isolated: set[str] = set()
        functions: list[Callable[..., None]] = []
        formats: list[struct.Struct] = []
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            libs = list(pool.map(compile_kernel, kernel_set.sources))
        for source, lib in zip(kernel_set.sources, libs, strict=True):
            fn = lib.egf_launch
            fn.restype = None
            argtypes: list[type[ctypes._SimpleCData[Any]]] = [ctypes.c_uint, ctypes.c_uint]
            fn.argtypes = argtypes + [
                ctypes.c_void_p if t.endswith("*") else _CTYPES[t] for _, t in source.spec.params
            ]
            self._index[source.spec.name] = len(functions)
            if source.origin != "bundled":
                self._isolated.add(source.spec.name)
            functions.append(fn)
            formats.append(argument_format([t for _, t in source.spec.params]))
        self._functions, self._formats = tuple(functions), tuple(formats)
        self.launch_timeout_s = launch_timeout_s
        self._worker: KernelWorker | None = None
        self._mapped = 0  # bumped by every allocation: a worker forked before it lacks the buffer
        self._worker_mapped = -1
        self.failed_kernels: dict[str, str] = {}
        self._canaries: guarded_memory.CanaryScan | None = None
        self._pool = guarded_memory.Pool()

    # ---- memory ----
    def alloc(self, spec: BufferSpec) -> int:
        guarded = self._pool.take(spec.size, spec.dtype)
        if guarded is None:
            guarded = guarded_memory.allocate(spec.size, spec.dtype)
            self._mapped += 1  # a new mapping: a worker forked before it lacks it
        base = guarded.base
        self._guarded[base] = guarded
        self._buffers[base] = torch.from_numpy(guarded.data)
        bisect.insort(self._bases, base)
        self._canaries = None
        return base

    def free(self, ptr: int) -> None:
        del self._buffers[ptr]
        self._bases.remove(ptr)
        self._canaries = None
        self._pool.give(self._guarded.pop(ptr))

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
        refusal = invalid_value(GemmShape(transa, transb, m, n, k, lda, ldb, ldc))
        if refusal is not None:
            raise GemmRefused(refusal)
        out = self._view(c, (m, n), (1, ldc))
        if alpha == 0.0:  # cuBLAS semantics: A and B are not read, C = beta * C
            if beta == 0.0:
                out.zero_()
            elif beta != 1.0:
                out.mul_(beta)
            return
        # Column-major operands as strided views: op(A) is m x k, op(B) is k x n, C is m x n.
        op_a = self._view(a, (m, k), (1, lda) if transa == "N" else (lda, 1))
        op_b = self._view(b, (k, n), (1, ldb) if transb == "N" else (ldb, 1))
        product = torch.mm(op_a, op_b)
        if alpha != 1.0:
            product = product * alpha
        if beta == 0.0:  # cuBLAS semantics: C is not read when beta == 0
            out.copy_(product)
        else:
            out.copy_(product + (out * beta if beta != 1.0 else out))

    def launch(self, spec: KernelSpec, blocks: int, threads: int, args: list[Any]) -> None:
        """An untrusted kernel runs in the worker (LaunchFailed when it crashed, exited or timed
        out); a bundled one in-process."""
        if spec.name not in self._isolated:
            self._functions[self._index[spec.name]](blocks, threads, *args)
            return
        worker = self._worker
        if worker is None or not worker.alive or self._worker_mapped != self._mapped:
            if worker is not None:
                worker.stop()
            worker = self._worker = KernelWorker(
                self._functions, self._formats, self.launch_timeout_s
            )
            self._worker_mapped = self._mapped
        worker.run(self._index[spec.name], blocks, threads, args)

    def close(self) -> None:
        """Stop the worker and wait for it (a later launch starts a new one), and unmap the
        freed buffers kept for reuse: each holds 16 GiB of address space
        (guarded_memory.REACH), which a long-lived process making many backends would run out
        of."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        reap_stopped(block=True)
        self._pool.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit os may be half torn down
            self.close()

    # ---- what a launch did ----
    def guard_breaches(self) -> list[tuple[int, str, int, int]]:
        """(base, side, distance, count) of every canary zone found changed, each restored."""
        if self._canaries is None:  # allocations changed since the last scan
            self._canaries = guarded_memory.CanaryScan(list(self._guarded.values()))
        found = self._canaries.breached()
        scanned = self._canaries.buffers
        return [(scanned[i].base, "before", distance, count) for i, distance, count in found]

    def watch(self, ptrs: Sequence[int]) -> CpuWatch:
        return CpuWatch(ptrs, guarded_memory.Watcher([self._guarded[p] for p in ptrs]))

    def synchronize(self) -> None:
        pass

    def cublas_handles(self) -> tuple[int, ...]:
        return ()  # torch's CPU GEMMs: no cuBLAS

    def info(self) -> dict[str, str]:
        return {
            "backend": "cpu",
            "device": platform.processor() or platform.machine(),
            "compiler": compiler_id(tuple(compiler())),
            "torch": torch.__version__,
        }


class CpuWatch:
    """Shadows of a pipeline's buffers; `changes` reports writes outside the declared boxes."""

    def __init__(self, ptrs: Sequence[int], watcher: guarded_memory.Watcher):
        self._ptrs = list(ptrs)
        self._watcher = watcher
        self._index = {p: i for i, p in enumerate(self._ptrs)}
        # the exemptions as the C scan takes them, by the identity of the recorder's memoised
        # exemptions (each kept here, so that its id names it alone)
        self._flat: dict[int, tuple[dict, list[int]]] = {}

    def changes(
        self, exempt: dict[int, tuple[tuple[int, int, int, int], ...]]
    ) -> list[tuple[int, int, int, int, int]]:
        """One C call: the comparison, the exemptions and the shadow refresh (guarded_memory).
        `exempt` is read once per distinct object: it must not change after its first call."""
        memo = self._flat.get(id(exempt))
        if memo is None or memo[0] is not exempt:
            index = self._index
            flat = [v for p, boxes in exempt.items() for box in boxes for v in (index[p], *box)]
            memo = self._flat[id(exempt)] = (exempt, flat)
        return [
            (self._ptrs[i], first, count, old, new)
            for i, first, count, old, new in self._watcher.changes(memo[1])
        ]
