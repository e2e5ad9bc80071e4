"""EGF010 on a deep capture with values: the trainer's own steps, rebuilt from its memory
history at the rebuild's checkpoints, handed to the same float64 oracle (`compare_step`).

Where each checkpoint of a step falls in the captured process (a step runs from the record
after the previous `polyak_ema` through its own; "before record N" means every change of the
calls before N applied, none of N's):

- `step_start`: each buffer as the step first reads it: before the step's first kernel launch or
  GEMM, from its first GEMM on, that is handed a pointer into the buffer (the batch may be
  uploaded after the forward began); a buffer no launch is handed, before the first GEMM.
- `after_forward` and `after_losses`: before the step's first `sp14_scale_wire_col` (or, in a
  step without one, its first `accumulate_d_h_s2_from_concat`): the forward, the losses and the
  gate producer have run, and ISV[393] is what the backward reads.
- `after_backward`: before the first call after the step's last accumulate that was seen to
  change `params`, `adam_m` or `adam_v` (the optimizer's first write; a launch cuBLAS made
  inside a GEMM counts as that GEMM).
- `before_polyak`: before the step's `polyak_ema`; `step_end`: after it.

The Adam step count is the step's place in the process (1 for the first step): a trainer that
starts fresh. The dims are the layout file's; the hyper-parameters are SPEC section 2's
(`CaptureTrace.hyper`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from egf_audit.oracle import model
from egf_audit.oracle.inputs import NETS
from egf_audit.runtime.capture_memory import MemoryHistory, Request
from egf_audit.runtime.capture_model import (
    CaptureLayout,
    CaptureTrace,
    Record,
    SnapshotRegion,
    bindings_of,
)
from egf_audit.runtime.config_view import ConfigDict, HyperView
from egf_audit.runtime.contract import (
    ACCUMULATE_KERNEL,
    AFTER_BACKWARD,
    AFTER_FORWARD,
    AFTER_LOSSES,
    BEFORE_POLYAK,
    BRANCHES,
    INT32_BUFFERS,
    POLYAK_KERNEL,
    SCALE_KERNEL,
    STEP_END,
    STEP_START,
)
from egf_audit.runtime.trace import BufferLayout, Launch, Missing, Trace

# the layout dims the oracle's shapes come from
DIM_NAMES = ("B", "OBS", "SH1", "SH2", "AUXK", "ADV", "VALH", "A", "E", "N_ISV")
UPDATED = ("params", "adam_m", "adam_v")  # the optimizer's first write to one ends the backward


def oracle_buffers() -> dict[str, tuple[str, ...]]:
    """The buffers the oracle reads, by checkpoint (egf_audit.oracle.inputs and .compare)."""
    batch: list[str] = []
    forward: list[str] = []
    for prefix, softmax, obs, ctx in NETS.values():
        batch += [obs, *(f"{ctx}_b{b}" for b in range(1, len(BRANCHES)))]
        forward += [*(f"{prefix}_{layer}" for layer in model.RELU_LAYERS), softmax]
    forward += [f"tgt_q_b{b}" for b in range(len(BRANCHES))]
    batch += ["actions", "aux_label", "reward", "done"]
    state = ["params", "target_params", "adam_m", "adam_v", "sn_state"]
    return {
        STEP_START: (*batch, *state),
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


def capture_dims(ct: CaptureTrace) -> CaptureDims | str:
    """The dims, or which of them the layout does not give."""
    got = ct.layout.dims
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


def _bound_buffers(outer: CaptureLayout, r: Record) -> set[str]:
    return {b.region.buffer for b in bindings_of(outer, r) if b.region is not None}


def _call_seq(r: Record) -> int:
    """The record a checkpoint is placed before: a launch cuBLAS made inside a GEMM is that
    GEMM's call."""
    return r.within if r.within is not None and r.within >= 0 else r.seq


def place_step(ct: CaptureTrace, step: int, wanted: dict[str, tuple[str, ...]]) -> Placed:
    """The checkpoints of one step (module docstring); Missing where the step lacks a launch
    a checkpoint is placed by."""
    records = [r for r, x in zip(ct.records, ct.trace.launches, strict=True) if x.step == step]
    polyak = [r for r in records if r.kind == "kernel" and r.name == POLYAK_KERNEL]
    if not polyak:
        raise Missing(f"step {step} launched no {POLYAK_KERNEL}")
    first_gemm = next((i for i, r in enumerate(records) if r.kind in ("sgemm", "gemm")), None)
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
    outer = ct.layout.outermost()
    updated = [outer.buffers[name] for name in UPDATED if name in outer.buffers]
    optimizer = None
    for r in records[last_accumulate + 1 :]:
        effect = ct.process.effects.get(r.seq)
        if effect is not None and any(
            b.contains(address) or (address <= b.base < address + size)
            for address, size in effect.changed
            for b in updated
        ):
            optimizer = _call_seq(r)
            break
    if optimizer is None:
        raise Missing(
            f"no call of step {step} after its last accumulate was seen to change "
            f"{', '.join(UPDATED)}: the end of its backward cannot be placed"
        )
    first_read: dict[str, int] = {}
    for r in records[first_gemm:]:
        if r.kind in ("kernel", "sgemm", "gemm") and r.within is None:
            for name in _bound_buffers(outer, r):
                first_read.setdefault(name, r.seq)
    start = records[first_gemm].seq
    at = {
        AFTER_FORWARD: records[scale].seq,
        AFTER_LOSSES: records[scale].seq,
        AFTER_BACKWARD: optimizer,
        BEFORE_POLYAK: polyak[-1].seq,
        STEP_END: polyak[-1].seq + 1,
    }
    before = {
        checkpoint: {
            name: first_read.get(name, start) if checkpoint == STEP_START else at[checkpoint]
            for name in names
        }
        for checkpoint, names in wanted.items()
    }
    return Placed(step, before)


def _layout(ct: CaptureTrace) -> dict[str, BufferLayout]:
    layout = ct.layout.as_trace_layout()
    for name in INT32_BUFFERS:
        if name in layout:
            layout[name]["dtype"] = "i32"
    return layout


def oracle_trace(ct: CaptureTrace, steps: list[int]) -> tuple[Trace, list[str], int]:
    """A Trace holding, for each step that can be placed, its checkpoints (as launches, with
    the Adam step count) and their snapshots rebuilt from the memory history; the problems of
    the steps that cannot be placed and of snapshot regions the history contradicts; and how
    many regions the history was checked against."""
    wanted = oracle_buffers()
    trace = Trace(ct.trace.scenario, "capture", _layout(ct))
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
                b = ct.layout.buffers[name]
                key = f"{step}|{checkpoint}|{name}"
                requests.append(Request(key, seq, b.base, b.size * 4))
    regions = [r for r in ct.process.snapshots if r.complete and r.rows <= 1 and r.values.size]
    for i, r in enumerate(regions):
        before = r.launch + 1 if r.when == "after" else r.launch
        requests.append(Request(f"snapshot|{i}", before, r.ptr, r.values.size * 4))
    got = MemoryHistory(ct.process).read(requests)
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


def unnamed_buffers(ct: CaptureTrace) -> list[str]:
    """The buffers the oracle reads that the layout does not name."""
    wanted = {name for names in oracle_buffers().values() for name in names}
    return sorted(wanted - set(ct.layout.buffers))
