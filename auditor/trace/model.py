"""What the recorder writes and the invariants read: launches, operand bindings, snapshots.

A `Region` is a row-major box inside one named buffer: `rows` rows of `width` elements, row
stride `ld`, starting at element `offset`. Every operand of every launch is bound to one, with
the tensor its pointer resolved to, so "K matches LDA" becomes a comparison of two boxes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

from egf_audit.trace.buffers import BufferLayout
from egf_audit.trace.call_sites import Site, call_sites
from egf_audit.trace.contract import STEP_START
from egf_audit.trace.effects import Effects

if TYPE_CHECKING:  # imported where an array is made: `egf-audit capture` runs without numpy
    import numpy as np

    from egf_audit.trace.captured import Captured


class Missing(KeyError):
    """Data a reader of the trace needs is absent: a checkpoint, a snapshot, a tensor, an operand.

    Every query below raises it, with words naming what was missing, so a checker reads straight
    through and the verdict is a FAIL that names it (a faulty wiring may well remove launches or
    checkpoints). It is a KeyError, and no other error means missing data."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "missing data"


@dataclass(frozen=True)
class Region:
    buffer: str
    offset: int
    rows: int
    width: int
    ld: int

    @property
    def last(self) -> int:
        """Element offset one past the last element touched."""
        if self.rows <= 0 or self.width <= 0:
            return self.offset
        return self.offset + (self.rows - 1) * self.ld + self.width

    def fits(self, size: int) -> bool:
        """The box lies inside a buffer of `size` elements, rows not overlapping (ld >= width)."""
        return (
            self.offset >= 0
            and self.rows >= 0
            and self.width >= 0
            and self.last <= size
            and (self.rows <= 1 or self.ld >= self.width)
        )

    def flat_indices(self) -> np.ndarray:
        import numpy as np

        rows = np.arange(self.rows, dtype=np.int64)[:, None] * self.ld
        cols = np.arange(self.width, dtype=np.int64)[None, :]
        return (self.offset + rows + cols).ravel()


@dataclass(frozen=True)
class Binding:
    """One pointer argument of a launch and what it resolved to."""

    role: str  # "A", "B", "C" for SGEMMs; the parameter name for kernels
    pointer: int
    access: str  # "r", "w" or "rw"
    region: Region | None  # None: the pointer resolved to no buffer
    tensor: str | None  # tensor name at the region's first element
    tensor_shape: tuple[int, int, int] | None  # (offset, rows, cols) of that tensor
    in_bounds: bool

    @property
    def writes(self) -> bool:
        return "w" in self.access

    @property
    def reads(self) -> bool:
        return "r" in self.access


@dataclass(frozen=True)
class Launch:
    index: int
    step: int
    kind: str  # "sgemm", "kernel", "memset", "copy", "checkpoint"
    name: str  # kernel name, "sgemm", "memset", "copy", or the checkpoint name
    label: str  # call site, e.g. "backward_branch_dw[d=0]@main"
    args: dict[str, Any]  # the raw arguments exactly as passed
    bindings: tuple[Binding, ...] = ()
    executed: bool = True  # False when the recorder refused an out-of-bounds launch
    # what the launch was observed to do (instrumented mode; None: not executed or not watched)
    effects: Effects | None = None
    refused: str | None = None  # why the callee would refuse the arguments (cuBLAS's rules)

    @property
    def site(self) -> str | None:
        """The backward call site ("cql", "main") from the label suffix, if any."""
        return self.label.rsplit("@", 1)[1] if "@" in self.label else None

    @overload
    def binding(self, role: str, required: Literal[True] = True) -> Binding: ...
    @overload
    def binding(self, role: str, required: bool) -> Binding | None: ...
    def binding(self, role: str, required: bool = True) -> Binding | None:
        """The operand `role`; absent, it is missing data (or None when not `required`: a
        kernel launch has no SGEMM operand C, and asking is no error)."""
        for b in self.bindings:
            if b.role == role:
                return b
        if required:
            raise Missing(f"launch {self.label} has no operand {role}")
        return None

    def writes_to(self, buffer: str) -> bool:
        return any(b.writes and b.region and b.region.buffer == buffer for b in self.bindings)


def recorded_launch(
    index: int,
    step: int,
    kind: str,
    name: str,
    label: str,
    args: dict[str, Any],
    bindings: tuple[Binding, ...],
    executed: bool,
    effects: Effects | None,
) -> Launch:
    """`Launch(index, step, kind, name, label, args, bindings, executed, effects)`, the same
    object, made without the frozen dataclass's `__init__` (one `object.__setattr__` a field):
    the recorder makes one per launch, and that `__init__` cost as much as the rest of a
    launch's bookkeeping. `tests/test_recorder_memo.py` holds it to `Launch`'s fields."""
    launch = object.__new__(Launch)
    vars(launch).update(
        index=index,
        step=step,
        kind=kind,
        name=name,
        label=label,
        args=args,
        bindings=bindings,
        executed=executed,
        effects=effects,
        refused=None,
    )
    return launch


class Snapshot(Mapping[str, "np.ndarray"]):
    """The buffers copied at one checkpoint. The copies stay where the backend made them (on
    the GPU: device memory, so a checkpoint costs a device-to-device copy, not a host round
    trip) and reach the host only when an invariant reads them, once."""

    def __init__(
        self,
        copies: dict[str, Any],
        to_host: Callable[[Any], np.ndarray],
        on_device: Callable[[Any], Any] | None = None,
    ):
        self._copies = copies
        self._to_host = to_host
        self._on_device = on_device
        self._host: dict[str, np.ndarray] = {}

    def __getitem__(self, buffer: str) -> np.ndarray:
        if buffer not in self._host:
            self._host[buffer] = self._to_host(self._copies[buffer])
        return self._host[buffer]

    def __contains__(self, buffer: object) -> bool:
        return buffer in self._copies  # Mapping's own would copy the buffer to the host

    def device_array(self, buffer: str) -> Any | None:
        """The copy of `buffer` where the backend made it, as an array that exports DLPack
        (CuPy's), so that float64 checks on the GPU read it with no host round trip; None where
        the copies are host memory (the CPU backend)."""
        return None if self._on_device is None else self._on_device(self._copies[buffer])

    def __iter__(self) -> Iterator[str]:
        return iter(self._copies)

    def __len__(self) -> int:
        return len(self._copies)

    @property
    def nbytes(self) -> int:
        return sum(int(c.nbytes) for c in self._copies.values())


@dataclass
class Trace:
    """One recording, the rebuild's or a capture's: its launches in order, their bindings, what
    each was observed to do, its steps and call sites. What only one source holds is data on
    it: a rebuild scenario's snapshots by checkpoint (`snapshots`); a captured process's
    records, layout, allocations, snapshot regions and observed effects (`captured`)."""

    scenario: str
    backend: str
    layout: dict[str, BufferLayout]
    meta: dict[str, Any] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    # snapshots[(step, checkpoint)][buffer] -> host copy (float32 or int32), made on first read
    snapshots: dict[tuple[int, str], Mapping[str, np.ndarray]] = field(default_factory=dict)
    # a capture of the trainer's own process: what only it holds; None on the rebuild's trace
    captured: Captured | None = None

    @property
    def capture(self) -> Captured:
        """What only a capture holds; on a rebuild's trace, missing data."""
        if self.captured is None:
            raise Missing(f"{self.scenario} is no capture of a trainer's process")
        return self.captured

    def sgemms(self) -> Iterator[Launch]:
        return (x for x in self.launches if x.kind == "sgemm")

    def kernels(self, name: str | None = None) -> Iterator[Launch]:
        return (x for x in self.launches if x.kind == "kernel" and (name is None or x.name == name))

    def by_label(self, label: str) -> list[Launch]:
        return [x for x in self.launches if x.label == label]

    # ---- queries: each raises Missing, naming what it did not find ----
    def checkpoint(self, step: int, name: str) -> Launch:
        for x in self.launches:
            if x.kind == "checkpoint" and x.step == step and x.name == name:
                return x
        raise Missing(f"no checkpoint {name} (step {step}) in {self.scenario}")

    def checkpoint_index(self, step: int, name: str) -> int:
        """Position of a checkpoint in the launch list (a launch's index is its position)."""
        return self.checkpoint(step, name).index

    def launches_between(self, step: int, begin: str, end: str) -> list[Launch]:
        """The launches strictly between two checkpoints of one step."""
        first, last = self.checkpoint_index(step, begin), self.checkpoint_index(step, end)
        if last < first:
            raise Missing(f"checkpoint {end} comes before {begin} (step {step}) in {self.scenario}")
        return [x for x in self.launches[first + 1 : last] if x.kind != "checkpoint"]

    def buffer_snapshot(self, step: int, checkpoint: str, buffer: str) -> np.ndarray:
        """A whole flat buffer as snapshotted at a checkpoint."""
        try:
            return self.snapshots[(step, checkpoint)][buffer]
        except KeyError:
            raise Missing(
                f"no snapshot of {buffer} at {checkpoint} (step {step}) in {self.scenario}"
            ) from None

    def tensor(self, flat: np.ndarray, buffer: str, tensor: str | None = None) -> np.ndarray:
        """A [rows, cols] view of one tensor (by default the buffer's own) inside a flat copy of
        `buffer`, through the trace's own layout."""
        name = tensor or buffer
        try:
            offset, rows, cols = self.layout[buffer]["tensors"][name]
        except KeyError:
            raise Missing(
                f"the layout of {self.scenario} has no tensor {name} in {buffer}"
            ) from None
        if flat.size < offset + rows * cols:
            raise Missing(f"a snapshot of {buffer} in {self.scenario} is shorter than {name}")
        return flat[offset : offset + rows * cols].reshape(rows, cols)

    def snapshot(
        self, step: int, checkpoint: str, buffer: str, tensor: str | None = None
    ) -> np.ndarray:
        """One tensor of a snapshot as a [rows, cols] array."""
        return self.tensor(self.buffer_snapshot(step, checkpoint, buffer), buffer, tensor)

    def training_steps(self) -> list[int]:
        """The training steps the trace ran: those with a `step_start` checkpoint."""
        return sorted(
            {x.step for x in self.launches if x.kind == "checkpoint" and x.name == STEP_START}
        )

    @property
    def steps(self) -> list[int]:
        return sorted({x.step for x in self.launches})

    def call_sites(self) -> list[Site]:
        """Its steps' backward_full call sites, cut from its launches' kinds and names alone
        (trace/call_sites.py), never from their labels: a capture's as the reader cut them when
        it made the trace (its launches are final then), the rebuild's cut on each call."""
        if self.captured is not None and self.captured.sites is not None:
            return self.captured.sites
        return call_sites(self.launches)

    def site_steps(self) -> list[int]:
        """The steps that have a call site: the training steps a capture ran to their end."""
        return sorted({s.step for s in self.call_sites()})

    def call_sites_by_step(self) -> dict[tuple[int, str], Site]:
        """Its call sites by (step, name): a check cuts them once and looks each site up (a
        site the cut did not find, or a step with another number of sites, is absent)."""
        return {(s.step, s.name): s for s in self.call_sites()}

    def to_jsonl(self) -> Iterator[str]:
        """One JSON object a line: a header, then every launch (snapshots are not exported)."""
        yield json.dumps(
            {
                "type": "trace",
                "scenario": self.scenario,
                "backend": self.backend,
                "meta": self.meta,
            },
            sort_keys=True,
        )
        names = [f.name for f in fields(Launch)]
        for x in self.launches:
            record = {name: getattr(x, name) for name in names}
            record["type"] = "launch"
            yield json.dumps(record, sort_keys=True, default=_json_default)


def _json_default(value: object) -> object:
    """What json cannot write itself: a dataclass as the dict of its fields (what
    dataclasses.asdict gives, without its deep copy of every launch: a capture's trace.jsonl
    is written while the user waits), a numpy scalar as its number."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    numpy = sys.modules.get("numpy")  # a numpy scalar needs numpy imported to exist
    if numpy is not None and isinstance(value, numpy.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")
