"""A captured process as a `Trace`: the same launches, bindings and labels `--trace` writes.

Steps are cut at each `polyak_ema` (the last launch of a trainer step). Call sites are cut as
the rebuild's are (trace/call_sites.py: the runs of `accumulate_d_h_s2_from_concat`
launches, one run per `backward_full` call site). Every pointer argument is
bound to the named buffer it lands in, or to none; a GEMM of any entry point binds each of its
batches' operands (trace/bindings.py, gemm_operands); a kernel egf-audit does not know
gets access "?" on every buffer its pointer arguments land in: it may write any of them.
"""

from __future__ import annotations

from dataclasses import replace

from egf_audit.capture.gemms import refusal
from egf_audit.trace.allocations import Allocation
from egf_audit.trace.bindings import bindings_of
from egf_audit.trace.buffers import CaptureLayout
from egf_audit.trace.call_sites import Cut, call_sites
from egf_audit.trace.captured import Captured
from egf_audit.trace.contract import POLYAK_KERNEL, at_site
from egf_audit.trace.model import Launch, Trace
from egf_audit.trace.process import ProcessCapture, Record

KINDS = {"kernel": "kernel", "sgemm": "sgemm", "gemm": "sgemm", "memset": "memset", "copy": "copy"}


def _steps(records: list[Record]) -> list[int]:
    steps, step = [], 0
    for r in records:
        steps.append(step)
        if r.kind == "kernel" and r.name == POLYAK_KERNEL:
            step += 1
    return steps


def to_trace(proc: ProcessCapture, layout: CaptureLayout, scenario: str) -> Trace:
    records = [r for r in proc.records if r.kind in KINDS]
    steps = _steps(records)
    sites = call_sites([Cut(KINDS[r.kind], r.name, steps[i]) for i, r in enumerate(records)])
    site_of = {}
    for s in sites:
        # label from the site's own backward (its first memset, or the first write of a dX
        # buffer) on, so the forward ahead of the first site keeps its plain name
        start = next(
            (i for i in range(s.begin, s.first_accumulate) if records[i].kind == "memset"), s.begin
        )
        for i in range(start, s.end + 1):
            site_of[i] = s.name
    captured = Captured(layout, proc, records, sites, allocations_of(proc))
    trace = Trace(
        scenario=scenario,
        backend="capture",
        layout=layout.as_trace_layout(),
        captured=captured,
    )
    trace.meta.update(pid=proc.pid, layout="file" if layout.from_file else "inferred")
    for i, r in enumerate(records):
        name = "sgemm" if r.kind == "sgemm" else r.name  # as the rebuild's trace names SGEMMs
        label = at_site(name, site_of[i]) if i in site_of else name
        args = dict(r.args, api=r.api)
        launch = Launch(i, steps[i], KINDS[r.kind], name, label, args, bindings_of(layout, r))
        if KINDS[r.kind] == "sgemm" and (why := refusal(r.args)) is not None:
            # cuBLAS logged the call, then refused it: nothing ran (EGF001, as the rebuild's)
            launch = replace(launch, refused=why)
        trace.launches.append(launch)
    return trace


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
