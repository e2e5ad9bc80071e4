"""EGF007 on a capture: each accumulate_d_h_s2_from_concat launch's arguments held to the
contract, and its result recomputed bitwise from the snapshots around it (the rebuild reads the
same facts from its checkpoints: the trunk-entry sum, invariants/trunk_entry.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from egf_audit.invariants.capture_common import (
    Dims,
    all_values,
    named,
    pointer_problem,
    regions,
    value_problems,
)
from egf_audit.invariants.common import bit_mismatch
from egf_audit.trace.contract import DIR_DX

if TYPE_CHECKING:
    from egf_audit.trace.model import Launch, Trace


def accumulate_problems(ct: Trace, x: Launch, d: Dims) -> list[str]:
    """accumulate_d_h_s2_from_concat held to the contract: d_h_s2 from its start, rows = B,
    sh2 = SH2, d_concat the start of one branch's dX, ld_concat that dX's row width (SH2 + 1
    for the direction branch's, the width the layout gives for the others)."""
    problems = value_problems(x, {"rows": d.B, "sh2": d.SH2})
    if (p := pointer_problem(ct, x, "d_h_s2", "d_h_s2")) is not None:
        problems.append(p)
    dx = x.binding("d_concat", required=False)
    if dx is None or dx.region is None:
        return problems  # an unnamed branch dX: only its own row stride is unknown
    width = d.concat_width if dx.region.buffer == DIR_DX else None
    buffer = ct.capture.layout.buffers.get(dx.region.buffer)
    if width is None and buffer is not None and buffer.shaped and dx.tensor_shape is not None:
        width = dx.tensor_shape[2]
    if dx.region.offset != 0:
        problems.append(f"d_concat points at {dx.region.buffer}[{dx.region.offset}], not its start")
    if width is not None and x.args.get("ld_concat") != width:
        problems.append(
            f"reads {dx.region.buffer} with row stride {x.args.get('ld_concat')}, its rows are "
            f"{width} wide"
        )
    return problems


def accumulate_value_problems(ct: Trace, x: Launch) -> tuple[list[str], bool]:
    """after == before + d_concat[:, :sh2] bitwise on every element (the kernel's own fp32
    add), from the snapshots around the launch; (problems, snapshotted)."""
    before, after = regions(ct, x, "before"), regions(ct, x, "after")
    if not before and not after:
        return [], False
    a, at = x.args, named(x)
    rows, sh2, ld = a.get("rows", 0), a.get("sh2", 0), a.get("ld_concat", 0)
    shapes = {"d_h_s2": (a.get("d_h_s2"), rows * sh2), "d_concat": (a.get("d_concat"), rows * ld)}
    problems = []
    for when, got, names in (("before", before, shapes), ("after", after, ("d_h_s2",))):
        for name in names:
            r = got.get(name)
            if r is None:
                problems.append(f"{at}: no {when} snapshot of {name}")
            elif (r.ptr, r.elements) != shapes[name]:
                problems.append(f"{at}: its {when} snapshot of {name} is not the launch's region")
    if problems:
        return problems, True
    old = all_values(before["d_h_s2"], f"d_h_s2 before {at}").reshape(rows, sh2)
    dx = all_values(before["d_concat"], f"d_concat before {at}").reshape(rows, ld)
    new = all_values(after["d_h_s2"], f"d_h_s2 after {at}").reshape(rows, sh2)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf - Inf is NaN, as on the device
        expected = old + dx[:, :sh2]
    if bit_mismatch(new, expected).any():
        problems.append(f"{at}: d_h_s2 after is not d_h_s2 + d_concat[:, :SH2] bitwise")
    return problems, True
