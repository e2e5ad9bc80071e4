"""A captured record's operands as the rebuild's bindings: every pointer argument bound to the
named buffer and tensor it lands in, the same `Binding` the rebuild's recorder makes.
"""

from __future__ import annotations

from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.trace.buffers import ELEMENT_BYTES, CaptureLayout
from egf_audit.trace.gemm_operands import gemm_operands
from egf_audit.trace.model import Binding, Region
from egf_audit.trace.process import GEMM_KINDS, Record


def _binding(
    layout: CaptureLayout, role: str, ptr: int, access: str, box: tuple[int, int, int, int]
) -> Binding:
    rel, rows, width, ld = box
    where = layout.resolve(ptr) if isinstance(ptr, int) else None
    if where is None:
        return Binding(role, ptr, access, None, None, None, False)
    buffer, offset = where
    region = Region(buffer.name, offset + rel, rows, width, ld)
    # a buffer inference sized from what it saw is known no further: the allocation holding
    # it bounds the launch instead (EGF001)
    in_bounds = region.fits(buffer.size) if buffer.bounded else region.offset >= 0
    found = layout.tensor_at(buffer, region.offset)
    name, shape = found if found else (None, None)
    return Binding(role, ptr, access, region, name, shape, in_bounds)


def bindings_of(layout: CaptureLayout, r: Record) -> tuple[Binding, ...]:
    a = r.args
    if r.kind in GEMM_KINDS:
        # every entry point alike: each batch's operands where they were judged; an operand of
        # another element size than the layout's fp32 is placed by its allocation alone (EGF001)
        return tuple(
            _binding(layout, op.role, op.pointer, op.access, (0, *op.box))
            if op.element_bytes == ELEMENT_BYTES
            else Binding(op.role, op.pointer, op.access, None, None, None, False)
            for op in gemm_operands(a)
        )
    if r.kind in ("memset", "copy"):
        count = -(-a["bytes"] // ELEMENT_BYTES)  # a partial last element is still touched
        ends = [("dst", "w")] + ([("src", "r")] if r.kind == "copy" else [])
        found = (
            _binding(layout, role, a.get(role, 0), acc, (0, 1, count, count)) for role, acc in ends
        )
        return tuple(b for b in found if b.region is not None)
    if r.kind == "kernel" and r.within is not None and r.within >= 0:
        # a launch cuBLAS made inside a GEMM call (the recorder saw cuBLAS on its call stack):
        # the GEMM's record binds what it reads and writes
        return ()
    if r.kind == "kernel" and r.decoded:
        spec = KERNELS_BY_NAME[r.name]
        return tuple(_binding(layout, x.param, a[x.param], x.mode, x.box(a)) for x in spec.accesses)
    if r.kind == "kernel":
        # a kernel egf-audit does not know: which named buffers its arguments point into, with
        # the access unknown ("?")
        found = (
            _binding(layout, k, v, "?", (0, 1, 1, 1)) for k, v in a.items() if k.startswith("p")
        )
        return tuple(b for b in found if b.region is not None)
    return ()
