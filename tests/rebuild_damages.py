"""Rebuild traces damaged where their values cannot show it: each shared rule's rebuild branch
(issue 30, one rule per invariant) must fail on these, although every snapshot is the clean
run's. tests/test_invariants_core.py asserts each verdict; the mutation harness
(tests/mutation/mutate.py) judges its mutants on the same damaged runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def each_launch(change: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A damage that passes every launch of a trace through `change` (its snapshots kept)."""

    def damage(trace):
        return dataclasses.replace(trace, launches=[change(x) for x in trace.launches])

    return damage


@each_launch
def dh_s2_gemms_overwrite(x):
    """Each GEMM that adds its dX to d_h_s2 (beta = 1) made to overwrite it (beta = 0)."""
    if x.kind == "sgemm" and x.writes_to("d_h_s2") and x.args.get("beta") == 1.0:
        return dataclasses.replace(x, args={**x.args, "beta": 0.0})
    return x


@each_launch
def dw_gemms_not_run(x):
    """The GEMMs that write dW w_b0fc marked as not run (their values stay in the snapshots,
    so only the flow of launches can see they are missing)."""
    c = x.binding("C", required=False) if x.kind == "sgemm" else None
    if c is not None and c.tensor == "w_b0fc" and c.region and c.region.buffer == "grad_buf":
        return dataclasses.replace(x, executed=False)
    return x


@each_launch
def online_concat_reads_the_target(x):
    """Each online rebuild of the concat made to name the target's h_s2 (its values stay in the
    snapshots, so only the flow of launches can see the wrong input)."""
    if not x.label.startswith("rebuild_online_concat@"):
        return x

    def moved(b):
        if b.role != "h_s2" or b.region is None:
            return b
        return dataclasses.replace(b, region=dataclasses.replace(b.region, buffer="tgt_h_s2"))

    return dataclasses.replace(x, bindings=tuple(moved(b) for b in x.bindings))


def unknown_kernel_on_the_target(trace):
    """The first production launch reading target_params made a kernel egf-audit does not
    know (access "?"), the way a capture binds one: it may have written what it was handed."""
    first = next(
        (
            x.index
            for x in trace.launches
            if x.step == 1
            and any(b.region is not None and b.region.buffer == "target_params" for b in x.bindings)
            and x.name != "polyak_ema"
        ),
        None,
    )
    if first is None:
        return trace
    x = trace.launches[first]
    unknown = tuple(dataclasses.replace(b, access="?") for b in x.bindings)
    launches = list(trace.launches)
    launches[first] = dataclasses.replace(x, bindings=unknown)
    return dataclasses.replace(trace, launches=launches)


@each_launch
def dw_reads_the_scaled_dx(x):
    """The main site's d = 0 dW GEMM made to read its x from the dX buffer the cql site's scale
    just wrote, in place of the concat scratch (same box): the values it computed stay."""
    if x.label != "backward_branch_dw[d=0]@main":
        return x

    def moved(b):
        if b.role != "A" or b.region is None:
            return b
        region = dataclasses.replace(b.region, buffer="sp14_d_dir_qaux_concat")
        return dataclasses.replace(b, region=region)

    return dataclasses.replace(x, bindings=tuple(moved(b) for b in x.bindings))


def scale_writes_dw(trace):
    """Every scale launch made to write the wire column of dW w_b0fc in grad_buf (the
    snapshots stay the clean run's)."""
    tensors = trace.layout.get("grad_buf", {}).get("tensors", {})
    if "w_b0fc" not in tensors:
        return trace
    offset, rows, cols = tensors["w_b0fc"]
    wire = {"buffer": "grad_buf", "offset": offset + cols - 1, "rows": rows, "ld": cols}

    def moved(b):
        if not b.writes or b.region is None:
            return b
        return dataclasses.replace(b, region=dataclasses.replace(b.region, **wire))

    return dataclasses.replace(
        trace,
        launches=[
            dataclasses.replace(x, bindings=tuple(moved(b) for b in x.bindings))
            if x.name == "sp14_scale_wire_col"
            else x
            for x in trace.launches
        ],
    )


@each_launch
def memset_onto_the_target(x):
    """The main site's zeroing memset made to write target_params from its start (one binding,
    the write: the finding names it; the snapshots stay the clean run's)."""
    if x.label != "zero_d_h_s2@main":
        return x
    moved = tuple(
        dataclasses.replace(b, region=dataclasses.replace(b.region, buffer="target_params"))
        if b.region is not None
        else b
        for b in x.bindings
    )
    return dataclasses.replace(x, bindings=moved)


# name: (the damage of each trace, the invariant whose rebuild branch it fails)
@each_launch
def concat_rebuild_short_grid(x):
    """Every launch of the dir concat (the forwards and the rebuilds) recorded as launched
    with one block of 32 threads for its rows (the values stay the clean run's, so only the
    launch's shape shows it)."""
    if x.kind == "kernel" and x.name == "sp14_dir_concat_qaux":
        return dataclasses.replace(x, args={**x.args, "grid": 1, "block": 32})
    return x


DAMAGES: dict[str, tuple[Callable[[Any], Any], str]] = {
    "dx-gemms-overwrite-d_h_s2": (dh_s2_gemms_overwrite, "EGF007"),
    "dw-w_b0fc-gemms-not-run": (dw_gemms_not_run, "EGF002"),
    "dw-reads-the-scaled-dx": (dw_reads_the_scaled_dx, "EGF002"),
    "scale-writes-dw": (scale_writes_dw, "EGF002"),
    "online-concat-reads-target-h_s2": (online_concat_reads_the_target, "EGF006"),
    "unknown-kernel-on-target": (unknown_kernel_on_the_target, "EGF005"),
    "memset-onto-target": (memset_onto_the_target, "EGF005"),
    "concat-rebuild-short-grid": (concat_rebuild_short_grid, "EGF001"),
}


def damaged(run: Any, damage: Callable[[Any], Any]) -> Any:
    """`run` with every trace damaged."""
    return dataclasses.replace(run, traces={n: damage(t) for n, t in run.traces.items()})
