"""Polyak's update measured, for EGF005 on a rebuild and on a capture alike: the blend's error
in fp32 ulps of its terms, and polyak_ema's arguments held to the contract."""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

import numpy as np
import torch

from egf_audit.invariants.capture_common import all_values, named, pointer_problem, regions
from egf_audit.invariants.common import json_float
from egf_audit.trace.contract import POLYAK_TAU, TARGET

if TYPE_CHECKING:
    from egf_audit.trace.model import Launch, Trace

MAX_POLYAK_ULP = 2
PAD_ELEMENTS = 64  # floats in the 256-byte granule an allocator rounds a buffer up to


def polyak_argument_problems(ct: Trace, x: Launch, net: int | None) -> list[str]:
    """polyak_ema(target, online, tau, n) held to the contract: target is the start of
    target_params, online the start of params, n the whole net (the layout's parameter table's
    extent, or it rounded up to a 256-byte granule, where it gives one; else both buffers'
    size, which must agree), tau the layout's `dims.tau`, or the preset's (POLYAK_TAU) for a
    trainer that states none, as the rebuild uses its config's."""
    problems = [
        p
        for p in (
            pointer_problem(ct, x, "target", TARGET),
            pointer_problem(ct, x, "online", "params"),
        )
        if p is not None
    ]
    # n is the whole net: the parameter table's extent, or (a trainer that allocates its
    # parameter buffers in 256-byte granules) that extent rounded up to 64 floats; both buffers
    # of that size. Without a table: both buffers' size.
    sizes = {ct.capture.layout.buffers[TARGET].size, ct.capture.layout.buffers["params"].size}
    room = min(sizes)
    allowed = {max(sizes)} if net is None else {net, -(-net // PAD_ELEMENTS) * PAD_ELEMENTS}
    n = x.args.get("n")
    if len(sizes) != 1 or n not in allowed or not isinstance(n, int) or n > room:
        words = " or ".join(str(a) for a in sorted(allowed))
        problems.append(
            f"n = {n}, the whole net is {words} elements (target_params and params hold "
            f"{' and '.join(str(z) for z in sorted(sizes))})"
        )
    tau, stated = x.args.get("tau"), ct.capture.layout.dims.get("tau")
    expected = POLYAK_TAU if stated is None else stated
    whose = "the preset's (the layout states no dims.tau)" if stated is None else "the layout's"
    if not isinstance(tau, float) or np.float32(tau) != np.float32(expected):
        problems.append(f"tau = {tau}, {whose} tau is {expected}")
    return problems


def net_elements(ct: Trace) -> int | None:
    """The parameter table's extent, where the layout file gives one (param_offsets)."""
    params = ct.capture.layout.buffers.get("params")
    if params is None or not ct.capture.layout.from_file or not params.shaped:
        return None
    ends = [offset + rows * cols for offset, rows, cols in params.tensors.values()]
    return max(ends) if ends and "params" not in params.tensors else None


@overload
def polyak_error_ulps(
    online: np.ndarray, start: np.ndarray, end: np.ndarray, tau: float
) -> np.ndarray: ...
@overload
def polyak_error_ulps(
    online: torch.Tensor, start: torch.Tensor, end: torch.Tensor, tau: float
) -> torch.Tensor: ...
def polyak_error_ulps(
    online: np.ndarray | torch.Tensor,
    start: np.ndarray | torch.Tensor,
    end: np.ndarray | torch.Tensor,
    tau: float,
) -> np.ndarray | torch.Tensor:
    """|end - (tau * online + (1 - tau) * start)|, exact in float64, in fp32 ulps of the terms'
    magnitude |tau * online| + |(1 - tau) * start|; 0 where a non-finite input propagated, inf
    where the result is not finite and should be. Arrays give an array (a capture's host
    copies); tensors a tensor on their device (the rebuild's snapshots, on the GPU there).

    The kernel rounds each product relative to itself, not to the sum. Where the two terms
    nearly cancel (a parameter crossing zero) the result's own ulp is far below those
    roundings, so the ulp is taken at the terms' magnitude; elsewhere the two agree."""
    if isinstance(online, np.ndarray):
        # a capture's arrays are read-only views of its files, which torch.from_numpy would
        # share and warn about: a writable copy where one is needed (the values are read only)
        host = [
            torch.from_numpy(np.require(a, requirements=("C", "W"))) for a in (online, start, end)
        ]
        return polyak_error_ulps(host[0], host[1], host[2], tau).numpy()
    assert isinstance(start, torch.Tensor) and isinstance(end, torch.Tensor)
    o, t, e = online.double(), start.double(), end.double()
    exact = tau * o + (1.0 - tau) * t
    magnitude = (tau * o).abs() + ((1.0 - tau) * t).abs()
    m32 = magnitude.float()
    ulp = (torch.nextafter(m32, torch.full_like(m32, torch.inf)) - m32).double()  # np.spacing
    ulps = (e - exact).abs() / ulp
    # a non-finite parameter propagates (NaN gives NaN, Inf the same Inf): the blend is right;
    # a non-finite result from finite inputs is infinitely far
    propagated = (exact.isnan() & e.isnan()) | (exact.isinf() & (e == exact))
    return torch.where(propagated, 0.0, torch.where(ulps.isnan(), torch.inf, ulps))


def first_and_count(mask: torch.Tensor) -> torch.Tensor:
    """[first set element or -1, how many are set] of a flat mask, on its device (float64:
    exact below 2**53), to be read back with the rest of the check."""
    if not mask.numel():
        return torch.tensor([-1.0, 0.0], dtype=torch.float64, device=mask.device)
    first = torch.where(mask.any(), mask.int().argmax(), -1)
    return torch.stack([first, mask.sum()]).double()


def polyak_snapshot_problems(ct: Trace, x: Launch) -> tuple[list[str], bool]:
    """(problems, snapshotted) of one Polyak launch's own snapshots, values included."""
    before, after = regions(ct, x, "before"), regions(ct, x, "after")
    if not before and not after:
        return [], False
    n, at = x.args.get("n"), named(x)
    problems = []
    for when, got, names in (
        ("before", before, ("target", "online")),
        ("after", after, ("target",)),
    ):
        for name in names:
            r = got.get(name)
            if r is None:
                problems.append(f"{at}: no {when} snapshot of {name}")
            elif (r.ptr, r.elements) != (x.args.get(name), n):
                problems.append(f"{at}: its {when} snapshot of {name} is not the launch's region")
    if problems:
        return problems, True
    online = all_values(before["online"], f"params before {at}")
    start = all_values(before["target"], f"target_params before {at}")
    end = all_values(after["target"], f"target_params after {at}")
    ulps = polyak_error_ulps(online, start, end, float(np.float32(x.args["tau"])))
    if ulps.size and float(np.max(ulps)) > MAX_POLYAK_ULP:
        problems.append(
            f"{at}: the result is {json_float(np.max(ulps))} ulp from tau * params + (1 - tau) "
            f"* target (at most {MAX_POLYAK_ULP})"
        )
    return problems, True


# ---- the target from step to step, by the recorder's hashes (a capture) ----
def _step_start_hashes(ct: Trace) -> dict[int, str]:
    """The recorder's hash of target_params at the first launch of each step after the first
    (it snapshots the last Polyak's target again there), by step."""
    position = {r.seq: i for i, r in enumerate(ct.capture.records)}
    out = {}
    for s in ct.capture.process.snapshots:
        if s.when == "step_start" and s.region == "target" and s.launch in position:
            out[ct.launches[position[s.launch]].step] = s.hash
    return out


def target_chain_problems(
    ct: Trace, polyaks: list[Launch], snapshotted: bool
) -> tuple[list[str], set[int]]:
    """(problems, the steps proven): at each step's start the target is its previous Polyak's
    result, and it is unchanged until this step's Polyak (the recorder's hashes over every
    element); a step whose start was hashed and equals its Polyak's before-snapshot is proven
    to leave the target unchanged until then."""
    starts = _step_start_hashes(ct)
    polyak_of_step = {x.step: x for x in polyaks}
    problems: list[str] = []
    proven: set[int] = set()
    for step, x in polyak_of_step.items():
        before = regions(ct, x, "before").get("target")
        previous = polyak_of_step.get(step - 1)
        if step in starts and before is not None:
            if starts[step] != before.hash:
                problems.append(
                    f"step {step}: target_params changed between the step's start and its Polyak"
                )
            else:
                proven.add(step)
        elif step > 0 and snapshotted:
            problems.append(f"step {step}: no snapshot of target_params at the step's start")
        last = regions(ct, previous, "after").get("target") if previous is not None else None
        if step in starts and last is not None and starts[step] != last.hash:
            problems.append(
                f"step {step}: target_params at the step's start is not the previous Polyak's "
                "result (a step repeated, skipped or rolled back)"
            )
    return problems, proven
