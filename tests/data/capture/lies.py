"""Lying captures: each one made from the recorded clean capture (`clean/`) by editing what the
recorder would have written had the trainer carried one real wiring bug.

A lie edits the launch arguments and everything the recorder derives from them: the snapshot
regions' pointers and walk (`ptr`, `elements`, `rows`, `ld`, `skip_col`, as
`egf_capture_recorder.c` takes them for the edited arguments), the snapshots of a launch removed
or added with it, `seq` renumbered so it stays strictly increasing (`launch` follows its launch),
and the snapshots file rebuilt so every `offset`/`count` points at the values kept. Values and
hashes change only where the lie is about values the recorder would have seen and the capture
determines them: a kept value is recomputed in fp32 as the kernel computes it (an accumulate's
`before + d_concat`, a Polyak update, a gated or zeroed wire) and a hash is recomputed over
elements whose every value is known (a zeroed wire column, a copied region). Where the lie
changes a region's content beyond the values the capture kept, its hash is replaced by a stand-in
(`stand_in_hash`): distinct from every recorded hash, and the same wherever the recorder would
have hashed the same bytes (a body left untouched by a scale, the target between two Polyak
updates, one accumulate's `after` and the next one's `before`). Regions downstream of a lie that
no snapshot determines keep their recorded values.

The clean capture predates the recorder's exit event (`{"ev": "exit", ...}`, written when the
process ends through exit()); every capture here gets one appended, as the recorder now writes
it, except the lie `no-exit-event`.

`LIES` maps a slug to (function, expected, needs_layout): the function takes the parsed clean
capture and returns it edited; `expected` is the set of invariant codes that must FAIL on it,
`REFUSED` (exit 2: the capture is malformed), `INCOMPLETE` (exit 1, naming what is incomplete)
or `PASSES` (a control: it must pass); `needs_layout` marks lies only the trainer's layout file
can show. `WITH_LAYOUT_ALSO` adds codes that must fail only with the layout file (a region that
leaves its allocation, where inference names the allocation from the faulty launch itself);
`NOT_PASS_WITHOUT_LAYOUT` names codes that inference may leave undecided but never pass.
Usage: `python lies.py OUT_DIR [--without-layout]` writes every lie to OUT_DIR/SLUG.
"""

from __future__ import annotations

import gzip
import json
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CLEAN = Path(__file__).resolve().parent / "clean"
VALUES_MAX = 32  # the clean capture was taken with --values-max 32
FNV_OFFSET, FNV_PRIME, MASK64 = 1469598103934665603, 1099511628211, (1 << 64) - 1

REFUSED, INCOMPLETE = "refused", "incomplete"
PASSES: frozenset[str] = frozenset()

CONCAT, SCALE = "sp14_dir_concat_qaux", "sp14_scale_wire_col"
ACCUMULATE, POLYAK = "accumulate_d_h_s2_from_concat", "polyak_ema"
DIR_DX = "sp14_d_dir_qaux_concat"
GATE_INDEX = 393
TAU = 0.005
SECOND_PID = 4871  # the faulty second trainer process of `second-process-scale-off-by-one`

# The ABI kernels' parameters (SPEC section 3) and how the recorder stores each one's bytes.
PARAMS = {
    CONCAT: ("concat", "h_s2", "aux_softmax", "rows", "sh2", "auxk", "up_idx", "down_idx"),
    SCALE: ("dx_concat", "isv", "rows", "ld", "wire_col", "isv_index"),
    ACCUMULATE: ("d_h_s2", "d_concat", "rows", "sh2", "ld_concat"),
    POLYAK: ("target", "online", "tau", "n"),
}
POINTERS = {  # the parameters that are device pointers (8 bytes, stored as is)
    "concat",
    "h_s2",
    "aux_softmax",
    "dx_concat",
    "isv",
    "d_h_s2",
    "d_concat",
    "target",
    "online",
}


# ---- the capture as read ----
@dataclass
class Process:
    """One process's events in file order. A snapshot event carries `_launch` (the event it
    was taken around; a `step_start` region, itself) and `_values` (the values kept); an event
    a lie inserts or moves carries `_new`; a line that is not JSON is `{"_raw": text}`."""

    pid: int
    events: list[dict[str, Any]]


@dataclass
class Capture:
    processes: list[Process]
    layout: dict[str, Any]
    manifest: dict[str, Any]

    @property
    def main(self) -> Process:
        return self.processes[0]

    def base(self, buffer: str) -> int:
        return self.layout["buffers"][buffer]["address"]

    def dim(self, name: str) -> int:
        return self.layout["dims"][name]


def read(folder: Path = CLEAN) -> Capture:
    processes = []
    for path in sorted(folder.glob("events-*.jsonl.gz")):
        pid = int(re.search(r"events-(\d+)", path.name).group(1))
        blob = gzip.decompress((folder / f"snapshots-{pid}.bin.gz").read_bytes())
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            events = [json.loads(line) for line in lines if line.strip()]
        by_seq = {e["seq"]: e for e in events}
        for e in events:
            if e["ev"] == "snapshot":
                e["_launch"] = by_seq[e["launch"]]
                e["_values"] = np.frombuffer(blob, np.float32, e["count"], e["offset"]).copy()
                # the lies take what a --values-max 32 capture did not keep as unknown: a base
                # that kept every value would need them derived from it instead
                assert e["count"] == min(e["elements"], VALUES_MAX) or e["skip_col"] >= 0, e
        processes.append(Process(pid, events))
    layout = json.loads(gzip.decompress((folder / "layout.json.gz").read_bytes()))
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return Capture(processes, layout, manifest)


def base() -> Capture:
    """The clean capture as the recorder writes it now: with its exit event."""
    capture = read()
    for proc in capture.processes:
        tid = proc.events[-1]["tid"]
        proc.events.append({"ev": "exit", "seq": 0, "tid": tid, "pid": proc.pid, "_new": True})
    return capture


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


def write(capture: Capture, dst: Path, with_layout: bool) -> Path:
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
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
            public = {k: v for k, v in e.items() if not k.startswith("_")}
            lines.append(json.dumps(public, separators=(",", ":")))
        with gzip.open(dst / f"events-{proc.pid}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        (dst / f"snapshots-{proc.pid}.bin.gz").write_bytes(gzip.compress(bytes(blob), mtime=0))
    if with_layout:
        text = json.dumps(capture.layout, sort_keys=True).encode()
        (dst / "layout.json.gz").write_bytes(gzip.compress(text, mtime=0))
    manifest = json.dumps(capture.manifest, indent=1) + "\n"
    (dst / "manifest.json").write_text(manifest, encoding="utf-8")
    return dst


# ---- hashes ----
def fnv1a(values: np.ndarray) -> str:
    """The recorder's region hash: FNV-1a 64 over each element's 4 little-endian bytes."""
    h = FNV_OFFSET
    for byte in np.ascontiguousarray(values, dtype="<f4").tobytes():
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return f"{h:016x}"


def zeros_hash(elements: int) -> str:
    return fnv1a(np.zeros(elements, np.float32))


def stand_in_hash(*tag: object) -> str:
    """The hash of a region the lie changed beyond the values a capture keeps (module doc)."""
    h = FNV_OFFSET
    for byte in repr(tag).encode():
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return f"{h:016x}"


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


# ---- finding and editing events ----
def is_kernel(e: dict[str, Any], name: str | None = None) -> bool:
    return e.get("ev") == "kernel" and (name is None or e["name"] == name)


def kernels(proc: Process, name: str) -> list[dict[str, Any]]:
    return [e for e in proc.events if is_kernel(e, name)]


def snapshots(proc: Process, launch: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in proc.events if e.get("ev") == "snapshot" and e["_launch"] is launch]


def snapshot(proc: Process, launch: dict[str, Any], when: str, region: str) -> dict[str, Any]:
    return next(s for s in snapshots(proc, launch) if s["when"] == when and s["region"] == region)


def arg(k: dict[str, Any], name: str) -> int | float:
    value = k["params"][PARAMS[k["name"]].index(name)][1]
    if name == "tau":
        return struct.unpack("<f", struct.pack("<I", value))[0]
    if name in POINTERS or name == "n":
        return value
    return struct.unpack("<i", struct.pack("<I", value & 0xFFFFFFFF))[0]


def set_arg(k: dict[str, Any], name: str, value: int | float) -> None:
    """A kernel parameter as the recorder stores it: its bytes as an unsigned integer."""
    slot = k["params"][PARAMS[k["name"]].index(name)]
    if name == "tau":
        slot[1] = struct.unpack("<I", struct.pack("<f", value))[0]
    elif name in POINTERS or name == "n":
        slot[1] = int(value) & MASK64
    else:
        slot[1] = int(value) & 0xFFFFFFFF


def _index(proc: Process, event: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(proc.events) if e is event)


def span(proc: Process, launch: dict[str, Any]) -> list[dict[str, Any]]:
    """A launch and the snapshot events the recorder wrote around it."""
    return [launch, *snapshots(proc, launch)]


def remove(proc: Process, events: list[dict[str, Any]]) -> None:
    gone = {id(e) for e in events}
    proc.events = [e for e in proc.events if id(e) not in gone]


def insert(proc: Process, at: int, events: list[dict[str, Any]]) -> None:
    for e in events:
        e["_new"] = True
    proc.events[at:at] = events


def insert_after(proc: Process, anchor: dict[str, Any], events: list[dict[str, Any]]) -> None:
    last = span(proc, anchor)[-1] if is_kernel(anchor) else anchor
    insert(proc, _index(proc, last) + 1, events)


def memory_event(ev: str, api: str, dst: int, src: int, nbytes: int, value: int) -> dict:
    return {
        "ev": ev,
        "seq": 0,
        "tid": 0,
        "api": api,
        "dst": dst,
        "src": src,
        "bytes": nbytes,
        "value": value,
    }


def unknown_kernel(name: str, pointer: int, tid: int) -> dict[str, Any]:
    """A kernel egf-audit's table does not know, as the recorder writes one: raw parameters."""
    return {
        "ev": "kernel",
        "seq": 0,
        "tid": tid,
        "api": "cuLaunchKernel",
        "name": name,
        "grid": [1, 1, 1],
        "block": [64, 1, 1],
        "params": [[8, pointer]],
    }


def _tid(proc: Process) -> int:
    return proc.events[0]["tid"]


# ---- cuBLAS calls (the logger's lines) ----
_ARG = re.compile(r"^\s*i!\s+(\w+):")


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
    return calls


def gemm_arg(call: dict[str, dict[str, Any]], key: str) -> int | str:
    raw = call[key]["msg"].split("val=", 1)[1].strip()
    if (ptr := re.search(r"HEX:(?:0x)?0x([0-9a-fA-F]+)", raw)) is not None:
        return int(ptr.group(1), 16)
    if (op := re.search(r"CUBLAS_OP_([NTC])", raw)) is not None:
        return op.group(1)
    return int(raw.split()[0])


def set_gemm_int(call: dict[str, dict[str, Any]], key: str, value: int) -> None:
    e = call[key]
    e["msg"] = re.sub(r"val=-?\d+", f"val={value}", e["msg"], count=1)


def gemm_reading(capture: Capture, proc: Process, buffer: str, transa: str, k: int) -> list:
    """The GEMM calls whose B operand starts `buffer` with op(A) = transa and the given k."""
    start = capture.base(buffer)
    return [
        c
        for c in gemm_calls(proc)
        if gemm_arg(c, "B") == start and gemm_arg(c, "transa") == transa and gemm_arg(c, "k") == k
    ]


# ---- steps and call sites ----
@dataclass
class Site:
    step: int
    name: str  # "cql" or "main", as the seed names the two backward_full call sites
    rebuild: dict[str, Any]  # sp14_dir_concat_qaux(save_h_s2) ahead of the site
    zeroing: dict[str, Any]  # the memset of d_h_s2
    scale: dict[str, Any] | None
    accumulates: list[dict[str, Any]]


def sites(capture: Capture, proc: Process) -> list[Site]:
    """The call sites: a concat rebuild then the memset of d_h_s2, the scale, the accumulates."""
    d_h_s2 = capture.base("d_h_s2")
    found: list[Site] = []
    step = 0
    for i, e in enumerate(proc.events):
        if is_kernel(e, POLYAK):
            step += 1
        elif e.get("ev") == "memset" and e["dst"] == d_h_s2 and is_kernel(proc.events[i - 1]):
            if proc.events[i - 1]["name"] == CONCAT:
                name = "main" if found and found[-1].step == step else "cql"
                found.append(Site(step, name, proc.events[i - 1], e, None, []))
        elif found and is_kernel(e, SCALE) and found[-1].scale is None:
            found[-1].scale = e
        elif found and is_kernel(e, ACCUMULATE):
            found[-1].accumulates.append(e)
    return found


def site(capture: Capture, step: int, name: str) -> Site:
    return next(s for s in sites(capture, capture.main) if s.step == step and s.name == name)


# ---- what the recorder derives from edited launches ----
def _kept(values: np.ndarray, elements: int) -> np.ndarray:
    return values[: min(elements, VALUES_MAX)]


def rederive_scale(
    proc: Process, k: dict[str, Any], old: dict[str, int], tag: str, alpha: float | None = None
) -> None:
    """The snapshots around a scale launch for its arguments: the wire = column ld - 1 of a
    [rows, ld] view at dx_concat (values), the body = the rest (hash), alpha = isv[isv_index].
    `old`: the arguments the recorded snapshots were taken with; `alpha`: the value at the new
    isv + isv_index, when the lie moved it."""
    dx, rows, ld = arg(k, "dx_concat"), arg(k, "rows"), arg(k, "ld")
    moved = (dx, rows, ld) != (old["dx_concat"], old["rows"], old["ld"])
    regions = {(s["when"], s["region"]): s for s in snapshots(proc, k)}
    a = regions[("before", "alpha")]
    a["ptr"] = arg(k, "isv") + 4 * arg(k, "isv_index")
    if alpha is not None:
        a["_values"] = np.array([alpha], np.float32)
        a["hash"] = fnv1a(a["_values"])
    gate = np.float32(a["_values"][0])
    for when in ("before", "after"):
        wire, body = regions[(when, "wire")], regions[(when, "body")]
        wire.update(ptr=dx, elements=rows, rows=rows, ld=1, skip_col=-1)
        wire["_values"] = _kept(wire["_values"], rows)
        body.update(ptr=dx, elements=rows * ld, rows=rows, ld=ld, skip_col=ld - 1)
        if moved:
            wire["hash"] = stand_in_hash(tag, k["seq"], when, "wire")
            body["hash"] = stand_in_hash(tag, k["seq"], "body")  # a scale leaves the body alone
    # the scale writes column wire_col; the recorder snapshots column ld - 1
    if arg(k, "wire_col") == ld - 1:
        before, after = regions[("before", "wire")], regions[("after", "wire")]
        if gate == 0:
            after["_values"] = np.zeros_like(after["_values"])
            after["hash"] = zeros_hash(rows)
        elif alpha is not None or moved:
            after["_values"] = (gate * before["_values"]).astype(np.float32)
            after["hash"] = stand_in_hash(tag, k["seq"], "after", "wire")


def edit_scale(proc: Process, k: dict[str, Any], tag: str, alpha: float | None = None, **new):
    old = {name: arg(k, name) for name in PARAMS[SCALE]}
    for name, value in new.items():
        set_arg(k, name, value)
    rederive_scale(proc, k, old, tag, alpha)


def rederive_accumulates(
    proc: Process,
    accumulates: list[dict[str, Any]],
    tag: str,
    changed_from: int = 0,
    start: tuple[np.ndarray, str] | None = None,
) -> None:
    """The snapshots of one call site's accumulate launches, in order, for their arguments:
    d_h_s2 and d_concat walked as the recorder walks them (rows * sh2, rows * ld_concat
    elements); each `before` is the previous launch's `after` (the same bytes: its values, and
    its hash where it covers as many elements); `after` = before + d_concat[:, :sh2] on the kept
    values, in fp32 as the kernel adds. From `changed_from` on, and wherever a walk changed,
    a region covers content the lie changed (a stand-in hash). `start`: the first launch's
    `before` (values, hash) when the lie changed it."""
    previous = None
    for i, k in enumerate(accumulates):
        rows, sh2, ld = arg(k, "rows"), arg(k, "sh2"), arg(k, "ld_concat")
        before = snapshot(proc, k, "before", "d_h_s2")
        source = snapshot(proc, k, "before", "d_concat")
        after = snapshot(proc, k, "after", "d_h_s2")
        walked = (before["ptr"], before["elements"])
        for s in (before, after):
            s.update(ptr=arg(k, "d_h_s2"), elements=rows * sh2, rows=1, ld=rows * sh2)
        if (source["ptr"], source["elements"]) != (arg(k, "d_concat"), rows * ld):
            source.update(ptr=arg(k, "d_concat"), elements=rows * ld, rows=1, ld=rows * ld)
            source["hash"] = stand_in_hash(tag, k["seq"], i, "d_concat")
        rewalked = walked != (before["ptr"], before["elements"])
        if previous is not None and previous["ptr"] == before["ptr"]:
            before["_values"] = _kept(previous["_values"], before["elements"]).copy()
            same = previous["elements"] == before["elements"]
            before["hash"] = previous["hash"] if same else stand_in_hash(tag, k["seq"], i)
        elif i == 0 and start is not None:
            before["_values"], before["hash"] = start[0].copy(), start[1]
        elif rewalked:
            before["hash"] = stand_in_hash(tag, k["seq"], i, "before")
        old = before["_values"]
        idx = np.arange(old.size)
        src = (idx // sh2) * ld + idx % sh2
        ok = src < source["_values"].size
        new = old.copy()
        new[ok] = (old[ok] + source["_values"][src[ok]]).astype(np.float32)
        after["_values"] = new
        if i >= changed_from or rewalked:
            after["hash"] = stand_in_hash(tag, k["seq"], i, "after")
        previous = after


def _polyak(tau: float, online: np.ndarray, target: np.ndarray) -> np.ndarray:
    """target = tau * online + (1 - tau) * target, as the kernel computes it (one fma)."""
    t = np.float32(tau)
    rest = ((np.float32(1) - t) * target).astype(np.float32).astype(np.float64)
    return (np.float64(t) * online.astype(np.float64) + rest).astype(np.float32)


# ---- the lies: the scale's arguments (EGF008, and EGF003/EGF004 where the gate's values can
# no longer be shown) ----
def scale_ld_sh2(capture: Capture) -> Capture:
    """The seed's off-by-one moved into the scale: ld = SH2, wire_col = SH2 - 1 (column SH2 - 1
    of a stride-SH2 view), at every scale launch."""
    sh2 = capture.dim("SH2")
    for k in kernels(capture.main, SCALE):
        edit_scale(capture.main, k, "scale-ld-sh2", ld=sh2, wire_col=sh2 - 1)
    return capture


def scale_rows_short(capture: Capture) -> Capture:
    """The scale covers B - 1 rows: the last row's wire gradient flows ungated."""
    for k in kernels(capture.main, SCALE):
        edit_scale(capture.main, k, "scale-rows", rows=capture.dim("B") - 1)
    return capture


def _isv_route(capture: Capture, buffer: str, element: int = 0) -> dict[str, int]:
    """isv pointing at `element` of `buffer`, isv_index reaching ISV[393] from there."""
    isv = capture.base(buffer) + 4 * element
    gate = capture.base("isv_signals") + 4 * GATE_INDEX
    return {"isv": isv, "isv_index": (gate - isv) // 4}


def scale_isv_in_params(capture: Capture) -> Capture:
    """isv points into `params`; isv_index reaches ISV[393] from there (the gate's value read,
    through a pointer that is not the ISV buffer)."""
    for k in kernels(capture.main, SCALE):
        edit_scale(capture.main, k, "isv-params", **_isv_route(capture, "params"))
    return capture


def scale_isv_in_dx(capture: Capture) -> Capture:
    """isv points at the start of sp14_d_dir_qaux_concat; a negative isv_index reaches
    ISV[393] from there."""
    for k in kernels(capture.main, SCALE):
        edit_scale(capture.main, k, "isv-dx", **_isv_route(capture, DIR_DX))
    return capture


def scale_isv_plus_one(capture: Capture) -> Capture:
    """isv = base of isv_signals + 4 and isv_index = 392: the same element by another route;
    the contract says isv is the base and isv_index 393."""
    for k in kernels(capture.main, SCALE):
        route = _isv_route(capture, "isv_signals", 1)
        edit_scale(capture.main, k, "isv-plus-one", **route)
    return capture


def scale_isv_index_392(capture: Capture) -> Capture:
    """The scale reads ISV[392]: zeroed at allocation and written by nothing (the producer writes
    ISV[393]), so both steps run closed and the live gate never reaches the wire."""
    for k in kernels(capture.main, SCALE):
        edit_scale(capture.main, k, "isv-392", alpha=0.0, isv_index=GATE_INDEX - 1)
    return capture


def scale_dx_other_buffer(capture: Capture) -> Capture:
    """The scale gates sp14_d_b2_concat (the same [B, SH2 + 1] shape) instead of the dir dX."""
    for k in kernels(capture.main, SCALE):
        edit_scale(capture.main, k, "dx-b2", dx_concat=capture.base("sp14_d_b2_concat"))
    return capture


def scale_dx_row_offset(capture: Capture) -> Capture:
    """wire_col = SH2 and ld = SH2 + 1, but dx_concat one row in: the scale gates rows 1..B of
    the wire, row 0 stays ungated and the last row lies past the buffer."""
    ld = capture.dim("SH2") + 1
    for k in kernels(capture.main, SCALE):
        edit_scale(capture.main, k, "dx-row", dx_concat=capture.base(DIR_DX) + 4 * ld)
    return capture


def scale_before_dx_gemm(capture: Capture) -> Capture:
    """Step 0's cql site runs its scale before backward_full (right after zeroing d_h_s2): it
    gates the dX buffer as allocated (zeros) and the dX GEMM's wire column stays ungated."""
    proc, s = capture.main, site(capture, 0, "cql")
    moved = span(proc, s.scale)
    remove(proc, moved)
    rows, ld = arg(s.scale, "rows"), arg(s.scale, "ld")
    for r in moved[1:]:
        if r["region"] == "wire":
            r["_values"], r["hash"] = np.zeros_like(r["_values"]), zeros_hash(rows)
        elif r["region"] == "body":
            r["hash"] = zeros_hash(rows * ld - rows)
    insert_after(proc, s.zeroing, moved)
    source = snapshot(proc, s.accumulates[0], "before", "d_concat")
    source["hash"] = stand_in_hash("scale-before-dx", "ungated wire")
    return capture


# ---- the accumulates (EGF007) ----
def accumulate_missing(capture: Capture) -> Capture:
    """The main site never accumulates branch 2's dX into d_h_s2 (every step)."""
    for s in sites(capture, capture.main):
        if s.name == "main":
            dropped = s.accumulates[2]
            remove(capture.main, span(capture.main, dropped))
            rest = [k for k in s.accumulates if k is not dropped]
            rederive_accumulates(capture.main, rest, "acc-missing", changed_from=2)
    return capture


def accumulate_twice(capture: Capture) -> Capture:
    """The main site accumulates branch 1's dX twice (the same d_concat, every step)."""
    proc = capture.main
    for s in sites(capture, proc):
        if s.name != "main":
            continue
        original = s.accumulates[1]
        twin = dict(original, params=[list(p) for p in original["params"]])
        copies = [twin]
        for r in snapshots(proc, original):
            copies.append(dict(r, _launch=twin, _values=r["_values"].copy()))
        insert_after(proc, original, copies)
        chain = [*s.accumulates[:2], twin, *s.accumulates[2:]]
        rederive_accumulates(proc, chain, "acc-twice", changed_from=2)
    return capture


def accumulate_site_dropped(capture: Capture) -> Capture:
    """The cql site accumulates nothing into d_h_s2 (all four launches gone, every step)."""
    for s in sites(capture, capture.main):
        if s.name == "cql":
            for k in s.accumulates:
                remove(capture.main, span(capture.main, k))
    return capture


def _edit_dir_accumulates(capture: Capture, tag: str, **new: int) -> Capture:
    for s in sites(capture, capture.main):
        for name, value in new.items():
            set_arg(s.accumulates[0], name, value)
        rederive_accumulates(capture.main, s.accumulates, tag)
    return capture


def accumulate_sh2_plus_one(capture: Capture) -> Capture:
    """The dir accumulate adds sh2 = SH2 + 1 columns: the wire column goes into d_h_s2, whose
    [B, SH2 + 1] view runs past its end."""
    return _edit_dir_accumulates(capture, "acc-sh2", sh2=capture.dim("SH2") + 1)


def accumulate_ld_sh2(capture: Capture) -> Capture:
    """The dir accumulate reads sp14_d_dir_qaux_concat with ld_concat = SH2."""
    return _edit_dir_accumulates(capture, "acc-ld", ld_concat=capture.dim("SH2"))


def accumulate_rows_short(capture: Capture) -> Capture:
    """The dir accumulate covers B - 1 rows of d_h_s2."""
    return _edit_dir_accumulates(capture, "acc-rows", rows=capture.dim("B") - 1)


def accumulate_b1_ld(capture: Capture) -> Capture:
    """Branch 1 (two extra columns, row stride SH2 + 2) accumulated with ld_concat = SH2 + 1:
    only its layout entry says its stride."""
    for s in sites(capture, capture.main):
        set_arg(s.accumulates[1], "ld_concat", capture.dim("SH2") + 1)
        rederive_accumulates(capture.main, s.accumulates, "acc-b1-ld", changed_from=1)
    return capture


# ---- Polyak (EGF005) ----
def _polyak_regions(proc: Process, k: dict[str, Any]) -> tuple[dict, dict, dict]:
    return (
        snapshot(proc, k, "before", "target"),
        snapshot(proc, k, "before", "online"),
        snapshot(proc, k, "after", "target"),
    )


def _step_start(proc: Process) -> list[dict[str, Any]]:
    return [e for e in proc.events if e.get("ev") == "snapshot" and e["when"] == "step_start"]


def polyak_online_grad_buf(capture: Capture) -> Capture:
    """Polyak averages grad_buf into the target (online = base of grad_buf). The gradients'
    values are not in the capture: the online region keeps its values, its hash is grad_buf's."""
    proc = capture.main
    for i, k in enumerate(kernels(proc, POLYAK)):
        set_arg(k, "online", capture.base("grad_buf"))
        online = snapshot(proc, k, "before", "online")
        online.update(ptr=capture.base("grad_buf"), hash=stand_in_hash("grad_buf", i))
    return capture


def polyak_target_is_params(capture: Capture) -> Capture:
    """Polyak with target = params: the online net averaged into itself, the target never
    updated. The recorder snapshots params as the target, then at the next step's start."""
    proc, params = capture.main, capture.base("params")
    for i, k in enumerate(kernels(proc, POLYAK)):
        set_arg(k, "target", params)
        target, online, after = _polyak_regions(proc, k)
        target.update(ptr=params, hash=online["hash"], _values=online["_values"].copy())
        after["ptr"] = params
        after["_values"] = _polyak(arg(k, "tau"), online["_values"], online["_values"])
        after["hash"] = stand_in_hash("target-is-params", i)
        # the next step's start: params as this update left them
        start = next((r for r in _step_start(proc) if r["seq"] > k["seq"]), None)
        if start is not None:
            start.update(ptr=params, hash=after["hash"], _values=after["_values"].copy())
    return capture


def polyak_n_short(capture: Capture) -> Capture:
    """Polyak with n one short of the whole net: the last parameter's target never moves."""
    proc = capture.main
    n = capture.layout["buffers"]["params"]["bytes"] // 4 - 1
    for k in kernels(proc, POLYAK):
        set_arg(k, "n", n)
    for r in proc.events:
        if r.get("ev") == "snapshot" and r["region"] in ("target", "online"):
            # one stand-in per recorded hash: the regions the recorder saw as the same bytes
            # (the target between two updates) stay the same
            r.update(elements=n, ld=n, hash=stand_in_hash("n-short", r["hash"]))
    return capture


def polyak_tau_swapped(capture: Capture) -> Capture:
    """tau and 1 - tau swapped: target = 0.995 * params + 0.005 * target."""
    proc, tau = capture.main, float(np.float32(1 - TAU))
    carried = None  # the target as the last update left it: values, hash
    for i, k in enumerate(kernels(proc, POLYAK)):
        set_arg(k, "tau", tau)
        target, online, after = _polyak_regions(proc, k)
        if carried is not None:
            target["_values"], target["hash"] = carried[0].copy(), carried[1]
        after["_values"] = _polyak(tau, online["_values"], target["_values"])
        after["hash"] = stand_in_hash("tau-swapped", i)
        carried = (after["_values"], after["hash"])
        start = next((r for r in _step_start(proc) if r["seq"] > k["seq"]), None)
        if start is not None:
            start["_values"], start["hash"] = carried[0].copy(), carried[1]
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


# ---- zeroing d_h_s2 (EGF007) ----
def zero_missing(capture: Capture) -> Capture:
    """Step 0's first call site never zeroes d_h_s2: only the allocation's memset did (the
    values are the same; only the launches show it)."""
    remove(capture.main, [site(capture, 0, "cql").zeroing])
    return capture


def zero_then_stale_copy(capture: Capture) -> Capture:
    """Step 0's main site copies stale data (tgt_h_s2) into d_h_s2 after zeroing it, before its
    backward GEMMs. The copied values are not in the capture: the kept ones stay, the site's
    d_h_s2 hashes are the stale content's."""
    proc, s = capture.main, site(capture, 0, "main")
    nbytes = s.zeroing["bytes"]
    copy = memory_event(
        "copy", "cuMemcpyDtoDAsync_v2", capture.base("d_h_s2"), capture.base("tgt_h_s2"), nbytes, 0
    )
    copy["tid"] = _tid(proc)
    insert_after(proc, s.zeroing, [copy])
    first = snapshot(proc, s.accumulates[0], "before", "d_h_s2")
    start = (first["_values"], stand_in_hash("stale-copy", "before"))
    rederive_accumulates(proc, s.accumulates, "stale-copy", start=start)
    return capture


def zero_half(capture: Capture) -> Capture:
    """Step 0's first call site zeroes only half of d_h_s2 (the other half still holds the
    allocation's zeros there: the values are the same, the memset's extent shows it)."""
    s = site(capture, 0, "cql")
    s.zeroing["bytes"] //= 2
    return capture


def zero_with_byte_one(capture: Capture) -> Capture:
    """cudaMemset(d_h_s2, 1, ...) at every site: each float becomes 0x01010101 (2.4e-38) instead
    of +0.0; value-FC dX lands on it with beta = 1 and rounds it away almost everywhere."""
    proc = capture.main
    tiny = np.array([0x01010101], np.uint32).view(np.float32)[0]
    for i, s in enumerate(sites(capture, proc)):
        s.zeroing["value"] = 1
        first = snapshot(proc, s.accumulates[0], "before", "d_h_s2")
        values = (first["_values"] + tiny).astype(np.float32)
        if np.array_equal(_bits(values), _bits(first["_values"])):
            continue  # no kept value moved; a stand-in would claim what the capture cannot show
        start = (values, stand_in_hash("byte-one", i))
        rederive_accumulates(proc, s.accumulates, f"byte-one-{i}", start=start)
    return capture


# ---- the wire overwritten between the scale and the accumulate (EGF008) ----
def wire_memset(capture: Capture) -> Capture:
    """Step 0's cql site fills sp14_d_dir_qaux_concat with 1.0 (cuMemsetD32, 0x3f800000) after
    its scale, before its accumulates: the gated wire and the dir dX are gone."""
    proc, s = capture.main, site(capture, 0, "cql")
    nbytes = capture.layout["buffers"][DIR_DX]["bytes"]
    fill = memory_event("memset", "cuMemsetD32Async", capture.base(DIR_DX), 0, nbytes, 0x3F800000)
    fill["tid"] = _tid(proc)
    insert_after(proc, s.scale, [fill])
    source = snapshot(proc, s.accumulates[0], "before", "d_concat")
    source["_values"] = np.ones_like(source["_values"])
    source["hash"] = fnv1a(np.ones(nbytes // 4, np.float32))
    rederive_accumulates(proc, s.accumulates, "wire-memset")
    return capture


def wire_copy(capture: Capture) -> Capture:
    """Step 0's cql site copies sp14_d_b2_concat over sp14_d_dir_qaux_concat after its scale,
    before its accumulates (the recorder's d_concat snapshot then shows branch 2's dX)."""
    proc, s = capture.main, site(capture, 0, "cql")
    nbytes = capture.layout["buffers"][DIR_DX]["bytes"]
    src = capture.base("sp14_d_b2_concat")
    copy = memory_event("copy", "cuMemcpyDtoDAsync_v2", capture.base(DIR_DX), src, nbytes, 0)
    copy["tid"] = _tid(proc)
    insert_after(proc, s.scale, [copy])
    source = snapshot(proc, s.accumulates[0], "before", "d_concat")
    b2 = snapshot(proc, s.accumulates[2], "before", "d_concat")
    source["_values"], source["hash"] = b2["_values"].copy(), b2["hash"]
    rederive_accumulates(proc, s.accumulates, "wire-copy")
    return capture


def wire_unknown_kernel(capture: Capture) -> Capture:
    """Step 0's cql site launches a kernel egf-audit does not know, handed a pointer to the wire
    column of sp14_d_dir_qaux_concat, after its scale and before its accumulates."""
    proc, s = capture.main, site(capture, 0, "cql")
    pointer = capture.base(DIR_DX) + 4 * capture.dim("SH2")
    insert_after(proc, s.scale, [unknown_kernel("fill_f32", pointer, _tid(proc))])
    return capture


def target_unknown_writer(capture: Capture) -> Capture:
    """In the middle of step 0 (no step-start snapshot yet proves the target unchanged), a kernel
    egf-audit does not know is handed a pointer into target_params (its w_b0fc)."""
    proc = capture.main
    pointer = capture.base("target_params") + 4 * capture.layout["param_offsets"]["w_b0fc"][0]
    anchor = site(capture, 0, "cql").rebuild
    insert(proc, _index(proc, anchor), [unknown_kernel("copy_f32", pointer, _tid(proc))])
    return capture


# ---- the gate's snapshots (EGF003) ----
def scale_snapshots_missing_and_wire_nonzero(capture: Capture) -> Capture:
    """Step 0's main-site scale has no snapshots (as when its stream was being captured into a
    graph), while step 0's cql-site scale shows wire row 5 ungated under ISV[393] = 0."""
    proc = capture.main
    remove(proc, snapshots(proc, site(capture, 0, "main").scale))
    scale = site(capture, 0, "cql").scale
    before, after = snapshot(proc, scale, "before", "wire"), snapshot(proc, scale, "after", "wire")
    wire = np.zeros(after["elements"], np.float32)  # the recorded hash says all rows are +0.0
    assert after["hash"] == fnv1a(wire)
    wire[5] = before["_values"][5]
    after["_values"], after["hash"] = _kept(wire, wire.size).copy(), fnv1a(wire)
    return capture


def wire_hash_nonzero(capture: Capture) -> Capture:
    """Step 0's cql-site scale: the kept 32 rows of the wire are +0.0 under ISV[393] = 0, the
    hash says a row beyond them (row 40) is not. Only the hash changes."""
    proc = capture.main
    scale = site(capture, 0, "cql").scale
    before, after = snapshot(proc, scale, "before", "wire"), snapshot(proc, scale, "after", "wire")
    wire = np.zeros(after["elements"], np.float32)
    wire[40] = before["_values"][5]  # an ungated gradient's magnitude
    after["hash"] = fnv1a(wire)
    return capture


# ---- GEMMs (EGF001, EGF011) and the capture's integrity ----
def malformed_line_then_k_short(capture: Capture) -> Capture:
    """A line that is not JSON in the middle of the events, and after it step 1's online forward
    GEMM on the concat scratch with k = SH2: reading up to the bad line would miss the bug."""
    proc, sh2 = capture.main, capture.dim("SH2")
    calls = gemm_reading(capture, proc, "sp14_dir_qaux_concat_scratch", "T", sh2 + 1)
    params, nbytes = capture.base("params"), capture.layout["buffers"]["params"]["bytes"]
    online = [c for c in calls if params <= gemm_arg(c, "A") < params + nbytes]
    call = next(c for c in online if c[""]["seq"] > _first_polyak(proc))
    set_gemm_int(call, "k", sh2)
    torn = f'{{"ev":"kernel","seq":{call[""]["seq"] - 1},"tid":{_tid(proc)},"api":"cuLau'
    insert(proc, _index(proc, call[""]), [{"_raw": torn}])
    return capture


def _first_polyak(proc: Process) -> int:
    return kernels(proc, POLYAK)[0]["seq"]


def manifest_exit_139(capture: Capture) -> Capture:
    """The command died of SIGSEGV, as a shell reports it (exit 139)."""
    capture.manifest["exit_code"] = 139
    return capture


def manifest_sigsegv(capture: Capture) -> Capture:
    """The command died of SIGSEGV, as Python's subprocess reports it (-11)."""
    capture.manifest["exit_code"] = -11
    return capture


def no_exit_event(capture: Capture) -> Capture:
    """The process never ended through exit(): the recorder wrote no exit event (the clean
    capture as committed, which predates the event)."""
    for proc in capture.processes:
        proc.events = [e for e in proc.events if e.get("ev") != "exit"]
    return capture


def clean(capture: Capture) -> Capture:
    """The control: the clean capture with its exit event. It must pass."""
    return capture


def second_process_off_by_one(capture: Capture) -> Capture:
    """A second trainer process (pid SECOND_PID) beside the clean one, its scale launches with
    the seed's off-by-one (ld = SH2, wire_col = SH2 - 1)."""
    proc = capture.main
    twins: dict[int, dict[str, Any]] = {}
    events = []
    for e in proc.events:
        twin = dict(e)
        if "params" in e:
            twin["params"] = [list(p) for p in e["params"]]
        if e.get("ev") == "init":
            twin.update(pid=SECOND_PID, ppid=proc.pid)
        if e.get("ev") == "exit":
            twin["pid"] = SECOND_PID
        twins[id(e)] = twin
        events.append(twin)
    for twin in events:
        if twin.get("ev") == "snapshot":
            twin["_launch"] = twins[id(twin["_launch"])]
            twin["_values"] = twin["_values"].copy()
    second = Process(SECOND_PID, events)
    capture.processes.append(second)
    sh2 = capture.dim("SH2")
    for k in kernels(second, SCALE):
        edit_scale(second, k, "second-process", ld=sh2, wire_col=sh2 - 1)
    entry = dict(capture.manifest["processes"][0], pid=SECOND_PID, audited=False)
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
    for call in gemm_reading(capture, capture.main, "sp14_dir_qaux_concat_scratch", "T", sh2 + 1):
        set_gemm_int(call, "k", sh2)
    return capture


def b1_forward_k_short(capture: Capture) -> Capture:
    """Branch 1's forward GEMMs (online and target) read k = SH2 + 1 of their SH2 + 2 columns:
    no K = SH2 signature, and without a layout file inference names neither operand's shape."""
    width = capture.dim("SH2") + capture.layout["dims"]["E"][1]
    proc = capture.main
    for buffer in ("save_b1_concat", "tgt_b1_concat"):
        for call in gemm_reading(capture, proc, buffer, "T", width):
            set_gemm_int(call, "k", width - 1)
    return capture


Lie = tuple[Callable[[Capture], Capture], frozenset[str] | str, bool]
_SCALE_VISIBLE = frozenset({"EGF008", "EGF003", "EGF004"})

LIES: dict[str, Lie] = {
    # controls
    "clean-with-exit-event": (clean, PASSES, False),
    "layout-shapeless": (layout_shapeless, PASSES, True),
    # the scale's arguments
    "scale-ld-sh2-col-sh2m1": (scale_ld_sh2, _SCALE_VISIBLE, False),
    "scale-rows-b-minus-1": (scale_rows_short, _SCALE_VISIBLE, False),
    "scale-isv-in-params": (scale_isv_in_params, frozenset({"EGF008"}), False),
    "scale-isv-in-dx": (scale_isv_in_dx, frozenset({"EGF008"}), False),
    "scale-isv-plus-4-index-392": (scale_isv_plus_one, frozenset({"EGF008"}), False),
    "scale-isv-index-392": (scale_isv_index_392, _SCALE_VISIBLE, False),
    "scale-dx-other-buffer": (scale_dx_other_buffer, _SCALE_VISIBLE, False),
    "scale-dx-row-offset": (scale_dx_row_offset, _SCALE_VISIBLE | {"EGF001"}, False),
    "scale-before-dx-gemm": (scale_before_dx_gemm, frozenset({"EGF008"}), False),
    # the accumulates
    "accumulate-missing-branch": (accumulate_missing, frozenset({"EGF007"}), False),
    "accumulate-branch-twice": (accumulate_twice, frozenset({"EGF007"}), False),
    "accumulate-site-dropped": (accumulate_site_dropped, frozenset({"EGF007"}), False),
    "accumulate-sh2-plus-1": (accumulate_sh2_plus_one, frozenset({"EGF007"}), False),
    "accumulate-ld-concat-sh2": (accumulate_ld_sh2, frozenset({"EGF007"}), False),
    "accumulate-rows-b-minus-1": (accumulate_rows_short, frozenset({"EGF007"}), False),
    "accumulate-b1-ld-sh2-plus-1": (accumulate_b1_ld, frozenset({"EGF007"}), True),
    # Polyak
    "polyak-online-grad-buf": (polyak_online_grad_buf, frozenset({"EGF005"}), True),
    "polyak-target-is-params": (polyak_target_is_params, frozenset({"EGF005"}), False),
    "polyak-n-short": (polyak_n_short, frozenset({"EGF005"}), True),
    "polyak-tau-swapped": (polyak_tau_swapped, frozenset({"EGF005"}), False),
    # the concat rebuild
    "rebuild-target-h-s2": (rebuild_target_h_s2, frozenset({"EGF006"}), False),
    "rebuild-target-softmax": (rebuild_target_softmax, frozenset({"EGF006"}), False),
    # zeroing d_h_s2
    "zero-d-h-s2-missing": (zero_missing, frozenset({"EGF007"}), False),
    "zero-d-h-s2-then-stale-copy": (zero_then_stale_copy, frozenset({"EGF007"}), False),
    "zero-d-h-s2-half": (zero_half, frozenset({"EGF007"}), False),
    "zero-d-h-s2-byte-one": (zero_with_byte_one, frozenset({"EGF007"}), False),
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
    # the capture's integrity
    "malformed-line-then-k-sh2": (malformed_line_then_k_short, REFUSED, False),
    "manifest-exit-139": (manifest_exit_139, INCOMPLETE, False),
    "manifest-exit-sigsegv": (manifest_sigsegv, INCOMPLETE, False),
    # the exit-event pair: the audit before the recorder wrote the event passes both, so
    # `no-exit-event` is the one it gets wrong; `clean-with-exit-event` must pass
    "no-exit-event": (no_exit_event, INCOMPLETE, False),
    "second-process-scale-off-by-one": (second_process_off_by_one, _SCALE_VISIBLE, False),
}

# Codes a lie must also fail with the trainer's layout file only: a region that leaves its
# allocation, where inference names the allocation from the faulty launch itself.
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
    return write(function(base()), Path(dst_folder), with_layout)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python lies.py OUT_DIR [--without-layout]")
    out, with_layout = Path(sys.argv[1]), "--without-layout" not in sys.argv[2:]
    for slug, (_, _, layout_only) in LIES.items():
        if with_layout or not layout_only:
            print(make(slug, out / slug, with_layout))
