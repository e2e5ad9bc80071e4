"""The GPU's stream-ordered observer (runtime/backends/stream_records.py, cuda_observe.py), run on
the CPU: its kernel compiles as C++ behind the CPU shim (threads one after another, atomics
plain), so its tasks, its records and their decoding are checked here against the CPU
backend's own comparison and canary scan, on the same buffers. The observer's CuPy side runs
in the GPU tests (test_integrity_effects.py, test_gpu.py)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from egf_audit.kernels import SHIM_HEADER, bundled_dir
from egf_audit.runtime.backends import guarded_memory as gm
from egf_audit.runtime.backends import stream_records as records
from egf_audit.runtime.backends.cpu_build import compiler
from egf_audit.runtime.guards import CANARY_BITS, GUARD_ELEMENTS

# what the CPU shim does not give (its unsigned atomicAdd overloads it does)
PRELUDE = r"""
struct uint4 { unsigned int x, y, z, w; };
inline unsigned long long atomicMin(unsigned long long* a, unsigned long long v) {
  unsigned long long old = *a; if (v < old) *a = v; return old; }
inline unsigned int atomicMax(unsigned int* a, unsigned int v) {
  unsigned int old = *a; if (v > old) *a = v; return old; }
"""
LAUNCHER = r"""
extern "C" void egf_run(unsigned int blocks, const long long* tasks, int n_tasks,
    const long long* boxes, unsigned long long* slots, long long slot_base,
    const unsigned long long* zones, int n_zones, int zone_len, unsigned int canary,
    unsigned int* zone_counts) {
  gridDim = {blocks, 1, 1};
  blockDim = {256, 1, 1};
  for (unsigned int b = 0; b < blocks; ++b) {
    blockIdx = {b, 0, 0};
    for (unsigned int t = 0; t < 256; ++t) {
      threadIdx = {t, 0, 0};
      egf_observe(tasks, n_tasks, boxes, slots, slot_base, zones, n_zones, zone_len, canary,
                  zone_counts);
    }
  }
}
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("observe")
    (folder / SHIM_HEADER).write_text((bundled_dir() / SHIM_HEADER).read_text())
    unit = folder / "observe.cpp"
    unit.write_text(f'#include "{SHIM_HEADER}"\n{PRELUDE}{records.SOURCE}{LAUNCHER}')
    lib = folder / "observe.so"
    subprocess.run(
        [*compiler(), "-O1", "-shared", "-fPIC", "-o", str(lib), str(unit)],
        check=True,
        capture_output=True,
    )
    run = ctypes.CDLL(str(lib)).egf_run
    run.restype = None
    u64, ll, i = ctypes.c_uint64, ctypes.c_longlong, ctypes.c_int
    run.argtypes = [ctypes.c_uint, u64, i, u64, u64, ll, u64, i, i, ctypes.c_uint, u64]
    return run


class Device:
    """Host memory laid out as the observer's device records."""

    def __init__(self, kernel, slots: int = 16):
        self.kernel = kernel
        self.slots = records.blank_slots(slots)
        self.counters = np.zeros(4096, np.uint32)
        self.queued: list = []
        self.used = self.counted = 0

    def observe(self, reach, memory, exempt, zones=None, bases=()):
        table, tasks = records.plan(reach, memory, exempt)
        zone_ptrs = np.array(zones if zones is not None else [0], np.uint64)
        n_zones = len(zones) if zones is not None else 0
        blocks = tasks + records.zone_blocks(n_zones, GUARD_ELEMENTS)
        boxes = table.ctypes.data + 8 * records.TASK * tasks
        self.kernel(
            blocks, table.ctypes.data, tasks, boxes, self.slots.ctypes.data, self.used,
            zone_ptrs.ctypes.data, n_zones, GUARD_ELEMENTS, CANARY_BITS,
            self.counters.ctypes.data + 4 * self.counted,
        )  # fmt: skip
        self.queued.append((self.used, tuple(reach), self.counted, tuple(bases)))
        self.used += len(reach)
        self.counted += 3 * n_zones

    def found(self):
        return records.decode(
            self.slots[: self.used], self.counters[: self.counted], self.queued, GUARD_ELEMENTS
        )


def _memory(pairs):
    return {
        live.ctypes.data: (live.ctypes.data, shadow.ctypes.data, live.size)
        for live, shadow in pairs
    }


def test_changes_outside_the_boxes_are_found_and_the_shadows_refreshed(kernel):
    shadow = np.zeros(20, np.uint32)
    live = shadow.copy()
    live[[2, 3, 7, 8, 12, 13]] = 1  # a [3, 2] box at offset 2 with row stride 5
    live[19] = 0x80000000
    live[17] = 5
    ptr = live.ctypes.data
    device = Device(kernel)
    device.observe([ptr], _memory([(live, shadow)]), {ptr: ((2, 3, 2, 5),)})
    assert device.found() == [([(ptr, 17, 2, 0, 5)], [])]
    assert shadow.tobytes() == live.tobytes()


def test_a_box_covering_the_buffer_only_refreshes_and_launches_keep_their_own_slots(kernel):
    a_shadow, b_shadow = np.zeros(9, np.uint32), np.zeros(70001, np.uint32)  # b: three chunks
    a, b = a_shadow.copy(), b_shadow.copy()
    memory = _memory([(a, a_shadow), (b, b_shadow)])
    device = Device(kernel)
    a[:] = 7
    b[[0, 40000, 70000]] = 3
    device.observe([a.ctypes.data, b.ctypes.data], memory, {a.ctypes.data: ((0, 3, 3, 3),)})
    b[5] = 1  # the next launch reaches b only, and may write none of it
    device.observe([b.ctypes.data], memory, {})
    assert device.found() == [
        ([(b.ctypes.data, 0, 3, 0, 3)], []),  # the first of three, in the later chunks too
        ([(b.ctypes.data, 5, 1, 0, 1)], []),
    ]
    assert a_shadow.tobytes() == a.tobytes() and b_shadow.tobytes() == b.tobytes()


def test_guard_zones_are_scanned_restored_and_reported_in_zone_order(kernel):
    wholes = [np.full(GUARD_ELEMENTS * 2 + 10, CANARY_BITS, np.uint32) for _ in range(2)]
    zones = []
    for w in wholes:
        zones += [w.ctypes.data, w.ctypes.data + (w.size - GUARD_ELEMENTS) * 4]
    wholes[1][-GUARD_ELEMENTS + 3] = 0  # 4 elements behind buffer 1
    wholes[1][-GUARD_ELEMENTS + 9] = 0
    wholes[0][GUARD_ELEMENTS - 1] = 1  # right in front of buffer 0
    device = Device(kernel)
    device.observe([], {}, {}, zones=zones, bases=(100, 200))
    device.observe([], {}, {})  # a launch without a scan (an SGEMM)
    device.observe([], {}, {}, zones=zones, bases=(100, 200))  # all intact again
    wholes[0][-1] = 5  # the last canary behind buffer 0: 64 elements after it
    device.observe([], {}, {}, zones=zones, bases=(100, 200))
    assert device.found() == [
        ([], [(100, "before", 1, 1), (200, "after", 4, 2)]),
        ([], []),
        ([], []),
        ([], [(100, "after", GUARD_ELEMENTS, 1)]),
    ]
    assert all((w[:GUARD_ELEMENTS] == CANARY_BITS).all() for w in wholes)
    assert all((w[-GUARD_ELEMENTS:] == CANARY_BITS).all() for w in wholes)


@pytest.mark.parametrize("seed", range(12))
def test_the_same_findings_as_the_cpu_backends_comparison(kernel, seed):
    """Random buffers, changes and boxes (strided, short last rows, flat, covering, empty):
    the kernel finds what guarded_memory's C scan finds, element for element."""
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 300)) for _ in range(4)]
    guarded = [gm.allocate(n, "f32") for n in sizes]
    try:
        watcher = gm.Watcher(guarded)
        shadows = [g.data.copy().view(np.uint32) for g in guarded]
        lives = [g.data.view(np.uint32) for g in guarded]
        memory = {
            live.ctypes.data: (live.ctypes.data, shadow.ctypes.data, live.size)
            for live, shadow in zip(lives, shadows, strict=True)
        }
        device = Device(kernel)
        for _launch in range(3):
            exempt, flat = {}, []
            for i, live in enumerate(lives):
                live[rng.random(live.size) < 0.2] = rng.integers(1, 2**32, dtype=np.uint32)
                for _ in range(int(rng.integers(0, 3))):
                    box = (
                        int(rng.integers(0, live.size)),
                        int(rng.integers(0, 5)),
                        int(rng.integers(0, 12)),
                        int(rng.integers(-1, 12)),
                    )
                    exempt[live.ctypes.data] = (*exempt.get(live.ctypes.data, ()), box)
                    flat += [i, *box]
            device.observe(list(memory), memory, exempt)
            expected = [(lives[i].ctypes.data, *rest) for i, *rest in watcher.changes(flat)]
            (got,) = device.found()[-1:]
            assert got == (expected, [])
            device = Device(kernel)  # fresh records: each launch read back on its own
    finally:
        for g in guarded:
            gm.release(g)


# ---- the observer itself (cuda_observe.py) and the recorder's settling, on CuPy-like host
# memory: every CuPy call it makes is served by numpy and the kernel above ----


class FakeArray:
    """A CuPy-like array over host memory: `.data.ptr` is its address."""

    def __init__(self, host: np.ndarray):
        self.host = host
        self.data = type("Pointer", (), {"ptr": host.ctypes.data})()
        self.size = host.size

    def copy(self):
        return FakeArray(self.host.copy())

    def __getitem__(self, key):
        return FakeArray(self.host[key])


class FakeStream:
    ptr = 0

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_cupy(kernel, types_of_arguments):
    import types

    def launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert (gy, gz, bx, by, bz, shared, extra) == (1, 1, records.THREADS, 1, 1, 0, 0)
        block = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        values = [
            ctypes.cast(block[i], ctypes.POINTER(t)).contents.value
            for i, t in enumerate(types_of_arguments())
        ]
        kernel(gx, *values)

    function = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=1))
    runtime = types.SimpleNamespace(
        memcpyDeviceToDevice=3,
        memcpyAsync=lambda dst, src, n, kind, stream: ctypes.memmove(dst, src, n),
        memsetAsync=lambda ptr, value, n, stream: ctypes.memset(ptr, value, n),
    )
    return types.SimpleNamespace(
        RawModule=lambda code, options: types.SimpleNamespace(get_function=lambda n: function),
        asarray=lambda a: FakeArray(np.array(a)),
        zeros=lambda shape, dtype: FakeArray(np.zeros(shape, dtype)),
        asnumpy=lambda a: a.host.copy(),
        cuda=types.SimpleNamespace(
            runtime=runtime, driver=types.SimpleNamespace(launchKernel=launch)
        ),
    )


@pytest.fixture
def observe_module(kernel, monkeypatch):
    """cuda_observe.py loaded afresh, under another name, with the fake as its `cupy`: the
    package's own module (and a real CuPy, where there is one) stays untouched."""
    import importlib.util
    import sys

    from egf_audit.runtime.backends import stream_records

    path = Path(stream_records.__file__).with_name("cuda_observe.py")
    spec = importlib.util.spec_from_file_location("cuda_observe_on_the_cpu", path)
    module = importlib.util.module_from_spec(spec)
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "cupy", fake_cupy(kernel, lambda: module._Call.TYPES))
        m.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
        spec.loader.exec_module(module)
    return module


class StreamOrderedCpu:
    """The CPU backend observed by the GPU's stream-ordered observer: its buffers stand for
    device memory, the canaries in front of each buffer for its zones (the CPU has none behind
    a buffer: a canary block stands in for that zone, and stays intact)."""

    def __init__(self, inner, module):
        self.inner, self.module = inner, module
        self.behind: dict[int, np.ndarray] = {}
        self.table = None  # kept until the allocations change, as the CUDA backend keeps it

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def zones(self):
        guarded = self.inner._guarded
        if self.table is not None and self.table.bases == tuple(guarded):
            return self.table
        ptrs = []
        for base, g in guarded.items():
            behind = self.behind.setdefault(base, np.full(GUARD_ELEMENTS, CANARY_BITS, np.uint32))
            ptrs += [g.canaries[-GUARD_ELEMENTS:].ctypes.data, behind.ctypes.data]
        table = FakeArray(np.array(ptrs or [0], np.uint64))
        self.table = self.module.ZoneTable(table, tuple(guarded))
        return self.table

    def watch(self, ptrs):
        buffers = {p: FakeArray(self.inner._guarded[p].data) for p in ptrs}
        return self.module.StreamObserver(
            buffers, FakeStream, self.zones, lambda name: name in self.inner._isolated
        )


VARIANTS = Path(__file__).parent / "kernel_variants"
EFFECT_CASES = {
    "sp14_scale_wire_col/bad_whole_row": "sp14_scale_wire_col",
    "effects/neighbour_tensor_write": "sn_scale",
    "effects/oob_write_before_buffer": "sp14_scale_wire_col",
    "effects/crash_null_write": "sp14_scale_wire_col",
    "sp14_scale_wire_col/ok_grid_stride_if_else": "sp14_scale_wire_col",
}


def _egf013(case, tmp_path, backend_of):
    """EGF013's (status, summary, evidence) of an audit (one mode, one step) with the kernel
    variant `case` from a --kernels folder, on the backend `backend_of(cpu)` makes."""
    import shutil

    from egf_audit import invariants
    from egf_audit.pipeline.config import preset_config
    from egf_audit.runtime.backends.cpu import CpuBackend
    from egf_audit.runtime.kernel_sources import load_kernel_set
    from egf_audit.scenarios.audit import Auditor

    folder = tmp_path / "kernels"
    folder.mkdir(exist_ok=True)
    shutil.copyfile(VARIANTS / f"{case}.cu", folder / f"{EFFECT_CASES[case]}_kernel.cu")
    cpu = CpuBackend(load_kernel_set(folder), launch_timeout_s=60)
    try:
        run = Auditor(preset_config("ci"), backend_of(cpu), steps=1).run(("sentinel",))
        (result,) = invariants.evaluate(run, codes=("EGF013",))
    finally:
        cpu.close()
    return result.verdict.status, result.verdict.summary, result.verdict.evidence


@pytest.mark.parametrize("case", sorted(EFFECT_CASES))
def test_the_stream_ordered_observer_gives_the_cpu_backends_verdict(case, observe_module, tmp_path):
    """A whole audit (one mode, one step) with a misbehaving kernel from a --kernels folder:
    observed in stream order, EGF013's verdict and evidence are the CPU observer's, word for
    word; the untrusted kernel is compared against every buffer."""
    on_the_cpu = _egf013(case, tmp_path, lambda cpu: cpu)
    in_stream_order = _egf013(case, tmp_path, lambda cpu: StreamOrderedCpu(cpu, observe_module))
    assert in_stream_order == on_the_cpu
    assert ("ok_" in case) == (on_the_cpu[0] == "pass"), on_the_cpu[1]


@pytest.mark.parametrize(
    "case", ["effects/neighbour_tensor_write", "effects/oob_write_before_buffer"]
)
def test_a_profiled_stream_ordered_observer_gives_the_same_verdict(case, observe_module, tmp_path):
    """Under `bench --profile` each launch's comparison and zone scan are queued as two timed
    launches of their own: a stray write and a guard breach are found all the same."""
    from egf_audit.runtime import costs

    on_the_cpu = _egf013(case, tmp_path, lambda cpu: cpu)
    with costs.collecting() as collected:
        profiled = _egf013(case, tmp_path, lambda cpu: StreamOrderedCpu(cpu, observe_module))
    assert profiled == on_the_cpu
    assert on_the_cpu[0] == "fail"
    assert collected.counts[costs.COMPARISONS] > 0 and collected.counts[costs.GUARDS] > 0


def test_a_plan_is_aimed_again_when_the_zone_table_changes(observe_module):
    """A launch's plan is made once and keeps its argument block; when the allocations change
    (a new zone table) its zone scan covers the new table's zones, and reports by its bases."""
    live = np.zeros(16, np.uint32)
    wholes = [np.full(2 * GUARD_ELEMENTS, CANARY_BITS, np.uint32) for _ in range(2)]

    def table(whole, base):
        ptrs = np.array([whole.ctypes.data, whole.ctypes.data + 4 * GUARD_ELEMENTS], np.uint64)
        return observe_module.ZoneTable(FakeArray(ptrs), (base,))

    tables = {"now": table(wholes[0], 100)}
    observer = observe_module.StreamObserver(
        {live.ctypes.data: FakeArray(live)}, FakeStream, lambda: tables["now"], lambda n: False
    )
    site = object()  # one launch site: the same key every time
    reach, exempt = (live.ctypes.data,), {live.ctypes.data: ((0, 1, 8, 8),)}
    wholes[0][3] = 0  # in front of allocation 100
    live[[2, 9]] = 1  # 2 is the launch's to write, 9 is not
    observer.queue(site, "kernel", "k", reach, exempt)
    tables["now"] = table(wholes[1], 200)  # the allocations changed
    wholes[1][GUARD_ELEMENTS] = 0  # right behind allocation 200
    wholes[0][5] = 0  # no longer a zone of the table: not scanned
    observer.queue(site, "kernel", "k", reach, exempt)
    observer.queue(site, "kernel", "k", reach, exempt)  # everything intact again
    assert observer.collect() == [
        ([(live.ctypes.data, 9, 1, 0, 1)], [(100, "before", GUARD_ELEMENTS - 3, 1)]),
        ([], [(200, "after", 1, 1)]),
        ([], []),
    ]
    assert len(observer._plans) == 1
