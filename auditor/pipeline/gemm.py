"""Row-major linear algebra on cuBLAS's column-major SGEMM. The operand swap is written once,
here: a row-major `[rows, cols]` buffer is, to cuBLAS, a column-major `cols x rows` matrix with
leading dimension = its row stride. Every argument lands in the trace exactly as passed.
"""

from __future__ import annotations

from egf_audit.runtime.recorder import Recorder


def gemm_xwt(
    rec: Recorder,
    label: str,
    y: int,
    x: int,
    w: int,
    rows: int,
    out_w: int,
    k: int,
    ld_x: int,
    ld_w: int,
    ld_y: int,
    beta: float = 0.0,
) -> None:
    """y[rows, out_w] = x[rows, :k] . w[out_w, :k]^T  (cuBLAS: T, N; m = out_w, n = rows)."""
    rec.sgemm(label, "T", "N", out_w, rows, k, 1.0, w, ld_w, x, ld_x, beta, y, ld_y)


def gemm_dw(
    rec: Recorder,
    label: str,
    dw: int,
    dy: int,
    x: int,
    rows: int,
    out_w: int,
    in_w: int,
    ld_x: int,
    ld_dy: int,
    ld_dw: int,
    beta: float = 1.0,
) -> None:
    """dw[out_w, :in_w] += dy[rows, out_w]^T . x[rows, :in_w]  (cuBLAS: N, T; m = in_w)."""
    rec.sgemm(label, "N", "T", in_w, out_w, rows, 1.0, x, ld_x, dy, ld_dy, beta, dw, ld_dw)


def gemm_dx(
    rec: Recorder,
    label: str,
    dx: int,
    dy: int,
    w: int,
    rows: int,
    in_w: int,
    out_w: int,
    ld_w: int,
    ld_dy: int,
    ld_dx: int,
    beta: float = 0.0,
) -> None:
    """dx[rows, :in_w] = dy[rows, out_w] . w[out_w, :in_w]  (cuBLAS: N, N; m = in_w)."""
    rec.sgemm(label, "N", "N", in_w, rows, out_w, 1.0, w, ld_w, dy, ld_dy, beta, dx, ld_dx)


def gemm_colsum(
    rec: Recorder, label: str, db: int, dy: int, ones: int, rows: int, cols: int
) -> None:
    """db[1, cols] += ones[1, rows] . dy[rows, cols]: a bias gradient as an SGEMM."""
    rec.sgemm(label, "N", "N", cols, 1, rows, 1.0, dy, cols, ones, rows, 1.0, db, cols)


def gemm_dot(rec: Recorder, label: str, out: int, x: int, y: int, n: int) -> None:
    """out[0] = x[1, n] . y[1, n]^T."""
    rec.sgemm(label, "T", "N", 1, 1, n, 1.0, x, n, y, n, 0.0, out, 1)
