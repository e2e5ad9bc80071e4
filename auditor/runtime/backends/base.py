"""What the recorder needs from a backend. Pointers are raw addresses; counts are elements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from egf_audit.kernels import KernelSpec
from egf_audit.runtime.memory import BufferSpec


class Backend(Protocol):
    name: str

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

    def info(self) -> dict[str, str]:
        """Device name and library versions, for the environment block."""
