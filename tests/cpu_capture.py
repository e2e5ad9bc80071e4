"""`egf-audit capture` of the stand-in trainer, emulated on the CPU.

The real recorder (auditor/capture/egf_capture_recorder.c and its units) needs a GPU: CUPTI calls
it back for every driver call of the trainer process. Here the stand-in
(`tests/standin/trainer.py`, `main`) runs on the CPU backend, wrapped in `RecordingBackend`, which
delegates every call and writes, in program order, the event line(s) the recorder writes for the
CUDA calls the CUDA backend (runtime/backends/cuda.py, through CuPy) makes in its place: per buffer
the allocation of its guarded block, one zero fill of the whole block and CuPy's two canary fills
of its guard zones (cuda_guard.guarded_zeros); per upload CuPy's staging copy and its copy (or, for
one element, its copy kernel) into the buffer; `cuMemsetD8Async` (cudaMemsetAsync) per memset;
`cuLaunchKernel` with the raw parameter bytes per kernel; cuBLAS's own log lines per SGEMM; the
snapshot regions of `abi_snapshots` around the snapshot kernels (every value kept, read back
through the backend); and the `exit` event. The folder then gets `layout.json` (the stand-in's
`--layout-out`) and `manifest.json` as `egf-audit capture` writes it. What this reproduces and what
it does not: tests/data/capture/EMULATED.md.

    capture_standin(tmp_path / "clean", None)
    capture_standin(tmp_path / "skip-scale", "skip-scale")
    capture_standin(tmp_path / "one-step", None, steps=1)
"""

from __future__ import annotations

import bisect
import contextlib
import io
import json
import re
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from standin import trainer as standin

from egf_audit.capture.build import SOURCES as RECORDER_SOURCES
from egf_audit.kernels import KernelSpec
from egf_audit.runtime.backends import select_backend
from egf_audit.runtime.guards import CANARY_BITS, GUARD_ELEMENTS
from egf_audit.runtime.memory import BufferSpec
from egf_audit.trace.buffers import ELEMENT_BYTES

DEFAULT_SNAPSHOT = ("sp14_scale_wire_col", "accumulate_d_h_s2_from_concat", "polyak_ema")
VALUES_MAX = 1 << 22  # the recorder's default (EGF_CAPTURE_VALUES_MAX unset)
PID, PPID = 4242, 4241  # a fixed fake process: the same files for the same capture
TID = 0x2A2A2A  # pthread_self() & 0xffffff as the recorder writes it; any fixed value
CUPTI_VERSION = 130001  # what CUDA 13.1's CUPTI reports (the committed fixtures' init event)
CUBLAS_LIBRARY = "libcublas.so.13"
# a kernel cuBLAS launched for an SGEMM on the H200 (which one depends on its heuristics)
CUBLAS_KERNEL = (
    "_Z16gemmSN_TN_kernelIfLi128ELi16ELi2ELi4ELi8ELi9ELb0E30cublasGemvTensorStridedBatchedIKfES2_"
    "S0_IfEEv22cublasGemmSmallNParamsIT7_T8_T9_T_E"
)
HANDLE = 0xD0DC8B0  # host addresses cuBLAS prints: the handle and CuPy's alpha/beta scalars
ALPHA_HOST, BETA_HOST = 0x96040F0, 0x94010F0
SGEMM_HEADER = (
    "I! cuBLAS (v13.1.0) function cublasStatus_t cublasSgemm_v2(cublasHandle_t, "
    "cublasOperation_t, cublasOperation_t, int, int, int, const float*, const float*, int, "
    "const float*, int, const float*, float*, int) called:\n"
)
_OPS = {"N": "CUBLAS_OP_N(0)", "T": "CUBLAS_OP_T(1)", "C": "CUBLAS_OP_C(2)"}
_MASK64 = (1 << 64) - 1
GUARD_BYTES = GUARD_ELEMENTS * ELEMENT_BYTES  # a guard zone of the CUDA backend (cuda_guard.py)
POOL_UNIT = 512  # CuPy's memory pool rounds every block up to a multiple of 512 bytes
# CuPy's elementwise kernels as the recorder writes them: a CArray or CIndexer argument is one
# struct parameter (32 or 24 bytes), whose raw value the recorder does not keep (0)
_CARRAY, _CINDEXER = [32, 0], [24, 0]


def recorder_mix64_constants(source: str) -> tuple[int, int, int]:
    """(index step, first and second multiplier) of the recorder's region hash as its C source
    spells them (mix64_element). Read from the source, not restated, so the emulation hashes as
    the shipped recorder does."""
    found = re.search(
        r"mix64_element\(.*?index \* (0x[0-9A-F]+)ULL;.*?>> 30\)\) \* (0x[0-9A-F]+)ULL;"
        r".*?>> 27\)\) \* (0x[0-9A-F]+)ULL;",
        source,
        re.S,
    )
    if found is None or '\\"hash\\":\\"mix64\\"' not in source:
        raise RuntimeError("the recorder's region hash (mix64_element) moved")
    step, m1, m2 = (int(g, 16) for g in found.groups())
    return step, m1, m2


MIX64_STEP, MIX64_M1, MIX64_M2 = recorder_mix64_constants(
    "".join(path.read_text(encoding="utf-8") for path in RECORDER_SOURCES)
)


def mix64(host: np.ndarray, ld: int, skip_col: int) -> int:
    """The recorder's region_hash: each element's bits plus its index times the step, through
    splitmix64's finaliser, summed modulo 2**64; column `skip_col` of rows of `ld` left out."""
    bits = np.ascontiguousarray(host, dtype="<f4").view("<u4").astype(np.uint64)
    index = np.arange(bits.size, dtype=np.uint64)
    z = bits + index * np.uint64(MIX64_STEP)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX64_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX64_M2)
    z ^= z >> np.uint64(31)
    if skip_col >= 0 and ld > 0:
        z = z[index % np.uint64(ld) != np.uint64(skip_col)]
    return int(z.sum(dtype=np.uint64))


def raw_parameter(ctype: str, value: Any) -> tuple[int, int]:
    """(size, raw) of one kernel parameter as the recorder writes it: the little-endian unsigned
    integer of the parameter's bytes (sizes as cuFuncGetParamInfo gives them)."""
    if ctype.endswith("*"):
        return 8, int(value) & _MASK64
    if ctype == "float":
        return 4, struct.unpack("<I", struct.pack("<f", float(value)))[0]
    if ctype == "int":
        return 4, int(value) & 0xFFFFFFFF
    if ctype == "long long":
        return 8, int(value) & _MASK64
    raise ValueError(f"no recorder encoding for C type {ctype!r}")


def _hex_pointer(address: int) -> str:
    """A pointer as cuBLAS's log prints it: `0x` then glibc's `%p` (itself `0x...`, or `(nil)`)."""
    return f"POINTER (IN HEX:0x{hex(address) if address else '(nil)'})"


def sgemm_log(
    transa: str,
    transb: str,
    m: int,
    n: int,
    k: int,
    a: int,
    lda: int,
    b: int,
    ldb: int,
    c: int,
    ldc: int,
) -> list[str]:
    """The messages cuBLAS's logger hands the recorder for one cublasSgemm_v2 call, in order
    (the header, then one line per argument; the trailing Time/Process/COMPILED WITH message is
    one the fixtures drop and the reader never reads)."""

    def line(name: str, ctype: str, val: str) -> str:
        return f"i!  {name}: type={ctype}; val={val}\n"

    return [
        SGEMM_HEADER,
        line("handle", "cublasHandle_t", _hex_pointer(HANDLE)),
        line("transa", "cublasOperation_t", _OPS[transa]),
        line("transb", "cublasOperation_t", _OPS[transb]),
        line("m", "int", str(m)),
        line("n", "int", str(n)),
        line("k", "int", str(k)),
        line("alpha", "float", _hex_pointer(ALPHA_HOST)),
        line("A", "float", _hex_pointer(a)),
        line("lda", "int", str(lda)),
        line("B", "float", _hex_pointer(b)),
        line("ldb", "int", str(ldb)),
        line("beta", "float", _hex_pointer(BETA_HOST)),
        line("C", "float", _hex_pointer(c)),
        line("ldc", "int", str(ldc)),
    ]


def _float_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(value)))[0]


class EventFiles:
    """events-<pid>.jsonl and snapshots-<pid>.bin, written as the recorder writes them."""

    def __init__(self, folder: Path, pid: int, values_max: int):
        self.events = (folder / f"events-{pid}.jsonl").open("w", encoding="utf-8")
        self.snapshots = (folder / f"snapshots-{pid}.bin").open("wb")
        self.snapshot_bytes = 0
        self.folder, self.pid = folder, pid
        self.values: Any = None  # values-<pid>.bin of a deep capture, opened by deep_values()
        self.values_bytes = 0
        self.values_max = values_max
        self.seq = 0
        self.counts = {"kernel": 0, "sgemm": 0, "memset": 0, "copy": 0, "snapshot": 0}
        self.notes: list[str] = []

    def event(self, ev: str, **fields: Any) -> int:
        """One line: ev, seq, tid, then `fields` in the recorder's order; returns its seq."""
        seq = self.seq
        self.seq += 1
        line = {"ev": ev, "seq": seq, "tid": TID, **fields}
        self.events.write(json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n")
        if ev in self.counts:
            self.counts[ev] += 1
        return seq

    def memory(self, ev: str, api: str, dst: int, src: int, nbytes: int, value: int = 0) -> int:
        return self.event(ev, api=api, dst=dst, src=src, bytes=nbytes, value=value)

    def note(self, msg: str) -> None:
        self.event("note", msg=msg)
        self.notes.append(msg)

    def region(
        self,
        launch: int,
        when: str,
        region: str,
        ptr: int,
        host: np.ndarray,
        rows: int,
        ld: int,
        skip_col: int,
    ) -> None:
        """`write_region`: the hash over every element (column `skip_col` left out), the values
        of the first values_max elements (none for the body of a matrix)."""
        host = np.ascontiguousarray(host, dtype="<f4")
        count = host.size
        keep = min(count, self.values_max)
        if skip_col >= 0:
            keep = 0
        offset = self.snapshot_bytes
        if keep > 0:
            self.snapshots.write(host[:keep].tobytes())
            self.snapshot_bytes += keep * ELEMENT_BYTES
        self.event(
            "snapshot",
            launch=launch,
            when=when,
            region=region,
            ptr=ptr,
            elements=count,
            rows=rows,
            ld=ld,
            skip_col=skip_col,
            hash=f"{mix64(host, ld, skip_col):016x}",
            offset=offset,
            count=keep,
        )

    def deep_values(self) -> None:
        self.values = (self.folder / f"values-{self.pid}.bin").open("wb")

    @staticmethod
    def runs_with_values(
        base: int, words: np.ndarray, differ: np.ndarray
    ) -> tuple[list[list[int]], list[np.ndarray]]:
        """The runs of the changed words `differ` (indices into `words`, which start at byte
        address `base`), and each run's new words."""
        runs: list[list[int]] = []
        chunks: list[np.ndarray] = []
        if differ.size:
            for run in np.split(differ, np.flatnonzero(np.diff(differ) != 1) + 1):
                runs.append([base + 4 * int(run[0]), 4 * int(run.size)])
                chunks.append(words[run[0] : run[-1] + 1])
        return runs, chunks

    def write_values(self, chunks: list[np.ndarray]) -> dict[str, int]:
        """`{"values": offset}` after writing `chunks` to the values file; {} without one."""
        if self.values is None:
            return {}
        offset = self.values_bytes
        for chunk in chunks:
            data = np.ascontiguousarray(chunk, dtype="<u4").tobytes()
            self.values.write(data)
            self.values_bytes += len(data)
        return {"values": offset}

    def close(self) -> None:
        self.events.close()
        self.snapshots.close()
        if self.values is not None:
            self.values.close()


class RecordingBackend:
    """A backend that delegates every call to `inner` and records the CUDA equivalent of each
    call the pipeline makes (module docstring)."""

    def __init__(
        self, inner: Any, files: EventFiles, snapshot_kernels: Sequence[str], deep: bool = False
    ):
        self._inner = inner
        self._files = files
        # --deep: after every launch, memset and copy, each buffer compared word by word with
        # a copy of it (the recorder's device shadow), the changed runs written as an effect
        self._deep = deep
        self._shadow: dict[int, np.ndarray] = {}
        self._blocks: list[int] = []  # pooled bytes of every block allocated (CuPy keeps them)
        self._snapshot_kernels = frozenset(snapshot_kernels)
        self._bases: list[int] = []
        self._sizes: dict[int, int] = {}  # bytes by base pointer
        # the last polyak_ema's target, snapshotted again at the next launch (g.step_start_*)
        self._polyak: tuple[int, int] | None = None
        self._step_start_pending = False
        self._staging = np.zeros(1, np.float32)  # stands in for CuPy's staging block (upload)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    # ---- --deep: what each call changed ----
    def _words(self, base: int) -> np.ndarray:
        return self._inner.read(base).view(np.uint32)  # read() hands out a copy of its own

    def _effect(self, launch: int) -> None:
        """The recorder's deep_effect: every live buffer compared with its shadow, the runs of
        words that differ written (as byte addresses), the shadow brought up to date."""
        if not self._deep:
            return
        changed: list[tuple[list[int], np.ndarray]] = []
        for base in self._bases:
            shadow = self._shadow[base]
            # most calls change one or two of ~80 buffers: an exact comparison of the bits
            # (never of the floats: -0.0 == +0.0 and NaN != NaN) skips the unchanged ones
            # without copying them, 73,000 times in a capture
            live = self._inner._buffers[base].numpy()
            if live.nbytes == shadow.nbytes and live.tobytes() == shadow.tobytes():
                continue
            now = live.view(np.uint32).copy()
            differ = np.flatnonzero(now != shadow)
            self._shadow[base] = now
            changed += zip(*self._files.runs_with_values(base, now, differ), strict=True)
        changed.sort(key=lambda run_chunk: run_chunk[0])
        self._files.event(
            "effect",
            launch=launch,
            allocations=len(self._blocks),
            bytes=sum(self._blocks),
            changed=[run for run, _ in changed],
            **self._files.write_values([chunk for _, chunk in changed]),
        )

    @staticmethod
    def _carray(pointer: int, count: int) -> str:
        """A 1-D CuPy CArray<float> as its kernels receive it: data, size, shape, strides."""
        return struct.pack("<QqqQ", pointer, count, count, ELEMENT_BYTES).hex()

    # ---- memory ----
    def _cupy_kernel(
        self, name: str, block: int, params: list[list[int]], arrays: Sequence[int] = ()
    ) -> int:
        """A launch of one of CuPy's own elementwise kernels, one block, as recorded on the H200;
        a deep recorder also writes its struct parameters (the CArrays' data pointers)."""
        extra: dict[str, Any] = {}
        if self._deep:
            extra["by"] = "cupy_backends.so"
            extra["blobs"] = [[i, self._carray(p, block)] for i, p in enumerate(arrays)]
        return self._files.event(
            "kernel",
            api="cuLaunchKernel",
            name=name,
            grid=[1, 1, 1],
            block=[block, 1, 1],
            params=params,
            **extra,
        )

    def alloc(self, spec: BufferSpec) -> int:
        """The CUDA backend's guarded buffer (cuda_guard.guarded_zeros): CuPy allocates one
        block for GUARD_ELEMENTS of canary, the buffer, GUARD_ELEMENTS of canary (cuMemAlloc_v2
        of its pool's rounded size), zero-fills the whole block (cupy.zeros: cudaMemsetAsync)
        and fills each guard zone with CANARY_BITS (one `cupy_fill` launch each). The buffer
        starts GUARD_BYTES into the block."""
        base = self._inner.alloc(spec)
        nbytes = spec.size * ELEMENT_BYTES
        bisect.insort(self._bases, base)
        self._sizes[base] = nbytes
        block, whole = base - GUARD_BYTES, nbytes + 2 * GUARD_BYTES
        pooled = -(-whole // POOL_UNIT) * POOL_UNIT
        made = self._files.memory("alloc", "cuMemAlloc_v2", block, 0, pooled)
        self._blocks.append(pooled)
        if self._deep:
            # the recorder copies a new allocation, and names its non-zero words (contents)
            now = self._shadow[base] = self._words(base)
            runs, chunks = self._files.runs_with_values(base, now, np.flatnonzero(now))
            self._files.event(
                "contents", alloc=made, changed=runs, **self._files.write_values(chunks)
            )
        self._effect(self._files.memory("memset", "cuMemsetD8Async", block, 0, whole))
        for zone in (block, base + nbytes):
            params = [[4, CANARY_BITS], _CARRAY, _CINDEXER]
            self._effect(self._cupy_kernel("cupy_fill", GUARD_ELEMENTS, params, [0, zone]))
        return base

    def free(self, ptr: int) -> None:
        self._inner.free(ptr)
        self._bases.remove(ptr)
        del self._sizes[ptr]
        self._shadow.pop(ptr, None)  # CuPy's pool keeps the block: still counted as allocated

    def upload(self, ptr: int, values: np.ndarray, stride: int = 1) -> None:
        """As CuPy writes `view[...] = cupy.asarray(values)`: a host-to-device copy into a
        staging block of its pool, then a device-to-device copy (cuMemcpyAsync) from it to
        `ptr`, or, for a single element, a `cupy_copy` kernel. The staging block is this
        backend's own host array (an address no buffer holds); CuPy's pool picks, allocates and
        reuses real ones."""
        values = np.asarray(values)
        count, nbytes = int(values.size), int(values.size) * ELEMENT_BYTES
        if stride != 1 and count > 1:  # the stand-in makes none; no recording shows CuPy's launch
            raise NotImplementedError("a strided upload (CuPy's strided copy kernel)")
        staging = self._staging.ctypes.data
        self._effect(self._files.memory("copy", "cuMemcpyHtoDAsync_v2", staging, 0, nbytes))
        if count == 1:
            # as the CUDA backend casts it; the recordings show float32 (CuPy names int32 alike)
            dtype = "int32" if values.dtype.kind in "iu" else "float32"
            params = [_CARRAY, _CARRAY, _CINDEXER]
            seq = self._cupy_kernel(f"cupy_copy__{dtype}_{dtype}", 1, params, [staging, ptr])
        else:
            seq = self._files.memory("copy", "cuMemcpyAsync", ptr, staging, nbytes)
        self._inner.upload(ptr, values, stride)
        self._effect(seq)

    def memset_zero(self, ptr: int, count: int) -> None:
        seq = self._files.memory("memset", "cuMemsetD8Async", ptr, 0, count * ELEMENT_BYTES)
        self._inner.memset_zero(ptr, count)
        self._effect(seq)

    def read(self, ptr: int) -> np.ndarray:
        """A download of the whole allocation (cupy.asnumpy: device to host). The stand-in runs
        plain, so it never reads back, and never takes the rebuild's checkpoint snapshots."""
        seq = self._files.memory("copy", "cuMemcpyDtoHAsync_v2", 0, ptr, self._sizes.get(ptr, 0))
        values = self._inner.read(ptr)
        self._effect(seq)
        return values

    # ---- launches ----
    def sgemm(self, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) -> None:
        """cuBLAS logs the call on entry, one message a line; the recorder adds alpha's and
        beta's bits (host pointer mode) to their lines. The kernels cuBLAS then launches are
        its own (their names depend on its heuristics) and are not emulated."""
        for msg in sgemm_log(transa, transb, m, n, k, a, lda, b, ldb, c, ldc):
            fields: dict[str, Any] = {}
            if msg.startswith("i!  alpha:"):
                fields = {"pointer_mode": 0, "alpha_bits": _float_bits(alpha)}
            elif msg.startswith("i!  beta:"):
                fields = {"pointer_mode": 0, "beta_bits": _float_bits(beta)}
            self._files.event("cublas", msg=msg, **fields)
        self._files.counts["sgemm"] += 1
        if not self._deep:
            self._inner.sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
            return
        # a deep recorder sees cuBLAS's own launch (a cuBLAS library on its call stack) with
        # its parameter block, which holds the operands' pointers
        block = struct.pack("<QQQiii", a, b, c, m, n, k).hex()
        seq = self._files.event(
            "kernel",
            api="cuLaunchKernel",
            name=CUBLAS_KERNEL,
            grid=[1, 1, 1],
            block=[128, 1, 1],
            params=[[len(block) // 2, 0]],
            by=CUBLAS_LIBRARY,
            blobs=[[0, block]],
        )
        self._inner.sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
        self._effect(seq)

    def launch(self, spec: KernelSpec, blocks: int, threads: int, args: list[Any]) -> None:
        """The kernel event; then, not launched yet, the target as a step starts (the first
        launch after a polyak_ema) and the regions before it; after it ran, the regions after."""
        params = [raw_parameter(ctype, v) for (_, ctype), v in zip(spec.params, args, strict=True)]
        seq = self._files.event(
            "kernel",
            api="cuLaunchKernel",
            name=spec.name,
            grid=[blocks, 1, 1],
            block=[threads, 1, 1],
            params=[list(p) for p in params],
        )
        if self._step_start_pending and self._polyak is not None:
            self._step_start_pending = False
            target, n = self._polyak
            self._snap(seq, "step_start", "target", target, n)
        named = {name: v for (name, _), v in zip(spec.params, args, strict=True)}
        snapshot = spec.name in self._snapshot_kernels
        if snapshot:
            self._abi_snapshots(seq, "before", spec.name, named)
        self._inner.launch(spec, blocks, threads, args)
        if snapshot:
            self._abi_snapshots(seq, "after", spec.name, named)
        self._effect(seq)

    # ---- snapshots (the recorder's abi_snapshots, snapshot_region and snap_concat) ----
    def _copy_to_host(self, ptr: int, count: int) -> np.ndarray | None:
        """cuMemcpyDtoH of `count` floats at `ptr`, read through the backend; None where the
        span leaves the allocation (a guarded CPU buffer has nothing readable past its end)."""
        if count <= 0:
            return None
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0:
            return None
        base = self._bases[i]
        start, nbytes = ptr - base, count * ELEMENT_BYTES
        if start + nbytes > self._sizes[base]:
            return None
        raw = np.ascontiguousarray(self._inner.read(base)).view(np.uint8)
        return raw[start : start + nbytes].view("<f4").copy()

    def _snap(self, launch: int, when: str, region: str, ptr: int, count: int) -> None:
        host = self._copy_to_host(ptr, count)
        if host is not None:
            self._files.region(launch, when, region, ptr, host, 1, count, -1)

    def _snap_concat(self, launch: int, when: str, ptr: int, rows: int, ld: int) -> None:
        host = self._copy_to_host(ptr, rows * ld)
        if host is None:
            return
        wire = host[ld - 1 :: ld][:rows] if ld > 0 else host[:0]
        self._files.region(launch, when, "wire", ptr, wire, rows, 1, -1)
        self._files.region(launch, when, "body", ptr, host, rows, ld, ld - 1)

    def _abi_snapshots(self, launch: int, when: str, name: str, a: dict[str, Any]) -> None:
        before = when == "before"
        if name == "sp14_scale_wire_col":
            self._snap_concat(launch, when, a["dx_concat"], a["rows"], a["ld"])
            if before:
                alpha = a["isv"] + ELEMENT_BYTES * a["isv_index"]
                self._snap(launch, when, "alpha", alpha, 1)
        elif name == "accumulate_d_h_s2_from_concat":
            rows, sh2, ld = a["rows"], a["sh2"], a["ld_concat"]
            self._snap(launch, when, "d_h_s2", a["d_h_s2"], rows * sh2)
            if before:
                self._snap(launch, when, "d_concat", a["d_concat"], rows * ld)
        elif name == "polyak_ema":
            n = a["n"]
            self._snap(launch, when, "target", a["target"], n)
            if before:
                self._snap(launch, when, "online", a["online"], n)
            else:
                self._polyak = (a["target"], n)
                self._step_start_pending = True


def capture_standin(
    folder: Path,
    fault: str | None,
    steps: int = 2,
    values_max: int | None = None,
    snapshot: Sequence[str] = DEFAULT_SNAPSHOT,
    deep: bool = False,
) -> Path:
    """A capture folder of the stand-in trainer (preset ci, `steps` steps: sentinel, live, ...)
    with `fault` put back (None: clean), as `egf-audit capture --out folder --layout L
    [--values-max N] [--snapshot K ...] -- python tests/standin/trainer.py ...` writes it on
    a GPU. Returns `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = EventFiles(folder, PID, VALUES_MAX if values_max is None else values_max)
    files.event(
        "init",
        pid=PID,
        ppid=PPID,
        cupti_version=CUPTI_VERSION,
        subscribe=0,
        param_info=True,
        hash="mix64",
        **({"deep": True, "values": True} if deep else {}),
    )
    if deep:
        files.deep_values()
    files.note(f"cublas logger attached: {CUBLAS_LIBRARY}")
    backends: list[Any] = []

    def recording_backend(device: str, kernels: Any, *rest: Any) -> RecordingBackend:
        inner = select_backend("cpu", kernels, *rest)
        backends.append(inner)
        return RecordingBackend(inner, files, snapshot, deep)

    argv = [*(["--fault", fault] if fault else []), "--steps", str(steps), "--device", "cpu"]
    argv += ["--layout-out", str(folder / "layout.json")]
    start = time.perf_counter()
    try:
        with (
            mock.patch.object(standin, "select_backend", recording_backend),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            exit_code = standin.main(argv)
        files.event("exit", pid=PID)  # exit(): the recorder's atexit handler
    finally:  # an exception out of the stand-in leaves the files as a crash would
        for inner in backends:
            inner.close()
        files.close()
    wall = time.perf_counter() - start
    command = ["python3", "tests/standin/trainer.py", *argv[:-1], "layout.json"]
    manifest = {
        "command": command,
        "exit_code": exit_code,
        "wall_s": round(wall, 3),
        "layout": "layout.json",
        "snapshot_kernels": list(snapshot),
        "deep": deep,
        "processes": [
            {
                "pid": PID,
                "audited": True,
                "kernels": files.counts["kernel"],
                "gemms": files.counts["sgemm"],
                "memsets": files.counts["memset"],
                "copies": files.counts["copy"],
                "snapshots": files.counts["snapshot"],
                "notes": files.notes,
            }
        ],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return folder
