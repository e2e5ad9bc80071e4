"""A captured process as a `Trace`: the same launches, bindings and labels `--trace` writes.

Steps are cut at each `polyak_ema` (the last launch of a trainer step). Call sites are the runs
of `accumulate_d_h_s2_from_concat` launches, one run per `backward_full` call site, named as the
seed names them (`cql`, then `main`) when a step has exactly two (a step with another count is
a finding of EGF007 and EGF008). A site's window starts after the previous site's last
accumulate, and the first site's at the step's first GEMM, so what the trainer did while it
allocated (its first memsets) is never counted as a step's work. Every pointer argument is
bound to the named buffer it lands in, or to none; a GEMM of any entry point binds each of its
batches' operands (runtime/capture_model.py, gemm_operands); a kernel egf-audit does not know
gets access "?" on every buffer its pointer arguments land in: it may write any of them.
"""

from __future__ import annotations

from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.runtime.capture_model import (
    Allocation,
    CaptureLayout,
    CaptureTrace,
    ProcessCapture,
    Record,
    Site,
    gemm_operands,
)
from egf_audit.runtime.contract import ACCUMULATE_KERNEL, POLYAK_KERNEL, SITES, at_site
from egf_audit.runtime.memory import ELEMENT_BYTES
from egf_audit.runtime.trace import Binding, Launch, Region, Trace

KINDS = {"kernel": "kernel", "sgemm": "sgemm", "gemm": "sgemm", "memset": "memset", "copy": "copy"}
GEMM_KINDS = ("sgemm", "gemm")  # cublasSgemm_v2, and every other GEMM entry point


def _binding(layout: CaptureLayout, role: str, ptr: int, access: str, box: tuple) -> Binding:
    rel, rows, width, ld = box
    where = layout.resolve(ptr) if isinstance(ptr, int) else None
    if where is None:
        return Binding(role, ptr, access, None, None, None, False)
    buffer, offset = where
    region = Region(buffer.name, offset + rel, rows, width, ld)
    # a buffer inference sized from what it saw is known no further: the allocation holding
    # it bounds the launch instead (EGF001)
    in_bounds = region.fits(buffer.size) if buffer.bounded else region.offset >= 0
    found = layout.tensor_at(buffer, region.offset)
    name, shape = found if found else (None, None)
    return Binding(role, ptr, access, region, name, shape, in_bounds)


def bindings_of(layout: CaptureLayout, r: Record) -> tuple[Binding, ...]:
    a = r.args
    if r.kind in GEMM_KINDS:
        # every entry point alike: each batch's operands where they were judged; an operand of
        # another element size than the layout's fp32 is placed by its allocation alone (EGF001)
        return tuple(
            _binding(layout, op.role, op.pointer, op.access, (0, *op.box))
            if op.element_bytes == ELEMENT_BYTES
            else Binding(op.role, op.pointer, op.access, None, None, None, False)
            for op in gemm_operands(a)
        )
    if r.kind in ("memset", "copy"):
        count = -(-a["bytes"] // ELEMENT_BYTES)  # a partial last element is still touched
        ends = [("dst", "w")] + ([("src", "r")] if r.kind == "copy" else [])
        found = (
            _binding(layout, role, a.get(role, 0), acc, (0, 1, count, count)) for role, acc in ends
        )
        return tuple(b for b in found if b.region is not None)
    if r.kind == "kernel" and r.decoded:
        spec = KERNELS_BY_NAME[r.name]
        return tuple(_binding(layout, x.param, a[x.param], x.mode, x.box(a)) for x in spec.accesses)
    if r.kind == "kernel":
        # a kernel egf-audit does not know: which named buffers its arguments point into, with
        # the access unknown ("?")
        found = (
            _binding(layout, k, v, "?", (0, 1, 1, 1)) for k, v in a.items() if k.startswith("p")
        )
        return tuple(b for b in found if b.region is not None)
    return ()


def _steps(records: list[Record]) -> list[int]:
    steps, step = [], 0
    for r in records:
        steps.append(step)
        if r.kind == "kernel" and r.name == POLYAK_KERNEL:
            step += 1
    return steps


def _sites(records: list[Record], steps: list[int]) -> list[Site]:
    groups: list[tuple[int, int]] = []  # (first, last) accumulate positions of each run
    for i, r in enumerate(records):
        if r.kind not in ("kernel", *GEMM_KINDS):
            continue
        if r.name == ACCUMULATE_KERNEL:
            if groups and groups[-1][1] == _previous_launch(records, i):
                groups[-1] = (groups[-1][0], i)
            else:
                groups.append((i, i))
    by_step: dict[int, list[tuple[int, int]]] = {}
    for first, last in groups:
        by_step.setdefault(steps[first], []).append((first, last))
    sites = []
    for step, runs in by_step.items():
        first_of_step = steps.index(step)
        begin = next(
            (i for i in range(first_of_step, runs[0][0]) if records[i].kind in GEMM_KINDS),
            first_of_step,
        )
        names = SITES if len(runs) == len(SITES) else tuple(f"site{k}" for k in range(len(runs)))
        for name, (first, last) in zip(names, runs, strict=True):
            sites.append(Site(name, step, begin, first, last))
            begin = last + 1
    return sites


def _previous_launch(records: list[Record], i: int) -> int | None:
    for j in range(i - 1, -1, -1):
        if records[j].kind in ("kernel", *GEMM_KINDS):
            return j
    return None


def to_trace(proc: ProcessCapture, layout: CaptureLayout, scenario: str) -> CaptureTrace:
    records = [r for r in proc.records if r.kind in KINDS]
    steps = _steps(records)
    sites = _sites(records, steps)
    site_of = {}
    for s in sites:
        # label from the site's own backward (its first memset, or the first write of a dX
        # buffer) on, so the forward ahead of the first site keeps its plain name
        start = next(
            (i for i in range(s.begin, s.first_accumulate) if records[i].kind == "memset"), s.begin
        )
        for i in range(start, s.end + 1):
            site_of[i] = s.name
    trace = Trace(scenario=scenario, backend="capture", layout=layout.as_trace_layout())
    trace.meta.update(pid=proc.pid, layout="file" if layout.from_file else "inferred")
    for i, r in enumerate(records):
        name = "sgemm" if r.kind == "sgemm" else r.name  # as the rebuild's trace names SGEMMs
        label = at_site(name, site_of[i]) if i in site_of else name
        args = dict(r.args, api=r.api)
        trace.launches.append(
            Launch(i, steps[i], KINDS[r.kind], name, label, args, bindings_of(layout, r))
        )
    return CaptureTrace(trace, layout, proc, records, sites, allocations_of(proc))


def allocations_of(proc: ProcessCapture) -> list[Allocation]:
    """Every allocation in the order made, each closed by the first free of its address that
    follows it (a free of an address nothing holds frees nothing)."""
    made: list[Allocation] = []
    live: dict[int, int] = {}  # address -> index in `made` of the allocation live there
    for r in proc.records:
        if r.kind == "alloc" and r.args:
            live[r.args["dst"]] = len(made)
            made.append(Allocation(r.args["dst"], r.args["bytes"], r.seq))
        elif r.kind == "free" and r.args and (i := live.pop(r.args["dst"], None)) is not None:
            made[i] = made[i]._replace(freed=r.seq)
    return made
