"""What the capture checks share: the contract every ABI launch's arguments are held to, who may
write a buffer, and the snapshot regions the recorder took around a launch.

A capture check reads one `Trace` of the trace model (egf_audit.trace), the type the rebuild's
recorder also gives: the trainer's own launches, their steps and call sites, and on
`Trace.captured` what only a capture holds (the layout that named its pointers, the recorder's
snapshot regions, the records the launches were made from). It never learns what process ran or
which fault it has. Missing data follows the trace's convention: a query here raises `Missing`,
naming what was absent, and the invariant's verdict is a FAIL that says so. UNDECIDED is
returned by a check itself, only when the capture gives it nothing at all to judge.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from egf_audit.trace.contract import AUX_DOWN_INDEX, AUX_UP_INDEX, SITES
from egf_audit.trace.evidence import observed_write
from egf_audit.trace.model import Missing
from egf_audit.trace.process import HASH_FNV1A, HASH_MIX64

if TYPE_CHECKING:
    from egf_audit.trace.call_sites import Site
    from egf_audit.trace.model import Launch, Trace
    from egf_audit.trace.process import SnapshotRegion

FNV_OFFSET = 1469598103934665603  # the earlier recorders' seed (fnv1a captures)
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1
# an fnv1a region's kept values are checked against its recorded hash up to this many elements
# (that hash is computed here byte by byte; larger regions are trusted as the recorder hashed
# them); a mix64 region's are checked whatever its size
HASH_CHECK_MAX = 1 << 18
# the recorder's region_hash (auditor/capture/rec_snapshot.c): splitmix64's finaliser over each
# element's bits plus its index times MIX64_STEP, summed modulo 2**64
MIX64_STEP, MIX64_M1, MIX64_M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
MIX64_CHUNK = 1 << 20  # elements mixed at a time: bounds the temporaries to a few MiB


# ---- the contract (kernels/CONTRACT.md, sections 3 and 5), from the layout's dims ----
@dataclass(frozen=True)
class Dims:
    """The dimensions the capture's launches are held to: the layout file's `dims`, or what the
    first sp14_dir_concat_qaux launch says when there is no file."""

    B: int
    SH2: int
    AUXK: int | None

    @property
    def concat_width(self) -> int:
        return self.SH2 + 1


def dims_of(ct: Trace) -> Dims:
    B, sh2 = ct.capture.dim("B"), ct.capture.dim("SH2")
    if B is None or sh2 is None:
        raise Missing("the capture names no B and SH2 (no layout dims, no decoded concat launch)")
    return Dims(B, sh2, ct.capture.dim("AUXK"))


def where(ct: Trace, pointer: object) -> str:
    """A pointer in words: `buffer[element]`, or that no named buffer holds it."""
    if not isinstance(pointer, int) or isinstance(pointer, bool):
        return f"{pointer!r} (not a pointer)"
    found = ct.capture.layout.resolve(pointer)
    if found is None:
        return "no named buffer"
    buffer, offset = found
    return f"{buffer.name}[{offset}]"


def pointer_problem(ct: Trace, x: Launch, param: str, buffer: str) -> str | None:
    """Why the pointer argument `param` is not the first element of `buffer`, or None."""
    base = ct.capture.layout.base_of(buffer)
    if base is None:
        raise Missing(f"no buffer {buffer} is named (by the layout file or by inference)")
    value = x.args.get(param)
    if value == base:
        return None
    return f"{param} points at {where(ct, value)}, not at the start of {buffer}"


def value_problems(x: Launch, expected: dict[str, int | None]) -> list[str]:
    """Integer arguments that differ from the contract's values (None: not known, not held)."""
    return [
        f"{name} = {x.args.get(name)!r}, the contract says {value}"
        for name, value in expected.items()
        if value is not None and x.args.get(name) != value
    ]


def concat_contract(d: Dims) -> dict[str, int | None]:
    return {
        "rows": d.B,
        "sh2": d.SH2,
        "auxk": d.AUXK,
        "up_idx": AUX_UP_INDEX,
        "down_idx": AUX_DOWN_INDEX,
    }


# ---- who writes a buffer ----
def certainly_writes(x: Launch, buffer: str) -> bool:
    """A declared write (a kernel's table region, a GEMM's C, a memset's or copy's dst)."""
    return any(b.writes and b.region is not None and b.region.buffer == buffer for b in x.bindings)


def may_write(ct: Trace | None, x: Launch, buffer: str) -> bool:
    """A declared write, or a kernel egf-audit does not know handed a pointer into `buffer`
    (access "?"), which can write anything it can reach from that pointer, unless the capture
    `ct` observed that it changed nothing of `buffer` (its deep effect or its guard)."""
    return certainly_writes(x, buffer) or (
        any(
            "?" in b.access and b.region is not None and b.region.buffer == buffer
            for b in x.bindings
        )
        and (ct is None or observed_write(ct, x, buffer) is not False)
    )


def reads_buffer(x: Launch, buffer: str) -> bool:
    return any(b.reads and b.region is not None and b.region.buffer == buffer for b in x.bindings)


def named(x: Launch, at: str = "") -> str:
    """A launch in words, for a finding: its label, position and step."""
    return f"{at}{x.label} (launch {x.index}, step {x.step})"


# ---- steps and call sites ----
def site_launches(ct: Trace, site: Site) -> list[Launch]:
    """The launches of one call site: from its begin to its last accumulate."""
    return ct.launches[site.begin : site.end + 1]


def site_name(site: Site) -> str:
    return f"step {site.step} @{site.name}"


def site_count_problems(ct: Trace) -> list[str]:
    """Steps whose number of backward_full call sites is not the trainer's (cql, main)."""
    per_step: dict[int, int] = {}
    for site in ct.call_sites():
        per_step[site.step] = per_step.get(site.step, 0) + 1
    return [
        f"step {step}: {count} call sites (runs of accumulate launches), the trainer has "
        f"{len(SITES)} ({', '.join(SITES)})"
        for step, count in sorted(per_step.items())
        if count != len(SITES)
    ]


# ---- snapshot regions ----
def regions(ct: Trace, x: Launch, when: str) -> dict[str, SnapshotRegion]:
    return ct.capture.process.regions(ct.capture.records[x.index].seq, when)


def region(ct: Trace, x: Launch, when: str, name: str) -> SnapshotRegion:
    found = regions(ct, x, when).get(name)
    if found is None:
        raise Missing(f"no {when} snapshot of {name} around {named(x)}")
    return found


def snapshotted(ct: Trace, x: Launch) -> bool:
    """The recorder took any snapshot around this launch."""
    return bool(regions(ct, x, "before") or regions(ct, x, "after"))


def all_values(r: SnapshotRegion, what: str) -> np.ndarray:
    """Every element's value of a region; a region kept by its hash only, or cut short by
    --values-max, cannot show them and is missing data. Values that disagree with the hash the
    recorder computed over the same elements are a capture that lies: missing data too."""
    if not r.complete:
        raise Missing(
            f"{what}: {r.values.size} of {r.elements} values kept (capture without --values-max "
            "to judge every element)"
        )
    checked = r.hash_kind == HASH_MIX64 or r.elements <= HASH_CHECK_MAX
    if checked and region_hash_hex(r.values, r.hash_kind) != r.hash:
        raise Missing(f"{what}: the kept values disagree with the recorder's hash of them")
    return r.values


def region_hash_hex(values: np.ndarray, kind: str) -> str:
    """The recorder's hash of a whole region (no column left out), of the kind its capture
    names, as the hex it writes."""
    return mix64_hex(values) if kind == HASH_MIX64 else fnv1a_hex(values)


def mix64_hex(values: np.ndarray) -> str:
    """The recorder's region_hash (rec_snapshot.c) over every element, in numpy (uint64
    arithmetic wraps as C's does)."""
    bits = np.ascontiguousarray(values, dtype="<f4").reshape(-1).view("<u4")
    total = 0
    for low in range(0, bits.size, MIX64_CHUNK):
        total = (total + _mix64_sum(bits[low : low + MIX64_CHUNK], low)) & MASK64
    return f"{total:016x}"


def _mix64_sum(bits: np.ndarray, low: int) -> int:
    """The sum of splitmix64's finaliser over elements `low`, `low + 1`, ... of these bits."""
    z = bits.astype(np.uint64) + np.arange(low, low + bits.size, dtype=np.uint64) * np.uint64(
        MIX64_STEP
    )
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX64_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX64_M2)
    z ^= z >> np.uint64(31)
    return int(z.sum(dtype=np.uint64))


def fnv1a_hex(values: np.ndarray) -> str:
    """The recorder's FNV-1a 64 over each element's four bytes, as the hex it writes."""
    return _fnv1a_of_bytes(np.ascontiguousarray(values, dtype="<f4").tobytes())


@functools.lru_cache(maxsize=4096)
def _fnv1a_of_bytes(data: bytes) -> str:
    # byte-serial, so a Python loop (about 1 µs a byte): memoised on the bytes themselves,
    # since one audit checks a region's values more than once and a process audits the same
    # capture's regions again (the lying-capture tests, 160 audits of a few fixtures)
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return f"{h:016x}"


def zeros_hash(elements: int, kind: str = HASH_FNV1A) -> str:
    """The hash of `elements` +0.0 values of the kind a capture names (fnv1a: every byte is 0,
    so each step only multiplies)."""
    if kind == HASH_MIX64:  # a chunk of zeros at a time: no array of `elements` is made
        zeros = np.zeros(min(elements, MIX64_CHUNK), dtype=np.uint32)
        total = 0
        for low in range(0, elements, MIX64_CHUNK):
            total = (total + _mix64_sum(zeros[: min(MIX64_CHUNK, elements - low)], low)) & MASK64
        return f"{total:016x}"
    return f"{(FNV_OFFSET * pow(FNV_PRIME, 4 * elements, 1 << 64)) & MASK64:016x}"


# ---- the scale's snapshots (EGF003, EGF004, EGF012) ----
@dataclass
class ScaleView:
    """What the recorder saw around one sp14_scale_wire_col launch. `problems` says why its
    snapshots cannot show the contract's wire (absent, or not of the region the launch names);
    `alpha` is None when the gate was not snapshotted."""

    launch: Launch
    alpha: np.float32 | None
    wire_before: SnapshotRegion | None
    wire_after: SnapshotRegion | None
    body_same: bool | None  # the other columns' hash unchanged by the launch
    problems: list[str]


def _region_problems(r: SnapshotRegion, ptr: object, elements: int, ld: int, skip: int) -> str:
    if (r.ptr, r.elements, r.ld, r.skip_col) != (ptr, elements, ld, skip):
        return (
            f"its {r.when} snapshot of {r.region} covers {r.elements} elements at row stride "
            f"{r.ld}, not the launch's own region"
        )
    return ""


def scale_views(ct: Trace) -> list[ScaleView]:
    from egf_audit.trace.contract import SCALE_KERNEL

    views = []
    for x in ct.kernels(SCALE_KERNEL):
        a = x.args
        rows, ld, index = a.get("rows", 0), a.get("ld", 0), a.get("isv_index", 0)
        before, after = regions(ct, x, "before"), regions(ct, x, "after")
        problems = []
        for when, got in (("before", before), ("after", after)):
            for name in ("wire", "body") + (("alpha",) if when == "before" else ()):
                if name not in got:
                    problems.append(f"no {when} snapshot of its {name}")
        shapes = {
            "wire": (a.get("dx_concat"), rows, 1, -1),
            "body": (a.get("dx_concat"), rows * ld, ld, ld - 1),
            "alpha": (a.get("isv", 0) + 4 * index, 1, 1, -1),
        }
        for got in (before, after):
            for name, r in got.items():
                if name in shapes and (p := _region_problems(r, *shapes[name])):
                    problems.append(p)
        alpha = None
        if "alpha" in before and before["alpha"].values.size == 1:
            alpha = np.float32(before["alpha"].values[0])
        body_same = None
        if "body" in before and "body" in after:
            body_same = before["body"].hash == after["body"].hash
        views.append(
            ScaleView(x, alpha, before.get("wire"), after.get("wire"), body_same, problems)
        )
    return views


def step_alphas(views: list[ScaleView]) -> dict[int, np.float32]:
    """ISV[393] as each step's scale launches read it (the first snapshot of the step)."""
    out: dict[int, np.float32] = {}
    for v in views:
        if v.alpha is not None:
            out.setdefault(v.launch.step, v.alpha)
    return out


def wire_at_accumulate(ct: Trace, site: Site, wire_col: int) -> tuple[Launch, np.ndarray]:
    """The wire column of the dir dX as it was when the site's first accumulate that reads the
    buffer ran: what the gate left, whatever ran in between. The column is the contract's
    (column SH2 of sp14_d_dir_qaux_concat, B rows at row stride SH2 + 1), never the one the
    accumulate's own `ld_concat` names: a launch's arguments are what is audited. Its values
    come from that accumulate's before-snapshot where it holds the whole buffer from its start,
    else from a deep capture's memory history just before it; neither is missing data."""
    from egf_audit.trace.contract import ACCUMULATE_KERNEL, DIR_DX
    from egf_audit.trace.memory_history import MemoryHistory, Request

    rows, ld = dims_of(ct).B, wire_col + 1
    base = ct.capture.layout.base_of(DIR_DX)
    if base is None:
        raise Missing(f"no buffer {DIR_DX} is named (by the layout file or by inference)")
    wires = np.arange(rows, dtype=np.int64) * ld + wire_col  # elements from the buffer's start
    for x in site_launches(ct, site):
        if not (x.name == ACCUMULATE_KERNEL and reads_buffer(x, DIR_DX)):
            continue
        r = regions(ct, x, "before").get("d_concat")
        if r is not None and r.ptr == base and r.elements >= rows * ld:  # the whole buffer
            return x, all_values(r, f"d_concat before {named(x)}")[wires]
        before = ct.capture.records[x.index].seq
        got = MemoryHistory(ct.capture.process).read([Request("wire", before, base, rows * ld * 4)])
        if isinstance(got["wire"], Missing):
            if (ld_arg := x.args.get("ld_concat", 0)) != ld:  # its snapshot is of its own rows
                raise Missing(
                    f"{named(x)} reads the dir dX with row stride {ld_arg}: no wire column"
                )
            raise Missing(
                f"{named(x)}: no snapshot before it holds the wire column of {DIR_DX} (row "
                f"stride {ld}), and no memory history has it: {got['wire']}"
            )
        return x, got["wire"].view("<f4")[wires]
    raise Missing(f"{site_name(site)}: no accumulate reads {DIR_DX}")


def site_scale(ct: Trace, site: Site, views: list[ScaleView]) -> ScaleView | None:
    inside = {x.index for x in site_launches(ct, site)}
    return next((v for v in views if v.launch.index in inside), None)
