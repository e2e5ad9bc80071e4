"""The CUDA backend: CuPy buffers, kernels from kernels/*.cu through `cupy.RawModule`, GEMMs through
`cupy_backends.cuda.libs.cublas.sgemm` on raw pointers, exactly as the trainer calls cuBLAS.
TF32 stays off: the handle's math mode is CUBLAS_DEFAULT_MATH."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
from collections.abc import Sequence
from functools import cache
from typing import Any, NamedTuple

import cupy
import numpy as np
from cupy_backends.cuda.libs import cublas

from egf_audit.errors import AuditEnvironmentError
from egf_audit.kernels import KernelSpec
from egf_audit.runtime.backends.cuda_guard import GUARDED, CudaWatch, ZoneScan, guarded_zeros
from egf_audit.runtime.backends.cuda_kernels import load_function, pack_arguments
from egf_audit.runtime.backends.cuda_observe import StreamObserver, ZoneTable, zone_table
from egf_audit.runtime.backends.cuda_worker import GpuKernelWorker, WorkerKernel
from egf_audit.runtime.backends.worker_process import DEFAULT_LAUNCH_TIMEOUT_S
from egf_audit.runtime.guards import GUARD_ELEMENTS
from egf_audit.runtime.kernel_sources import KernelSet
from egf_audit.runtime.memory import BufferSpec
from egf_audit.trace.buffers import ELEMENT_BYTES

_DTYPES = {"f32": np.float32, "i32": np.int32}
_OPS = {"N": cublas.CUBLAS_OP_N, "T": cublas.CUBLAS_OP_T}
CAPTURE_WORKSPACE_BYTES = 32 << 20
SNAPSHOT_ALIGN = 256  # bytes; every copy in a checkpoint's allocation starts aligned
# How launches are observed: "stream" (the default: in stream order, cuda_observe.py) or "sync"
# (every buffer compared and the flags read back after each launch, cuda_guard.py: the
# observer before issue 20, kept so that both can be timed side by side in one run)
OBSERVERS = ("stream", "sync")
OBSERVER_VARIABLE = "EGF_AUDIT_OBSERVER"


@cache
def _libcublas() -> ctypes.CDLL:
    """The libcublas this process already loaded for CuPy (its cuBLAS calls and ours must share
    one library, one handle)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if re.search(r"/libcublas\.so[.\d]*$", path):
                return ctypes.CDLL(path)
    return ctypes.CDLL("libcublas.so")


@cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def allocation_of(ptr: int) -> tuple[int, int]:
    """(base, bytes) of the device allocation holding `ptr` (a pool block lies inside one)."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = _libcuda().cuMemGetAddressRange_v2(
        ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)
    )
    if status != 0:
        raise AuditEnvironmentError(f"cuMemGetAddressRange failed with status {status}")
    return base.value, size.value


class DeviceCopy(NamedTuple):
    """One buffer's bytes inside a checkpoint's single device allocation (a named tuple: a
    checkpoint makes one per buffer, and a tuple is made in a fraction of a dataclass's time)."""

    flat: cupy.ndarray  # uint8, shared by every buffer of the checkpoint
    offset: int
    nbytes: int
    dtype: np.dtype


class _SnapshotPlan(NamedTuple):
    """Where a checkpoint's copies go in its allocation: (source pointer, offset, bytes, dtype)
    per buffer, and the allocation's bytes."""

    copies: tuple[tuple[int, int, int, np.dtype], ...]
    nbytes: int


def _snapshot_plan(sources: Sequence[cupy.ndarray]) -> _SnapshotPlan:
    copies, offset = [], 0
    for array in sources:
        copies.append((array.data.ptr, offset, array.nbytes, array.dtype))
        offset += -(-array.nbytes // SNAPSHOT_ALIGN) * SNAPSHOT_ALIGN
    return _SnapshotPlan(tuple(copies), offset)


class CudaBackend:
    name = "cuda"

    def __init__(self, kernel_set: KernelSet, launch_timeout_s: float = DEFAULT_LAUNCH_TIMEOUT_S):
        if not GUARDED:  # the sanitized child: memcheck must see every buffer's own bounds
            cupy.cuda.set_allocator(None)
        self._buffers: dict[int, cupy.ndarray] = {}  # by base pointer
        self._wholes: dict[int, cupy.ndarray] = {}  # each buffer with its guard zones (uint32)
        self._zones: ZoneScan | None = None  # rebuilt when the allocations change
        self._zone_table: ZoneTable | None = None  # likewise
        # per checkpoint's buffers: where each one's copy goes, and the bytes of them all
        self._snapshot_plans: dict[tuple[int, ...], _SnapshotPlan] = {}
        self.observer = os.environ.get(OBSERVER_VARIABLE, "stream")
        if self.observer not in OBSERVERS:
            raise AuditEnvironmentError(
                f"{OBSERVER_VARIABLE}={self.observer!r}: choose from {', '.join(OBSERVERS)}"
            )
        self.failed_kernels: dict[str, str] = {}
        # Every source is compiled here, untrusted ones too (compiling runs none of their code):
        # a source NVRTC refuses is refused before any scenario runs, and the worker then finds
        # the build in CuPy's kernel cache.
        self._functions = {s.spec.name: load_function(s) for s in kernel_set.sources}
        # Kernels egf-audit does not ship (a --kernels source, a fault's patch) run in a worker
        # process (cuda_worker.py): a fault there cannot end this context, nor a hang this
        # thread. Under --sanitize too: compute-sanitizer follows the worker, where each buffer
        # is its own IPC-opened allocation, and the watchdog still ends a kernel that hangs.
        untrusted = [s for s in kernel_set.sources if s.origin != "bundled"]
        self._isolated = {s.spec.name: i for i, s in enumerate(untrusted)}
        self._worker_kernels = [
            WorkerKernel(s.spec.name, s.path, s.code, s.include_dir, tuple(s.spec.params))
            for s in untrusted
        ]
        self.launch_timeout_s = launch_timeout_s
        self._worker: GpuKernelWorker | None = None
        self._allocations = 0  # bumped by every allocation: the worker must open the new one
        self._worker_allocations = -1
        self._workspace: cupy.ndarray | None = None  # set by prepare_capture()
        self._raw_sgemm: Any = None
        self.handle = cupy.cuda.device.get_cublas_handle()
        self.use_stream(cupy.cuda.get_current_stream())
        cublas.setMathMode(self.handle, cublas.CUBLAS_DEFAULT_MATH)  # no TF32
        cublas.setPointerMode(self.handle, cublas.CUBLAS_POINTER_MODE_HOST)
        self._alpha = np.zeros(1, np.float32)
        self._beta = np.zeros(1, np.float32)

    def use_stream(self, stream: cupy.cuda.Stream) -> None:
        """Run every later launch on `stream` (CUDA-graph capture needs a non-default one)."""
        self.stream = stream
        self._zones = None  # the zone scan runs on the pipeline's stream
        self._zone_table = None
        cublas.setStream(self.handle, stream.ptr)
        if self._workspace is not None:  # cublasSetStream drops a user workspace: set it again
            self._set_workspace(self._workspace)

    def prepare_capture(self) -> None:
        """Make SGEMMs capturable in a CUDA graph. CuPy's cuBLAS wrapper refuses calls while a
        stream captures, so SGEMMs go to the same cublasSgemm_v2 entry point through ctypes,
        with a fixed workspace so that cuBLAS allocates nothing during the capture."""
        lib = _libcublas()
        self._raw_sgemm = lib.cublasSgemm_v2
        self._raw_sgemm.restype = ctypes.c_int
        self._raw_sgemm.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
        ]
        self._workspace = cupy.empty(CAPTURE_WORKSPACE_BYTES, dtype=cupy.uint8)
        self._set_workspace(self._workspace)

    def _set_workspace(self, workspace: cupy.ndarray) -> None:
        status = _libcublas().cublasSetWorkspace_v2(
            ctypes.c_void_p(self.handle),
            ctypes.c_void_p(workspace.data.ptr),
            ctypes.c_size_t(workspace.nbytes),
        )
        if status != 0:
            raise AuditEnvironmentError(f"cublasSetWorkspace_v2 failed with status {status}")

    # ---- memory ----
    def alloc(self, spec: BufferSpec) -> int:
        """A zero-filled buffer between two guard zones of canaries (cuda_guard.py)."""
        with self.stream:
            whole, array = guarded_zeros(
                spec.size, _DTYPES[spec.dtype], GUARD_ELEMENTS if GUARDED else 0
            )
        self.synchronize()
        self._buffers[array.data.ptr] = array
        self._wholes[array.data.ptr] = whole
        self._zones = self._zone_table = None
        self._snapshot_plans.clear()
        self._allocations += 1
        return array.data.ptr

    def free(self, ptr: int) -> None:
        self.synchronize()
        del self._buffers[ptr]
        del self._wholes[ptr]
        self._zones = self._zone_table = None
        self._snapshot_plans.clear()

    def read(self, ptr: int) -> np.ndarray:
        self.synchronize()
        return cupy.asnumpy(self._buffers[ptr])

    def snapshot(self, ptrs: Sequence[int]) -> list[DeviceCopy]:
        """One allocation for the whole checkpoint and one device-to-device copy per buffer,
        queued on the pipeline's stream after every launch so far: no host round trip, and no
        CuPy array made per buffer."""
        key = tuple(ptrs)
        plan = self._snapshot_plans.get(key)
        if plan is None:
            plan = self._snapshot_plans[key] = _snapshot_plan([self._buffers[p] for p in key])
        with self.stream:  # the pool orders reuse of this block on the same stream
            flat = cupy.empty(plan.nbytes, dtype=cupy.uint8)
        at, stream, runtime = flat.data.ptr, self.stream.ptr, cupy.cuda.runtime
        for source, offset, nbytes, _ in plan.copies:
            runtime.memcpyAsync(at + offset, source, nbytes, runtime.memcpyDeviceToDevice, stream)
        return [DeviceCopy(flat, offset, nbytes, dtype) for _, offset, nbytes, dtype in plan.copies]

    def to_host(self, copy: DeviceCopy) -> np.ndarray:
        self.synchronize()
        raw = cupy.asnumpy(copy.flat[copy.offset : copy.offset + copy.nbytes])
        return raw.view(copy.dtype)

    def device_view(self, copy: DeviceCopy) -> cupy.ndarray:
        """A snapshot copy as a device array of its dtype, for checks that run on the GPU."""
        self.synchronize()
        return copy.flat[copy.offset : copy.offset + copy.nbytes].view(copy.dtype)

    def _view(self, ptr: int, count: int, stride: int, dtype: type) -> cupy.ndarray:
        nbytes = ((count - 1) * stride + 1) * ELEMENT_BYTES
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, self)
        return cupy.ndarray(
            (count,), dtype, cupy.cuda.MemoryPointer(mem, 0), strides=(stride * ELEMENT_BYTES,)
        )

    def upload(self, ptr: int, values: np.ndarray, stride: int = 1) -> None:
        values = np.ascontiguousarray(values).ravel()
        dtype = np.int32 if values.dtype.kind in "iu" else np.float32
        with self.stream:
            self._view(ptr, values.size, stride, dtype)[...] = cupy.asarray(values.astype(dtype))

    def memset_zero(self, ptr: int, count: int) -> None:
        cupy.cuda.runtime.memsetAsync(ptr, 0, count * ELEMENT_BYTES, self.stream.ptr)

    def sgemm(self, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) -> None:
        self._alpha[0], self._beta[0] = alpha, beta
        args = (
            self.handle,
            _OPS[transa],
            _OPS[transb],
            m,
            n,
            k,
            self._alpha.ctypes.data,
            a,
            lda,
            b,
            ldb,
            self._beta.ctypes.data,
            c,
            ldc,
        )
        if self._raw_sgemm is None:
            cublas.sgemm(*args)
            return
        status = self._raw_sgemm(*args)  # the capture-safe path (prepare_capture)
        if status != 0:
            raise AuditEnvironmentError(f"cublasSgemm_v2 failed with status {status}")

    def launch(self, spec: KernelSpec, blocks: int, threads: int, args: list[Any]) -> None:
        """A bundled kernel on this stream; an untrusted one in the worker (LaunchFailed when it
        faulted, its worker died, or it did not return in time)."""
        if spec.name in self._isolated:
            self.synchronize()  # the worker's launch must follow every write queued here
            self._ready_worker().run(self._isolated[spec.name], blocks, threads, args)
            return
        packed = pack_arguments(spec.params, args)
        self._functions[spec.name]((blocks,), (threads,), packed, stream=self.stream)

    def _ready_worker(self) -> GpuKernelWorker:
        """A live worker that has every current allocation open."""
        if self._worker is None or not self._worker.alive:
            self._worker = None  # a failed start below must not leave a dead one here
            worker = GpuKernelWorker(
                self._worker_kernels, cupy.cuda.Device().id, self.launch_timeout_s
            )
            self._worker, self._worker_allocations = worker, -1
        if self._worker_allocations != self._allocations:
            shared = {allocation_of(w.data.ptr) for w in self._wholes.values()}
            self._worker.share(
                [(base, size, cupy.cuda.runtime.ipcGetMemHandle(base)) for base, size in shared]
            )
            self._worker_allocations = self._allocations
        return self._worker

    def synchronize(self) -> None:
        self.stream.synchronize()

    # ---- what a launch did ----
    def guard_breaches(self) -> list[tuple[int, str, int, int]]:
        if self._zones is None:
            self._zones = ZoneScan(list(self._wholes.values()), self.stream)
        bases = list(self._wholes)
        return [(bases[i], side, d, n) for i, side, d, n in self._zones.breached()]

    def watch(self, ptrs: Sequence[int]) -> CudaWatch | StreamObserver:
        if self.observer == "sync":
            return CudaWatch(ptrs, [self._buffers[p] for p in ptrs], self.stream)
        return StreamObserver(
            {p: self._buffers[p] for p in ptrs},
            lambda: self.stream,
            self._zones_now,
            lambda name: name in self._isolated,
        )

    def _zones_now(self) -> ZoneTable:
        """Every allocation's guard zones, as device pointers (rebuilt when they change)."""
        if self._zone_table is None:
            with self.stream:
                self._zone_table = zone_table(self._wholes, GUARDED)
        return self._zone_table

    def close(self) -> None:
        """Stop the kernel worker (a later untrusted launch starts a new one)."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit much may be torn down
            self.close()

    def cublas_handles(self) -> tuple[int, ...]:
        return (int(self.handle),)  # CuPy's, made for this thread; every SGEMM names it

    def info(self) -> dict[str, str]:
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return {
            "backend": "cuda",
            "device": name,
            "cupy": cupy.__version__,
            "cuda_runtime": str(cupy.cuda.runtime.runtimeGetVersion()),
            "cublas": str(cublas.getVersion(self.handle)),
            "math_mode": "CUBLAS_DEFAULT_MATH (TF32 off)",
        }
