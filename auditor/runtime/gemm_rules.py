"""The argument rules cublasSgemm enforces before it touches memory.

cuBLAS answers CUBLAS_STATUS_INVALID_VALUE, and runs nothing, when an op is not N or T, a size is
negative, or a leading dimension is below the rows the column-major operand stores (and below
1). Both backends apply the same rules: the CPU backend would otherwise run torch on any strided
view it is given, and the recorder refuses such a call in instrumented mode on every backend, so
the trace shows the refusal cuBLAS would give.
"""

from __future__ import annotations

from functools import lru_cache

INVALID_VALUE = "CUBLAS_STATUS_INVALID_VALUE"
OPS = ("N", "T")


class GemmRefused(ValueError):
    """An SGEMM cuBLAS would refuse (plain mode, where nothing records it)."""


@lru_cache(maxsize=4096)  # every step repeats the same few dozen calls
def invalid_value(
    transa: str, transb: str, m: int, n: int, k: int, lda: int, ldb: int, ldc: int
) -> str | None:
    """Why cuBLAS refuses these arguments with CUBLAS_STATUS_INVALID_VALUE, or None."""
    for name, op in (("transa", transa), ("transb", transb)):
        if op not in OPS:
            return f"{INVALID_VALUE}: {name} = {op!r} is not N or T"
    for name, size in (("m", m), ("n", n), ("k", k)):
        if size < 0:
            return f"{INVALID_VALUE}: {name} = {size} is negative"
    stored = (
        ("lda", lda, m if transa == "N" else k),
        ("ldb", ldb, k if transb == "N" else n),
        ("ldc", ldc, m),
    )
    for name, ld, rows in stored:
        if ld < max(1, rows):
            return f"{INVALID_VALUE}: {name} = {ld} is below max(1, {rows}), the rows it stores"
    return None
