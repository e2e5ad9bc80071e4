"""The argument rules cublasSgemm enforces before it touches memory.

cuBLAS answers CUBLAS_STATUS_INVALID_VALUE, and runs nothing, when an op is not N or T, a size is
negative, or a leading dimension is below the rows the column-major operand stores (and below
1). Both backends apply the same rules: the CPU backend would otherwise run torch on any strided
view it is given, and the recorder refuses such a call in instrumented mode on every backend, so
the trace shows the refusal cuBLAS would give.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any, NamedTuple

INVALID_VALUE = "CUBLAS_STATUS_INVALID_VALUE"
OPS = ("N", "T")


class GemmShape(NamedTuple):
    """The eight arguments of cublasSgemm that fix its shape, in cuBLAS's order (the pointers
    and the scalars alpha and beta aside). Its fields are the one home of these names: the
    recorder's launch arguments, the cuBLAS witness, EGF001's evidence, the report's argument
    columns and the capture reader all read them through `GEMM_ARGS`."""

    transa: str
    transb: str
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int

    @classmethod
    def of(cls, args: Mapping[str, Any]) -> GemmShape:
        """The shape of a launch's or a logged call's arguments, read by name."""
        return cls(*(args[name] for name in GEMM_ARGS))


GEMM_ARGS: tuple[str, ...] = GemmShape._fields
GEMM_OPS = GEMM_ARGS[:2]  # transa, transb
GEMM_SIZES = GEMM_ARGS[2:5]  # m, n, k
GEMM_LDS = GEMM_ARGS[5:]  # lda, ldb, ldc
GEMM_INTS = GEMM_ARGS[2:]  # the sizes and the leading dimensions


class GemmRefused(ValueError):
    """An SGEMM cuBLAS would refuse (plain mode, where nothing records it)."""


@lru_cache(maxsize=4096)  # every step repeats the same few dozen calls
def invalid_value(shape: GemmShape) -> str | None:
    """Why cuBLAS refuses these arguments with CUBLAS_STATUS_INVALID_VALUE, or None."""
    transa, transb, m, n, k, lda, ldb, ldc = shape
    for name, op in zip(GEMM_OPS, (transa, transb), strict=True):
        if op not in OPS:
            return f"{INVALID_VALUE}: {name} = {op!r} is not N or T"
    for name, size in zip(GEMM_SIZES, (m, n, k), strict=True):
        if size < 0:
            return f"{INVALID_VALUE}: {name} = {size} is negative"
    # the rows each column-major operand stores: A is m x k or k x m, B k x n or n x k, C m x n
    rows_stored = (m if transa == "N" else k, k if transb == "N" else n, m)
    for name, ld, rows in zip(GEMM_LDS, (lda, ldb, ldc), rows_stored, strict=True):
        if (why := ld_below_rows(name, ld, rows)) is not None:
            return why
    return None


def ld_below_rows(name: str, ld: int, rows: int) -> str | None:
    """cuBLAS's rule for one leading dimension: at least the rows its column-major operand
    stores, and at least 1 (a capture holds cuBLASLt's D to it too)."""
    if ld < max(1, rows):
        return f"{INVALID_VALUE}: {name} = {ld} is below max(1, {rows}), the rows it stores"
    return None


def gemm_operand_boxes(shape: GemmShape) -> dict[str, tuple[int, int, int]]:
    """(rows, width, ld) of A, B and C as row-major boxes. A column-major operand stored as
    (r x c) with leading dimension ld is, row-major, c rows of r elements with row stride ld."""
    transa, transb, m, n, k, lda, ldb, ldc = shape
    a_stored = (m, k) if transa == "N" else (k, m)
    b_stored = (k, n) if transb == "N" else (n, k)
    return {
        "A": (a_stored[1], a_stored[0], lda),
        "B": (b_stored[1], b_stored[0], ldb),
        "C": (n, m, ldc),
    }


def contraction(role: str, transa: str, transb: str) -> str:
    """What K runs over for a row-major operand of an SGEMM: "columns" (x of y = x . W^T, the
    forward) or "rows" (x of dW = dY^T . x, a weight gradient, K = the batch)."""
    op = transa if role == "A" else transb
    return "columns" if (role == "A") == (op == "T") else "rows"
