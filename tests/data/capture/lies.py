"""Lying captures: each one made from the recorded clean capture (`clean/`) as the recorder would
have written it had the trainer carried one real wiring bug.

The clean capture keeps every snapshot value (no --values-max): the recorder's copy of each
region around `sp14_scale_wire_col`, `accumulate_d_h_s2_from_concat` and `polyak_ema`, and of
the target at each step's start. A lie does not patch those regions. It edits what the trainer
launched (a launch's arguments, a launch or memory call added, moved or removed, a kernel that
computes the wrong thing), and `rerecord` then replays the recorder over the process: it keeps
the device memory the capture shows, launch by launch, runs the three snapshotted kernels as
their CUDA source computes (`kernels/*.cu`, fp32, one fma for Polyak), and writes every
snapshot event (`ptr`, `elements`, `rows`, `ld`, `skip_col`, the values kept, and the hash as
`write_region` computes it: FNV-1a 64 from 1469598103934665603 over each element's four
little-endian bytes, column `skip_col` of a body left out) where and when
`egf_capture_recorder.c` writes it, including the target at the first launch after each Polyak.
`seq` is renumbered so it stays strictly increasing, the snapshots file is rebuilt from the
values kept, and the manifest's per-process counts are the events written. A lie is written as
the recorder and `egf-audit capture` write a capture: plain `events-PID.jsonl`,
`snapshots-PID.bin` and `layout.json` (the committed fixtures are gzipped by shrink.py).

What the replay knows of device memory, and where each part comes from:

- each allocation (`alloc`) and what memsets and device-to-device copies put in it; the
  stand-in trainer's allocator (egf_audit/runtime/backends/cuda_guard.py, `guarded_zeros`)
  zero-fills each allocation and then launches two `cupy_fill`s of 0x7FA5A5A5: the recorder
  cannot decode their pointers (CuPy passes arrays as structs), the allocator puts them in the
  64 elements on each side of the buffer (its guard zones), and the replay does too;
- what the clean capture's snapshots show the trainer's own launches wrote: each dX GEMM's
  result (the accumulate's `d_concat`, the direction branch's with the scale's `before` wire
  put back), the value-FC dX GEMM's product (the first accumulate's `d_h_s2`, which it wrote
  with beta = 1 onto the site's zeroing), the online net at each Polyak (after Adam), the target
  as the initial upload left it (the first Polyak's `before`), and the gate `alpha_grad_compute`
  wrote (the next scale's `alpha`);
- a GEMM, host upload or kernel that writes a buffer in ways the capture does not show makes
  that buffer unknown until something the capture shows writes it again.

A lie that makes the recorder read memory the capture does not show says so in its docstring,
and supplies a stand-in (`stand_in`: fixed-seed values of the buffer's kind) that the replay then
carries like any other value: every region's hash is its values' hash, unless the lie is about
a hash. What a lie changes downstream of the regions it determines (the trunk's backward, Adam,
the next step's forward) is not in the capture: those launches' results stay as recorded (the
online net at the next Polyak, the next step's dX). Two assumptions about the H200 are the
replay's: a NaN that fp32 arithmetic produces is the canonical 0x7FFFFFFF, and cuBLAS's beta = 1
epilogue adds C to its fp32 product once.

`LIES` maps a slug to (function, expected, needs_layout): the function takes the clean capture
(`base()`: with its exit event, snapshots stripped and the truths above attached) and returns it
edited; `expected` is the set of invariant codes that must FAIL on it, `REFUSED` (exit 2: the
capture is malformed), `INCOMPLETE` (exit 1, naming what is incomplete) or `PASSES` (a control:
it must pass); `needs_layout` marks lies only the trainer's layout file can show.
`WITH_LAYOUT_ALSO` adds codes that must fail only with the layout file (a region that leaves its
buffer, where inference names the buffer from the faulty launch itself);
`NOT_PASS_WITHOUT_LAYOUT` names codes that inference may leave undecided but never pass.
Usage: `python lies.py OUT_DIR [--without-layout]` writes every lie to OUT_DIR/SLUG.
"""

from __future__ import annotations

import bisect
import copy
import functools
import gzip
import json
import re
import struct
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CLEAN = Path(__file__).resolve().parent / "clean"
FNV_OFFSET, FNV_PRIME, MASK64 = 1469598103934665603, 1099511628211, (1 << 64) - 1
VALUES_MAX = 1 << 22  # the recorder's default --values-max
CANARY, GUARD = 0x7FA5A5A5, 64  # the stand-in allocator's guard zones: bits, elements a side
CANONICAL_NAN = 0x7FFFFFFF  # the NaN the GPU's fp32 arithmetic returns
STDIO_BUFFER = 1 << 16  # the recorder's events buffer (setvbuf): written out when full

REFUSED, INCOMPLETE = "refused", "incomplete"
PASSES: frozenset[str] = frozenset()

CONCAT, SCALE = "sp14_dir_concat_qaux", "sp14_scale_wire_col"
ACCUMULATE, POLYAK = "accumulate_d_h_s2_from_concat", "polyak_ema"
SNAPSHOTTED = (SCALE, ACCUMULATE, POLYAK)
DIR_DX, SCRATCH = "sp14_d_dir_qaux_concat", "sp14_dir_qaux_concat_scratch"
GATE_INDEX = 393
SIGKILL_EXIT = -9  # the command's exit code as `egf-audit capture` records a SIGKILL

KERNEL_SOURCES = Path(__file__).resolve().parents[3] / "kernels"


@functools.cache
def _written_params() -> dict[str, tuple[int, ...]]:
    """The trainer's kernels by name: the positions of their pointer parameters that are not
    const (kernels/*.cu), the only ones a launch writes through."""
    found = {}
    for path in sorted(KERNEL_SOURCES.glob("*.cu")):
        source = path.read_text(encoding="utf-8")
        for m in re.finditer(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', source):
            params = [p.strip() for p in m.group(2).split(",")]
            found[m.group(1)] = tuple(
                i for i, p in enumerate(params) if "*" in p and not p.startswith("const")
            )
    return found


# The kernels' parameters (SPEC section 3, kernels/*.cu) and how the recorder stores each one's
# bytes: an unsigned integer of the parameter's size.
PARAMS = {
    CONCAT: ("concat", "h_s2", "aux_softmax", "rows", "sh2", "auxk", "up_idx", "down_idx"),
    SCALE: ("dx_concat", "isv", "rows", "ld", "wire_col", "isv_index"),
    ACCUMULATE: ("d_h_s2", "d_concat", "rows", "sh2", "ld_concat"),
    POLYAK: ("target", "online", "tau", "n"),
    "alpha_grad_compute": ("isv", "prob_sum", "rows", "auxk", "isv_index", "ema"),
}
POINTERS = {
    "concat",
    "h_s2",
    "aux_softmax",
    "dx_concat",
    "isv",
    "prob_sum",
    "d_h_s2",
    "d_concat",
    "target",
    "online",
}


# ---- the capture as read ----
@dataclass
class Process:
    """One process's events in file order. While read, a snapshot event carries `_launch` (the
    kernel event it names) and `_values` (the values kept); an event a lie inserts or moves
    carries `_new`; a line that is not JSON is `{"_raw": text}`. What the replay needs beyond
    the events: `_loads` (memory the capture does not show, in place just before the event) and
    `_sets` (what the event wrote, where the capture does not show it: replaces its effect).
    `dies`: how the process died before its exit event (`_kept_lines`), None when it ended."""

    pid: int
    events: list[dict[str, Any]]
    dies: tuple[str, dict[str, Any]] | None = None


@dataclass
class Capture:
    processes: list[Process]
    layout: dict[str, Any]
    manifest: dict[str, Any]
    values_max: int = VALUES_MAX  # the recorder's --values-max

    @property
    def main(self) -> Process:
        return self.processes[0]

    def base(self, buffer: str) -> int:
        return self.layout["buffers"][buffer]["address"]

    def dim(self, name: str) -> Any:
        return self.layout["dims"][name]

    def offset(self, name: str) -> int:
        """A parameter tensor's element offset in a params-shaped buffer (param_offsets)."""
        return self.layout["param_offsets"][name][0]


def _bytes(path: Path) -> bytes:
    """A capture file's bytes: plain as the recorder writes it, or gzipped as a committed
    fixture keeps it (PATH.gz)."""
    if path.exists():
        return path.read_bytes()
    return gzip.decompress(path.with_name(path.name + ".gz").read_bytes())


def read(folder: Path = CLEAN) -> Capture:
    """A capture folder as the recorder wrote it (snapshot events with their values)."""
    folder = Path(folder)
    processes = []
    pids = {int(m.group(1)) for p in folder.iterdir() if (m := _EVENTS.fullmatch(p.name))}
    for pid in sorted(pids):
        blob = _bytes(folder / f"snapshots-{pid}.bin")
        text = _bytes(folder / f"events-{pid}.jsonl").decode("utf-8")
        events = [json.loads(line) for line in text.splitlines() if line.strip()]
        by_seq = {e["seq"]: e for e in events}
        for e in events:
            if e["ev"] == "snapshot":
                e["_launch"] = by_seq[e["launch"]]
                e["_values"] = np.frombuffer(blob, "<f4", e["count"], e["offset"]).copy()
        processes.append(Process(pid, events))
    layout = json.loads(_bytes(folder / "layout.json"))
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return Capture(processes, layout, manifest)


_EVENTS = re.compile(r"events-(\d+)\.jsonl(?:\.gz)?")


@functools.cache
def _clean() -> Capture:
    capture = read()
    for proc in capture.processes:
        _attach_truths(capture, proc)
        proc.events = [e for e in proc.events if e["ev"] != "snapshot"]
    return capture


def base() -> Capture:
    """The clean capture as recorded (with its exit event), its snapshot events stripped and
    what they show the trainer wrote attached to the launches that wrote it (module doc)."""
    clean = _clean()
    processes = [Process(p.pid, [_copy_event(e) for e in p.events]) for p in clean.processes]
    return Capture(processes, copy.deepcopy(clean.layout), copy.deepcopy(clean.manifest))


def _copy_event(e: dict[str, Any]) -> dict[str, Any]:
    """An event a lie may edit: its own dict, parameter pairs and lists of loads and sets (the
    values in them are never written in place)."""
    new = dict(e)
    if e.get("params") is not None:
        new["params"] = [list(pair) for pair in e["params"]]
    for key in ("_loads", "_sets"):
        if key in e:
            new[key] = list(e[key])
    return new


# ---- what the clean capture's snapshots show the trainer wrote ----
def _attach_truths(capture: Capture, proc: Process) -> None:
    """`_sets` and `_loads` on the events whose effect the snapshots show (module doc)."""
    regions: dict[int, dict[tuple[str, str], dict[str, Any]]] = {}
    for e in proc.events:
        if e["ev"] == "snapshot" and e["when"] != "step_start":
            regions.setdefault(id(e["_launch"]), {})[(e["when"], e["region"])] = e
    calls = {id(c[""]): c for c in gemm_calls(proc)}
    writer: dict[int, dict[str, Any]] = {}  # pointer -> the latest GEMM whose C starts there
    gated: dict[int, tuple[np.ndarray, int, int]] = {}  # dx -> a scale's wire before, rows, ld
    producers: list[dict[str, Any]] = []  # alpha_grad_compute launches not yet read
    first_gemm, first_polyak = None, None
    events = proc.events
    for i, e in enumerate(events):
        if first_gemm is None and e["ev"] == "memset" and e["value"] == 0:
            fills = [x for x in events[i + 1 : i + 3] if is_kernel(x, "cupy_fill")]
            if len(fills) == 2 and all(f["params"][0] == [4, CANARY] for f in fills):
                canary = np.full(GUARD, CANARY, np.uint32).view(np.float32)
                fills[0]["_sets"] = [("set", e["dst"], canary)]
                fills[1]["_sets"] = [("set", e["dst"] + e["bytes"] - 4 * GUARD, canary)]
        elif id(e) in calls:
            first_gemm = first_gemm or e
            writer[gemm_arg(calls[id(e)], "C")] = e
        elif is_kernel(e, "alpha_grad_compute"):
            producers.append(e)
        elif is_kernel(e, SCALE):
            alpha = regions[id(e)][("before", "alpha")]
            for x in producers:
                if arg(x, "isv") + 4 * arg(x, "isv_index") == alpha["ptr"]:
                    x["_sets"] = [("set", alpha["ptr"], alpha["_values"].copy())]
            producers = []
            assert arg(e, "wire_col") == arg(e, "ld") - 1, e
            wire = regions[id(e)][("before", "wire")]["_values"]
            gated[arg(e, "dx_concat")] = (wire, arg(e, "rows"), arg(e, "ld"))
        elif is_kernel(e, ACCUMULATE):
            got = regions[id(e)]
            source = arg(e, "d_concat")
            content = got[("before", "d_concat")]["_values"].copy()
            if source in gated:  # the dX GEMM wrote the wire before the scale gated it
                wire, rows, ld = gated.pop(source)
                content[np.arange(rows) * ld + ld - 1] = wire
            gemm = writer.pop(source)
            c = calls[id(gemm)]
            assert gemm_arg(c, "m") * gemm_arg(c, "n") == content.size, e
            gemm["_sets"] = [("set", source, content)]
            fc = writer.pop(arg(e, "d_h_s2"), None)
            if fc is not None:  # the value-FC dX GEMM (beta = 1) onto the site's zeroing
                product = got[("before", "d_h_s2")]["_values"].copy()
                assert not (product.view(np.uint32) == 0x80000000).any(), e
                fc["_sets"] = [("add", arg(e, "d_h_s2"), product)]
        elif is_kernel(e, POLYAK):
            got = regions[id(e)]
            e["_loads"] = [("set", arg(e, "online"), got[("before", "online")]["_values"].copy())]
            first_polyak = first_polyak or got
    if first_gemm is not None and first_polyak is not None:
        target = first_polyak[("before", "target")]
        first_gemm["_loads"] = [("set", target["ptr"], target["_values"].copy())]


# ---- device memory, as far as the capture shows it ----
class Unknown(Exception):
    """The recorder would read memory the capture does not show (a lie needs a stand-in)."""


class Memory:
    """The process's allocations byte by byte, each byte known or not."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._blocks: list[tuple[int, np.ndarray, np.ndarray]] = []

    def allocate(self, start: int, nbytes: int) -> None:
        i = bisect.bisect(self._starts, start)
        self._starts.insert(i, start)
        self._blocks.insert(i, (start, np.zeros(nbytes, np.uint8), np.zeros(nbytes, bool)))

    def _overlaps(self, ptr: int, nbytes: int):
        i = max(bisect.bisect(self._starts, ptr) - 1, 0)
        for start, data, known in self._blocks[i:]:
            if start >= ptr + nbytes:
                break
            lo, hi = max(ptr, start) - start, min(ptr + nbytes, start + data.size) - start
            if lo < hi:
                yield data, known, lo, hi, max(ptr, start) - ptr

    def read_bytes(self, ptr: int, nbytes: int) -> np.ndarray:
        parts = list(self._overlaps(ptr, nbytes))
        if len(parts) != 1 or parts[0][3] - parts[0][2] != nbytes:
            raise Unknown(f"{nbytes} bytes at {ptr:#x} are not inside one allocation")
        data, known, lo, hi, _ = parts[0]
        if not known[lo:hi].all():
            raise Unknown(f"{nbytes} bytes at {ptr:#x} hold what the capture does not show")
        return data[lo:hi].copy()

    def read(self, ptr: int, count: int) -> np.ndarray:
        return self.read_bytes(ptr, 4 * count).view("<f4")

    def store(self, ptr: int, raw: np.ndarray) -> None:
        """Bytes written at ptr (the part inside allocations: a write elsewhere is not kept)."""
        for data, known, lo, hi, at in self._overlaps(ptr, raw.size):
            data[lo:hi] = raw[at : at + hi - lo]
            known[lo:hi] = True

    def write(self, ptr: int, values: np.ndarray) -> None:
        self.store(ptr, np.ascontiguousarray(values, "<f4").ravel().view(np.uint8))

    def forget(self, ptr: int, nbytes: int) -> None:
        for _, known, lo, hi, _ in self._overlaps(ptr, nbytes):
            known[lo:hi] = False


# ---- fp32 as the GPU computes it ----
def _gpu(x: np.ndarray) -> np.ndarray:
    """An fp32 result with every NaN the GPU's canonical one."""
    x = np.array(x, np.float32)
    nan = np.isnan(x)
    x.view(np.uint32)[nan] = CANONICAL_NAN
    return x


def _fma32(a: np.float32, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fl(a * b + c) rounded once, as the GPU's fma: the product is exact in fp64; the sum is
    fp64-rounded, then rounded to fp32, and put right where that rounded twice (the fp64 sum
    sits exactly halfway between two fp32 values and the dropped remainder decides)."""
    p = np.float64(a) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c64
        back = s - p
        rest = (p - (s - back)) + (c64 - back)
        r = s.astype(np.float32)
    halfway = (s.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)
    for i in np.flatnonzero(halfway & (rest != 0) & np.isfinite(s)):
        toward = np.float32(np.inf if rest[i] > 0 else -np.inf)
        if (r[i] > s[i]) != (rest[i] > 0):
            r[i] = np.nextafter(r[i], toward)
    return _gpu(r)


# ---- the recorder, replayed ----
def rerecord(capture: Capture) -> Capture:
    """Every snapshot event of every process, as the recorder writes it for these launches."""
    for proc in capture.processes:
        _Replay(capture, proc).run()
    return capture


class _Replay:
    def __init__(self, capture: Capture, proc: Process) -> None:
        self.capture, self.proc = capture, proc
        self.mem = Memory()
        self.calls = {id(c[""]): c for c in gemm_calls(proc)}
        self.wanted = set(capture.manifest["snapshot_kernels"])
        buffers = capture.layout["buffers"].values()
        self.buffers = sorted((b["address"], b["bytes"]) for b in buffers)  # the trainer's own
        self.pending: tuple[int, int] | None = None  # the last Polyak's target region
        self.out: list[dict[str, Any]] = []

    def run(self) -> None:
        for e in self.proc.events:
            assert e.get("ev") != "snapshot", "rerecord writes every snapshot itself"
            self.out.append(e)
            if "_raw" in e:
                continue
            try:
                self.event(e)
            except Unknown as exc:
                raise Unknown(f"{exc} (replaying {e['ev']} seq {e['seq']})") from None
        self.proc.events = self.out

    def event(self, e: dict[str, Any]) -> None:
        for mode, ptr, values in e.get("_loads", ()):
            self.apply(mode, ptr, values)
        ev = e["ev"]
        if ev == "alloc":
            self.mem.allocate(e["dst"], e["bytes"])
        elif "_sets" in e:
            self.step_start(e)
            for mode, ptr, values in e["_sets"]:
                self.apply(mode, ptr, values)
        elif ev == "memset":
            wide = "D32" in e["api"]
            pattern = struct.pack("<I", e["value"] & 0xFFFFFFFF) if wide else bytes([e["value"]])
            raw = np.frombuffer(pattern * (e["bytes"] // len(pattern)), np.uint8)
            self.mem.store(e["dst"], raw)
        elif ev == "copy":
            self.copy(e)
        elif ev == "cublas" and id(e) in self.calls:
            c = self.calls[id(e)]
            m, n, ldc = gemm_arg(c, "m"), gemm_arg(c, "n"), gemm_arg(c, "ldc")
            if m > 0 and n > 0:
                self.mem.forget(gemm_arg(c, "C"), 4 * ((n - 1) * ldc + m))
        elif ev == "kernel":
            self.kernel(e)

    def apply(self, mode: str, ptr: int, values: np.ndarray) -> None:
        if mode == "add":
            values = _gpu(self.mem.read(ptr, values.size) + values)
        self.mem.write(ptr, values)

    def copy(self, e: dict[str, Any]) -> None:
        if "HtoD" in e["api"]:
            self.mem.forget(e["dst"], e["bytes"])
        elif "DtoH" not in e["api"]:
            try:
                self.mem.store(e["dst"], self.mem.read_bytes(e["src"], e["bytes"]))
            except Unknown:
                self.mem.forget(e["dst"], e["bytes"])

    def step_start(self, k: dict[str, Any]) -> None:
        """The target again at the first driver launch after a Polyak (its kernel line, then
        this region, named by its seq, before the launch runs)."""
        if k["ev"] != "kernel" or k["params"] is None or self.pending is None:
            return
        if k.get("_no_snapshots"):  # a stream being captured: the recorder waits
            return
        ptr, n = self.pending
        self.pending = None
        self.snap(k, "step_start", "target", ptr, n)

    def kernel(self, k: dict[str, Any]) -> None:
        self.step_start(k)
        name = k["name"]
        if name not in SNAPSHOTTED or k["params"] is None:
            # a pointer into a buffer it may write (any, for a kernel not in kernels/*.cu)
            written = _written_params().get(name)
            for at, (size, value) in enumerate(k["params"] or ()):
                i = bisect.bisect(self.buffers, (value, MASK64)) - 1
                inside = size == 8 and i >= 0 and value < sum(self.buffers[i])
                if inside and (written is None or at in written):
                    self.mem.forget(*self.buffers[i])
            return
        snap = name in self.wanted and not k.get("_no_snapshots")
        if snap:
            self.snapshots(k, "before")
        {SCALE: self.scale, ACCUMULATE: self.accumulate, POLYAK: self.polyak}[name](k)
        if snap:
            self.snapshots(k, "after")

    # -- abi_snapshots --
    def snapshots(self, k: dict[str, Any], when: str) -> None:
        name = k["name"]
        if name == SCALE:
            rows, ld = arg(k, "rows"), arg(k, "ld")
            self.snap_concat(k, when, arg(k, "dx_concat"), rows, ld)
            if when == "before":
                self.snap(k, when, "alpha", _alpha_ptr(k), 1)
        elif name == ACCUMULATE:
            rows, sh2, ld = arg(k, "rows"), arg(k, "sh2"), arg(k, "ld_concat")
            self.snap(k, when, "d_h_s2", arg(k, "d_h_s2"), rows * sh2)
            if when == "before":
                self.snap(k, when, "d_concat", arg(k, "d_concat"), rows * ld)
        else:
            n = arg(k, "n")
            self.snap(k, when, "target", arg(k, "target"), n)
            if when == "before":
                self.snap(k, when, "online", arg(k, "online"), n)
            else:
                self.pending = (arg(k, "target"), n)

    def snap(self, k: dict[str, Any], when: str, region: str, ptr: int, count: int) -> None:
        if count > 0:
            self.emit(k, when, region, ptr, self.mem.read(ptr, count), 1, count, -1)

    def snap_concat(self, k: dict[str, Any], when: str, ptr: int, rows: int, ld: int) -> None:
        if rows * ld <= 0:
            return
        host = self.mem.read(ptr, rows * ld)
        self.emit(k, when, "wire", ptr, host[np.arange(rows) * ld + ld - 1], rows, 1, -1)
        self.emit(k, when, "body", ptr, host, rows, ld, ld - 1)

    def emit(self, k, when, region, ptr, values, rows, ld, skip) -> None:
        """One region as write_region writes it: the hash of every element (column skip_col
        left out), the values of the first --values-max (none of a body)."""
        hashed = values[np.arange(values.size) % ld != skip] if skip >= 0 and ld > 0 else values
        keep = 0 if skip >= 0 else min(values.size, self.capture.values_max)
        self.out.append(
            {
                "ev": "snapshot",
                "seq": 0,
                "tid": k["tid"],
                "launch": 0,
                "when": when,
                "region": region,
                "ptr": ptr & MASK64,
                "elements": int(values.size),
                "rows": rows,
                "ld": ld,
                "skip_col": skip,
                "hash": fnv1a(hashed),
                "offset": 0,
                "count": keep,
                "_launch": k,
                "_values": values[:keep].copy(),
                "_new": True,
            }
        )

    # -- the kernels, as kernels/*.cu compute them --
    def scale(self, k: dict[str, Any]) -> None:
        """*g = (a == 0.0f) ? 0.0f : (*g) * a on column wire_col of each of rows rows; a lie's
        `_bug` may drop the alpha == 0 branch or leave rows untouched."""
        rows, ld, col = arg(k, "rows"), arg(k, "ld"), arg(k, "wire_col")
        if rows <= 0:
            return
        a = self.mem.read(_alpha_ptr(k), 1)[0]
        start = arg(k, "dx_concat") + 4 * col
        span = self.mem.read(start, (rows - 1) * ld + 1)
        g = span[:: max(ld, 1)][:rows]
        bug = k.get("_bug", {})
        if a == 0 and bug.get("nan_branch", True):
            new = np.zeros(rows, np.float32)
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                new = _gpu(g * a)
        for row in bug.get("untouched_rows", ()):
            new[row] = g[row]
        span[:: max(ld, 1)][:rows] = new
        self.mem.write(start, span)

    def accumulate(self, k: dict[str, Any]) -> None:
        """d_h_s2[i] += d_concat[(i / sh2) * ld_concat + i % sh2] for i < rows * sh2."""
        rows, sh2, ld = arg(k, "rows"), arg(k, "sh2"), arg(k, "ld_concat")
        if rows * sh2 <= 0:
            return
        i = np.arange(rows * sh2)
        source = (i // sh2) * ld + i % sh2
        d_concat = self.mem.read(arg(k, "d_concat"), int(source.max()) + 1)
        old = self.mem.read(arg(k, "d_h_s2"), rows * sh2)
        with np.errstate(invalid="ignore", over="ignore"):
            self.mem.write(arg(k, "d_h_s2"), _gpu(old + d_concat[source]))

    def polyak(self, k: dict[str, Any]) -> None:
        """target[i] = tau * online[i] + (1.0f - tau) * target[i]: one fma (tau, online, the
        rounded (1 - tau) * target), as the H200's clean capture shows bit for bit."""
        n, tau = arg(k, "n"), np.float32(arg(k, "tau"))
        if n <= 0:
            return
        target = self.mem.read(arg(k, "target"), n)
        online = self.mem.read(arg(k, "online"), n)
        with np.errstate(invalid="ignore", over="ignore"):
            rest = _gpu((np.float32(1) - tau) * target)
        self.mem.write(arg(k, "target"), _fma32(tau, online, rest))


def _alpha_ptr(k: dict[str, Any]) -> int:
    return (arg(k, "isv") + 4 * arg(k, "isv_index")) & MASK64


# ---- writing ----
def _renumber(events: list[dict[str, Any]]) -> None:
    """Strictly increasing seqs: recorded events keep theirs, shifted past inserted ones."""
    prev, shift = -1, 0
    for e in events:
        if "_raw" in e:
            continue
        if e.pop("_new", False):
            seq = prev + 1
        else:
            seq = max(e["seq"] + shift, prev + 1)
            shift = seq - e["seq"]
        e["seq"] = prev = seq


def _flushed(events: list[dict[str, Any]], i: int) -> bool:
    """The recorder flushes its events file after event i: after init, a note, the exit
    event, and each group of before or after regions of a launch (flush_all)."""
    e = events[i]
    if e.get("ev") in ("init", "note", "exit"):
        return True
    if e.get("ev") != "snapshot" or e["when"] == "step_start":
        return False
    after = events[i + 1] if i + 1 < len(events) else {}
    same = after.get("ev") == "snapshot" and after["when"] == e["when"]
    return not (same and after["_launch"] is e["_launch"])


def _straddles(events: list[dict[str, Any]], lines: list[str], start: int) -> int:
    """The first line from `start` on in which the recorder's 64 KiB events buffer filled up, so
    that stdio wrote it out to a point inside that line; only where no snapshot since the last
    flush is waiting (its values would be cut short in the snapshots file too)."""
    offset = flushed = 0
    pending = False
    for i, line in enumerate(lines):
        end = offset + len(line.encode()) + 1
        boundary = flushed + (end - 2 - flushed) // STDIO_BUFFER * STDIO_BUFFER
        if i >= start and not pending and offset < boundary < end - 1:
            return i
        if "_raw" not in events[i] and _flushed(events, i):
            flushed, pending = end, False
        elif events[i].get("ev") == "snapshot":
            pending = True
        offset = end
    raise ValueError(f"the recorder's buffer never fills up after event {start}")


def _kept_lines(proc: Process, lines: list[str]) -> tuple[list[str], str]:
    """The whole lines a process that died left in its file, and the start of the one it was
    writing: what the recorder flushed, then the full 64 KiB buffers stdio wrote out since.
    `dies`: ("after", event): right after that event (and the snapshots of that launch); or
    ("filling", event): while writing the first line after the event that filled the buffer
    (`_straddles`)."""
    if proc.dies is None:
        return lines, ""
    how, anchor = proc.dies
    events = proc.events
    kill = next(i for i, e in enumerate(events) if e is anchor)
    if how == "after":
        while kill + 1 < len(events) and events[kill + 1].get("_launch") is anchor:
            kill += 1  # a launch's snapshots are written before the launch returns
    else:
        kill = _straddles(events, lines, kill)
    flush = max(i for i in range(kill + 1) if _flushed(events, i))
    pending = "".join(line + "\n" for line in lines[flush + 1 : kill + 1]).encode()
    written = pending[: len(pending) // STDIO_BUFFER * STDIO_BUFFER]
    whole = written.split(b"\n")
    return lines[: flush + 1] + [w.decode() for w in whole[:-1]], whole[-1].decode()


_SGEMM_ARGS = {"transa", "transb", "m", "n", "k", "lda", "ldb", "ldc", "A", "B", "C"}


def _gemm_count(events: list[dict[str, Any]]) -> int:
    """The GEMM calls `egf-audit capture` counts in the manifest: each logged GEMM call, but a
    cublasSgemm_v2 whose log a killed process never finished (its arguments or the bits of
    alpha and beta missing), which the reader drops."""
    calls: dict[int, list[Any]] = {}  # tid -> [function, argument names, recorder keys]
    whole: list[list[Any]] = []
    for e in events:
        tid = e.get("tid")
        if e.get("ev") != "cublas":
            whole += [calls.pop(tid)] if tid in calls else []
            continue
        call = re.search(r"function\s+cublasStatus_t\s+(cublas\w+)\s*\(", e["msg"])
        if "I! " in e["msg"] or tid not in calls:
            whole += [calls.pop(tid)] if tid in calls else []
            calls[tid] = [call.group(1) if call else None, set(), {}]
        if arg := re.match(r"^\s*i!\s+(\w+):", e["msg"]):
            calls[tid][1].add(arg.group(1))
        calls[tid][2].update(
            {k: e[k] for k in ("alpha_bits", "beta_bits", "pointer_mode") if k in e}
        )
    whole += calls.values()
    count = 0
    for function, names, bits in whole:
        if function is None or "gemm" not in function.lower():
            continue
        scalars = bits.get("pointer_mode") == 1 or {"alpha_bits", "beta_bits"} <= set(bits)
        if function == "cublasSgemm_v2" and not (names >= _SGEMM_ARGS and scalars):
            continue
        count += 1
    return count


_LINE = json.JSONEncoder(separators=(",", ":")).encode  # the recorder's compact lines


def write(capture: Capture, dst: Path, with_layout: bool) -> Path:
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    counts = {}
    for proc in capture.processes:
        _renumber(proc.events)
        present = {id(e) for e in proc.events}
        lines, blob = [], bytearray()
        for e in proc.events:
            if "_raw" in e:
                lines.append(e["_raw"])
                continue
            if e["ev"] == "snapshot":
                assert id(e["_launch"]) in present, f"a snapshot outlived its launch: {e}"
                values = np.ascontiguousarray(e["_values"], dtype="<f4")
                e["launch"], e["offset"], e["count"] = e["_launch"]["seq"], len(blob), values.size
                blob += values.tobytes()
            lines.append(_LINE({k: v for k, v in e.items() if not k.startswith("_")}))
        kept, torn = _kept_lines(proc, lines)
        written = [e for e in proc.events[: len(kept)] if "_raw" not in e]
        if proc.dies is not None:  # the snapshots flushed with the lines kept
            ends = [s["offset"] + 4 * s["count"] for s in written if s["ev"] == "snapshot"]
            blob = blob[: max(ends, default=0)]
        text = "".join(line + "\n" for line in kept) + torn
        (dst / f"events-{proc.pid}.jsonl").write_text(text, encoding="utf-8")
        (dst / f"snapshots-{proc.pid}.bin").write_bytes(bytes(blob))
        kinds = [e["ev"] for e in written]
        counts[proc.pid] = {
            "kernels": kinds.count("kernel"),
            "gemms": _gemm_count(written),
            "memsets": kinds.count("memset"),
            "copies": kinds.count("copy"),
            "snapshots": kinds.count("snapshot"),
        }
    if with_layout:
        (dst / "layout.json").write_text(json.dumps(capture.layout), encoding="utf-8")
    manifest = copy.deepcopy(capture.manifest)
    for entry in manifest["processes"]:
        entry.update(counts.get(entry["pid"], {}))
    if not with_layout:  # as `egf-audit capture` without --layout writes it
        manifest["layout"] = None
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return dst


# ---- hashes ----
@functools.lru_cache(maxsize=4096)
def _fnv1a_bytes(data: bytes) -> str:
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return f"{h:016x}"


def fnv1a(values: np.ndarray) -> str:
    """The recorder's region hash: FNV-1a 64 over each element's 4 little-endian bytes."""
    return _fnv1a_bytes(np.ascontiguousarray(values, dtype="<f4").tobytes())


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def stand_in(tag: str, shape: int | tuple[int, ...], kind: str) -> np.ndarray:
    """Fixed-seed fp32 values standing in for a buffer the capture does not show: "gradient"
    (normal, sd 1e-3), "activation" (a ReLU's output: max(normal, 0)) or "wire" (an aux
    softmax difference, uniform in (-1, 1))."""
    rng = np.random.default_rng(zlib.crc32(tag.encode()))
    if kind == "gradient":
        values = 1e-3 * rng.standard_normal(shape)
    elif kind == "activation":
        values = np.maximum(rng.standard_normal(shape), 0.0)
    else:
        values = rng.uniform(-1.0, 1.0, shape)
    return values.astype(np.float32)


# ---- finding and editing events ----
def is_kernel(e: dict[str, Any], name: str | None = None) -> bool:
    return e.get("ev") == "kernel" and (name is None or e["name"] == name)


def kernels(proc: Process, name: str) -> list[dict[str, Any]]:
    return [e for e in proc.events if is_kernel(e, name)]


def arg(k: dict[str, Any], name: str) -> int | float:
    value = k["params"][PARAMS[k["name"]].index(name)][1]
    if name in ("tau", "ema"):
        return struct.unpack("<f", struct.pack("<I", value))[0]
    if name in POINTERS or name == "n":
        return value
    return struct.unpack("<i", struct.pack("<I", value & 0xFFFFFFFF))[0]


def set_arg(k: dict[str, Any], name: str, value: int | float) -> None:
    """A kernel parameter as the recorder stores it: its bytes as an unsigned integer."""
    slot = k["params"][PARAMS[k["name"]].index(name)]
    if name in ("tau", "ema"):
        slot[1] = struct.unpack("<I", struct.pack("<f", value))[0]
    elif name in POINTERS or name == "n":
        slot[1] = int(value) & MASK64
    else:
        slot[1] = int(value) & 0xFFFFFFFF


def _index(proc: Process, event: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(proc.events) if e is event)


def remove(proc: Process, events: list[dict[str, Any]]) -> None:
    gone = {id(e) for e in events}
    proc.events = [e for e in proc.events if id(e) not in gone]


def insert(proc: Process, at: int, events: list[dict[str, Any]]) -> None:
    for e in events:
        e["_new"] = True
    proc.events[at:at] = events


def insert_after(proc: Process, anchor: dict[str, Any], events: list[dict[str, Any]]) -> None:
    insert(proc, _index(proc, anchor) + 1, events)


def move_after(proc: Process, event: dict[str, Any], anchor: dict[str, Any]) -> None:
    remove(proc, [event])
    insert_after(proc, anchor, [event])


def memory_event(
    proc: Process, ev: str, api: str, dst: int, src: int, nbytes: int, value: int
) -> dict[str, Any]:
    return {
        "ev": ev,
        "seq": 0,
        "tid": _tid(proc),
        "api": api,
        "dst": dst,
        "src": src,
        "bytes": nbytes,
        "value": value,
    }


def unknown_kernel(proc: Process, name: str, pointer: int) -> dict[str, Any]:
    """A kernel egf-audit's table does not know, as the recorder writes one: raw parameters.
    What it writes is not in the capture: the replay has it leave memory as it was."""
    return {
        "ev": "kernel",
        "seq": 0,
        "tid": _tid(proc),
        "api": "cuLaunchKernel",
        "name": name,
        "grid": [1, 1, 1],
        "block": [64, 1, 1],
        "params": [[8, pointer]],
        "_sets": [],
    }


def _tid(proc: Process) -> int:
    return proc.events[0]["tid"]


# ---- cuBLAS calls (the logger's lines) ----
_ARG = re.compile(r"^\s*i!\s+(\w+):")
_HEX = re.compile(r"HEX:(?:0x)?0x([0-9a-fA-F]+)")


def gemm_calls(proc: Process) -> list[dict[str, dict[str, Any]]]:
    """Every logged GEMM call: argument name -> the log event carrying it ("" the header)."""
    calls: list[dict[str, dict[str, Any]]] = []
    for e in proc.events:
        if e.get("ev") != "cublas":
            continue
        if "I! " in e["msg"]:
            calls.append({"": e})
        elif calls and (m := _ARG.match(e["msg"])):
            calls[-1][m.group(1)] = e
    return [c for c in calls if "emm" in c[""]["msg"] and "C" in c]


def gemm_arg(call: dict[str, dict[str, Any]], key: str) -> int | str:
    raw = call[key]["msg"].split("val=", 1)[1].strip()
    if (ptr := _HEX.search(raw)) is not None:
        return int(ptr.group(1), 16)
    if (op := re.search(r"CUBLAS_OP_([NTC])", raw)) is not None:
        return op.group(1)
    return int(raw.split()[0])


def set_gemm_int(call: dict[str, dict[str, Any]], key: str, value: int) -> None:
    e = call[key]
    e["msg"] = re.sub(r"val=-?\d+", f"val={value}", e["msg"], count=1)


def set_gemm_pointer(call: dict[str, dict[str, Any]], key: str, value: int) -> None:
    e = call[key]
    e["msg"] = _HEX.sub(f"HEX:0x0x{value:x}", e["msg"], count=1)


def gemm_reading(capture: Capture, proc: Process, buffer: str, transa: str, k: int) -> list:
    """The GEMM calls whose B operand starts `buffer` with op(A) = transa and the given k."""
    start = capture.base(buffer)
    return [
        c
        for c in gemm_calls(proc)
        if gemm_arg(c, "B") == start and gemm_arg(c, "transa") == transa and gemm_arg(c, "k") == k
    ]


def gemm_writing(capture: Capture, proc: Process, pointer: int) -> list:
    """The GEMM calls whose C operand starts at `pointer`."""
    return [c for c in gemm_calls(proc) if gemm_arg(c, "C") == pointer]


# ---- steps and call sites ----
@dataclass
class Site:
    step: int
    name: str  # "cql" or "main", as the seed names the two backward_full call sites
    rebuild: dict[str, Any]  # sp14_dir_concat_qaux(save_h_s2) ahead of the site
    zeroing: dict[str, Any]  # the memset of d_h_s2
    scale: dict[str, Any] | None
    accumulates: list[dict[str, Any]]
    value_fc: dict[str, Any] | None = None  # the header of the value-FC dX GEMM (C = d_h_s2)


def sites(capture: Capture, proc: Process) -> list[Site]:
    """The call sites: a concat rebuild then the memset of d_h_s2, the value-FC dX GEMM, the
    scale, the accumulates."""
    d_h_s2 = capture.base("d_h_s2")
    fc = {id(c[""]) for c in gemm_writing(capture, proc, d_h_s2)}
    found: list[Site] = []
    step = 0
    for i, e in enumerate(proc.events):
        if is_kernel(e, POLYAK):
            step += 1
        elif e.get("ev") == "memset" and e["dst"] == d_h_s2 and is_kernel(proc.events[i - 1]):
            if proc.events[i - 1]["name"] == CONCAT:
                name = "main" if found and found[-1].step == step else "cql"
                found.append(Site(step, name, proc.events[i - 1], e, None, []))
        elif found and id(e) in fc and not found[-1].accumulates:
            found[-1].value_fc = e
        elif found and is_kernel(e, SCALE) and found[-1].scale is None:
            found[-1].scale = e
        elif found and is_kernel(e, ACCUMULATE):
            found[-1].accumulates.append(e)
    return found


def site(capture: Capture, step: int, name: str) -> Site:
    return next(s for s in sites(capture, capture.main) if s.step == step and s.name == name)


# ---- the lies: the scale's arguments (EGF008, and EGF003/EGF004 where the gate's values can
# no longer be shown) ----
def _every_scale(capture: Capture, **new: int) -> Capture:
    for k in kernels(capture.main, SCALE):
        for name, value in new.items():
            set_arg(k, name, value)
    return capture


def scale_ld_sh2(capture: Capture) -> Capture:
    """The seed's off-by-one moved into the scale: ld = SH2, wire_col = SH2 - 1 (column SH2 - 1
    of a stride-SH2 view), at every scale launch. The recorder copies column SH2 - 1 of the
    stride-SH2 reading of sp14_d_dir_qaux_concat (its first B * SH2 elements, as the dX GEMM
    left them), and the accumulates read what the scale left there."""
    sh2 = capture.dim("SH2")
    return _every_scale(capture, ld=sh2, wire_col=sh2 - 1)


def scale_rows_short(capture: Capture) -> Capture:
    """The scale covers B - 1 rows: the last row's wire gradient flows ungated."""
    return _every_scale(capture, rows=capture.dim("B") - 1)


def scale_short_grid(capture: Capture) -> Capture:
    """Every scale launched with one block of 32 threads for B = 64 rows (a `rows / 2` grid
    arithmetic): its arguments are right, and rows 32 to 63 run ungated (the replay leaves them
    as the dX GEMM wrote them)."""
    rows = capture.dim("B")
    for k in kernels(capture.main, SCALE):
        k["grid"], k["block"] = [1, 1, 1], [32, 1, 1]
        k["_bug"] = {"untouched_rows": list(range(32, rows))}
    return capture


def concat_short_grid(capture: Capture) -> Capture:
    """Every rebuild of the dir concat launched with one block of 32 threads for B = 64 rows:
    its arguments are right, and the last 32 rows of the scratch keep whatever was there (the
    target's rebuild, at the first call site). Nothing snapshots the concat: only the launch's
    shape shows it."""
    for k in kernels(capture.main, "sp14_dir_concat_qaux"):
        k["grid"], k["block"] = [1, 1, 1], [32, 1, 1]
    return capture


def polyak_grid_2d(capture: Capture) -> Capture:
    """Every Polyak launched over a grid of 55 x 2 blocks: the kernel indexes with x alone, so
    each element of the target would be blended twice. The replay keeps what the capture shows
    (one blend); the launch's shape is what contradicts the contract."""
    for k in kernels(capture.main, POLYAK):
        k["grid"] = [k["grid"][0], 2, 1]
    return capture


def accumulate_block_2d(capture: Capture) -> Capture:
    """Every accumulate launched with blocks of 256 x 2 threads: the kernel indexes with x
    alone, so each element would be added twice. The replay keeps what the capture shows (one
    add); the launch's shape is what contradicts the contract."""
    for k in kernels(capture.main, ACCUMULATE):
        k["block"] = [256, 2, 1]
    return capture


def _isv_route(capture: Capture, buffer: str, element: int = 0) -> dict[str, int]:
    """isv pointing at `element` of `buffer`, isv_index reaching ISV[393] from there."""
    isv = capture.base(buffer) + 4 * element
    gate = capture.base("isv_signals") + 4 * GATE_INDEX
    return {"isv": isv, "isv_index": (gate - isv) // 4}


def scale_isv_in_params(capture: Capture) -> Capture:
    """isv points into `params`; isv_index reaches ISV[393] from there (the gate's value read,
    through a pointer that is not the ISV buffer)."""
    return _every_scale(capture, **_isv_route(capture, "params"))


def scale_isv_in_dx(capture: Capture) -> Capture:
    """isv points at the start of sp14_d_dir_qaux_concat; a negative isv_index reaches
    ISV[393] from there."""
    return _every_scale(capture, **_isv_route(capture, DIR_DX))


def scale_isv_plus_one(capture: Capture) -> Capture:
    """isv = base of isv_signals + 4 and isv_index = 392: the same element by another route;
    the contract says isv is the base and isv_index 393."""
    return _every_scale(capture, **_isv_route(capture, "isv_signals", 1))


def scale_isv_index_392(capture: Capture) -> Capture:
    """The scale reads ISV[392]: zeroed at allocation and written by nothing (the producer writes
    ISV[393]), so both steps run closed and the live gate never reaches the wire."""
    return _every_scale(capture, isv_index=GATE_INDEX - 1)


def scale_dx_other_buffer(capture: Capture) -> Capture:
    """The scale gates sp14_d_b2_concat (the same [B, SH2 + 1] shape) instead of the dir dX:
    the recorder copies branch 2's dX, the dir dX reaches its accumulate ungated."""
    return _every_scale(capture, dx_concat=capture.base("sp14_d_b2_concat"))


def scale_dx_row_offset(capture: Capture) -> Capture:
    """wire_col = SH2 and ld = SH2 + 1, but dx_concat one row in: the scale gates rows 1..B of
    the wire, row 0 stays ungated and the last row lies past the buffer, in its allocation's
    guard zone (canaries until the first scale there writes its +0.0)."""
    return _every_scale(capture, dx_concat=capture.base(DIR_DX) + 4 * (capture.dim("SH2") + 1))


def scale_before_dx_gemm(capture: Capture) -> Capture:
    """Step 0's cql site runs its scale before backward_full (right after zeroing d_h_s2): it
    gates the dX buffer as allocated (zeros, nothing wrote it yet) and the dX GEMM's wire
    column reaches the accumulate ungated."""
    proc, s = capture.main, site(capture, 0, "cql")
    move_after(proc, s.scale, s.zeroing)
    return capture


def scale_wire_col_sh2m1(capture: Capture) -> Capture:
    """The fault catalogue's scale-wrong-col: wire_col = SH2 - 1 with ld = SH2 + 1. The kernel
    gates column SH2 - 1 (a trunk gradient column the accumulate adds into d_h_s2); the
    recorder copies column ld - 1 = SH2, which stays ungated, and hashes the rest, which the
    scale changed."""
    return _every_scale(capture, wire_col=capture.dim("SH2") - 1)


def scale_no_nan_branch(capture: Capture) -> Capture:
    """The fault catalogue's no-nan-branch: sp14_scale_wire_col computes *g = *g * a without
    the alpha == 0 branch. Under ISV[393] = 0 a negative wire gradient becomes -0.0
    (0x80000000), not +0.0; the live step is unchanged."""
    for k in kernels(capture.main, SCALE):
        k["_bug"] = {"nan_branch": False}
    return capture


def _online_concat(capture: Capture, step: int) -> np.ndarray:
    """A stand-in for the online concat [h_s2 | p_up - p_down] the rebuild writes in a step:
    save_h_s2 and aux_nb_softmax_buf are not in the capture."""
    rows, sh2 = capture.dim("B"), capture.dim("SH2")
    concat = np.empty((rows, sh2 + 1), np.float32)
    concat[:, :sh2] = stand_in(f"save_h_s2 step {step}", (rows, sh2), "activation")
    concat[:, sh2] = stand_in(f"aux wire step {step}", rows, "wire")
    return concat.ravel()


def scale_x_concat(capture: Capture) -> Capture:
    """The fault catalogue's scale-x-concat: the scale is pointed at the x concat scratch
    (sp14_dir_qaux_concat_scratch, the same [B, SH2 + 1]) instead of the dX buffer. The
    scratch's content (save_h_s2 and the aux softmax's wire, as each site's rebuild wrote it) is
    not in the capture: each site's rebuild writes a stand-in (`_online_concat`, one per step:
    both sites rebuild the same concat), and the recorder copies that."""
    for s in sites(capture, capture.main):
        s.rebuild["_sets"] = [("set", capture.base(SCRATCH), _online_concat(capture, s.step))]
    return _every_scale(capture, dx_concat=capture.base(SCRATCH))


def scale_dw_wire_col(capture: Capture) -> Capture:
    """The fault catalogue's scale-dw-wire-col: the scale is pointed at dW's wire column,
    grad_buf[goff_w_b0fc..] as [ADV, SH2 + 1], instead of the dX buffer. The dW GEMM's product
    is not in the capture: each site's w_b0fc dW GEMM (beta = 1, onto grad_buf zeroed at the
    step's start) adds a stand-in gradient (`stand_in`, one per site), and the recorder copies
    what the scale found there."""
    proc = capture.main
    dw = capture.base("grad_buf") + 4 * capture.offset("w_b0fc")
    rows, width = capture.layout["param_offsets"]["w_b0fc"][1:]
    for i, call in enumerate(gemm_writing(capture, proc, dw)):
        call[""]["_sets"] = [("add", dw, stand_in(f"dW w_b0fc {i}", rows * width, "gradient"))]
    return _every_scale(capture, dx_concat=dw, rows=rows, ld=width)


def scale_missing_everywhere(capture: Capture) -> Capture:
    """The fault catalogue's skip-scale: no sp14_scale_wire_col launch at any call site."""
    remove(capture.main, kernels(capture.main, SCALE))
    return capture


def scale_missing_cql_site(capture: Capture) -> Capture:
    """The fault catalogue's cql-site-ungated: only the main site scales; the CQL site's wire
    reaches its accumulate (and the aux head) ungated in every step."""
    remove(capture.main, [s.scale for s in sites(capture, capture.main) if s.name == "cql"])
    return capture


# ---- the d = 0 backward GEMMs with K = SH2 (the fault catalogue's pre-B.10 faults) ----
def _dir_gemms(capture: Capture, proc: Process) -> list[tuple[dict, dict]]:
    """Each call site's d = 0 dW GEMM (C = grad_buf's w_b0fc) and dX GEMM (C = the dir dX), in
    order."""
    dw = gemm_writing(capture, proc, capture.base("grad_buf") + 4 * capture.offset("w_b0fc"))
    dx = gemm_writing(capture, proc, capture.base(DIR_DX))
    assert len(dw) == len(dx), (len(dw), len(dx))
    return list(zip(dw, dx, strict=True))


def _dw_from_h_s2(capture: Capture, call: dict[str, dict[str, Any]]) -> None:
    """dW = dY^T . (save_h_s2, SH2): the pre-B.10 x operand, K = SH2 columns, into the same
    [ADV, SH2 + 1] gradient (its wire column never written). Its result is grad_buf's, which no
    snapshot reads."""
    sh2 = capture.dim("SH2")
    set_gemm_pointer(call, "A", capture.base("save_h_s2"))
    set_gemm_int(call, "m", sh2)
    set_gemm_int(call, "lda", sh2)


def _first_columns(content: np.ndarray, width: int, keep: int) -> np.ndarray:
    """The first `keep` columns of each row of a [rows, width] matrix, as rows."""
    return np.ascontiguousarray(content.reshape(-1, width)[:, :keep])


def dw_k_sh2(capture: Capture) -> Capture:
    """The fault catalogue's dw-k-sh2: every d = 0 dW GEMM reads (save_h_s2, SH2), the pre-B.10
    operand: K = SH2 against w_b0fc's row stride SH2 + 1, the wire column of dW never written."""
    for dw, _ in _dir_gemms(capture, capture.main):
        _dw_from_h_s2(capture, dw)
    return capture


def dx_k_sh2(capture: Capture) -> Capture:
    """The fault catalogue's dx-k-sh2: every d = 0 dX GEMM keeps K = SH2 (m = SH2 into the
    [B, SH2 + 1] dir dX, row stride SH2 + 1): its wire column is never written and keeps what
    was there (+0.0 from the allocation, then what each scale left). cuBLAS may round the
    first SH2 columns differently at m = SH2; that is not in the capture: they are taken as
    recorded."""
    sh2 = capture.dim("SH2")
    base = capture.base(DIR_DX)
    for _, dx in _dir_gemms(capture, capture.main):
        set_gemm_int(dx, "m", sh2)
        ((_, _, content),) = dx[""]["_sets"]
        rows = _first_columns(content, sh2 + 1, sh2)
        dx[""]["_sets"] = [("set", base + 4 * (sh2 + 1) * b, row) for b, row in enumerate(rows)]
    return capture


def dx_reads_target_w_b0fc(capture: Capture) -> Capture:
    """Every d = 0 dX GEMM reads the target's w_b0fc (goff_w_b0fc on target_params' base, the
    tensor of the same shape) instead of the online one: the shapes, spans and strides are the
    clean ones. In step 0 the target is still the online net's copy, so its dX is the recorded
    one; from step 1 on it is d_b0_hid . W_target, which the capture does not show: a stand-in
    gradient (`stand_in`, one per call) that the scale and the accumulates then read."""
    target = capture.base("target_params") + 4 * capture.offset("w_b0fc")
    steps = [s.step for s in sites(capture, capture.main)]
    for i, (_, dx) in enumerate(_dir_gemms(capture, capture.main)):
        set_gemm_pointer(dx, "A", target)
        if steps[i] > 0:
            ((mode, ptr, content),) = dx[""]["_sets"]
            dx[""]["_sets"] = [
                (mode, ptr, stand_in(f"dX from W_target {i}", content.size, "gradient"))
            ]
    return capture


def wrapper_on_main(capture: Capture) -> Capture:
    """The fault catalogue's wrapper-on-main: the main site calls the legacy backward_full
    wrapper (both new pointers 0), whose d = 0 branch takes the K = SH2 path: dW from
    (save_h_s2, SH2), and dX with K = SH2 straight into d_h_s2 (beta = 0, row stride SH2),
    before the value-FC dX adds onto it. The dir dX buffer keeps the cql site's content, which
    the main site's scale and accumulate then read again. The K = SH2 dX product is not in the
    capture (cuBLAS may round it differently at m = SH2): it is taken as the recorded dir dX's
    first SH2 columns."""
    proc, sh2 = capture.main, capture.dim("SH2")
    for s, (dw, dx) in zip(sites(capture, proc), _dir_gemms(capture, proc), strict=True):
        if s.name != "main":
            continue
        _dw_from_h_s2(capture, dw)
        ((_, _, content),) = dx[""]["_sets"]
        set_gemm_int(dx, "m", sh2)
        set_gemm_int(dx, "ldc", sh2)
        set_gemm_pointer(dx, "C", capture.base("d_h_s2"))
        dx[""]["_sets"] = [("set", capture.base("d_h_s2"), _first_columns(content, sh2 + 1, sh2))]
    return capture


# ---- the accumulates (EGF007) ----
def accumulate_missing(capture: Capture) -> Capture:
    """The main site never accumulates branch 2's dX into d_h_s2 (every step)."""
    drop = [s.accumulates[2] for s in sites(capture, capture.main) if s.name == "main"]
    remove(capture.main, drop)
    return capture


def accumulate_twice(capture: Capture) -> Capture:
    """The main site accumulates branch 1's dX twice (the same d_concat, every step)."""
    proc = capture.main
    for s in sites(capture, proc):
        if s.name == "main":
            original = s.accumulates[1]
            insert_after(proc, original, [copy.deepcopy(original)])
    return capture


def accumulate_site_dropped(capture: Capture) -> Capture:
    """The cql site accumulates nothing into d_h_s2 (all four launches gone, every step)."""
    for s in sites(capture, capture.main):
        if s.name == "cql":
            remove(capture.main, s.accumulates)
    return capture


def _edit_dir_accumulates(capture: Capture, **new: int) -> Capture:
    for s in sites(capture, capture.main):
        for name, value in new.items():
            set_arg(s.accumulates[0], name, value)
    return capture


def accumulate_sh2_plus_one(capture: Capture) -> Capture:
    """The dir accumulate adds sh2 = SH2 + 1 columns: the wire column goes into d_h_s2, whose
    [B, SH2 + 1] view runs past its end into its allocation's guard zone (canaries, then the
    GPU's NaN: the site's memset zeroes only d_h_s2 itself)."""
    return _edit_dir_accumulates(capture, sh2=capture.dim("SH2") + 1)


def accumulate_ld_sh2(capture: Capture) -> Capture:
    """The fault catalogue's accumulate-wire-col: the dir accumulate reads
    sp14_d_dir_qaux_concat with ld_concat = SH2, walking into the wire column."""
    return _edit_dir_accumulates(capture, ld_concat=capture.dim("SH2"))


def accumulate_rows_short(capture: Capture) -> Capture:
    """The dir accumulate covers B - 1 rows of d_h_s2."""
    return _edit_dir_accumulates(capture, rows=capture.dim("B") - 1)


def accumulate_b1_ld(capture: Capture) -> Capture:
    """Branch 1 (two extra columns, row stride SH2 + 2) accumulated with ld_concat = SH2 + 1:
    only its layout entry says its stride."""
    for s in sites(capture, capture.main):
        set_arg(s.accumulates[1], "ld_concat", capture.dim("SH2") + 1)
    return capture


# ---- Polyak (EGF005) ----
def polyak_online_grad_buf(capture: Capture) -> Capture:
    """Polyak averages grad_buf into the target (online = base of grad_buf). grad_buf's values
    at that point (the step's gradients, after Adam read them) are not in the capture: each
    Polyak finds a stand-in gradient there (`stand_in`, one per step); the target it writes,
    and the target at the next step's start, follow from it."""
    proc, grad = capture.main, capture.base("grad_buf")
    n = capture.layout["buffers"]["grad_buf"]["bytes"] // 4
    for i, k in enumerate(kernels(proc, POLYAK)):
        set_arg(k, "online", grad)
        k["_loads"].append(("set", grad, stand_in(f"grad_buf step {i}", n, "gradient")))
    return capture


def polyak_target_is_params(capture: Capture) -> Capture:
    """Polyak with target = params: the online net averaged into itself, the target never
    updated. The recorder copies params as the target, and again at the next step's start."""
    for k in kernels(capture.main, POLYAK):
        set_arg(k, "target", capture.base("params"))
    return capture


def polyak_n_short(capture: Capture) -> Capture:
    """Polyak with n one short of the whole net: the last parameter's target never moves."""
    n = capture.layout["buffers"]["params"]["bytes"] // 4 - 1
    for k in kernels(capture.main, POLYAK):
        set_arg(k, "n", n)
    return capture


def polyak_tau_swapped(capture: Capture) -> Capture:
    """The fault catalogue's polyak-tau-swap: tau and 1 - tau swapped, target = 0.995 * params
    + 0.005 * target; the target at the next step's start, and the next Polyak, follow."""
    for k in kernels(capture.main, POLYAK):
        set_arg(k, "tau", float(np.float32(1) - np.float32(arg(k, "tau"))))
    return capture


def target_grad_leak(capture: Capture) -> Capture:
    """The fault catalogue's target-grad-leak: the value head's dW GEMM (w_v1) takes goff_w_v1
    on target_params' base instead of grad_buf's, and adds (beta = 1) into the target net at
    both call sites of every step. The dW it adds is not in the capture: a stand-in gradient
    (`stand_in`, one per call); the target Polyak reads, and the next step's start, follow."""
    proc, at = capture.main, capture.offset("w_v1")
    leak = capture.base("target_params") + 4 * at
    for i, call in enumerate(gemm_writing(capture, proc, capture.base("grad_buf") + 4 * at)):
        set_gemm_pointer(call, "C", leak)
        size = gemm_arg(call, "m") * gemm_arg(call, "n")
        call[""]["_sets"] = [("add", leak, stand_in(f"dW w_v1 {i}", size, "gradient"))]
    return capture


# ---- the concat rebuild (EGF006) ----
def rebuild_target_h_s2(capture: Capture) -> Capture:
    """The main site's rebuild reads the target's h_s2 (tgt_h_s2), not save_h_s2."""
    for s in sites(capture, capture.main):
        if s.name == "main":
            set_arg(s.rebuild, "h_s2", capture.base("tgt_h_s2"))
    return capture


def rebuild_target_softmax(capture: Capture) -> Capture:
    """The main site's rebuild takes its wire from the target's softmax (tgt_aux_softmax)."""
    for s in sites(capture, capture.main):
        if s.name == "main":
            set_arg(s.rebuild, "aux_softmax", capture.base("tgt_aux_softmax"))
    return capture


def rebuild_missing(capture: Capture) -> Capture:
    """The fault catalogue's skip-rebuild: no sp14_dir_concat_qaux before backward_full at
    either site; dW reads the target concat the target forward left in the scratch."""
    remove(capture.main, [s.rebuild for s in sites(capture, capture.main)])
    return capture


# ---- zeroing d_h_s2 (EGF007) ----
def zero_missing(capture: Capture) -> Capture:
    """Step 0's first call site never zeroes d_h_s2: only the allocation's memset did (the
    values are the same; only the launches show it)."""
    remove(capture.main, [site(capture, 0, "cql").zeroing])
    return capture


def zero_missing_every_site(capture: Capture) -> Capture:
    """The fault catalogue's no-zero-d-h-s2: no site zeroes d_h_s2, so each value-FC dX
    (beta = 1) lands on what the previous site left there. What the previous site's aux dX
    GEMM (beta = 1) and relu_backward did to d_h_s2 after its last accumulate is not in the
    capture: the lie has them leave it as that accumulate left it."""
    proc = capture.main
    found = sites(capture, proc)
    fc = {id(s.value_fc) for s in found}
    for call in gemm_writing(capture, proc, capture.base("d_h_s2")):
        if id(call[""]) not in fc:
            call[""]["_sets"] = []
    for k in kernels(proc, "relu_backward"):
        if k["params"][0][1] == capture.base("d_h_s2"):
            k["_sets"] = []
    remove(proc, [s.zeroing for s in found])
    return capture


def zero_then_stale_copy(capture: Capture) -> Capture:
    """Step 0's main site copies stale data (tgt_h_s2) into d_h_s2 after zeroing it, before its
    backward GEMMs. tgt_h_s2's values (the target forward's trunk activations) are not in the
    capture: the copy brings a stand-in (`stand_in`, ReLU activations), and the value-FC dX
    and the accumulates add onto it."""
    proc, s = capture.main, site(capture, 0, "main")
    d_h_s2, nbytes = capture.base("d_h_s2"), s.zeroing["bytes"]
    copied = memory_event(
        proc, "copy", "cuMemcpyDtoDAsync_v2", d_h_s2, capture.base("tgt_h_s2"), nbytes, 0
    )
    copied["_sets"] = [("set", d_h_s2, stand_in("tgt_h_s2 step 0", nbytes // 4, "activation"))]
    insert_after(proc, s.zeroing, [copied])
    return capture


def zero_half(capture: Capture) -> Capture:
    """Step 0's first call site zeroes only half of d_h_s2 (the other half still holds the
    allocation's zeros there: the values are the same, the memset's extent shows it)."""
    site(capture, 0, "cql").zeroing["bytes"] //= 2
    return capture


def zero_with_byte_one(capture: Capture) -> Capture:
    """cudaMemset(d_h_s2, 1, ...) at every site: each float becomes 0x01010101 (2.4e-38) instead
    of +0.0; the value-FC dX lands on it with beta = 1 and rounds it away except where the
    product is +0.0 (rows the ReLU closed)."""
    for s in sites(capture, capture.main):
        s.zeroing["value"] = 1
    return capture


def zero_past_end(capture: Capture) -> Capture:
    """Every site's memset of d_h_s2 is sized for the concat, B * (SH2 + 1) floats: it zeroes
    d_h_s2 and runs past its end into the allocation's guard zone (SPEC 8: memsets stay
    inside their buffers). The values the accumulates see are the same."""
    nbytes = 4 * capture.dim("B") * (capture.dim("SH2") + 1)
    for s in sites(capture, capture.main):
        s.zeroing["bytes"] = nbytes
    return capture


# ---- the wire overwritten between the scale and the accumulate (EGF008) ----
def wire_memset(capture: Capture) -> Capture:
    """Step 0's cql site fills sp14_d_dir_qaux_concat with 1.0 (cuMemsetD32, 0x3f800000) after
    its scale, before its accumulates: the gated wire and the dir dX are gone."""
    proc, s = capture.main, site(capture, 0, "cql")
    nbytes = capture.layout["buffers"][DIR_DX]["bytes"]
    fill = memory_event(
        proc, "memset", "cuMemsetD32Async", capture.base(DIR_DX), 0, nbytes, 0x3F800000
    )
    insert_after(proc, s.scale, [fill])
    return capture


def wire_copy(capture: Capture) -> Capture:
    """Step 0's cql site copies sp14_d_b2_concat over sp14_d_dir_qaux_concat after its scale,
    before its accumulates (the recorder's d_concat snapshot then shows branch 2's dX)."""
    proc, s = capture.main, site(capture, 0, "cql")
    nbytes = capture.layout["buffers"][DIR_DX]["bytes"]
    src = capture.base("sp14_d_b2_concat")
    copied = memory_event(
        proc, "copy", "cuMemcpyDtoDAsync_v2", capture.base(DIR_DX), src, nbytes, 0
    )
    insert_after(proc, s.scale, [copied])
    return capture


def wire_unknown_kernel(capture: Capture) -> Capture:
    """Step 0's cql site launches a kernel egf-audit does not know, handed a pointer to the wire
    column of sp14_d_dir_qaux_concat, after its scale and before its accumulates. What it wrote
    is not in the capture: the replay has it leave the buffer as the scale left it."""
    proc, s = capture.main, site(capture, 0, "cql")
    pointer = capture.base(DIR_DX) + 4 * capture.dim("SH2")
    insert_after(proc, s.scale, [unknown_kernel(proc, "fill_f32", pointer)])
    return capture


def target_unknown_writer(capture: Capture) -> Capture:
    """In the middle of step 0 (no step-start snapshot yet proves the target unchanged), a kernel
    egf-audit does not know is handed a pointer into target_params (its w_b0fc). What it wrote
    is not in the capture: the replay has it leave the target as it was."""
    proc = capture.main
    pointer = capture.base("target_params") + 4 * capture.offset("w_b0fc")
    anchor = site(capture, 0, "cql").rebuild
    insert(proc, _index(proc, anchor), [unknown_kernel(proc, "copy_f32", pointer)])
    return capture


# ---- the gate's snapshots (EGF003) ----
def scale_snapshots_missing_and_wire_nonzero(capture: Capture) -> Capture:
    """Step 0's main-site scale has no snapshots (its stream was being captured into a graph:
    the recorder skips them), while step 0's cql-site scale leaves wire row 5 ungated under
    ISV[393] = 0 (the recorder copies it, and the accumulate reads it)."""
    site(capture, 0, "main").scale["_no_snapshots"] = True
    site(capture, 0, "cql").scale["_bug"] = {"untouched_rows": [5]}
    return capture


def wire_hash_nonzero(capture: Capture) -> Capture:
    """A capture recorded with --values-max 32, in which step 0's cql-site scale leaves wire
    row 40 ungated under ISV[393] = 0: the 32 rows kept are +0.0, only the hash over all rows
    (and over the accumulate's d_concat) says a row beyond them is not."""
    capture.values_max = 32
    site(capture, 0, "cql").scale["_bug"] = {"untouched_rows": [40]}
    return capture


# ---- GEMMs (EGF001, EGF011) and the capture's integrity ----
def malformed_line_then_k_short(capture: Capture) -> Capture:
    """A line that is not JSON in the middle of the events, and after it step 1's online forward
    GEMM on the concat scratch with k = SH2: reading up to the bad line would miss the bug."""
    proc, sh2 = capture.main, capture.dim("SH2")
    calls = gemm_reading(capture, proc, SCRATCH, "T", sh2 + 1)
    params, nbytes = capture.base("params"), capture.layout["buffers"]["params"]["bytes"]
    online = [c for c in calls if params <= gemm_arg(c, "A") < params + nbytes]
    call = next(c for c in online if c[""]["seq"] > kernels(proc, POLYAK)[0]["seq"])
    set_gemm_int(call, "k", sh2)
    torn = f'{{"ev":"kernel","seq":{call[""]["seq"] - 1},"tid":{_tid(proc)},"api":"cuLau'
    insert(proc, _index(proc, call[""]), [{"_raw": torn}])
    return capture


def manifest_exit_139(capture: Capture) -> Capture:
    """The command died of SIGSEGV, as a shell reports it (exit 139)."""
    capture.manifest["exit_code"] = 139
    return capture


def manifest_sigsegv(capture: Capture) -> Capture:
    """The command died of SIGSEGV, as Python's subprocess reports it (-11)."""
    capture.manifest["exit_code"] = -11
    return capture


def no_exit_event(capture: Capture) -> Capture:
    """The process left through os._exit(0) after its last step: no atexit handler ran, so the
    recorder wrote no exit event (what it had not flushed is lost with it: nothing here, its
    last Polyak's snapshots flushed the file). The command itself exited 0."""
    for proc in capture.processes:
        proc.events = [e for e in proc.events if e.get("ev") != "exit"]
        proc.dies = ("after", proc.events[-1])
    return capture


def events_cut_off(capture: Capture) -> Capture:
    """The trainer was killed (SIGKILL) during step 0's main-site backward, while the recorder
    wrote the line in which its 64 KiB events buffer filled up: the file holds what the
    recorder flushed (after the cql site's last accumulate), then the full buffer written out
    since, its last line cut in the middle; no exit event. Most lines are cuBLAS's log, and in
    this recording every buffer boundary falls inside a logged GEMM's argument lines: the file
    ends with a GEMM call whose first arguments are whole and whose next one is cut. The
    manifest says the command died of signal 9."""
    proc = capture.main
    proc.events = [e for e in proc.events if e.get("ev") != "exit"]
    proc.dies = ("filling", site(capture, 0, "main").zeroing)
    capture.manifest["exit_code"] = SIGKILL_EXIT
    return capture


def clean(capture: Capture) -> Capture:
    """The control: the clean capture as recorded, with its exit event. It must pass."""
    return capture


def second_process_off_by_one(capture: Capture) -> Capture:
    """A second trainer process (the next pid) beside the clean one, its scale launches with
    the seed's off-by-one (ld = SH2, wire_col = SH2 - 1)."""
    proc = capture.main
    pid = max(p.pid for p in capture.processes) + 1
    events = copy.deepcopy(proc.events)
    for e in events:
        if e.get("ev") == "init":
            e.update(pid=pid, ppid=proc.pid)
        if e.get("ev") == "exit":
            e["pid"] = pid
    second = Process(pid, events)
    capture.processes.append(second)
    sh2 = capture.dim("SH2")
    for k in kernels(second, SCALE):
        set_arg(k, "ld", sh2)
        set_arg(k, "wire_col", sh2 - 1)
    entry = dict(capture.manifest["processes"][0], pid=pid, audited=False)
    capture.manifest["processes"].append(entry)
    return capture


def _shapeless(capture: Capture) -> None:
    """The layout file gives every single-tensor buffer (inputs, activations, dX and scratch
    buffers) with its address and bytes only."""
    for name, spec in capture.layout["buffers"].items():
        if set(spec.get("tensors", {})) == {name}:
            spec.pop("tensors")
        spec.pop("shape", None)


def layout_shapeless(capture: Capture) -> Capture:
    """The control: a correct capture whose layout file gives the activations without shapes
    (each one flat allocation, judged by its span). It must pass."""
    _shapeless(capture)
    return capture


def layout_shapeless_k_short(capture: Capture) -> Capture:
    """The forward GEMMs on the concat scratch with k = SH2 (row stride SH2 + 1), under a layout
    file that gives the scratch without a shape."""
    _shapeless(capture)
    sh2 = capture.dim("SH2")
    for call in gemm_reading(capture, capture.main, SCRATCH, "T", sh2 + 1):
        set_gemm_int(call, "k", sh2)
    return capture


def dw_ldc_below_rows(capture: Capture) -> Capture:
    """Every GEMM that writes dW w_b0fc passes ldc one below the rows C stores (m): cuBLAS logs
    the call, answers CUBLAS_STATUS_INVALID_VALUE and computes nothing, so the dW the optimizer
    reads is whatever grad_buf held. The replay forgets C as for any GEMM; no snapshot shows
    the difference."""
    dw = capture.base("grad_buf") + 4 * capture.offset("w_b0fc")
    calls = gemm_writing(capture, capture.main, dw)
    assert calls, "no GEMM writes dW w_b0fc"
    for call in calls:
        set_gemm_int(call, "ldc", int(gemm_arg(call, "m")) - 1)
    return capture


def column_gemm_ldc_below_rows(capture: Capture) -> Capture:
    """Every one-column GEMM (n = 1: the bias gradients, dW of a bias as the batch's column sum
    through a ones vector) passes ldc one below m. Its C box is one row whatever ldc is, so
    every operand still spans its tensor: only cuBLAS's refusal shows that nothing ran."""
    calls = [c for c in gemm_calls(capture.main) if gemm_arg(c, "n") == 1]
    assert calls, "no one-column GEMM"
    for call in calls:
        set_gemm_int(call, "ldc", int(gemm_arg(call, "m")) - 1)
    return capture


def b1_forward_k_short(capture: Capture) -> Capture:
    """Branch 1's forward GEMMs (online and target) read k = SH2 + 1 of their SH2 + 2 columns:
    no K = SH2 signature, and without a layout file inference names neither operand's shape."""
    width = capture.dim("SH2") + capture.dim("E")[1]
    proc = capture.main
    for buffer in ("save_b1_concat", "tgt_b1_concat"):
        for call in gemm_reading(capture, proc, buffer, "T", width):
            set_gemm_int(call, "k", width - 1)
    return capture


# The fault catalogue (egf_audit/scenarios/faults.py) in capture form: every fault whose capture
# the clean one determines is here, by its name or as scale-missing-everywhere (skip-scale),
# scale-missing-cql-site (cql-site-ungated), scale-wire-col-sh2m1 (scale-wrong-col),
# rebuild-missing (skip-rebuild), zero-d-h-s2-missing-every-site (no-zero-d-h-s2),
# accumulate-ld-concat-sh2 (accumulate-wire-col), polyak-tau-swapped (polyak-tau-swap) and
# layout-shapeless-fwd-k-sh2 (fwd-k-sh2). Not here: sn-vector-sh2 and adam-state-sh2 (EGF009
# has no capture check: the optimizer's slices are indexed inside its code), gate-no-clamp (this
# batch's aux head is above chance, so the clamp never acts: the trainer without it records the
# clean capture), scale-writes-past-region and sn-normalize-writes-neighbour (EGF013: a write
# outside every snapshotted region changes no recorded event).
Lie = tuple[Callable[[Capture], Capture], frozenset[str] | str, bool]
_SCALE_VISIBLE = frozenset({"EGF008", "EGF003", "EGF004"})

LIES: dict[str, Lie] = {
    # controls
    "clean-with-exit-event": (clean, PASSES, False),
    "layout-shapeless": (layout_shapeless, PASSES, True),
    # the scale's arguments, and the scale itself (the fault catalogue's scale faults)
    "scale-ld-sh2-col-sh2m1": (scale_ld_sh2, _SCALE_VISIBLE, False),
    "scale-rows-b-minus-1": (scale_rows_short, _SCALE_VISIBLE, False),
    "scale-short-grid": (scale_short_grid, frozenset({"EGF001", "EGF003", "EGF004"}), False),
    "scale-isv-in-params": (scale_isv_in_params, frozenset({"EGF008"}), False),
    "scale-isv-in-dx": (scale_isv_in_dx, frozenset({"EGF008"}), False),
    "scale-isv-plus-4-index-392": (scale_isv_plus_one, frozenset({"EGF008"}), False),
    "scale-isv-index-392": (scale_isv_index_392, _SCALE_VISIBLE, False),
    "scale-dx-other-buffer": (scale_dx_other_buffer, _SCALE_VISIBLE, False),
    "scale-dx-row-offset": (scale_dx_row_offset, _SCALE_VISIBLE | {"EGF001"}, False),
    "scale-before-dx-gemm": (scale_before_dx_gemm, frozenset({"EGF008"}), False),
    "scale-wire-col-sh2m1": (scale_wire_col_sh2m1, _SCALE_VISIBLE, False),
    "scale-no-nan-branch": (scale_no_nan_branch, frozenset({"EGF003"}), False),
    "scale-x-concat": (scale_x_concat, _SCALE_VISIBLE, False),
    "scale-dw-wire-col": (scale_dw_wire_col, _SCALE_VISIBLE, False),
    "scale-missing-everywhere": (scale_missing_everywhere, _SCALE_VISIBLE, False),
    "scale-missing-cql-site": (scale_missing_cql_site, _SCALE_VISIBLE, False),
    # the d = 0 backward GEMMs with K = SH2
    "dw-k-sh2": (dw_k_sh2, frozenset({"EGF001", "EGF006", "EGF011"}), False),
    "dx-k-sh2": (dx_k_sh2, frozenset({"EGF001", "EGF011"}), False),
    # the d = 0 dX GEMM on the target's weights (EGF001: which tensor each GEMM reads)
    "dx-reads-target-w-b0fc": (dx_reads_target_w_b0fc, frozenset({"EGF001"}), False),
    "wrapper-on-main": (
        wrapper_on_main,
        frozenset({"EGF001", "EGF006", "EGF007", "EGF008", "EGF011"}),
        False,
    ),
    # the accumulates
    "accumulate-missing-branch": (accumulate_missing, frozenset({"EGF007"}), False),
    "accumulate-branch-twice": (accumulate_twice, frozenset({"EGF007"}), False),
    "accumulate-site-dropped": (accumulate_site_dropped, frozenset({"EGF007"}), False),
    "accumulate-sh2-plus-1": (accumulate_sh2_plus_one, frozenset({"EGF007"}), False),
    "accumulate-ld-concat-sh2": (accumulate_ld_sh2, frozenset({"EGF007"}), False),
    "accumulate-rows-b-minus-1": (accumulate_rows_short, frozenset({"EGF007"}), False),
    "accumulate-b1-ld-sh2-plus-1": (accumulate_b1_ld, frozenset({"EGF007"}), True),
    "accumulate-block-2d": (accumulate_block_2d, frozenset({"EGF001"}), False),
    # Polyak, and the target net's other writers
    "polyak-online-grad-buf": (polyak_online_grad_buf, frozenset({"EGF005"}), True),
    "polyak-target-is-params": (polyak_target_is_params, frozenset({"EGF005"}), False),
    "polyak-n-short": (polyak_n_short, frozenset({"EGF005"}), True),
    "polyak-tau-swapped": (polyak_tau_swapped, frozenset({"EGF005"}), False),
    "polyak-grid-2d": (polyak_grid_2d, frozenset({"EGF001"}), False),
    "target-grad-leak": (target_grad_leak, frozenset({"EGF005"}), False),
    # the concat rebuild
    "rebuild-target-h-s2": (rebuild_target_h_s2, frozenset({"EGF006"}), False),
    "rebuild-target-softmax": (rebuild_target_softmax, frozenset({"EGF006"}), False),
    "rebuild-missing": (rebuild_missing, frozenset({"EGF006"}), False),
    "rebuild-short-grid": (concat_short_grid, frozenset({"EGF001"}), False),
    # zeroing d_h_s2
    "zero-d-h-s2-missing": (zero_missing, frozenset({"EGF007"}), False),
    "zero-d-h-s2-missing-every-site": (zero_missing_every_site, frozenset({"EGF007"}), False),
    "zero-d-h-s2-then-stale-copy": (zero_then_stale_copy, frozenset({"EGF007"}), False),
    "zero-d-h-s2-half": (zero_half, frozenset({"EGF007"}), False),
    "zero-d-h-s2-byte-one": (zero_with_byte_one, frozenset({"EGF007"}), False),
    "zero-d-h-s2-past-end": (zero_past_end, frozenset({"EGF001"}), True),
    # the wire overwritten after its scale
    "wire-overwritten-memset": (wire_memset, frozenset({"EGF008"}), False),
    "wire-overwritten-copy": (wire_copy, frozenset({"EGF008"}), False),
    "wire-overwritten-unknown-kernel": (wire_unknown_kernel, frozenset({"EGF008"}), False),
    "target-unknown-writer": (target_unknown_writer, frozenset({"EGF005"}), False),
    # the gate's snapshots
    "scale-snapshots-missing-wire-nonzero": (
        scale_snapshots_missing_and_wire_nonzero,
        frozenset({"EGF003"}),
        False,
    ),
    "wire-hash-nonzero-beyond-kept": (wire_hash_nonzero, frozenset({"EGF003"}), False),
    # GEMMs
    "layout-shapeless-fwd-k-sh2": (layout_shapeless_k_short, frozenset({"EGF001", "EGF011"}), True),
    "b1-fwd-k-short": (b1_forward_k_short, frozenset({"EGF001"}), False),
    "dw-ldc-below-rows": (dw_ldc_below_rows, frozenset({"EGF001"}), False),
    "column-gemm-ldc-below-rows": (column_gemm_ldc_below_rows, frozenset({"EGF001"}), False),
    # the capture's integrity
    "malformed-line-then-k-sh2": (malformed_line_then_k_short, REFUSED, False),
    "manifest-exit-139": (manifest_exit_139, INCOMPLETE, False),
    "manifest-exit-sigsegv": (manifest_sigsegv, INCOMPLETE, False),
    # the exit-event pair: the audit before the recorder wrote the event passes both, so
    # `no-exit-event` is the one it gets wrong; `clean-with-exit-event` must pass
    "no-exit-event": (no_exit_event, INCOMPLETE, False),
    "events-cut-off-mid-line": (events_cut_off, INCOMPLETE, False),
    "second-process-scale-off-by-one": (second_process_off_by_one, _SCALE_VISIBLE, False),
}

# Codes a lie must also fail with the trainer's layout file only: a region that leaves its
# buffer, where inference names the buffer from the faulty launch itself.
WITH_LAYOUT_ALSO: dict[str, frozenset[str]] = {
    "accumulate-sh2-plus-1": frozenset({"EGF001"}),  # d_h_s2 as [B, SH2 + 1]: past its end
    "scale-isv-in-params": frozenset({"EGF001"}),  # isv[isv_index] far past params' end
    "scale-isv-in-dx": frozenset({"EGF001"}),  # isv[isv_index] before the dX buffer's start
}

# Without the layout file these codes may be left undecided (naming the GEMM) but never pass.
NOT_PASS_WITHOUT_LAYOUT: dict[str, frozenset[str]] = {
    "b1-fwd-k-short": frozenset({"EGF001"}),
}


def make(name: str, dst_folder: Path, with_layout: bool) -> Path:
    """Write the lie `name` as a capture folder (the layout file only `with_layout`)."""
    function, _, needs_layout = LIES[name]
    if needs_layout and not with_layout:
        raise ValueError(f"{name} is visible only with the trainer's layout file")
    return write(rerecord(function(base())), Path(dst_folder), with_layout)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python lies.py OUT_DIR [--without-layout]")
    out, with_layout = Path(sys.argv[1]), "--without-layout" not in sys.argv[2:]
    for slug, (_, _, layout_only) in LIES.items():
        if with_layout or not layout_only:
            print(make(slug, out / slug, with_layout))
