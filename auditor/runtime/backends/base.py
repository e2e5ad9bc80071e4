"""What the recorder needs from a backend. Pointers are raw addresses; counts are elements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import numpy as np

from egf_audit.kernels import KernelSpec
from egf_audit.runtime.costs import Costs
from egf_audit.runtime.memory import BufferSpec

if TYPE_CHECKING:
    import cupy
    from typing_extensions import TypeIs


class Watch(Protocol):
    def changes(
        self, exempt: dict[int, tuple[tuple[int, int, int, int], ...]]
    ) -> list[tuple[int, int, int, int, int]]:
        """Bitwise changes since the last call (or the start), outside the boxes (offset, rows,
        width, row stride) exempt for each pointer: (pointer, first element, count, old bits,
        new bits) per allocation that changed elsewhere. The copies are brought up to date."""


# (pointer, first element, count, old bits, new bits) of a stray write; (base pointer, side,
# distance, count) of a guard breach: what `Watch.changes` and `Backend.guard_breaches` return
StrayFound = tuple[int, int, int, int, int]
BreachFound = tuple[int, str, int, int]


class StreamWatch(Protocol):
    """A watch whose checks run in the device's stream order (the CUDA backend), so no launch
    waits for its own: `queue` puts one launch's checks behind it, `collect` brings the findings
    of every launch queued since the last call to the host, in queue order (one wait)."""

    def queue(
        self,
        key: object,
        kind: str,
        name: str,
        reach: Sequence[int],
        exempt: dict[int, tuple[tuple[int, int, int, int], ...]],
        costs: Costs | None = None,
    ) -> None:
        """Check the launch just queued: the allocations at `reach` (the ones its pointers
        land in) outside its `exempt` boxes, and, after a kernel, every guard zone. `key`
        names launches with the same reach and boxes (their plans are memoised); `costs`
        times each part (runtime/costs.py)."""

    def collect(self) -> list[tuple[list[StrayFound], list[BreachFound]]]: ...


def in_stream_order(watch: Watch | StreamWatch) -> TypeIs[StreamWatch]:
    return hasattr(watch, "queue")


class Backend(Protocol):
    name: str
    # kernel name -> its first failure (crash, exit, time-out), in words; the recorder runs no
    # later launch of a kernel listed here. An audit clears it when it starts.
    failed_kernels: dict[str, str]

    def alloc(self, spec: BufferSpec) -> int:
        """A zero-filled allocation for `spec`; returns its base pointer."""

    def free(self, ptr: int) -> None:
        """Release an allocation made by `alloc`."""

    def read(self, ptr: int) -> np.ndarray:
        """A host copy of the whole allocation at `ptr` (float32 or int32)."""

    def snapshot(self, ptrs: Sequence[int]) -> list[Any]:
        """Copies of the whole allocations at `ptrs`, made now, kept wherever is cheapest."""

    def to_host(self, copy: Any) -> np.ndarray:
        """A snapshot copy as a host array."""

    def upload(self, ptr: int, values: np.ndarray, stride: int = 1) -> None:
        """Host values into elements ptr, ptr + stride, ... (a device write the recorder logs)."""

    def memset_zero(self, ptr: int, count: int) -> None: ...

    def sgemm(
        self,
        transa: str,
        transb: str,
        m: int,
        n: int,
        k: int,
        alpha: float,
        a: int,
        lda: int,
        b: int,
        ldb: int,
        beta: float,
        c: int,
        ldc: int,
    ) -> None:
        """Column-major C = alpha op(A) op(B) + beta C, exactly as cublasSgemm takes it."""

    def launch(self, spec: KernelSpec, blocks: int, threads: int, args: list[Any]) -> None: ...

    def synchronize(self) -> None: ...

    # ---- what a launch did (trace/effects.py) ----
    def guard_breaches(self) -> list[tuple[int, str, int, int]]:
        """(base pointer, "before"/"after", distance, count) for every allocation whose guard
        zone changed since the last call; the zones are restored."""

    def watch(self, ptrs: Sequence[int]) -> Watch | StreamWatch:
        """Start watching the allocations at `ptrs` (copies of them as they are now)."""

    def close(self) -> None:
        """Release what the backend holds beyond its buffers (the CPU's kernel worker)."""

    def info(self) -> dict[str, str]:
        """Device name and library versions, for the environment block."""

    def cublas_handles(self) -> tuple[int, ...]:
        """The cuBLAS handles the pipeline's SGEMMs run on (the cuBLAS witness pairs only the
        calls logged on them); () where the backend has no cuBLAS."""


class StreamBackend(Backend, Protocol):
    """A backend whose launches run on a CUDA stream (the CUDA backend): the bench times the
    pipeline on a stream of its own and captures its step in a CUDA graph."""

    stream: cupy.cuda.Stream

    def use_stream(self, stream: cupy.cuda.Stream) -> None:
        """Run every later launch on `stream`."""

    def prepare_capture(self) -> None:
        """Make the SGEMMs capturable in a CUDA graph (a fixed cuBLAS workspace)."""


def runs_on_streams(backend: Backend) -> TypeGuard[StreamBackend]:
    """The CUDA backend, by its name: the one whose launches run on a stream."""
    return backend.name == "cuda"
