"""Every cuBLAS GEMM entry point as one form: the SGEMM's shape arguments, its pointers, and what
a batched, typed or cuBLASLt call adds (trace/process.py's `Record` carries them).

Two sources. cuBLAS's own logger words each call of the classic API (`cublasSgemm_v2`,
`cublasGemmEx`, `cublasSgemmStridedBatched`, `cublasGemmStridedBatchedEx`, `cublasSgemmBatched`,
...) as one line per argument, named as in cublas_api.h; the recorder adds alpha's and beta's
bits and, for a pointer-array call, the pointers it read from the arrays. cuBLASLt's logger names
a `cublasLtMatmul` by its descriptors, which the recorder reads while the call is in progress
into an `ltmatmul` event: each matrix layout as [type, order, rows, cols, ld, batch count, batch
stride], the matmul descriptor as [compute type, scale type, pointer mode, transa, transb] and,
from recorders that read them, [epilogue, bias pointer, auxiliary pointer, auxiliary ld].

A call whose operands cannot be named keeps its shape and says why in `unbound`: EGF001 lists
it as a GEMM it cannot judge, never passes it. What no GEMM can be (an op that is no N, T or C,
a negative size) is refused by the reader.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from egf_audit.trace.gemm_operands import MAX_BATCHES_BOUND, gemm_operands
from egf_audit.trace.gemm_rules import GEMM_ARGS, GemmShape, invalid_value, ld_below_rows

from .schema import ADDRESS_LIMIT, LOWEST_ADDRESS

# cudaDataType -> bytes of one element (library_types.h); a type not here is not bound
TYPE_BYTES = {
    0: 4,
    1: 8,
    2: 2,
    3: 1,
    4: 8,
    5: 16,
    6: 4,
    7: 2,
    8: 1,
    10: 4,
    14: 2,
    15: 4,
    28: 1,
    29: 1,
}
# the classic API's typed calls: cublas<t>gemm...: S float, D double, H half, C/Z complex
_LETTER_BYTES = {"S": 4, "D": 8, "H": 2, "C": 8, "Z": 16}
_TYPED = re.compile(r"cublas([SDHCZ])gemm")
_TYPE_CODE = re.compile(r"\((\d+)\)\s*$")
OPS = {0: "N", 1: "T", 2: "C"}
LT_ORDER_COL = 0  # CUBLASLT_ORDER_COL: the layout cuBLAS's own calls use; others are not bound


def scalar(bits: int | None, nbytes: int) -> float | None:
    """alpha or beta from its first min(nbytes, 8) bytes as the recorder read them."""
    if bits is None:
        return None
    if nbytes == 2:
        return float(struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0])
    if nbytes in (8, 16):  # double, or the real part of a double complex
        return float(struct.unpack("<d", struct.pack("<Q", bits))[0])
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0])


def _type_bytes(token: Any) -> int | None:
    """Bytes of a logged cudaDataType ("CUDA_R_32F(0)")."""
    match = _TYPE_CODE.search(token) if isinstance(token, str) else None
    return TYPE_BYTES.get(int(match.group(1))) if match else None


def classic_gemm(function: str, args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A logged classic-API GEMM in the one form: `args` as the log gave them, `extra` what the
    recorder added (pointer mode, scalar bits, a pointer-array call's pointers)."""
    out = dict(args)
    nbytes = int(extra.get("scalar_bytes", 4))
    out["alpha"] = scalar(extra.get("alpha_bits"), nbytes)
    out["beta"] = scalar(extra.get("beta_bits"), nbytes)
    out["pointer_mode"] = extra.get("pointer_mode")
    missing = [k for k in GEMM_ARGS if k not in args]
    if missing:  # a call of another shape (grouped, ...): its operands cannot be placed
        out["unbound"] = f"{function}: its log gives no {', '.join(missing)}"
        return out
    if "batchCount" in args:
        out["batch"] = out.pop("batchCount")
    typed = _TYPED.match(function)
    for role in ("A", "B", "C"):
        size = _type_bytes(args.get(f"{role}type")) if f"{role}type" in args else None
        if size is None and typed:
            size = _LETTER_BYTES[typed.group(1)]
        if size is None:
            out["unbound"] = f"{function}: the element type of {role} is not known"
            return out
        if size != 4:
            out[f"bytes{role}"] = size
        if f"{role}array" in args:
            pointers = extra.get(f"{role.lower()}_ptrs")
            if pointers is None:
                out["unbound"] = (
                    f"{function}: the pointers in {role}array were not read (more than "
                    f"{MAX_BATCHES_BOUND} batches, or a stream under graph capture)"
                )
                return out
            out[role] = pointers[0] if pointers else 0
            out[f"{role}_ptrs"] = pointers
    return out


def _layout_words(layout: list[int] | None, role: str) -> str | None:
    if layout is None:
        return f"{role} has no matrix layout"
    if -1 in layout:
        return f"{role}'s matrix layout could not be read"
    if layout[1] != LT_ORDER_COL:
        return f"{role}'s matrix layout has order {layout[1]}, not column-major"
    if layout[0] not in TYPE_BYTES:
        return f"{role}'s element type {layout[0]} is not known"
    return None


# cublasLtEpilogue_t (cublasLt.h): the bits that name a pointer besides A, B, C and D
EPILOGUE_DEFAULT, RELU, BIAS, GELU, AUX, BGRADA, BGRADB = 1, 2, 4, 32, 128, 256, 512
EPILOGUES = frozenset({1, 2, 130, 4, 6, 134, 136, 152, 32, 160, 36, 164, 192, 208, 256, 512})


def _epilogue(found: list[int], d: list[int] | None) -> dict[str, Any] | str | None:
    """What a cuBLASLt epilogue adds to the call's operands: None for none (a recorder before the
    epilogue was read, the default, or a ReLU or GELU on D alone); the bias vector it reads (the
    BIAS epilogues: one element per row of D) or writes (BGRADA: per row, BGRADB: per column);
    else why the call cannot be bound (an auxiliary matrix, written or read, is not bound)."""
    if not found or found[0] in (EPILOGUE_DEFAULT, RELU, GELU):
        return None
    epilogue, bias = found[0], found[1]
    if epilogue not in EPILOGUES:
        return f"its epilogue {epilogue} is none cuBLASLt documents, or could not be read"
    if epilogue & AUX:
        return f"its epilogue {epilogue} reads or writes an auxiliary matrix, which is not bound"
    if d is None or d[5] > 1:
        return f"its epilogue {epilogue} applies a bias to a batched or unread D"
    if bias <= 0:
        return f"its epilogue {epilogue} uses a bias vector whose pointer could not be read"
    length = d[3] if epilogue == BGRADB else d[2]
    access = "r" if epilogue & BIAS else "w"
    return {"bias": bias, "bias_length": length, "bias_access": access}


def _lt_dims_conflict(
    a: list[int], b: list[int], c: list[int], d: list[int], transa: int, transb: int
) -> str | None:
    """Where a cublasLtMatmul's four layouts disagree on m, n or k (op(A) is m x k, op(B) k x n,
    C and D m x n): cuBLASLt answers such a call CUBLAS_STATUS_INVALID_VALUE and computes
    nothing, so the GEMM the capture holds never ran. None where they agree."""
    m, n = d[2], d[3]
    a_rows, a_cols = (a[2], a[3]) if transa == 0 else (a[3], a[2])
    b_rows, b_cols = (b[2], b[3]) if transb == 0 else (b[3], b[2])
    if (c[2], c[3]) != (m, n):
        return f"C's layout is {c[2]} x {c[3]} and D's {m} x {n}"
    if a_rows != m:
        return f"op(A) has {a_rows} rows and D {m}"
    if b_cols != n:
        return f"op(B) has {b_cols} columns and D {n}"
    if a_cols != b_rows:
        return f"op(A) has {a_cols} columns (k) and op(B) {b_rows} rows"
    return None


def lt_gemm(event: dict[str, Any]) -> dict[str, Any]:
    """A recorded `cublasLtMatmul` in the one form. D = op(A)·op(B) (scaled) + C: m and n are
    D's rows and columns, k the columns of op(A); alpha and beta as the recorder read them from
    the addresses the log names (of the descriptor's scale type), else None: then C counts as
    read and D as written."""
    a, b, c, d = (event[k] for k in ("adesc", "bdesc", "cdesc", "ddesc"))
    compute, scale, mode, transa, transb = event["desc"][:5]
    out: dict[str, Any] = {"A": event["a"], "B": event["b"], "C": event["c"], "D": event["d"]}
    # a scale type cuBLASLt does not have (or that could not be read) says nothing of the bits:
    # alpha and beta unknown, so C counts as read and D as written
    nbytes = TYPE_BYTES.get(scale)
    alpha = scalar(event.get("alpha_bits"), nbytes) if nbytes else None
    beta = scalar(event.get("beta_bits"), nbytes) if nbytes else None
    out |= {"alpha": alpha, "beta": beta, "pointer_mode": mode, "compute_type": compute}
    if c is None:  # cuBLASLt takes Cdesc = Ddesc when C is not given its own
        c = d
    problems = [
        p for role, lay in zip("ABCD", (a, b, c, d), strict=True) if (p := _layout_words(lay, role))
    ]
    if transa not in OPS or transb not in OPS:
        problems.append(f"transa {transa} or transb {transb} could not be read")
    epilogue = _epilogue(event["desc"][5:], d)
    if isinstance(epilogue, str):
        problems.append(epilogue)
    if problems:
        out |= {"transa": "N", "transb": "N", "m": 0, "n": 0, "k": 0, "lda": 1, "ldb": 1}
        out |= {"ldc": 1, "unbound": f"cublasLtMatmul: {problems[0]}"}
        return out
    if isinstance(epilogue, dict):
        out |= epilogue
    if (conflict := _lt_dims_conflict(a, b, c, d, transa, transb)) is not None:
        out["conflict"] = conflict
    out["transa"], out["transb"] = OPS[transa], OPS[transb]
    out["m"], out["n"] = d[2], d[3]
    out["k"] = a[3] if transa == 0 else a[2]
    out["lda"], out["ldb"], out["ldc"], out["ldd"] = a[4], b[4], c[4], d[4]
    batch = max(lay[5] for lay in (a, b, c, d))
    if batch > 1:
        out["batch"] = batch
    for role, lay in zip("ABCD", (a, b, c, d), strict=True):
        if TYPE_BYTES[lay[0]] != 4:
            out[f"bytes{role}"] = TYPE_BYTES[lay[0]]
        if batch > 1:
            out[f"stride{role}"] = lay[6] if lay[5] > 1 else 0
    return out


def operands_problem(args: dict[str, Any]) -> str | None:
    """Why a GEMM's operands cannot lie in the process's memory, if they cannot: the first or the
    last batch of a strided call, or any batch of a pointer-array call, starts or ends outside
    its address space (capture/schema.py). A null pointer names no operand; an unbound call
    names no box."""
    if "unbound" in args:
        return None
    for op in gemm_operands(args):
        if not op.pointer:
            continue
        end = op.pointer + op.extent_bytes
        if not LOWEST_ADDRESS <= op.pointer < ADDRESS_LIMIT or end > ADDRESS_LIMIT:
            return (
                f"operand {op.role} spans bytes {op.pointer} to {end}, outside the process's "
                "address space (2**15 to 2**48)"
            )
    return None


def refusal(args: dict[str, Any]) -> str | None:
    """Why cuBLAS refuses a recorded GEMM's arguments with CUBLAS_STATUS_INVALID_VALUE and
    computes nothing, by the rules the rebuild's recorder applies (trace/gemm_rules.py: a
    negative size, a leading dimension below the rows its column-major operand stores), or
    None. Its logger wrote the call before refusing it, so the capture holds a GEMM that never
    ran. For a real matrix, op C is op T; cuBLASLt holds D's leading dimension to the rule too,
    and refuses layouts that disagree on a size."""
    if "unbound" in args:
        return None
    if "conflict" in args:  # a cuBLASLt call whose layouts disagree on a size
        return f"its matrix layouts disagree: {args['conflict']}"
    shape = GemmShape.of(args)
    real = {"C": "T"}  # op C of a real matrix is op T
    shape = shape._replace(
        transa=real.get(shape.transa, shape.transa), transb=real.get(shape.transb, shape.transb)
    )
    why = invalid_value(shape)
    ldd = args.get("ldd")
    if why is None and isinstance(ldd, int):
        why = ld_below_rows("ldd", ldd, shape.m)
    return why
