"""How much of a tensor one GEMM operand covers: EGF001's span and slice arithmetic.

An operand is a row-major box (`Region`: offset, rows, width, row stride) in a named buffer; a
tensor is (offset, rows, cols), and where the layout declares leading axes the program slices
(`[L, B*T, C]`, llm.c's `qkvr` as `[L, 3, B, NH, T, HS]`), its shape too: the last two axes are
one slice's rows and columns, the leading ones index the slices. An operand of a GEMM that has
no named tensor may still imply slices through its own arguments: a strided-batched operand
whose batch stride is a whole number R of its row strides reads one [R, ld] slice per batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from egf_audit.trace.gemm_rules import GEMM_ARGS, GemmShape, contraction, gemm_operand_boxes

if TYPE_CHECKING:
    from egf_audit.trace.model import Launch, Region


def span_problem(r: Region, tensor_shape: tuple[int, int, int], tensor: str | None) -> str | None:
    """Why an operand resolved into a tensor does not cover it exactly (its first element, all
    its rows and columns, its row stride), or None. The rebuild's and the capture's EGF001."""
    t_offset, t_rows, t_cols = tensor_shape
    if r.offset != t_offset:
        return f"starts {r.offset - t_offset} elements into {tensor}"
    if r.width != t_cols:
        return f"spans {r.width} of {t_cols} columns of {tensor}"
    if r.rows != t_rows:
        return f"spans {r.rows} of {t_rows} rows of {tensor}"
    if r.rows > 1 and r.ld != t_cols:
        return f"uses row stride {r.ld} on {tensor}, whose row stride is {t_cols}"
    return None


def rows_problem(r: Region, tensor_shape: tuple[int, int, int], tensor: str | None) -> str | None:
    """Why an operand of a trainer that is not SP14 is not whole rows of the named tensor it
    points into, or None. Batched and sliced GEMMs read a tensor a block of rows at a time, so a
    block of rows passes; a block of columns (K = SH2 against a row stride of SH2 + 1), another
    row stride, or a box running past the tensor's end does not."""
    t_offset, t_rows, t_cols = tensor_shape
    start, size = r.offset - t_offset, t_rows * t_cols
    end = start + (r.rows - 1) * r.ld + r.width if r.rows > 0 and r.width > 0 else start
    if r.rows > 1:
        if r.width != t_cols:
            return f"spans {r.width} of {t_cols} columns of {tensor}"
        if r.ld != t_cols:
            return f"uses row stride {r.ld} on {tensor}, whose row stride is {t_cols}"
        if start % t_cols:
            return f"starts {start % t_cols} elements into a row of {tensor}"
    if end > size:
        return f"reaches {end - size} elements past the end of {tensor}"
    return None


def _slice_index(number: int, leading: tuple[int, ...]) -> str:
    """The `number`-th slice (row-major over the leading axes) as its index, `[0, 1, 0, 0]`."""
    index = []
    for axis in reversed(leading):
        number, i = divmod(number, axis)
        index.append(i)
    return "[" + ", ".join(str(i) for i in reversed(index)) + "]"


def _rows_words(first: int, last: int) -> str:
    return f"row {first}" if first == last else f"rows {first} to {last}"


def slice_problem(
    r: Region, tensor_shape: tuple[int, int, int], shape: tuple[int, ...], tensor: str | None
) -> str | None:
    """Why an operand on a tensor declared with leading axes does not cover whole slices of it,
    or None: every column of a slice, its row stride, from a slice's first row through a
    slice's last (all R rows of each slice it reads, whichever axis K runs along), inside the
    tensor. A block of whole slices passes (one layer, one head, or several at once)."""
    leading, (R, C) = shape[:-2], shape[-2:]
    words = f"{tensor} {list(shape)}"
    start, count = r.offset - tensor_shape[0], math.prod(leading)
    if r.rows <= 0 or r.width <= 0:
        return None  # an empty box reads nothing
    if r.width != C:
        return f"spans {r.width} of {C} columns of each slice of {words}"
    if r.rows > 1 and r.ld != C:
        return f"uses row stride {r.ld} on {words}, whose row stride is {C}"
    if start % C or (start // C) % R:
        row, column = divmod(start, C)
        return (
            f"starts at row {row % R}, column {column} of slice {_slice_index(row // R, leading)} "
            f"of {words}, not at a slice's first row"
        )
    end_row = start // C + r.rows  # one past the last row it reads
    if end_row > count * R:
        return f"reaches {end_row - count * R} rows past the end of {words}"
    if end_row % R:
        held = end_row % R
        return (
            f"spans {held} of {R} rows of slice {_slice_index(end_row // R, leading)} of "
            f"{words}: {_rows_words(held, R - 1)} missing"
        )
    return None


def implied_slice_problem(args: dict[str, Any], role: str, box: tuple[int, int, int]) -> str | None:
    """Why one operand of a strided-batched GEMM, named by no tensor, reduces over fewer rows
    than each batch's slice holds, or None. Its batch stride, when it is a whole number R of its
    row strides, implies [R, ld] slices; where K runs along its rows it must run over all R of
    them (the attention dq GEMM's K = T - 1 leaves a row of every head out). A box with K along
    its columns, a stride that is no whole number of rows, or a single batch implies nothing."""
    rows, _, ld = box
    stride = args.get(f"stride{role}", 0)
    if int(args.get("batch", 1)) <= 1 or not isinstance(stride, int) or ld <= 0 or stride <= 0:
        return None
    if role not in ("A", "B") or contraction(role, args["transa"], args["transb"]) != "rows":
        return None
    slice_rows, rest = divmod(stride, ld)
    if rest or rows >= slice_rows:
        return None
    return (
        f"reduces over {rows} of the {slice_rows} rows of each batch's slice (batch stride "
        f"{stride} = {slice_rows} x {ld}): {_rows_words(rows, slice_rows - 1)} of every batch "
        "left out"
    )


def k_sh2_signature(x: Launch, sh2: int | None) -> str | None:
    """The seed's bug read off the arguments alone, no buffer named: an operand that spans SH2
    columns with row stride SH2 + 1 (K = SH2 against a leading dimension of SH2 + 1)."""
    if sh2 is None or not all(k in x.args for k in GEMM_ARGS):
        return None
    boxes = gemm_operand_boxes(GemmShape.of(x.args))
    for role, (rows, width, ld) in boxes.items():
        if rows > 1 and ld == sh2 + 1 and width == sh2:
            return f"operand {role} spans {sh2} columns with row stride {sh2 + 1} (K = SH2)"
    return None
