"""EGF013 kernel-effects-contained: what every launch was observed to do to memory stays inside
what it declares, and no launch crashed, exited or hung the process that ran it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from egf_audit.invariants.registry import (
    Invariant,
    Verdict,
    failed,
    failed_with,
    passed,
    undecided,
)
from egf_audit.trace.observed import observations, where
from egf_audit.trace.spans import Spans

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.effects import Effects
    from egf_audit.trace.model import Launch, Trace
    from egf_audit.trace.process import SnapshotRegion

MAX_LISTED = 20  # findings listed in the evidence; the summary counts them all


def _traces(run: AuditRun, mode: str) -> list[Trace]:
    """The mode's scenarios and the mode-independent ones (wrapper diagnostic, gate probes):
    a kernel that misbehaves anywhere fails the gate."""
    return [run.traces[s.name] for s in run.scenarios.values() if s.mode in (mode, None)]


def _what(x: Launch) -> str:
    return f"{x.name}" if x.kind == "kernel" else f"{x.kind} {x.name}"


def _findings(trace: Trace, x: Launch, e: Effects) -> list[dict[str, object]]:
    where = {"scenario": trace.scenario, "launch": x.index, "label": x.label, "kernel": _what(x)}
    out: list[dict[str, object]] = []
    if e.failure:
        out.append({**where, "problem": f"the launch {e.failure}"})
    if e.not_run:
        out.append({**where, "problem": f"not run: {e.not_run}"})
    for s in e.stray_writes:
        tensor = f" ({s.tensor})" if s.tensor else ""
        out.append(
            {
                **where,
                "problem": (
                    f"wrote {s.buffer}[{s.element}]{tensor} outside its declared write region "
                    f"({s.count} elements changed there; first 0x{s.old_bits:08x} -> "
                    f"0x{s.new_bits:08x})"
                ),
                "buffer": s.buffer,
                "element": s.element,
            }
        )
    for g in e.guard_breaches:
        out.append(
            {
                **where,
                "problem": (
                    f"overwrote the guard zone {g.distance} elements {g.side} {g.buffer} "
                    f"({g.count} canaries changed)"
                ),
                "buffer": g.buffer,
            }
        )
    return out


def check(run: AuditRun, mode: str) -> Verdict:
    findings: list[dict[str, object]] = []
    unobserved: list[str] = []
    observed = 0
    traces = _traces(run, mode)
    for trace in traces:
        for x in trace.launches:
            if x.kind == "checkpoint" or (not x.executed and x.effects is None):
                continue  # nothing ran (a refused out-of-bounds launch is EGF001's)
            if x.effects is None:
                unobserved.append(f"{trace.scenario} #{x.index} {x.label}")
                continue
            observed += 1
            findings += _findings(trace, x, x.effects)
    if findings:
        first = findings[0]
        return failed(
            f"{first['scenario']} launch #{first['launch']} {first['label']} "
            f"[{first['kernel']}]: {first['problem']} ({len(findings)} findings)",
            findings=findings[:MAX_LISTED],
            findings_total=len(findings),
        )
    if not observed and not unobserved:
        return failed(
            f"no launch to observe in the {len(traces)} traces of mode {mode}: the launches are "
            "missing",
            traces=len(traces),
        )
    if unobserved:
        return failed(
            f"{len(unobserved)} executed launches carry no observation of their effects, "
            f"first: {unobserved[0]}",
            unobserved=unobserved[:MAX_LISTED],
        )
    return passed(
        f"{observed} launches in {len(traces)} traces observed: every change inside a declared "
        "write region, every guard zone intact, no launch crashed, exited or hung",
        launches_observed=observed,
    )


NOT_DEEP = (
    "not a deep capture: it needs every allocation compared around every launch, which "
    "`egf-audit capture --deep` records"
)


def _contradictions(ct: Trace, changed: dict[int, Spans]) -> list[str]:
    """A launch whose snapshots of a region differ before and after it, while its effect shows
    no change inside that region: the recorder saw one thing and wrote another."""
    pairs: dict[tuple[int, str, int], dict[str, SnapshotRegion]] = {}
    for s in ct.capture.process.snapshots:
        if s.when in ("before", "after"):
            pairs.setdefault((s.launch, s.region, s.ptr), {})[s.when] = s
    found = []
    for (seq, region, ptr), pair in sorted(pairs.items()):
        before, after = pair.get("before"), pair.get("after")
        if before is None or after is None or before.hash == after.hash or seq not in changed:
            continue
        # a region's values are contiguous in memory, but for the wire: a column of the concat,
        # whose rows the body region of the same launch spans
        walked = pairs.get((seq, "body", ptr), {}).get("after") if region == "wire" else after
        if walked is None:
            continue
        if not changed[seq].intersect(Spans.of([(ptr, ptr + 4 * walked.elements)])).bytes:
            found.append(
                f"the capture contradicts itself: #{seq}'s snapshots of {region} differ before "
                "and after it, and its effect shows no change there"
            )
    return found


def check_capture(ct: Trace) -> Verdict:
    """A deep capture: every change the recorder saw after a kernel launch, memset or copy lies
    inside what that call may write (trace/observed.py); an undeep capture is UNDECIDED."""
    if not ct.capture.process.deep:
        return undecided(NOT_DEEP)
    observed, problems = observations(ct)
    problems = [f"missing data: {p}" for p in problems]
    judged = changed = 0
    for o in observed:
        r = o.record
        label = f"#{r.seq} {r.name}" + (f" (in {o.gemm.name} #{o.gemm.seq})" if o.gemm else "")
        if o.allowed is None:
            if o.changed:
                problems.append(
                    f"{label} changed memory, and what it may write is unknown: {o.unknown}"
                )
            continue
        judged += 1
        changed += o.changed.bytes
        for start, end in o.changed.minus(o.allowed).ranges:
            problems.append(
                f"{label} wrote {where(ct, start, r.seq)} outside its declared write region "
                f"({end - start} bytes changed there)"
            )
    problems += _contradictions(ct, {o.record.seq: o.changed for o in observed})
    if problems:
        return failed_with(problems, calls_observed=len(observed))
    if not judged:
        return failed("a deep capture with no observed call: the launches are missing")
    return passed(
        f"{judged} calls observed: every change inside what its call may write, every live "
        "allocation compared after each",
        calls_observed=judged,
        bytes_changed=changed,
    )


INVARIANT = Invariant(
    code="EGF013",
    slug="kernel-effects-contained",
    message="Every launch must change only what it declares, and no launch may crash, exit or "
    "hang.",
    what=(
        "For every executed launch of every scenario (the mode's and the mode-independent "
        "diagnostic and probes): each buffer, compared bitwise before and after the launch, "
        "changed only inside the regions the launch declares it writes (the kernel table in "
        "kernels/, the SGEMM's C box, the memset or copy destination); the guard zones around "
        "every allocation are intact after it; and the launch returned, neither crashing, "
        "calling exit() nor running past its time-out."
    ),
    why=(
        "Every other invariant reads regions that the launches declare, and the document "
        "says every launch stays in bounds: a kernel that writes where it does not say (the "
        "row next to its column, a neighbouring tensor of the same allocation, one element past "
        "its buffer) or reads past its buffer makes those claims false while every result "
        "they check can still look right. A kernel that crashes or exits the process would "
        "take the gate down with it, with no verdict and possibly exit 0."
    ),
    how=(
        "Observed, never declared. Instrumented mode keeps a copy of every buffer and, after "
        "each launch, compares every buffer the launch can reach with it bit for bit outside "
        "the launch's declared write regions (inside the same allocation too), then brings the "
        "copy up to date: on the CPU every buffer; on the GPU, in stream order, the buffers the "
        "pointers of egf-audit's own code land in, and every buffer for a kernel it does not "
        "ship; the first change is reported with its buffer, element, tensor and bits. Every "
        "allocation "
        "sits between guard zones of canary values, checked after each kernel. Every kernel "
        "egf-audit does not ship (a --kernels source, a fault's patch) runs in a worker "
        "process: on the CPU one forked on the same shared memory, each buffer inside 8 GiB of "
        "PROT_NONE address space on either side, as far as a 32-bit int index reaches, so that "
        "a read or write past it, near or far, faults; on the GPU one with its own CUDA context "
        "on the same device memory (CUDA IPC), so a fault ends only the worker's context. A "
        "crash, exit, GPU fault or time-out (`--launch-timeout`) of the worker is recorded on "
        "the launch, and the kernel's later launches are not run. A launch that ran without "
        "being observed fails too. A read that lands in memory the process may read is not "
        "seen here: on the CPU one more than 8 GiB from its buffer, on the GPU one past its "
        "buffer that does not leave the mapped memory (`--sanitize` sees those)."
    ),
    catches=(
        "A kernel that writes outside its declared region (a whole row instead of the wire "
        "column, the next tensor of `params`, a slot of `isv_signals` it only reads), an "
        "off-by-one bound that reads or writes past the buffer, a kernel that segfaults, "
        "aborts, calls exit() or never returns."
    ),
    limits=(
        "It sees changed bits: a write outside the declared regions that stores the value "
        "already there passes, and so does any write inside them, whatever its value (the "
        "values are the other invariants'). A read is seen only when it faults: on the CPU one "
        "more than 8 GiB from its buffer is not, and on the GPU one past its buffer that stays "
        "in mapped memory only `--sanitize` (memcheck) sees. From a capture it is decided only "
        "with `--deep` (every allocation compared on the GPU after every launch, memset and "
        "copy), and there it sees changes, not reads, nor a crash (the capture's own "
        "completeness does); a kernel egf-audit does not know is bounded by the allocations "
        "its parameters point into, not by regions."
    ),
    example=(
        "`if (b > rows) return;` in `sp14_scale_wire_col`: the thread b = rows writes one row "
        "past `sp14_d_dir_qaux_concat`; on the CPU the inaccessible zone after it faults and the "
        "launch is recorded as crashed with SIGSEGV, naming the scenario, the launch and the "
        "kernel."
    ),
    check=check,
    reads=("launches",),
    capture=check_capture,
    # containment needs no SP14 name: any captured process is judged by what it was handed
    any_process=True,
)
