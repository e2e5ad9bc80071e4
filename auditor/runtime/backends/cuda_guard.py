"""Guard zones of canaries around every allocation (CUDA backend), and the observer that waits
for each launch.

Each allocation is GUARD_ELEMENTS of canary, the buffer, GUARD_ELEMENTS of canary. The default
observer (cuda_observe.py) checks them in stream order. The one here, chosen by
EGF_AUDIT_OBSERVER=sync, is the observer before issue 20, kept so that the two can be timed
side by side: after every launch two small kernels scan every zone, or compare every buffer with
its shadow, in one launch each, and one device-to-host copy of flags per launch decides which
buffers to look at closer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from typing import Any

import cupy
import numpy as np

from egf_audit.runtime.guards import CANARY_BITS, GUARD_ELEMENTS, changed_outside
from egf_audit.runtime.sanitizer import SANITIZED_CHILD

_SCAN = r"""
extern "C" __global__ void egf_zones_changed(const unsigned int* const* zones, int length,
                                             unsigned int canary, int* flags) {
  const unsigned int* zone = zones[blockIdx.x];
  for (int j = threadIdx.x; j < length; j += blockDim.x)
    if (zone[j] != canary) flags[blockIdx.x] = 1;
}
extern "C" __global__ void egf_buffers_changed(const unsigned int* const* live,
                                               const unsigned int* const* shadow,
                                               const long long* counts, int* flags) {
  const unsigned int* a = live[blockIdx.y];
  const unsigned int* b = shadow[blockIdx.y];
  long long n = counts[blockIdx.y];
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n;
       j += (long long)gridDim.x * blockDim.x)
    if (a[j] != b[j]) flags[blockIdx.y] = 1;
}
"""
THREADS = 256
# Under --sanitize the audit runs again as a child with SANITIZED_CHILD set: every buffer its
# own cudaMalloc (no pool) and no guard zones, so memcheck sees each buffer's real bounds.
GUARDED = not os.environ.get(SANITIZED_CHILD)
COMPARE_BLOCKS = 64  # blocks per buffer in the comparison; each strides over the buffer


@cache
def _kernels() -> cupy.RawModule:
    return cupy.RawModule(code=_SCAN, options=("-std=c++17",))


def guarded_zeros(size: int, dtype: Any, guard: int) -> tuple[cupy.ndarray, cupy.ndarray]:
    """(whole allocation as uint32, the buffer inside it): zero-filled between canary zones of
    `guard` elements (0 under compute-sanitizer, which must see the buffer's own bounds)."""
    whole = cupy.zeros(size + 2 * guard, dtype=np.uint32)
    if guard:
        whole[:guard] = CANARY_BITS
        whole[guard + size :] = CANARY_BITS
    inner = whole[guard : guard + size].view(dtype)
    return whole, inner


class ZoneScan:
    """Every guard zone of a set of allocations, checked in one launch."""

    def __init__(self, wholes: Sequence[cupy.ndarray], stream: Any):
        self.wholes = list(wholes) if GUARDED else []
        self.stream = stream
        ptrs = []
        for w in self.wholes:
            ptrs += [w.data.ptr, w.data.ptr + (w.size - GUARD_ELEMENTS) * 4]
        self._zones = cupy.asarray(np.array(ptrs, np.uint64))
        self._flags = cupy.zeros(max(len(ptrs), 1), np.int32)

    def breached(self) -> list[tuple[int, str, int, int]]:
        """(index, side, distance from the buffer, count) per changed zone; zones restored."""
        if not self.wholes:
            return []
        with self.stream:
            self._flags[...] = 0
            _kernels().get_function("egf_zones_changed")(
                (len(self.wholes) * 2,),
                (THREADS,),
                (self._zones, np.int32(GUARD_ELEMENTS), np.uint32(CANARY_BITS), self._flags),
            )
            flags = cupy.asnumpy(self._flags, stream=self.stream)
        self.stream.synchronize()
        found = []
        for z in np.flatnonzero(flags):
            i, after = divmod(int(z), 2)
            whole = self.wholes[i]
            zone = whole[-GUARD_ELEMENTS:] if after else whole[:GUARD_ELEMENTS]
            where = cupy.asnumpy(cupy.flatnonzero(zone != CANARY_BITS))
            nearest = int(where[0]) + 1 if after else GUARD_ELEMENTS - int(where[-1])
            zone[...] = CANARY_BITS
            found.append((i, "after" if after else "before", nearest, int(where.size)))
        return found


class CudaWatch:
    """Shadow copies of a pipeline's buffers on the device."""

    def __init__(self, ptrs: Sequence[int], buffers: Sequence[cupy.ndarray], stream: Any):
        self._ptrs = list(ptrs)
        self.stream = stream
        with stream:
            self.live = list(buffers)
            self.shadows = [b.copy() for b in buffers]
            self._live_ptrs = cupy.asarray(np.array([b.data.ptr for b in buffers], np.uint64))
            self._shadow_ptrs = cupy.asarray(
                np.array([s.data.ptr for s in self.shadows], np.uint64)
            )
            self._counts = cupy.asarray(np.array([b.size for b in buffers], np.int64))
            self._flags = cupy.zeros(max(len(buffers), 1), np.int32)

    def changes(
        self, exempt: dict[int, tuple[tuple[int, int, int, int], ...]]
    ) -> list[tuple[int, int, int, int, int]]:
        if not self.live:
            return []
        with self.stream:
            self._flags[...] = 0
            _kernels().get_function("egf_buffers_changed")(
                (COMPARE_BLOCKS, len(self.live)),
                (THREADS,),
                (self._live_ptrs, self._shadow_ptrs, self._counts, self._flags),
            )
            flags = cupy.asnumpy(self._flags, stream=self.stream)
        self.stream.synchronize()
        found = []
        for i in np.flatnonzero(flags):
            ptr = self._ptrs[int(i)]
            with self.stream:
                change = changed_outside(
                    cupy, self.live[int(i)], self.shadows[int(i)], exempt.get(ptr, ())
                )
            if change is not None:
                found.append((ptr, *change))
        return found
