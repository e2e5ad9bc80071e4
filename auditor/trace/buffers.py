"""Named buffers and the tensors inside them, as a trace records them: the rebuild's layout as
`Trace.layout` holds it (`BufferLayout`), and a capture's buffers named by its layout file or by
inference (`Buffer`, `CaptureLayout`), against which a captured pointer resolves.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

ELEMENT_BYTES = 4  # fp32 and int32 alike


class BufferLayout(TypedDict):
    """One buffer of `Trace.layout`, as the recorder (the rebuild's `Layout.as_dict`) and the
    capture reader (`CaptureLayout.as_trace_layout`) write it."""

    dtype: str  # "f32" or "i32"
    size: int  # elements
    tensors: dict[str, list[int]]  # name -> [offset, rows, cols]


def tensor_table(layout: Mapping[str, BufferLayout], buffer: str) -> dict[str, list[int]]:
    """The tensors of `buffer` in a trace's layout, by name; {} when the layout has none."""
    spec = layout.get(buffer)
    return {} if spec is None else spec.get("tensors", {})


def buffer_size(layout: Mapping[str, BufferLayout], buffer: str) -> int | None:
    """The size of `buffer` in a trace's layout, in elements; None when the layout has none."""
    spec = layout.get(buffer)
    return None if spec is None else spec.get("size")


@dataclass
class Buffer:
    name: str
    base: int  # device address
    size: int  # elements
    tensors: dict[str, tuple[int, int, int]]  # name -> (offset, rows, cols)
    source: str  # how it was named
    shaped: bool = True  # False: a flat allocation; its own-name tensor is a placeholder
    bounded: bool = True  # False: `size` is only what inference saw of it, a lower bound
    # named by its allocation, not its address: (bytes, index) = the index-th allocation of that
    # many bytes the process made; its base is 0 until the layout is placed in a process
    allocation: tuple[int, int] | None = None
    # the declared shape of each tensor the layout gives leading axes the program slices
    # (`[L, B*T, C]`: its rows above are L * B*T); the last two axes are one slice's rows, cols
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def contains(self, ptr: int) -> bool:
        return self.base <= ptr < self.base + self.size * ELEMENT_BYTES


def _end(b: Buffer) -> int:
    return b.base + b.size * ELEMENT_BYTES


class NamedBuffer(TypedDict):
    """How one buffer of a capture was named: a row of the capture document's buffer table."""

    buffer: str
    elements: int
    named_by: str


@dataclass
class CaptureLayout:
    buffers: dict[str, Buffer] = field(default_factory=dict)
    dims: dict[str, Any] = field(default_factory=dict)
    from_file: bool = False
    _by_base: list[Buffer] | None = field(default=None, repr=False)
    _bases: list[int] = field(default_factory=list, repr=False)
    # by position in _by_base: the buffer below it still open where it starts (-1: none)
    _parent: list[int] = field(default_factory=list, repr=False)

    def add(self, buffer: Buffer) -> None:
        self.buffers.setdefault(buffer.name, buffer)
        self._by_base = None

    def _index(self) -> list[Buffer]:
        if self._by_base is None:
            by_base = sorted(self.buffers.values(), key=lambda b: (b.base, -b.size))
            self._bases = [b.base for b in by_base]
            self._parent = []
            open_: list[int] = []  # the buffers not ended where the next one starts, in order
            for i, b in enumerate(by_base):
                while open_ and _end(by_base[open_[-1]]) <= b.base:
                    open_.pop()
                self._parent.append(open_[-1] if open_ else -1)
                open_.append(i)
            self._by_base = by_base
        return self._by_base

    def resolve(self, ptr: int) -> tuple[Buffer, int] | None:
        """The innermost named buffer holding `ptr`, and the element offset into it. Buffers
        nest (a tensor's own name inside a flat buffer) but never partly overlap, so the
        holder with the highest base at or below `ptr` is the innermost. Only a buffer still
        open where the last one at or below `ptr` starts can hold it (one that ended before
        ends below `ptr`), and those are that buffer's chain of parents: O(log n + depth)."""
        by_base = self._index()
        i = bisect.bisect_right(self._bases, ptr) - 1
        while i >= 0 and not by_base[i].contains(ptr):
            i = self._parent[i]
        if i < 0:
            return None
        inner = by_base[i]
        byte_offset = ptr - inner.base
        if byte_offset % ELEMENT_BYTES:
            return None
        return inner, byte_offset // ELEMENT_BYTES

    def outermost(self) -> CaptureLayout:
        """The same layout without the buffers that lie inside another (a view the file names
        inside `params`, say): every pointer resolves to the allocation-level buffer. One
        sweep in address order: a buffer lies inside another when one before it (a lower
        base, or the same base and more elements) ends at or after its end."""
        inside: set[int] = set()
        reach, group, group_reach = -1, None, -1  # the furthest end before this group
        for b in sorted(self.buffers.values(), key=lambda b: (b.base, -b.size)):
            if (b.base, b.size) != group:  # a group: buffers of one span, none inside another
                group, group_reach = (b.base, b.size), reach
            if group_reach >= _end(b):
                inside.add(id(b))
            reach = max(reach, _end(b))
        kept = {name: b for name, b in self.buffers.items() if id(b) not in inside}
        return CaptureLayout(kept, self.dims, self.from_file)

    def base_of(self, name: str) -> int | None:
        buffer = self.buffers.get(name)
        return None if buffer is None else buffer.base

    def tensor_at(self, buffer: Buffer, offset: int) -> tuple[str, tuple[int, int, int]] | None:
        """The named tensor of `buffer` holding element `offset` (never a placeholder)."""
        for name, (t_offset, rows, cols) in buffer.tensors.items():
            if not buffer.shaped and name == buffer.name:
                continue  # the placeholder of a flat allocation names no shape
            if t_offset <= offset < t_offset + rows * cols:
                return name, (t_offset, rows, cols)
        return None

    def as_trace_layout(self) -> dict[str, BufferLayout]:
        """The form `Trace.layout` has: buffer -> dtype, size, tensors."""
        return {
            b.name: {
                "dtype": "f32",
                "size": b.size,
                "tensors": {k: list(v) for k, v in b.tensors.items()},
            }
            for b in self.buffers.values()
        }

    def naming(self) -> list[NamedBuffer]:
        return [
            {"buffer": b.name, "elements": b.size, "named_by": b.source}
            for b in sorted(self.buffers.values(), key=lambda b: b.name)
        ]
