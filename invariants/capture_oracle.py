"""EGF010 on a deep capture with values: the trainer's own steps, rebuilt from its memory
history at the rebuild's checkpoints, handed to the same float64 oracle (`compare_step`).

Where each checkpoint of a step falls in the captured process (a step runs from the record
after the previous `polyak_ema` through its own; "before record N" means every change of the
calls before N applied, none of N's):

- `step_start`: the state (params, target, Adam m/v, sn vectors) before the step's first kernel
  launch or GEMM, from its first GEMM on, handed a pointer into it (struct parameters
  included); each batch buffer before the first such launch that does not also change it (a
  launch that does gathers the batch into it; one uploaded after the forward began is read
  as the step read it); a buffer no launch is handed, before the first GEMM.
- `after_forward` and `after_losses`: before the first call site's rebuild of the concat (the
  last `sp14_dir_concat_qaux` before the step's first `sp14_scale_wire_col` or
  `accumulate_d_h_s2_from_concat`): the forward, the losses and the gate producer have run and
  the backward has not; ISV[393] before the first scale, as the backward reads it.
- `after_backward`: before the first call after the step's last accumulate that was seen to
  change `params`, `adam_m` or `adam_v` (the optimizer's first write; a launch cuBLAS made
  inside a GEMM counts as that GEMM).
- `before_polyak`: before the step's `polyak_ema`; `step_end`: after it.

The Adam step count is the step's place in the process (1 for the first step): a trainer that
starts fresh. The dims are the layout file's; the hyper-parameters are the contract's
(kernels/CONTRACT.md, section 2; `Captured.hyper`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from egf_audit.oracle import model
from egf_audit.oracle.inputs import NETS
from egf_audit.trace.bindings import bindings_of
from egf_audit.trace.buffers import ELEMENT_BYTES, Buffer, BufferLayout, CaptureLayout
from egf_audit.trace.config_view import ConfigDict, HyperView
from egf_audit.trace.contract import (
    ACCUMULATE_KERNEL,
    AFTER_BACKWARD,
    AFTER_FORWARD,
    AFTER_LOSSES,
    BEFORE_POLYAK,
    BRANCHES,
    CONCAT_KERNEL,
    INT32_BUFFERS,
    ISV,
    POLYAK_KERNEL,
    SCALE_KERNEL,
    STEP_END,
    STEP_START,
)
from egf_audit.trace.memory_history import MemoryHistory, Request
from egf_audit.trace.model import Launch, Missing, Trace
from egf_audit.trace.process import GEMM_KINDS, Record, SnapshotRegion
from egf_audit.trace.spans import Spans

# the layout dims the oracle's shapes come from
DIM_NAMES = ("B", "OBS", "SH1", "SH2", "AUXK", "ADV", "VALH", "A", "E", "N_ISV")
UPDATED = ("params", "adam_m", "adam_v")  # the optimizer's first write to one ends the backward
# what the step updates in place: read at its start before the first launch handed it
STATE = ("params", "target_params", "adam_m", "adam_v", "sn_state")


def oracle_buffers() -> dict[str, tuple[str, ...]]:
    """The buffers the oracle reads, by checkpoint (egf_audit.oracle.inputs and .compare)."""
    batch: list[str] = []
    forward: list[str] = []
    for prefix, softmax, obs, ctx in NETS.values():
        batch += [obs, *(f"{ctx}_b{b}" for b in range(1, len(BRANCHES)))]
        forward += [*(f"{prefix}_{layer}" for layer in model.RELU_LAYERS), softmax]
    forward += [f"tgt_q_b{b}" for b in range(len(BRANCHES))]
    batch += ["actions", "aux_label", "reward", "done"]
    return {
        STEP_START: (*batch, *STATE),
        AFTER_FORWARD: tuple(forward),
        AFTER_LOSSES: ("isv_signals", "td_argmax"),
        AFTER_BACKWARD: ("grad_buf",),
        BEFORE_POLYAK: ("params", "adam_m", "adam_v", "sn_state"),
        STEP_END: ("params", "target_params"),
    }


@dataclass(frozen=True)
class CaptureDims:
    """The layout file's dims, as the oracle reads them (`DimsView`)."""

    B: int
    OBS: int
    SH1: int
    SH2: int
    AUXK: int
    ADV: int
    VALH: int
    A: tuple[int, int, int, int]
    E: tuple[int, int, int, int]
    N_ISV: int


@dataclass(frozen=True)
class CaptureConfig:
    """The capture's dims and the hyper-parameters, as `compare_step` reads a config."""

    dims: CaptureDims
    hyper: HyperView
    preset: str = "capture"
    seed: int = 0

    def as_dict(self) -> ConfigDict:
        return {"preset": self.preset, "seed": self.seed, "dims": {}, "hyper": {}}


def capture_dims(ct: Trace) -> CaptureDims | str:
    """The dims, or which of them the layout does not give."""
    got = ct.capture.layout.dims
    lacking = [name for name in DIM_NAMES if name not in got]
    if lacking:
        return f"no {', '.join(lacking)} in its dims"
    try:
        four = {k: tuple(int(v) for v in got[k]) for k in ("A", "E")}
        ints = {k: int(got[k]) for k in DIM_NAMES if k not in ("A", "E")}
    except (TypeError, ValueError):
        return "dims that are not integers (A and E: four each)"
    if any(len(v) != len(BRANCHES) for v in four.values()):
        return f"A and E with other than {len(BRANCHES)} entries"
    a, e = four["A"], four["E"]
    return CaptureDims(
        B=ints["B"],
        OBS=ints["OBS"],
        SH1=ints["SH1"],
        SH2=ints["SH2"],
        AUXK=ints["AUXK"],
        ADV=ints["ADV"],
        VALH=ints["VALH"],
        A=(a[0], a[1], a[2], a[3]),
        E=(e[0], e[1], e[2], e[3]),
        N_ISV=ints["N_ISV"],
    )


class HistorySnapshot(Mapping[str, np.ndarray]):
    """One checkpoint's buffers, as the history rebuilt them: a buffer whose bytes are unknown
    raises its own `Missing` (why it is unknown) when the oracle reads it."""

    def __init__(self, buffers: dict[str, np.ndarray | Missing]):
        self._buffers = buffers

    def __getitem__(self, buffer: str) -> np.ndarray:
        got = self._buffers[buffer]
        if isinstance(got, Missing):
            raise got
        return got

    def __contains__(self, buffer: object) -> bool:
        return buffer in self._buffers

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffers)

    def __len__(self) -> int:
        return len(self._buffers)


@dataclass(frozen=True)
class Placed:
    """Where a step's checkpoints fall: the record seq each buffer is read before."""

    step: int
    before: dict[str, dict[str, int]]  # checkpoint -> buffer -> record seq


def _handed(outer: CaptureLayout, r: Record) -> set[str]:
    """The buffers a launch was handed a pointer into: its bound operands, and for a kernel
    egf-audit does not know every pointer among its parameters, struct ones included."""
    names = {b.region.buffer for b in bindings_of(outer, r) if b.region is not None}
    for pointer in r.pointers:
        found = outer.resolve(pointer)
        if found is not None:
            names.add(found[0].name)
    return names


def _changes(ct: Trace, r: Record) -> Spans:
    """What a call was seen to change: a kernel's own effect; a GEMM's, the effects of the
    launches cuBLAS made inside it."""
    calls = ct.capture.made_inside().get(r.seq, []) if r.kind in GEMM_KINDS else [r]
    return Spans.runs(
        run for c in calls if (e := ct.capture.process.effects.get(c.seq)) for run in e.changed
    )


def _touches(changed: Spans, b: Buffer) -> bool:
    return bool(changed.intersect(Spans.of([(b.base, b.base + b.size * ELEMENT_BYTES)])))


def _call_seq(r: Record) -> int:
    """The record a checkpoint is placed before: a launch cuBLAS made inside a GEMM is that
    GEMM's call."""
    return r.within if r.within is not None and r.within >= 0 else r.seq


def place_step(ct: Trace, step: int, wanted: dict[str, tuple[str, ...]]) -> Placed:
    """The checkpoints of one step (module docstring); Missing where the step lacks a launch
    a checkpoint is placed by."""
    records = [r for r, x in zip(ct.capture.records, ct.launches, strict=True) if x.step == step]
    polyak = [r for r in records if r.kind == "kernel" and r.name == POLYAK_KERNEL]
    if not polyak:
        raise Missing(f"step {step} launched no {POLYAK_KERNEL}")
    first_gemm = next((i for i, r in enumerate(records) if r.kind in GEMM_KINDS), None)
    if first_gemm is None:
        raise Missing(f"step {step} ran no GEMM: its forward cannot be placed")
    backward = [
        i
        for i, r in enumerate(records)
        if r.kind == "kernel" and r.name in (SCALE_KERNEL, ACCUMULATE_KERNEL)
    ]
    if not backward:
        raise Missing(f"step {step} launched no {SCALE_KERNEL} or {ACCUMULATE_KERNEL}")
    scale = next((i for i in backward if records[i].name == SCALE_KERNEL), backward[0])
    last_accumulate = max(
        (i for i in backward if records[i].name == ACCUMULATE_KERNEL), default=backward[-1]
    )
    # the first call site's rebuild of the concat: the forward and the losses are done there
    rebuild = max(
        (i for i in range(backward[0]) if records[i].name == CONCAT_KERNEL), default=scale
    )
    outer = ct.capture.layout.outermost()
    updated = [outer.buffers[name] for name in UPDATED if name in outer.buffers]
    optimizer = next(
        (
            _call_seq(r)
            for r in records[last_accumulate + 1 :]
            if any(_touches(_changes(ct, r), b) for b in updated)
        ),
        None,
    )
    if optimizer is None:
        raise Missing(
            f"no call of step {step} after its last accumulate was seen to change "
            f"{', '.join(UPDATED)}: the end of its backward cannot be placed"
        )
    first_read: dict[str, int] = {}
    for r in records[first_gemm:]:
        if r.kind not in ("kernel", *GEMM_KINDS) or r.within is not None:
            continue
        for name in _handed(outer, r) - set(first_read):
            # state is read before the step changes it in place; a batch buffer is read by the
            # first launch that does not write it (one that does gathers the batch into it)
            if name in STATE or not _touches(_changes(ct, r), outer.buffers[name]):
                first_read[name] = r.seq
    start = records[first_gemm].seq

    def at(checkpoint: str, name: str) -> int:
        if checkpoint == STEP_START:
            return first_read.get(name, start)
        if checkpoint == AFTER_FORWARD or (checkpoint == AFTER_LOSSES and name != ISV):
            return records[rebuild].seq
        return {
            AFTER_LOSSES: records[scale].seq,  # ISV[393] as the backward's scale reads it
            AFTER_BACKWARD: optimizer,
            BEFORE_POLYAK: polyak[-1].seq,
            STEP_END: polyak[-1].seq + 1,
        }[checkpoint]

    before = {
        checkpoint: {name: at(checkpoint, name) for name in names}
        for checkpoint, names in wanted.items()
    }
    return Placed(step, before)


def _layout(ct: Trace) -> dict[str, BufferLayout]:
    layout = ct.capture.layout.as_trace_layout()
    for name in INT32_BUFFERS:
        if name in layout:
            layout[name]["dtype"] = "i32"
    return layout


def oracle_trace(ct: Trace, steps: list[int]) -> tuple[Trace, list[str], int]:
    """A Trace holding, for each step that can be placed, its checkpoints (as launches, with
    the Adam step count) and their snapshots rebuilt from the memory history; the problems of
    the steps that cannot be placed and of snapshot regions the history contradicts; and how
    many regions the history was checked against."""
    wanted = oracle_buffers()
    trace = Trace(ct.scenario, "capture", _layout(ct))
    problems: list[str] = []
    requests: list[Request] = []
    placed: list[Placed] = []
    for step in steps:
        try:
            p = place_step(ct, step, wanted)
        except Missing as exc:
            problems.append(str(exc))
            continue
        placed.append(p)
        for checkpoint, reads in p.before.items():
            for name, seq in reads.items():
                b = ct.capture.layout.buffers[name]
                key = f"{step}|{checkpoint}|{name}"
                requests.append(Request(key, seq, b.base, b.size * ELEMENT_BYTES))
    regions = [
        r for r in ct.capture.process.snapshots if r.complete and r.rows <= 1 and r.values.size
    ]
    for i, r in enumerate(regions):
        before = r.launch + 1 if r.when == "after" else r.launch
        requests.append(Request(f"snapshot|{i}", before, r.ptr, r.values.size * 4))
    got = MemoryHistory(ct.capture.process).read(requests)
    checked, disagree = _snapshot_disagreements(regions, got)
    problems += disagree
    for p in placed:
        for checkpoint in wanted:
            meta = {"adam_t": p.step + 1} if checkpoint in (STEP_START, BEFORE_POLYAK) else {}
            trace.launches.append(
                Launch(len(trace.launches), p.step, "checkpoint", checkpoint, checkpoint, meta)
            )
            buffers: dict[str, np.ndarray | Missing] = {}
            for name in p.before[checkpoint]:
                raw = got[f"{p.step}|{checkpoint}|{name}"]
                dtype = "<i4" if name in INT32_BUFFERS else "<f4"
                buffers[name] = raw if isinstance(raw, Missing) else raw.view(dtype)
            trace.snapshots[(p.step, checkpoint)] = HistorySnapshot(buffers)
    return trace, problems, checked


def _snapshot_disagreements(
    regions: list[SnapshotRegion], got: dict[str, np.ndarray | Missing]
) -> tuple[int, list[str]]:
    """The recorder took its snapshot regions itself, around the ABI kernels: where the history
    knows the same bytes, they must be the same (a values file edited on its own disagrees).
    A region the history cannot vouch for is no disagreement: what the oracle reads of it fails
    on its own."""
    problems = []
    checked = 0
    for i, r in enumerate(regions):
        known = got[f"snapshot|{i}"]
        if isinstance(known, Missing):
            continue
        checked += 1
        kept = np.ascontiguousarray(r.values, dtype="<f4").view(np.uint8)
        if not np.array_equal(kept, known):
            first = int(np.flatnonzero(kept != known)[0]) // 4
            problems.append(
                f"the values file disagrees with the recorder's {r.region} snapshot {r.when} "
                f"launch {r.launch} (first at element {first}): the capture contradicts itself"
            )
    return checked, problems


def unnamed_buffers(ct: Trace) -> list[str]:
    """The buffers the oracle reads that the layout does not name."""
    wanted = {name for names in oracle_buffers().values() for name in names}
    return sorted(wanted - set(ct.capture.layout.buffers))
