"""A GEMM call's operands, whatever entry point made it: each batch's operand as a pointer, an
element size and a row-major box, from the one form every GEMM record carries (below). The
capture reader checks them against the process's address space, the bindings name them,
EGF001 judges them and spans.py spells them out in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egf_audit.trace.buffers import ELEMENT_BYTES
from egf_audit.trace.gemm_rules import GemmShape, gemm_operand_boxes

# Every GEMM record (cublasSgemm_v2, cublasGemmEx, the batched and strided-batched calls,
# cublasLtMatmul) carries the SGEMM's eight shape arguments (transa, transb, m, n, k, lda, ldb,
# ldc), its pointers A, B, C, and where they differ from one fp32 matrix each: `batch` (count),
# `strideA`/`strideB`/`strideC` (elements between batches), `A_ptrs`/`B_ptrs`/`C_ptrs` (a
# pointer-array call's pointers), `bytesA`/`bytesB`/`bytesC` (element size), `D` and `ldd`
# (cuBLASLt's output, when it is not C), `bias`, `bias_length` and `bias_access` (a cuBLASLt
# epilogue's bias vector, read or written), `conflict` (where a cuBLASLt call's layouts disagree
# on a size: cuBLASLt refused it) and `unbound` (why its operands cannot be named).
MAX_BATCHES_BOUND = 4096  # a pointer-array call binds each batch; the recorder reads this many


@dataclass(frozen=True)
class GemmOperand:
    """One operand of one batch of a GEMM call: where it starts, its element size, and its
    row-major box (rows, width, row stride) in elements of that size."""

    role: str  # "A", "B", "C", "D"; "A[3]" for batch 3 of a batched call
    pointer: int
    access: str  # "r", "w", "rw"
    element_bytes: int
    box: tuple[int, int, int]

    @property
    def extent_bytes(self) -> int:
        """Bytes from the pointer to one past the last element the box touches."""
        rows, width, ld = self.box
        return 0 if rows <= 0 or width <= 0 else ((rows - 1) * ld + width) * self.element_bytes


def gemm_operands(args: dict[str, Any]) -> list[GemmOperand]:
    """Every operand of every batch the call's operands are judged at: all batches of a
    pointer-array call; the first and the last of a strided one (the batches between lie
    between them, with the same box); none when the call is `unbound`."""
    if "unbound" in args:
        return []
    boxes = gemm_operand_boxes(GemmShape.of(args))
    beta = args.get("beta")
    has_d = "D" in args and args["D"] != args["C"]
    access = {"A": "r", "B": "r", "C": "r" if has_d else ("w" if beta == 0.0 else "rw")}
    if has_d:
        boxes["D"] = (*boxes["C"][:2], args["ldd"])
        access["D"] = "w"
    batch = int(args.get("batch", 1))
    out = []
    for role, box in boxes.items():
        size = int(args.get(f"bytes{role}", ELEMENT_BYTES))
        pointers = args.get(f"{role}_ptrs")
        if pointers is None:
            stride = int(args.get(f"stride{role}", 0)) * size
            first_last = (0, batch - 1) if batch > 1 else (0,)
            pointers = [args[role] + i * stride for i in first_last]
            batches = list(first_last)
        else:
            batches = list(range(len(pointers)))
        for i, pointer in zip(batches, pointers, strict=True):
            name = role if i == 0 else f"{role}[{i}]"
            out.append(GemmOperand(name, pointer, access[role], size, box))
    if "bias" in args:  # a cuBLASLt epilogue's vector, of D's element type (its default)
        n, size = int(args["bias_length"]), int(args.get("bytesD", ELEMENT_BYTES))
        out.append(GemmOperand("bias", int(args["bias"]), args["bias_access"], size, (1, n, n)))
    return out
