"""Host allocations the audited kernels cannot leave unnoticed (CPU backend).

Each buffer gets its own shared anonymous mapping, so a forked kernel worker (cpu_worker.py)
works on the very memory the parent's torch GEMMs use, inside a reservation of address space:

    [REACH, PROT_NONE][canaries ... | buffer data, ending on a page boundary][REACH, PROT_NONE]

No access lands in readable memory anywhere within REACH bytes of a buffer: a read or write
past its end, or before its canaries, near or far, faults, and in the worker that fault is a
crash verdict. REACH is 8 GiB a side: every index a kernel forms in the ABI's 32-bit int
arithmetic lies within 2^31 elements of 4 bytes of its pointer, and the config refuses a buffer
whose rows, rounded up to the launch's whole blocks, would need a larger index (pipeline/config.py,
INT32_MAX). The reservation is address space only: PROT_NONE pages are never backed by memory
nor charged to the commit limit, and x86-64 Linux gives a process 128 TiB of it (the ~100
buffers of an audit take ~1.6 TiB). The canaries fill the rest of the pages in front of the
buffer (at least GUARD_ELEMENTS of them); a write just before the buffer changes one, and
`breached_canaries` finds it after the launch. `Watcher` keeps a shadow copy of every buffer so
that the recorder can see what a launch changed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime.backends.cpu_build import load_library
from egf_audit.runtime.guards import CANARY_BITS, GUARD_ELEMENTS
from egf_audit.trace.buffers import ELEMENT_BYTES

PAGE = mmap.PAGESIZE
REACH = 1 << 33  # bytes of inaccessible address space on each side of a buffer (see above)
PROT_NONE = 0  # not exported by the mmap module
MAP_FIXED = 0x10  # not exported either; the same value on Linux and the BSDs
_DTYPES = {"f32": np.float32, "i32": np.int32}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass
class GuardedBuffer:
    mapping: int  # address of the whole reservation, both inaccessible sides included
    length: int  # bytes of the reservation
    data: np.ndarray  # the buffer itself (float32 or int32), live memory
    canaries: np.ndarray  # uint32, the zone right in front of the buffer, live memory

    @property
    def base(self) -> int:
        return self.data.ctypes.data

    @property
    def committed(self) -> int:
        """Bytes of real memory: the canary zone and the data, not the reservation."""
        return self.length - 2 * REACH


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise AuditEnvironmentError(f"{what} failed: {os.strerror(err)}")


def allocate(count: int, dtype: str) -> GuardedBuffer:
    """A zero-filled buffer of `count` elements behind canaries, REACH bytes of inaccessible
    address space on each side."""
    nbytes = count * ELEMENT_BYTES
    inner_bytes = -(-(nbytes + GUARD_ELEMENTS * ELEMENT_BYTES) // PAGE) * PAGE
    length = REACH + inner_bytes + REACH
    address = _libc.mmap(None, length, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if address in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise AuditEnvironmentError(
            f"cannot reserve {length / 2**30:.1f} GiB of address space around a buffer (the CPU "
            f"backend's guard zones; a `ulimit -v` must leave room for them): {os.strerror(err)}"
        )
    # the buffer's own memory replaces the middle of the reservation, shared with the worker
    inner_address = _libc.mmap(
        address + REACH,
        inner_bytes,
        mmap.PROT_READ | mmap.PROT_WRITE,
        mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | MAP_FIXED,
        -1,
        0,
    )
    if inner_address != address + REACH:
        err = ctypes.get_errno()
        _libc.munmap(address, length)
        raise AuditEnvironmentError(
            f"cannot map {inner_bytes} bytes for a buffer: {os.strerror(err)}"
        )
    inner = (ctypes.c_uint8 * inner_bytes).from_address(inner_address)
    # numpy's stub lists no ctypes array among the buffers frombuffer takes; it is one
    raw = np.frombuffer(inner, dtype=np.uint8)  # type: ignore[call-overload]
    split = inner_bytes - nbytes
    canaries = raw[:split].view(np.uint32)
    canaries[:] = CANARY_BITS
    data = raw[split:].view(_DTYPES[dtype])
    return GuardedBuffer(address, length, data, canaries)


def release(buffer: GuardedBuffer) -> None:
    """Unmap; the caller must hold no view of the buffer any more."""
    _check(_libc.munmap(buffer.mapping, buffer.length), "munmap")


class Pool:
    """Freed buffers kept for the next allocation of the same size: every scenario allocates
    the same ~100 buffers, and mapping each afresh costs more than the scenario's kernels. A
    reused buffer is zero-filled and its canaries restored, as a new one would be. It keeps at
    most MAX_BYTES of memory and MAX_BUFFERS reservations (16 GiB of address space each)."""

    MAX_BYTES = 256 << 20
    MAX_BUFFERS = 256

    def __init__(self) -> None:
        self._free: dict[tuple[int, str], list[GuardedBuffer]] = {}
        self._order: list[tuple[int, str]] = []  # oldest first, for eviction
        self._bytes = 0

    def take(self, count: int, dtype: str) -> GuardedBuffer | None:
        stack = self._free.get((count, dtype))
        if not stack:
            return None
        buffer = stack.pop()
        self._order.remove((count, dtype))
        self._bytes -= buffer.committed
        buffer.data[...] = 0
        buffer.canaries[:] = CANARY_BITS
        return buffer

    def give(self, buffer: GuardedBuffer) -> None:
        key = (buffer.data.size, "i32" if buffer.data.dtype == np.int32 else "f32")
        self._free.setdefault(key, []).append(buffer)
        self._order.append(key)
        self._bytes += buffer.committed
        while (self._bytes > self.MAX_BYTES or len(self._order) > self.MAX_BUFFERS) and self._order:
            old = self._order.pop(0)
            evicted = self._free[old].pop(0)
            self._bytes -= evicted.committed
            release(evicted)

    def clear(self) -> None:
        """Unmap every kept buffer (the backend is done with them)."""
        for stack in self._free.values():
            for buffer in stack:
                release(buffer)
        self._free.clear()
        self._order.clear()
        self._bytes = 0


# One C call per launch scans every buffer and every canary zone: done from Python, the ~100
# buffers of a pipeline cost more per launch than the launch itself.
SCAN_SOURCE = r"""
#include <cstddef>
#include <cstdint>
#include <cstring>
// Per buffer i that changed: compare bit for bit, skipping elements inside its exempt boxes
// (boxes[5 * b ..] = buffer, offset, rows, width, row stride, for b < m), report (i, first index,
// count, old bits, new bits) of the others, then refresh the shadow.
extern "C" int egf_changes(int n, void* const* live, void* const* shadow, const long long* counts,
                           int m, const long long* boxes, long long* out) {
  int k = 0;
  for (int i = 0; i < n; ++i) {
    size_t nbytes = (size_t)counts[i] * 4;
    if (std::memcmp(live[i], shadow[i], nbytes) == 0) continue;
    const uint32_t* a = (const uint32_t*)live[i];
    uint32_t* s = (uint32_t*)shadow[i];
    long long first = -1, count = 0;
    uint32_t old_bits = 0, new_bits = 0;
    for (long long j = 0; j < counts[i]; ++j) {
      if (a[j] == s[j]) continue;
      bool inside = false;
      for (int b = 0; b < m && !inside; ++b) {
        const long long* x = boxes + 5 * b;
        long long d = j - x[1];
        if (x[0] != i || d < 0) continue;
        if (x[2] <= 1 || x[4] <= 0) inside = d < x[3];
        else inside = d / x[4] < x[2] && d % x[4] < x[3];
      }
      if (inside) continue;
      if (first < 0) { first = j; old_bits = s[j]; new_bits = a[j]; }
      ++count;
    }
    std::memcpy(s, a, nbytes);
    if (count) {
      long long* o = out + 5 * k++;
      o[0] = i; o[1] = first; o[2] = count; o[3] = old_bits; o[4] = new_bits;
    }
  }
  return k;
}
// `reference` holds canaries, at least as many as the largest zone
extern "C" int egf_canaries(int n, void* const* zones, const size_t* nbytes, const void* reference,
                            int* out) {
  int k = 0;
  for (int i = 0; i < n; ++i)
    if (std::memcmp(zones[i], reference, nbytes[i]) != 0) out[k++] = i;
  return k;
}
"""


@lru_cache(maxsize=1)
def _scan() -> ctypes.CDLL:
    lib = load_library("egf-scan", SCAN_SOURCE, {}, "egf-audit memory scan helper")
    pointers = ctypes.POINTER(ctypes.c_void_p)
    sizes = ctypes.POINTER(ctypes.c_size_t)
    out = ctypes.POINTER(ctypes.c_int)
    lib.egf_canaries.argtypes = [ctypes.c_int, pointers, sizes, ctypes.c_void_p, out]
    longs = ctypes.POINTER(ctypes.c_longlong)
    lib.egf_changes.argtypes = [ctypes.c_int, pointers, pointers, longs, ctypes.c_int, longs, longs]
    return lib


class _Table:
    """Pointer and size arrays for one C scan call, built once per set of buffers."""

    def __init__(self, columns: Sequence[Sequence[int]], sizes: Sequence[int]):
        n = len(sizes)
        self.n = n
        self.columns = [(ctypes.c_void_p * n)(*c) for c in columns]
        self.sizes = (ctypes.c_size_t * n)(*sizes)
        self.out = (ctypes.c_int * max(n, 1))()


class CanaryScan:
    """Every canary zone of a set of buffers, checked in one C call."""

    def __init__(self, buffers: Sequence[GuardedBuffer]):
        self.buffers = list(buffers)
        zones = [b.canaries for b in self.buffers]
        self._table = _Table([[z.ctypes.data for z in zones]], [z.nbytes for z in zones])
        self._reference = np.full(max((z.size for z in zones), default=1), CANARY_BITS, np.uint32)

    def breached(self) -> list[tuple[int, int, int]]:
        """(index in `buffers`, distance from the buffer of the nearest changed canary, how many
        changed) for every zone found changed; each is restored."""
        t = self._table
        k = _scan().egf_canaries(t.n, t.columns[0], t.sizes, self._reference.ctypes.data, t.out)
        found = []
        for i in t.out[:k]:
            zone = self.buffers[i].canaries
            where = np.flatnonzero(zone != CANARY_BITS)
            zone[:] = CANARY_BITS
            found.append((i, int(zone.size - where[-1]), int(where.size)))
        return found


class Watcher:
    """Shadow copies of a set of buffers, and the buffers that changed since the last look."""

    def __init__(self, buffers: Sequence[GuardedBuffer]):
        self.live = [b.data for b in buffers]
        self.shadows = [d.copy() for d in self.live]
        self._table = _Table(
            [[d.ctypes.data for d in self.live], [s.ctypes.data for s in self.shadows]],
            [d.nbytes for d in self.live],
        )

        n = len(self.live)
        self._counts = (ctypes.c_longlong * n)(*(d.size for d in self.live))
        self._out = (ctypes.c_longlong * (5 * max(n, 1)))()

    def changes(self, boxes: Sequence[int]) -> list[tuple[int, int, int, int, int]]:
        """(index, first element, count, old bits, new bits) for every buffer that changed
        outside the exempt boxes, each shadow brought up to date. `boxes` holds five numbers a
        box: buffer index, offset, rows, width, row stride."""
        t = self._table
        m = len(boxes) // 5
        flat = (ctypes.c_longlong * max(len(boxes), 1))(*boxes)
        k = _scan().egf_changes(t.n, t.columns[0], t.columns[1], self._counts, m, flat, self._out)
        out = self._out
        return [
            (out[5 * j], out[5 * j + 1], out[5 * j + 2], out[5 * j + 3], out[5 * j + 4])
            for j in range(k)
        ]
