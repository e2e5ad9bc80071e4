"""EGF007 d-h-s2-accumulation: d_h_s2 starts from zero and holds exactly its three inflows.

Three facts per call site and step of the mode's production trace:
1. the last write to d_h_s2 before backward_full's first launch is a memset of all B*SH2
   elements (so the value-FC dX, which accumulates with beta = 1, starts from zero), and the
   snapshot at `{site}:before_backward_full` is bitwise zero;
2. at `{site}:trunk_entry`, d_h_s2 equals a float64 recomputation of value-FC dX + the first
   SH2 columns of every branch's concat dX + aux dX, within a proved fp32 error bound;
3. no accumulate launch reads column SH2 (the wire) of sp14_d_dir_qaux_concat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from egf_audit.invariants.capture_accumulate import accumulate_problems, accumulate_value_problems
from egf_audit.invariants.capture_common import (
    dims_of,
    may_write,
    named,
    site_count_problems,
    site_launches,
    site_name,
    where,
)
from egf_audit.invariants.common import (
    column_hits,
    count_by,
    covers_all,
    in_step,
    json_float,
    listed,
    production,
    steps,
)
from egf_audit.invariants.registry import Invariant, Verdict, failed, failed_with, passed
from egf_audit.invariants.trunk_entry import (
    MEASURED,
    TrunkEntry,
    entry_json,
    recompute,
    trunk_entry,
)
from egf_audit.oracle.inputs import device, flat_snapshot
from egf_audit.trace.contract import (
    ACCUMULATE_KERNEL,
    BEFORE_BACKWARD_FULL,
    BRANCHES,
    DIR_DX,
    SITES,
    site_checkpoint,
)
from egf_audit.trace.model import Missing

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.call_sites import Site
    from egf_audit.trace.model import Launch, Trace


def _first_backward_full_launch(trace: Trace, step: int, site: str) -> Launch:
    """The first launch after the `{site}:before_backward_full` checkpoint: backward_full's
    first launch (the audit places that checkpoint immediately before the call)."""
    mark = trace.checkpoint(step, site_checkpoint(site, BEFORE_BACKWARD_FULL))
    for x in trace.launches[mark.index + 1 :]:
        if x.kind != "checkpoint":
            return x
    raise Missing(f"nothing runs after {site_checkpoint(site, BEFORE_BACKWARD_FULL)} (step {step})")


@dataclass(frozen=True)
class Zeroing:
    """What EGF007's zeroing rule found in one call site's window."""

    zero: Launch | None  # the last memset of 0 over all of d_h_s2 in the window
    overwrites: list[Launch]  # after it: writes of d_h_s2 that do not accumulate into it


def _accumulates_into(x: Launch) -> bool:
    """A GEMM adding its product to d_h_s2 (beta = 1, C read and written)."""
    c = x.binding("C", required=False) if x.kind == "sgemm" else None
    return c is not None and c.access == "rw" and x.args.get("beta") == 1.0


def zeroing(ct: Trace | None, window: Sequence[Launch], n: int) -> Zeroing:
    """EGF007's one rule for a call site's zero baseline, for the rebuild's launches and a
    capture's alike. `window` is the site's launches from after the previous site's last
    accumulate (or the step's start) up to its own first accumulate: there the last memset of 0
    over all n elements of d_h_s2 is the baseline; every write of d_h_s2 after it must add to it
    (a GEMM with beta = 1: a copy, a memset, a beta = 0 GEMM or, in a capture, a kernel
    egf-audit does not know replaces the baseline). A memset placed after a dX GEMM that
    added to d_h_s2 is not this rule's to see: the window also holds the previous site's
    trunk-entry GEMMs, which add to d_h_s2 legitimately; the values (the rebuild's trunk-entry
    sum, a deep capture's oracle) see the dX it discards."""
    zero_at = next((i for i in range(len(window) - 1, -1, -1) if _memsets_all(window[i], n)), None)
    if zero_at is None:
        return Zeroing(None, [])
    after = [
        x for x in window[zero_at + 1 :] if may_write(ct, x, "d_h_s2") and not _accumulates_into(x)
    ]
    return Zeroing(window[zero_at], after)


def _site_window(trace: Trace, found: Site | None) -> list[Launch]:
    """The rebuild's window for `zeroing`, as a capture's: the call site's launches (cut by
    trace/call_sites.py) up to its first accumulate; none where the cut found no such site."""
    return [] if found is None else trace.launches[found.begin : found.first_accumulate]


def _zeroing_failures(
    trace: Trace, step: int, site: str, found_site: Site | None, n: int
) -> list[dict[str, object]]:
    """`zeroing` on the site's window: a memset of all of d_h_s2 before backward_full, kept."""
    first = _first_backward_full_launch(trace, step, site)
    found = zeroing(None, _site_window(trace, found_site), n)
    out: list[dict[str, object]] = []
    if found.zero is None:
        last_write = next(
            (x for x in reversed(trace.launches[: first.index]) if x.writes_to("d_h_s2")), None
        )
        out.append(
            {
                "kind": "d_h_s2-not-zeroed",
                "step": step,
                "site": site,
                "last_write": last_write.label if last_write else None,
                "backward_full_first": first.label,
            }
        )
    at = {"step": step, "site": site, "zeroed_by": found.zero.label if found.zero else None}
    if found.overwrites:
        out.append(
            {
                "kind": "d_h_s2-overwritten",
                **at,
                "overwritten_by": [x.label for x in found.overwrites],
            }
        )
    return out


def _baseline_nonzero(trace: Trace, step: int, site: str) -> torch.Tensor:
    """How many elements of d_h_s2 at `{site}:before_backward_full` are not +0.0 (bit
    patterns: -0.0 and NaN count), on the oracle's device, to be read back later."""
    point = site_checkpoint(site, BEFORE_BACKWARD_FULL)
    baseline = flat_snapshot(trace, step, point, "d_h_s2", device())
    return torch.count_nonzero(baseline.view(torch.int32)).double()


def _baseline_failures(step: int, site: str, nonzero: int) -> list[dict[str, object]]:
    if not nonzero:
        return []
    return [{"kind": "d_h_s2-baseline-nonzero", "step": step, "site": site, "elements": nonzero}]


def _memsets_all(launch: Launch, n: int) -> bool:
    """A memset of 0 over every one of the n elements of d_h_s2 (rebuild and capture alike)."""
    if launch.kind != "memset" or launch.args.get("value") != 0:
        return False
    dst = next(
        (b.region for b in launch.bindings if b.region and b.region.buffer == "d_h_s2"), None
    )
    if dst is None:
        return False
    return covers_all(dst, n)


def _wire_column_reads(trace: Trace, step: int, sh2: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for x in in_step(trace, step):
        if x.kind != "kernel" or x.name != ACCUMULATE_KERNEL:
            continue
        for b in x.bindings:
            if b.reads and b.region is not None and b.region.buffer == DIR_DX:
                hits = column_hits(b.region, sh2 + 1, sh2)
                if hits:
                    out.append(
                        {
                            "kind": "wire-column-accumulated",
                            "step": step,
                            "label": x.label,
                            "elements": hits,
                        }
                    )
    return out


def check(run: AuditRun, mode: str) -> Verdict:
    trace = production(run, mode)
    dims = run.config.dims
    # Every site-step's values are measured on the device and read back at once, then reported
    # in the order of the checks; what raises Missing raises where it did before.
    checked: list[tuple[int, list[dict[str, object]], list[list[dict[str, object]]]]] = []
    measures: list[torch.Tensor] = []
    accumulates = 0
    sites = trace.call_sites_by_step()  # cut once, as a capture's sites are, labels unread
    for step in steps(trace):
        zeroing = []
        for site in SITES:
            found = sites.get((step, site))
            zeroing.append(_zeroing_failures(trace, step, site, found, dims.B * dims.SH2))
            nonzero = _baseline_nonzero(trace, step, site)
            measures.append(torch.cat([nonzero.reshape(1), recompute(run, trace, step, site)]))
        checked.append((step, _wire_column_reads(trace, step, dims.SH2), zeroing))
        accumulates += sum(1 for x in in_step(trace, step) if x.name == ACCUMULATE_KERNEL)
    read = iter(torch.stack(measures).tolist())
    failures: list[dict[str, object]] = []
    errors: list[TrunkEntry] = []
    for step, wire_reads, zeroing in checked:
        for site, zeroing_failures in zip(SITES, zeroing, strict=True):
            measured = next(read)
            failures += zeroing_failures + _baseline_failures(step, site, int(measured[0]))
            result = trunk_entry(step, site, measured[1:])
            errors.append(result)
            if result["elements_over"]:
                failures.append({"kind": "trunk-entry-mismatch", **entry_json(result)})
        failures += wire_reads

    pairs = len(errors)
    evidence: dict[str, object] = {
        **listed(failures),
        **{k: json_float(max(e[k] for e in errors)) for k in MEASURED},
        "accumulate_launches": accumulates,
    }
    if failures:
        parts = [
            f"{text} at {count_by(failures, kind)} of {pairs} site-steps"
            for kind, text in (
                ("d_h_s2-not-zeroed", "d_h_s2 not zeroed before backward_full"),
                ("d_h_s2-overwritten", "d_h_s2 overwritten after its zeroing"),
                ("d_h_s2-baseline-nonzero", "d_h_s2 non-zero at backward_full entry"),
                ("trunk-entry-mismatch", "trunk-entry d_h_s2 differs from its inflows"),
            )
            if count_by(failures, kind)
        ]
        wire = count_by(failures, "wire-column-accumulated")
        if wire:
            parts.append(f"the wire column is read by {wire} of {accumulates} accumulates")
        return failed("; ".join(parts), **evidence)
    return passed(
        f"d_h_s2 zeroed before backward_full and equal to value dX + sum_d "
        f"d_concat_d[:, :SH2] + aux dX at trunk entry at {pairs} site-steps; "
        f"no accumulate (of {accumulates}) reads the wire column",
        **evidence,
    )


# ---- the same invariant on a capture of the trainer's process ----
def _zeroing_problems(ct: Trace, window: list[Launch], at: str, n: int) -> list[str]:
    """The rebuild's rule on the site's own window (after the previous site's last accumulate,
    or the step's first GEMM): a memset of 0 over all of d_h_s2 there, and every write after
    the last such memset, up to the first accumulate, accumulates (a GEMM with beta = 1): a
    copy, a memset, a beta = 0 GEMM or an unknown kernel there replaces the zero baseline."""
    found = zeroing(ct, window, n)
    if found.zero is None:
        return [f"{at}: d_h_s2 is not zeroed inside the call site (after its previous use)"]
    problems = [f"{at}: {named(x)} overwrites d_h_s2 after its zeroing" for x in found.overwrites]
    return problems


def check_capture(ct: Trace) -> Verdict:
    """Per call site of the capture: the zeroing inside the site's own window (never the
    allocation's memset), every accumulate's arguments, one accumulate per branch (the four
    branches' dX, each once, the direction branch's among them), every step with both call
    sites, and each accumulate's result bitwise from its snapshots. The trunk-entry sum the
    rebuild recomputes needs the aux and value dX, which a capture does not keep: its parts
    are the accumulates checked here. UNDECIDED never: with no accumulate snapshot the values
    part fails as missing only when other accumulates were snapshotted."""
    if not ct.call_sites():  # a process audited for its ABI launches whose backward never ran
        return failed(f"no {ACCUMULATE_KERNEL} launch: no branch's dX reaches d_h_s2")
    d = dims_of(ct)
    if "d_h_s2" not in ct.capture.layout.buffers:
        raise Missing("d_h_s2 is not named (layout file or accumulate launch)")
    n = d.B * d.SH2
    problems = site_count_problems(ct)
    accumulates, snapshotted = [], 0
    for site in ct.call_sites():
        at = site_name(site)
        launches = site_launches(ct, site)
        window = launches[: site.first_accumulate - site.begin]
        problems += _zeroing_problems(ct, window, at, n)
        mine = [x for x in launches if x.kind == "kernel" and x.name == ACCUMULATE_KERNEL]
        accumulates += mine
        for x in mine:
            problems += [f"{at}: {named(x)}: {p}" for p in accumulate_problems(ct, x, d)]
        sources = [x.args.get("d_concat") for x in mine]
        twice = sorted({where(ct, p) for p in sources if sources.count(p) > 1})
        if twice:
            problems.append(f"{at}: accumulates {', '.join(twice)} more than once")
        if len(set(sources)) != len(BRANCHES):
            problems.append(
                f"{at}: accumulates {len(set(sources))} branches' dX, the trainer has "
                f"{len(BRANCHES)} ({', '.join(BRANCHES)})"
            )
        if ct.capture.layout.base_of(DIR_DX) not in sources:
            problems.append(f"{at}: no accumulate reads {DIR_DX}")
    for x in accumulates:
        try:
            found, seen = accumulate_value_problems(ct, x)
        except Missing as exc:  # judge every other launch still
            found, seen = [f"missing data: {exc}"], True
        problems += found
        snapshotted += seen
    if 0 < snapshotted < len(accumulates):
        missing = len(accumulates) - snapshotted
        problems.append(f"{missing} of {len(accumulates)} accumulate launches have no snapshots")
    evidence = {"sites": len(ct.call_sites()), "accumulates": len(accumulates)}
    evidence["accumulates_snapshotted"] = snapshotted
    if problems:
        return failed_with(problems, **evidence)
    values = "each result bitwise d_h_s2 + d_concat[:, :SH2]" if snapshotted else "no values kept"
    return passed(
        f"at all {len(ct.call_sites())} call sites d_h_s2 is zeroed inside the site before "
        f"backward_full and each branch's dX[:, :SH2] is accumulated once ({values})",
        **evidence,
    )


INVARIANT = Invariant(
    code="EGF007",
    slug="d-h-s2-accumulation",
    message="d_h_s2 must start from zero and hold exactly value dX + branch dX[:, :SH2] + aux dX.",
    what=(
        "At both call sites of every production step, `d_h_s2` is zeroed by a memset of all "
        "B*SH2 elements after its previous use and before `backward_full`, with no other write "
        "in between; at trunk entry it equals value-FC dX + the first SH2 columns of every "
        "branch's concat dX + aux dX; and no accumulate launch reads column SH2 (the wire) of "
        "`sp14_d_dir_qaux_concat`."
    ),
    why=(
        "B.10 moved the direction branch's dX out of `d_h_s2` into `sp14_d_dir_qaux_concat`. "
        "Before B.10 that dX SGEMM wrote `d_h_s2` with beta = 0 and so cleared it; now only the"
        " value-FC dX (beta = 1) writes it inside `backward_full`, on top of whatever is there."
        " Without the memset the trunk backward of the main site adds the CQL site's stale "
        "gradient. An accumulate that walks into the wire column feeds the gated aux gradient "
        "into the trunk as if it were a hidden-unit gradient."
    ),
    how=(
        "From the launch trace: the last write to `d_h_s2` before the first launch after "
        "`cql:before_backward_full`/`main:before_backward_full` must be a memset covering every"
        " element, and the snapshot there must be bitwise zero. From the "
        "`cql:trunk_entry`/`main:trunk_entry` snapshots: a float64 recomputation `d_v_hid . "
        "W_v0 + sum_d d_concat_d[:, :SH2] + d_aux_logits . W_aux` (weights from `step_start`) "
        "must match `d_h_s2` elementwise within gamma_N * M, where M sums the magnitudes of all"
        " terms and N is twice the terms an element sums: a proved bound for any fp32 "
        "evaluation order. Every accumulate's read region of the dir concat dX must contain no "
        "flat index i with i % (SH2 + 1) == SH2."
    ),
    catches=(
        "A missing `d_h_s2` memset (the value-FC dX accumulates onto stale data), and an "
        "accumulate that reads the dir concat dX with row stride SH2 instead of SH2 + 1 (it "
        "walks into the wire column and shears every later row)."
    ),
    limits=(
        "It checks d_h_s2 against its inflows as they were snapshotted, not whether each inflow "
        "is right (EGF010 checks the step end to end), and within a worst-case fp32 bound, so "
        "an error smaller than that bound, such as a dropped term far smaller than the others, "
        "passes. Only the production trace is read. On a capture the value and aux dX are not "
        "kept: the trunk-entry sum is not recomputed, only the zeroing, the accumulates' "
        "arguments and their bitwise results are judged."
    ),
    example=(
        "`accumulate_d_h_s2_from_concat(d_h_s2, d_dir_qaux_concat, B, SH2, /*ld_concat=*/SH2)`:"
        " row b is read from offset b*SH2, so row 1 starts with row 0's wire column."
    ),
    check=check,
    capture=check_capture,
)
