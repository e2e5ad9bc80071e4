"""Named flat buffers, named tensors inside them, and pointer resolution.

A `Layout` is a set of buffers, each holding row-major `[rows, cols]` tensors at element offsets
(what the trainer's buffers are is egf_audit.pipeline.layout's business). A raw device pointer
resolves to (buffer, element offset); the layout then names the tensor.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from egf_audit.trace.buffers import ELEMENT_BYTES

if TYPE_CHECKING:
    from egf_audit.trace.buffers import BufferLayout


@dataclass(frozen=True)
class Tensor:
    name: str
    offset: int  # element offset inside its buffer
    rows: int
    cols: int

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class BufferSpec:
    name: str
    dtype: str  # "f32" or "i32"
    tensors: tuple[Tensor, ...]

    @cached_property
    def size(self) -> int:
        return max(t.end for t in self.tensors)

    @cached_property
    def _by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> Tensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.name} has no tensor {name}") from None

    def tensor_at(self, offset: int) -> Tensor | None:
        for t in self.tensors:
            if t.offset <= offset < t.end:
                return t
        return None


@dataclass(frozen=True)
class Layout:
    """All buffers of one pipeline instance. `state_shapes` lets Adam m/v have their own table."""

    buffers: tuple[BufferSpec, ...]

    @cached_property
    def _by_name(self) -> dict[str, BufferSpec]:
        return {b.name: b for b in self.buffers}

    def buffer(self, name: str) -> BufferSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no buffer named {name}") from None

    def as_dict(self) -> dict[str, BufferLayout]:
        return {
            b.name: {
                "dtype": b.dtype,
                "size": b.size,
                "tensors": {t.name: [t.offset, t.rows, t.cols] for t in b.tensors},
            }
            for b in self.buffers
        }


@dataclass
class AddressMap:
    """Resolves raw pointers to (buffer, element offset) by address range."""

    layout: Layout
    bases: dict[str, int] = field(default_factory=dict)
    _sorted: list[tuple[int, str]] = field(default_factory=list)

    def register(self, name: str, base: int) -> None:
        self.bases[name] = base
        bisect.insort(self._sorted, (base, name))

    def ptr(self, buffer: str, tensor: str | None = None, element: int = 0) -> int:
        offset = self.layout.buffer(buffer).tensor(tensor).offset if tensor else 0
        return self.bases[buffer] + (offset + element) * ELEMENT_BYTES

    def resolve(self, pointer: int) -> tuple[str, int] | None:
        """(buffer, element offset) for a pointer into a buffer, else None (null or foreign)."""
        i = bisect.bisect_right(self._sorted, (pointer, "\uffff")) - 1
        if i < 0:
            return None
        base, name = self._sorted[i]
        byte_offset = pointer - base
        size = self.layout.buffer(name).size
        if byte_offset % ELEMENT_BYTES or byte_offset // ELEMENT_BYTES >= size:
            return None
        return name, byte_offset // ELEMENT_BYTES
