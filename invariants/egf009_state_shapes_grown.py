"""EGF009 state-shapes-grown: every per-parameter state was grown with w_b0fc.

From the layout the trace recorded: the adam_m / adam_v offset tables equal the params table
(w_b0fc [ADV, SH2 + 1] included), and the spectral-norm vectors of w_b0fc span its columns (v)
and rows (u), scratch included. From the launches: every adam_update's four slices have the
parameter tensor's size and sit on the tensor of that name, each tensor updated once a step,
and every spectral-norm launch that touches u or v covers the whole vector.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from egf_audit.invariants.common import (
    describe,
    in_step,
    kinds,
    listed,
    production,
    size,
    steps,
)
from egf_audit.invariants.registry import Invariant, Verdict, failed, passed, undecided
from egf_audit.trace.bindings import bindings_of
from egf_audit.trace.buffers import tensor_table
from egf_audit.trace.model import Trace

if TYPE_CHECKING:
    from egf_audit.trace.audit_run import AuditRun
    from egf_audit.trace.buffers import BufferLayout
    from egf_audit.trace.model import Binding, Launch, Trace

ADAM_ROLES = {"param": "params", "grad": "grad_buf", "m": "adam_m", "v": "adam_v"}
SN_PREFIX = "spectral_norm:"
NO_ADAM_UPDATE = (
    "no adam_update launch: the trainer does not update per tensor with the ABI's kernel, so no "
    "launch argument carries a tensor's Adam slices"
)
# (buffer, tensor, which extent of w_b0fc it must span): v multiplies W from the right, u from
# the left, and each power-iteration scratch has its vector's length
SN_VECTORS = (
    ("sn_state", "v_b0fc", "cols"),
    ("sn_scratch_v", "sn_scratch_v", "cols"),
    ("sn_state", "u_b0fc", "rows"),
    ("sn_scratch_u", "sn_scratch_u", "rows"),
)


def _layout_failures(
    layout: Mapping[str, BufferLayout], adv: int, width: int
) -> list[dict[str, object]]:
    """Offset tables and vector lengths; `width` is SH2 + 1."""
    out: list[dict[str, object]] = []
    params = tensor_table(layout, "params")
    shape = params.get("w_b0fc", [None])[1:]
    if shape != [adv, width]:
        out.append({"kind": "w_b0fc-shape", "shape": shape, "expected": [adv, width]})
    for state in ("adam_m", "adam_v"):
        # one failure per table, naming the first tensor that differs: the ones after it
        # usually differ only because that one shifted them
        table = tensor_table(layout, state)
        names = [*params, *(n for n in table if n not in params)]
        differ = [n for n in names if table.get(n) != params.get(n)]
        if differ:
            out.append(
                {
                    "kind": "adam-state-table",
                    "buffer": state,
                    "tensor": differ[0],
                    "state": table.get(differ[0]),
                    "param": params.get(differ[0]),
                    "tensors_differing": len(differ),
                }
            )
    for buffer, name, spans in SN_VECTORS:
        spec = tensor_table(layout, buffer).get(name)
        length = spec[1] * spec[2] if spec else None
        expected = width if spans == "cols" else adv
        if length != expected:
            out.append(
                {
                    "kind": "sn-vector-length",
                    "buffer": buffer,
                    "tensor": name,
                    "length": length,
                    "expected": expected,
                }
            )
    return out


def _adam_failure(
    x: Launch, params: dict[str, list[int]]
) -> tuple[dict[str, object] | None, str | None]:
    """(failure or None, the parameter tensor updated) of one adam_update launch."""
    bound = {role: x.binding(role, required=False) for role in ADAM_ROLES}
    param = bound["param"]
    name = param.tensor if param else None
    spec = params.get(name) if name is not None else None
    expected = spec[1] * spec[2] if spec else None
    if expected is not None and all(
        _slice_ok(bound[role], buffer, name, expected) for role, buffer in ADAM_ROLES.items()
    ):
        return None, name
    slices = {
        role: {"tensor": b.tensor, **(describe(b.region) or {})} if b else None
        for role, b in bound.items()
    }
    failure: dict[str, object] = {
        "kind": "adam-slice",
        "step": x.step,
        "label": x.label,
        "tensor": name,
        "param_size": expected,
        "slices": slices,
    }
    return failure, name


def _slice_ok(b: Binding | None, buffer: str, name: str | None, expected: int) -> bool:
    """On `buffer`, starting at the first element of the tensor `name`, `expected` long."""
    return (
        b is not None
        and b.region is not None
        and b.region.buffer == buffer
        and b.tensor == name
        and b.tensor_shape is not None
        and b.region.offset == b.tensor_shape[0]
        and size(b.region) == expected
    )


def _sn_failures(x: Launch, adv: int, width: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for b in x.bindings:
        if b.region is None:
            continue
        is_v = b.region.buffer == "sn_scratch_v" or b.tensor == "v_b0fc"
        is_u = b.region.buffer == "sn_scratch_u" or b.tensor == "u_b0fc"
        expected = width if is_v else adv if is_u else None
        if expected is not None and size(b.region) != expected:
            out.append(
                {
                    "kind": "sn-launch-length",
                    "step": x.step,
                    "label": x.label,
                    "role": b.role,
                    "tensor": b.tensor,
                    "length": size(b.region),
                    "expected": expected,
                }
            )
    return out


def _touches_v(x: Launch) -> bool:
    return any(
        b.region and (b.region.buffer == "sn_scratch_v" or b.tensor == "v_b0fc") for b in x.bindings
    )


SN_SCRATCH = ("sn_scratch_u", "sn_scratch_v")


def _is_spectral_norm(x: Launch) -> bool:
    """The rebuild labels its spectral-norm launches (their GEMMs on w_b0fc among them)."""
    return x.label.startswith(SN_PREFIX)


def _touches_sn_vector(x: Launch) -> bool:
    """A captured launch has no label but its name: a spectral-norm launch is one bound to u or
    v of w_b0fc or to their scratch, which is every launch whose lengths the check reads."""
    return any(
        b.region and (b.region.buffer in SN_SCRATCH or b.tensor in ("u_b0fc", "v_b0fc"))
        for b in x.bindings
    )


def _adam_step(
    launches: list[Launch],
    step: int,
    params: dict[str, list[int]],
    failures: list[dict[str, object]],
) -> int:
    """The adam_update launches of one step held to the parameter table (their failures
    appended to `failures`, each tensor updated exactly once); how many there were."""
    updated: list[str | None] = []
    for x in launches:
        if x.kind == "kernel" and x.name == "adam_update":
            failure, name = _adam_failure(x, params)
            failures += [failure] if failure else []
            updated.append(name)
    counts = {n: updated.count(n) for n in set(updated) | set(params)}
    wrong = {n: c for n, c in sorted(counts.items(), key=str) if c != 1}
    if wrong:
        failures.append({"kind": "adam-coverage", "step": step, "updates": wrong})
    return len(updated)


def judge(
    trace: Trace,
    step_numbers: list[int],
    adv: int,
    width: int,
    is_spectral_norm: Callable[[Launch], bool],
    updates_seen: bool = True,
) -> Verdict:
    """The layout's tables and the launches of `step_numbers`, for both ways of seeing: the
    rebuild's production trace and a capture's trace (`width` is SH2 + 1). `updates_seen`:
    the launches carry each tensor's Adam slices (the ABI's adam_update). Where they do not (a
    trainer's own optimizer) the tables and the vectors' lengths are judged all the
    same from the layout, and a verdict with nothing wrong there is UNDECIDED: what the update
    and the spectral norm's launches cover is then not seen."""
    layout = trace.layout
    params = tensor_table(layout, "params")
    failures = _layout_failures(layout, adv, width)
    adam_launches = sn_launches = 0
    # Where the optimizer is the trainer's own, its launches are kernels egf-audit does not
    # know (a pointer each, no extent) and copies that may span u and v together: their
    # lengths say nothing, so only the tables are judged, and the rest is UNDECIDED.
    for step in step_numbers if updates_seen else ():
        launches = in_step(trace, step)
        adam_launches += _adam_step(launches, step, params, failures)
        sn = [x for x in launches if is_spectral_norm(x)]
        sn_launches += len(sn)
        for x in sn:
            failures += _sn_failures(x, adv, width)
        if not any(_touches_v(x) for x in sn):
            failures.append({"kind": "sn-v-unused", "step": step})

    evidence = {
        **listed(failures),
        "w_b0fc": params.get("w_b0fc"),
        "v_b0fc": tensor_table(layout, "sn_state").get("v_b0fc"),
        "adam_launches": adam_launches,
        "spectral_norm_launches": sn_launches,
    }
    if failures:
        return failed(
            f"{len(failures)} state-shape violation(s): {', '.join(kinds(failures))}",
            **evidence,
        )
    if not updates_seen:
        return undecided(
            f"{NO_ADAM_UPDATE}; the layout's tables hold: adam_m/adam_v equal params "
            f"({len(params)} tensors, w_b0fc [{adv}, {width}]), v_b0fc spans {width}, u_b0fc "
            f"{adv}",
            **evidence,
        )
    return passed(
        f"adam_m/adam_v tables equal params ({len(params)} tensors, w_b0fc [{adv}, {width}]); "
        f"v_b0fc spans {width}, u_b0fc {adv}; {adam_launches} adam_update and "
        f"{sn_launches} spectral-norm launches match their tensors",
        **evidence,
    )


def check(run: AuditRun, mode: str) -> Verdict:
    trace = production(run, mode)
    dims = run.config.dims
    return judge(trace, steps(trace), dims.ADV, dims.SH2 + 1, _is_spectral_norm)


# what a capture's layout must name for the per-tensor check: the parameter table's buffers
CAPTURE_TABLES = ("params", "adam_m", "adam_v", "sn_state")


def check_capture(ct: Trace) -> Verdict:
    """The same check on a capture, where the trainer updates per tensor with the ABI's
    adam_update and names its optimizer state in the layout file; otherwise UNDECIDED."""
    adv, sh2 = ct.capture.dim("ADV"), ct.capture.dim("SH2")
    lacking = [b for b in CAPTURE_TABLES if b not in ct.capture.layout.buffers]
    if adv is None or sh2 is None or lacking:
        what = "no ADV and SH2 in its dims" if adv is None or sh2 is None else ", ".join(lacking)
        return undecided(
            f"the layout does not name the optimizer state ({what}): Adam's m/v slices and the "
            "spectral-norm vectors cannot be placed"
        )
    updates_seen = any(r.kind == "kernel" and r.name == "adam_update" for r in ct.capture.records)
    steps_run = ct.site_steps()
    if not steps_run:
        return failed("no training step reached its polyak_ema: no update to judge")
    # judged against the allocation-level buffers: a view the layout names inside params (or
    # another state table) is not the table an Adam slice must sit on
    outer = ct.capture.layout.outermost()
    trace = Trace(ct.scenario, ct.backend, outer.as_trace_layout())
    trace.launches = [
        dataclasses.replace(x, bindings=bindings_of(outer, r))
        for x, r in zip(ct.launches, ct.capture.records, strict=True)
    ]
    return judge(trace, steps_run, adv, sh2 + 1, _touches_sn_vector, updates_seen)


INVARIANT = Invariant(
    code="EGF009",
    slug="state-shapes-grown",
    message="Adam m/v and the spectral-norm vectors of w_b0fc must span [ADV, SH2 + 1].",
    what=(
        "The Adam `m` and `v` offset tables equal the parameter table tensor for tensor "
        "(`w_b0fc` is `[ADV, SH2 + 1]`), the spectral-norm vector `v` of `w_b0fc` and its "
        "scratch span SH2 + 1 and `u` spans ADV; every `adam_update` launch updates one "
        "parameter tensor whole, with its param, grad, m and v slices each on the tensor of "
        "that name and of that size; every spectral-norm launch covers whole vectors."
    ),
    why=(
        "B.8 grew `w_b0fc` by one column. Every per-parameter state has to grow with it: an "
        "Adam table still sized `[ADV, SH2]` makes the update of `w_b0fc` `ADV * SH2` long, "
        "so its last ADV weights are never trained; a spectral-norm `v` of length SH2 "
        "estimates the norm of the matrix without its wire column, so the projection lets the "
        "wire weights grow unbounded. Neither crashes: every access is in bounds."
    ),
    how=(
        "From the `layout` the trace recorded (buffer -> tensors -> [offset, rows, cols]): "
        "table equality for `adam_m`/`adam_v` against `params`, and the lengths of `v_b0fc`, "
        "`u_b0fc`, `sn_scratch_v`, `sn_scratch_u`. From the launches of every production "
        "step: each `adam_update` binding's region size, buffer, start offset and tensor name "
        "against the parameter tensor; one update per tensor per step; every `spectral_norm:*` "
        "binding on u or v of exactly ADV or SH2 + 1 elements."
    ),
    catches=(
        "Adam state slices of `w_b0fc` left at the pre-B.8 shape `[ADV, SH2]`, and the "
        "spectral-norm vector `v` of `w_b0fc` left at the pre-B.8 length SH2."
    ),
    limits=(
        "It checks sizes and placement, from the recorded layout and the launches' declared "
        "regions, not what Adam or the spectral norm compute (EGF010 compares the update with "
        "its float64 model). Spectral-norm launches are found by their `spectral_norm:` label, "
        "and only the production trace is read. On a capture it is decided where the trainer "
        "updates per tensor with the ABI's `adam_update` and its layout file names `params`, "
        "`adam_m`, `adam_v` and `sn_state` with their tensors (spectral-norm launches are then "
        "those bound to u, v or their scratch). A trainer with an optimizer of its own indexes "
        "its state inside its kernels, where no launch argument shows it: its layout file's "
        "tables and vector lengths are judged all the same (a short `v_b0fc` fails), and what "
        "its launches cover is UNDECIDED, with the reason."
    ),
    example=(
        "`adam_m` allocated from the old shape table: `adam_update(poff_w_b0fc, goff_w_b0fc, "
        "m + moff_w_b0fc, ..., n = ADV * SH2)` leaves ADV weights without an update."
    ),
    check=check,
    capture=check_capture,
)
