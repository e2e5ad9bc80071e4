"""The device records of the stream-ordered observer (cuda_observe.py): the kernel that fills
them, the tasks it runs and how its records read back, kept apart from CuPy so that the CPU can
build, run (the kernel compiles as C++ too) and test all of it.

A launch's comparison is a table of tasks, one block each, then the exempt boxes:

    task = (whole, live pointer, shadow pointer, begin, end, slot, first box, boxes)

`whole` = 1 when a box the launch may write covers the allocation: only the shadow is then
refreshed. Per (launch, reached allocation) a slot of three numbers collects the first changed
element outside the boxes as (index << 32 | old bits), the same with the new bits, and the
count. Per (kernel launch, guard zone) three counters collect how many canaries changed, the
largest `zone_len - j` and the largest `j + 1` over the changed ones j (so zero-filled counters
need no other start value): the first and the last changed canary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from egf_audit.runtime.backends.base import BreachFound, StrayFound

Box = tuple[int, int, int, int]

SOURCE = r"""
typedef unsigned long long egf_u64;
typedef unsigned int egf_u32;

// j lies in one of the `count` boxes (offset, rows, width, row stride): the CPU scan's rule.
__device__ __forceinline__ bool egf_inside(long long j, const long long* box, long long count) {
  for (long long b = 0; b < count; ++b, box += 4) {
    long long d = j - box[0];
    if (d < 0) continue;
    if (box[1] <= 1 || box[3] <= 0) {
      if (d < box[2]) return true;
    } else if (d / box[3] < box[1] && d % box[3] < box[2]) {
      return true;
    }
  }
  return false;
}

// One changed element: refresh its shadow; outside the boxes, keep the smallest index with its
// old and new bits (the index in the high word, so the minimum picks the first element) and
// count it.
__device__ __forceinline__ void egf_changed(long long j, egf_u32 now, egf_u32 before,
                                            egf_u32* shadow, bool whole, const long long* box,
                                            long long boxes, egf_u64* slot) {
  shadow[j] = now;
  if (whole || egf_inside(j, box, boxes)) return;
  egf_u64 at = (egf_u64)j << 32;
  atomicMin(slot, at | before);
  atomicMin(slot + 1, at | now);
  atomicAdd(slot + 2, 1ull);
}

// Blocks [0, n_tasks) compare one chunk of one allocation each. A task is eight numbers:
// {whole, live, shadow, begin, end, slot, first box, boxes}; whole = 1: the launch may write all
// of it, so only the shadow is refreshed. The blocks after them scan the guard zones, a thread a
// canary (zones[2i] is in front of allocation i, zones[2i + 1] behind it): a changed one is
// restored and counted in the zone's three counters at `zone_counts` (count, largest
// zone_len - j, largest j + 1).
extern "C" __global__ void egf_observe(const long long* tasks, int n_tasks,
                                       const long long* boxes, egf_u64* slots,
                                       long long slot_base, const egf_u64* zones, int n_zones,
                                       int zone_len, egf_u32 canary, egf_u32* zone_counts) {
  if ((long long)blockIdx.x < n_tasks) {
    const long long* t = tasks + 8 * (long long)blockIdx.x;
    bool whole = t[0] == 1;
    const egf_u32* live = (const egf_u32*)t[1];
    egf_u32* shadow = (egf_u32*)t[2];
    long long begin = t[3], end = t[4];
    egf_u64* slot = slots + 3 * (slot_base + t[5]);
    const long long* box = boxes + 4 * t[6];
    long long nbox = t[7];
    long long tail = begin;
    if (((((egf_u64)live) | ((egf_u64)shadow)) & 15) == 0 && (begin & 3) == 0) {
      tail = begin + ((end - begin) & ~3LL);
      const uint4* lv = (const uint4*)(live + begin);
      uint4* sv = (uint4*)(shadow + begin);
      for (long long v = threadIdx.x; 4 * v < tail - begin; v += blockDim.x) {
        uint4 a = lv[v], s = sv[v];
        if (a.x == s.x && a.y == s.y && a.z == s.z && a.w == s.w) continue;
        long long j = begin + 4 * v;
        if (a.x != s.x) egf_changed(j, a.x, s.x, shadow, whole, box, nbox, slot);
        if (a.y != s.y) egf_changed(j + 1, a.y, s.y, shadow, whole, box, nbox, slot);
        if (a.z != s.z) egf_changed(j + 2, a.z, s.z, shadow, whole, box, nbox, slot);
        if (a.w != s.w) egf_changed(j + 3, a.w, s.w, shadow, whole, box, nbox, slot);
      }
    }
    for (long long j = tail + threadIdx.x; j < end; j += blockDim.x) {
      egf_u32 a = live[j], s = shadow[j];
      if (a != s) egf_changed(j, a, s, shadow, whole, box, nbox, slot);
    }
    return;
  }
  long long t = ((long long)blockIdx.x - n_tasks) * blockDim.x + threadIdx.x;
  if (t >= (long long)n_zones * zone_len) return;
  long long z = t / zone_len;
  int j = (int)(t % zone_len);
  egf_u32* zone = (egf_u32*)zones[z];
  if (zone[j] == canary) return;
  zone[j] = canary;
  egf_u32* counts = zone_counts + 3 * z;
  atomicAdd(counts, 1u);
  atomicMax(counts + 1, (egf_u32)(zone_len - j));
  atomicMax(counts + 2, (egf_u32)(j + 1));
}
"""
THREADS = 256
CHUNK = 1 << 15  # elements one block compares (128 KiB of each side)
TASK = 8  # numbers a task
SLOT = 3  # numbers a slot
NONE = (1 << 64) - 1  # an empty slot's two minima


def covers(box: Box, size: int) -> bool:
    """Every element of an allocation of `size` lies in `box` (egf_inside's rule)."""
    offset, rows, width, ld = box
    if offset != 0:
        return False
    if rows <= 1 or ld <= 0:
        return width >= size
    return width >= ld and rows * ld >= size


def plan(
    reach: Sequence[int],
    memory: Mapping[int, tuple[int, int, int]],
    exempt: Mapping[int, tuple[Box, ...]],
) -> tuple[np.ndarray, int]:
    """The table of one launch's comparison (tasks, then boxes) and its task count. `memory`:
    per watched allocation (live address, shadow address, elements)."""
    tasks: list[int] = []
    boxes: list[int] = []
    for slot, ptr in enumerate(reach):
        live, shadow, size = memory[ptr]
        own = exempt.get(ptr, ())
        whole = any(covers(b, size) for b in own)
        first, count = len(boxes) // 4, 0 if whole else len(own)
        if not whole:
            boxes += [v for b in own for v in b]
        for begin in range(0, size, CHUNK):
            end = min(begin + CHUNK, size)
            tasks += [int(whole), live, shadow, begin, end, slot, first, count]
    table = np.array(tasks + boxes, np.int64) if tasks else np.zeros(1, np.int64)
    return table, len(tasks) // TASK


def blank_slots(n: int) -> np.ndarray:
    slots = np.zeros((n, SLOT), np.uint64)
    slots[:, :2] = NONE
    return slots


def zone_blocks(zones: int, zone_len: int) -> int:
    """Blocks the guard-zone scan takes: a thread a canary."""
    return -(-zones * zone_len // THREADS)


def decode(
    slots: np.ndarray,
    counters: np.ndarray,
    queued: Sequence[tuple[int, tuple[int, ...], int, tuple[int, ...]]],
    zone_len: int,
) -> list[tuple[list[StrayFound], list[BreachFound]]]:
    """What each queued launch was seen to do, from the used slots and zone counters (uint32).
    `queued`: per launch (first slot, the allocations it reached, its first zone counter, the
    allocations whose zones its scan covered, () when none). Findings keep slot order and zone
    order; a breach's distance is from the buffer's edge to the nearest changed canary."""
    found: list[tuple[list[StrayFound], list[BreachFound]]] = [([], []) for _ in queued]
    changed = np.flatnonzero(slots[:, 2]) if len(slots) else ()
    breached = np.flatnonzero(counters[0::3]) if len(counters) else ()  # breached zones only
    # which launch a slot or a counter is of, looked up only when something was found
    firsts = np.array([q[0] for q in queued], np.int64) if len(changed) else None
    starts = np.array([q[2] for q in queued], np.int64) if len(breached) else None
    for s in changed:
        assert firsts is not None  # made above whenever a slot changed
        q = int(np.searchsorted(firsts, s, side="right")) - 1
        first, reach, _, _ = queued[q]
        old_key, new_key, count = (int(v) for v in slots[s])
        found[q][0].append(
            (reach[s - first], old_key >> 32, count, old_key & 0xFFFFFFFF, new_key & 0xFFFFFFFF)
        )
    for hit in breached:
        assert starts is not None  # made above whenever a zone was breached
        q = int(np.searchsorted(starts, 3 * hit, side="right")) - 1
        while not queued[q][3]:  # a launch without a scan holds no counters: an earlier one
            q -= 1
        bases, zone = queued[q][3], int(hit) - queued[q][2] // 3
        count, from_end, past_start = (int(v) for v in counters[3 * hit : 3 * hit + 3])
        after = zone % 2 == 1
        # behind the buffer the nearest canary is the first one; in front, the last one
        distance = zone_len - from_end + 1 if after else zone_len - past_start + 1
        found[q][1].append((bases[zone // 2], "after" if after else "before", distance, count))
    return found
