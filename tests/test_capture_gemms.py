"""Every GEMM entry point, runtime-API launches and processes that are no SP14 trainer, read from
event lines written as the recorder writes them (rec_gemm.c): cuBLAS's own log lines
as cuBLAS 13.1 words them (recorded from libcublas with its logger on), cuBLASLt matmuls as the
recorder's `ltmatmul` event, kernel launches under C++-mangled and extern "C" names. The
committed GPU recordings of the same paths are tested in tests/test_capture_runtime.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from capture_folders import write_manifest

from egf_audit.capture.events import read_capture
from egf_audit.capture.kernel_params import source_name
from egf_audit.capture.layout import load_layout_file, place
from egf_audit.cli.capture_audit import audit_capture
from egf_audit.errors import UsageError
from egf_audit.invariants.registry import FAIL, PASS, UNDECIDED
from egf_audit.trace.gemm_operands import gemm_operands

PID = 777
HEADERS = {
    "cublasSgemm_v2": "cublasSgemm_v2(cublasHandle_t, cublasOperation_t, cublasOperation_t, "
    "int, int, int, const float*, const float*, int, const float*, int, const float*, float*, "
    "int)",
    "cublasGemmEx": "cublasGemmEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, "
    "int, int, const void*, const void*, cudaDataType, int, const void*, cudaDataType, int, "
    "const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t)",
    "cublasSgemmStridedBatched": "cublasSgemmStridedBatched(cublasHandle_t, ...)",
    "cublasGemmStridedBatchedEx": "cublasGemmStridedBatchedEx(cublasHandle_t, ...)",
    "cublasSgemmBatched": "cublasSgemmBatched(cublasHandle_t, ...)",
}
F32 = {1.0: 0x3F800000, 0.5: 0x3F000000, 0.0: 0}


def _pointer(value: int) -> str:
    return f"POINTER (IN HEX:0x{hex(value)})"


class Events:
    """An events file of one process, written line by line as the recorder writes it."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.add("init", pid=PID, ppid=1, cupti_version=130001, subscribe=0, param_info=True)

    def add(self, ev: str, **fields: Any) -> None:
        self.lines.append({"ev": ev, "seq": len(self.lines), "tid": 1, **fields})

    def alloc(self, address: int, nbytes: int) -> None:
        self.add("alloc", api="cudaMalloc_v3020", dst=address, src=0, bytes=nbytes, value=0)

    def kernel(self, name: str, params: list[list[int]] | None, api="cudaLaunchKernel_v7000"):
        self.add("kernel", api=api, name=name, grid=[1, 1, 1], block=[256, 1, 1], params=params)

    def gemm(self, function: str, args: list[tuple[str, str, str]], **extras: Any) -> None:
        """One classic call: its header, then one line per (name, type, value); `extras` go on
        the line that completes alpha and beta (beta's, or computeType's for the Ex calls) and,
        for pointer arrays, batchCount's, where the recorder writes them."""
        header = f"I! cuBLAS (v13.1.2) function cublasStatus_t {HEADERS[function]} called:\n"
        self.add("cublas", msg=header)
        ex = any(name == "computeType" for name, _, _ in args)
        for name, ctype, value in args:
            extra = {}
            if name == ("computeType" if ex else "beta"):
                extra = {k: v for k, v in extras.items() if not k.endswith("_ptrs")}
            if name == "batchCount":
                extra = {k: v for k, v in extras.items() if k.endswith("_ptrs")}
            self.add("cublas", msg=f"i!  {name}: type={ctype}; val={value}\n", **extra)

    def write(self, folder: Path, ended: bool = True, layout: dict | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        lines = list(self.lines)
        if ended:
            lines.append({"ev": "exit", "seq": len(lines), "tid": 1, "pid": PID})
        text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        (folder / f"events-{PID}.jsonl").write_text(text)
        (folder / f"snapshots-{PID}.bin").write_bytes(b"")
        if layout is not None:
            (folder / "layout.json").write_text(json.dumps(layout))
        return write_manifest(folder, command=["trainer"], exit_code=0)


def _shape(ta="T", tb="N", m=12, n=24, k=16) -> list[tuple[str, str, str]]:
    ops = {"N": "CUBLAS_OP_N(0)", "T": "CUBLAS_OP_T(1)"}
    return [
        ("handle", "cublasHandle_t", _pointer(0x2B0CCC20)),
        ("transa", "cublasOperation_t", ops[ta]),
        ("transb", "cublasOperation_t", ops[tb]),
        ("m", "int", str(m)),
        ("n", "int", str(n)),
        ("k", "int", str(k)),
    ]


# one flat allocation, as llm.c keeps its activations: X [24, 16], W [12, 16], Y [24, 12], then
# Q, K [24, 4] (3 batches of 8 x 4) and S [24, 8] (3 batches of 8 x 8)
BASE = 0x7F0000000000
TENSORS = {"X": (0, 24, 16), "W": (384, 12, 16), "Y": (576, 24, 12)}
TENSORS |= {"Q": (864, 24, 4), "K": (960, 24, 4), "S": (1056, 24, 8)}
TOTAL = 1056 + 24 * 8


def at(name: str, element: int = 0) -> int:
    return BASE + 4 * (TENSORS[name][0] + element)


LAYOUT = {
    "format": "egf-audit-layout/1",
    "dims": {},
    "buffers": {
        "acts": {
            "address": BASE,
            "bytes": 4 * TOTAL,
            "tensors": {k: list(v) for k, v in TENSORS.items()},
        }
    },
}


def sgemm_y(events: Events, k: int = 16, ldb: int = 16) -> None:
    """Y = X·Wᵀ as llm.c's matmul_forward calls it: (T, N, OC, BT, C, W, C, X, C, Y, OC)."""
    events.gemm(
        "cublasSgemm_v2",
        [
            *_shape(k=k),
            ("alpha", "float", _pointer(0x1000)),
            ("A", "float", _pointer(at("W"))),
            ("lda", "int", "16"),
            ("B", "float", _pointer(at("X"))),
            ("ldb", "int", str(ldb)),
            ("beta", "float", _pointer(0x1004)),
            ("C", "float", _pointer(at("Y"))),
            ("ldc", "int", "12"),
        ],
        pointer_mode=0,
        scalar_bytes=4,
        alpha_bits=F32[1.0],
        beta_bits=F32[0.0],
    )


def strided_s(events: Events, function: str = "cublasSgemmStridedBatched", ldc: int = 8) -> None:
    """S_b = Q_b·K_bᵀ per batch, as llm.c's attention: (T, N, T, T, HS, K, HS, T*HS, Q, HS,
    T*HS, S, T, T*T, NB)."""
    ex = function.endswith("Ex")
    ctype = "void" if ex else "float"
    typed = [("Atype", "cudaDataType_t", "CUDA_R_32F(0)")] if ex else []
    args = [
        *_shape(m=8, n=8, k=4),
        ("alpha", ctype, _pointer(0x1000)),
        ("A", ctype, _pointer(at("K"))),
        *typed,
        ("lda", "int", "4"),
        ("strideA", "SOME TYPE", "32"),
        ("B", ctype, _pointer(at("Q"))),
        *[(n.replace("A", "B"), t, v) for n, t, v in typed],
        ("ldb", "int", "4"),
        ("strideB", "SOME TYPE", "32"),
        ("beta", ctype, _pointer(0x1004)),
        ("C", ctype, _pointer(at("S"))),
        *[(n.replace("A", "C"), t, v) for n, t, v in typed],
        ("ldc", "int", str(ldc)),
        ("strideC", "SOME TYPE", "64"),
        ("batchCount", "int", "3"),
    ]
    if ex:
        args += [
            ("computeType", "cublasComputeType_t", "CUBLAS_COMPUTE_32F(68)"),
            ("algo", "SOME TYPE", "CUBLAS_GEMM_DEFAULT(-1)"),
        ]
    extras = {"pointer_mode": 0, "scalar_bytes": 4, "alpha_bits": F32[1.0], "beta_bits": 0}
    events.gemm(function, args, **extras)


def _gemms(folder: Path) -> list[Any]:
    (proc,) = read_capture(folder)
    return [r for r in proc.records if r.kind in ("sgemm", "gemm")]


def _verdicts(folder: Path, use_layout: bool = True) -> dict[str, Any]:
    (process,) = audit_capture(folder, use_layout=use_layout).processes
    return dict(process.verdicts)


# ---- each entry point in one form ----
def test_a_strided_batched_call_binds_its_first_and_last_batch(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    strided_s(events)
    (gemm,) = _gemms(events.write(tmp_path / "c"))
    assert gemm.kind == "gemm" and gemm.name == "cublasSgemmStridedBatched"
    assert (gemm.args["batch"], gemm.args["strideA"], gemm.args["strideC"]) == (3, 32, 64)
    assert gemm.args["beta"] == 0.0
    operands = {op.role: op for op in gemm_operands(gemm.args)}
    assert sorted(operands) == ["A", "A[2]", "B", "B[2]", "C", "C[2]"]
    assert operands["C[2]"].pointer == at("S", 2 * 64)
    assert operands["C"].access == "w" and operands["A"].access == "r"
    assert operands["A"].box == (8, 4, 4)  # T rows of HS, row stride HS


def test_the_ex_calls_read_their_scalars_by_compute_type_and_their_element_types(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    strided_s(events, "cublasGemmStridedBatchedEx")
    (gemm,) = _gemms(events.write(tmp_path / "c"))
    assert gemm.args["alpha"] == 1.0 and gemm.args["beta"] == 0.0
    assert "bytesA" not in gemm.args  # fp32: the layout's element size
    assert [op.role for op in gemm_operands(gemm.args)] == ["A", "A[2]", "B", "B[2]", "C", "C[2]"]


def test_a_pointer_array_call_binds_every_batch_from_the_pointers_the_recorder_read(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    a_ptrs = [at("K", 32 * b) for b in range(3)]
    b_ptrs = [at("Q", 32 * b) for b in range(3)]
    c_ptrs = [at("S", 64 * b) for b in range(3)]
    args = [
        *_shape(m=8, n=8, k=4),
        ("alpha", "float", _pointer(0x1000)),
        ("Aarray", "SOME TYPE", _pointer(0x5000)),
        ("lda", "int", "4"),
        ("Barray", "SOME TYPE", _pointer(0x5100)),
        ("ldb", "int", "4"),
        ("beta", "float", _pointer(0x1004)),
        ("Carray", "SOME TYPE", _pointer(0x5200)),
        ("ldc", "int", "8"),
        ("batchCount", "int", "3"),
    ]
    extras = {"pointer_mode": 0, "scalar_bytes": 4, "alpha_bits": F32[1.0], "beta_bits": 0}
    events.gemm("cublasSgemmBatched", args, a_ptrs=a_ptrs, b_ptrs=b_ptrs, c_ptrs=c_ptrs, **extras)
    folder = events.write(tmp_path / "c", layout=LAYOUT)
    (gemm,) = _gemms(folder)
    operands = gemm_operands(gemm.args)
    roles = [f"{role}{i}" for role in "ABC" for i in ("", "[1]", "[2]")]
    assert [op.role for op in operands] == roles
    assert [op.pointer for op in operands if op.role.startswith("C")] == c_ptrs
    assert _verdicts(folder)["EGF001"].status == PASS


def test_a_pointer_array_call_whose_arrays_were_not_read_is_listed_never_passed(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    args = [
        *_shape(m=8, n=8, k=4),
        ("Aarray", "SOME TYPE", _pointer(0x5000)),
        ("lda", "int", "4"),
        ("Barray", "SOME TYPE", _pointer(0x5100)),
        ("ldb", "int", "4"),
        ("Carray", "SOME TYPE", _pointer(0x5200)),
        ("ldc", "int", "8"),
        ("batchCount", "int", "5000"),
    ]
    events.gemm("cublasSgemmBatched", args)
    folder = events.write(tmp_path / "c")
    (gemm,) = _gemms(folder)
    assert gemm.args["unbound"].startswith("cublasSgemmBatched: the pointers in Aarray were not")
    verdict = _verdicts(folder)["EGF001"]
    assert verdict.status == UNDECIDED
    assert verdict.summary.startswith("1 of 1 GEMMs cannot be judged: cublasSgemmBatched: the")


def _lt_event(
    events: Events, ld_d: int = 8, order: int = 0, a: int | None = None, **scalars: int
) -> None:
    """A batched cublasLtMatmul S_b = Q_b·K_bᵀ, as the recorder writes it from the call's own
    descriptors: layouts [type, order, rows, cols, ld, batch, stride]; desc [compute, scale,
    pointer mode, transa, transb]; alpha_bits and beta_bits where it read them."""
    events.add(
        "ltmatmul",
        **scalars,
        a=at("K") if a is None else a,
        b=at("Q"),
        c=at("S"),
        d=at("S"),
        adesc=[0, order, 4, 8, 4, 3, 32],
        bdesc=[0, 0, 4, 8, 4, 3, 32],
        cdesc=[0, 0, 8, 8, 8, 3, 64],
        ddesc=[0, 0, 8, 8, ld_d, 3, 64],
        desc=[68, 0, 0, 1, 0],
    )


def test_a_cublaslt_matmul_is_bound_from_its_layouts(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _lt_event(events)
    folder = events.write(tmp_path / "c", layout=LAYOUT)
    (gemm,) = _gemms(folder)
    a = gemm.args
    assert (a["transa"], a["transb"], a["m"], a["n"], a["k"]) == ("T", "N", 8, 8, 4)
    assert (a["lda"], a["ldb"], a["ldc"], a["batch"], a["strideA"], a["strideC"]) == (
        4,
        4,
        8,
        3,
        32,
        64,
    )
    assert a["beta"] is None  # not in cuBLASLt's log: C counts as read and written
    assert {op.role: op.access for op in gemm_operands(a)}["C"] == "rw"
    assert _verdicts(folder)["EGF001"].status == PASS


@pytest.mark.parametrize("beta, c_access", [(1.0, "rw"), (0.0, "w"), (0.5, "rw")])
def test_a_cublaslt_matmuls_scalars_are_read_from_the_bits_the_recorder_wrote(
    tmp_path, beta, c_access
):
    """In place (C = D): beta = 0 writes C without reading it, any other beta accumulates."""
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _lt_event(events, alpha_bits=F32[1.0], beta_bits=F32[beta])
    (gemm,) = _gemms(events.write(tmp_path / "c", layout=LAYOUT))
    assert (gemm.args["alpha"], gemm.args["beta"]) == (1.0, beta)
    assert {op.role: op.access for op in gemm_operands(gemm.args)}["C"] == c_access


def test_a_cublaslt_scale_type_that_is_no_type_leaves_the_scalars_unknown(tmp_path):
    """beta's bits read as a type the descriptor does not name are no beta: C counts as read
    and written, as where the recorder could not read them."""
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _lt_event(events, alpha_bits=F32[1.0], beta_bits=F32[0.0])
    events.lines[-1]["desc"][1] = -1
    (gemm,) = _gemms(events.write(tmp_path / "c", layout=LAYOUT))
    assert (gemm.args["alpha"], gemm.args["beta"]) == (None, None)
    assert {op.role: op.access for op in gemm_operands(gemm.args)}["C"] == "rw"


def test_a_cublaslt_layout_in_row_order_is_listed_as_not_judged(tmp_path):
    events = Events()
    _lt_event(events, order=1)
    (gemm,) = _gemms(events.write(tmp_path / "c"))
    assert gemm.args["unbound"] == "cublasLtMatmul: A's matrix layout has order 1, not column-major"


def _lt_epilogue(events: Events, epilogue: int, bias: int = 0, aux: int = 0, aux_ld: int = 0):
    """Y = op(W)ᵀ·X through cublasLtMatmul (m = 12 rows of D, n = 24 columns), with the
    descriptor's epilogue, bias pointer, auxiliary pointer and its ld as the recorder reads
    them after the five it always read."""
    events.add(
        "ltmatmul",
        a=at("W"),
        b=at("X"),
        c=at("Y"),
        d=at("Y"),
        adesc=[0, 0, 16, 12, 16, 1, 0],
        bdesc=[0, 0, 16, 24, 16, 1, 0],
        cdesc=[0, 0, 12, 24, 12, 1, 0],
        ddesc=[0, 0, 12, 24, 12, 1, 0],
        desc=[68, 0, 0, 1, 0, epilogue, bias, aux, aux_ld],
    )


@pytest.mark.parametrize(
    ("epilogue", "bias", "bound"),
    [
        (1, 0, None),  # the default: nothing besides A, B, C and D
        (2, 0, None),  # ReLU on D alone
        (32, 0, None),  # GELU on D alone
        (4, at("W"), (12, "r")),  # BIAS: one element a row of D, read
        (6, at("W"), (12, "r")),  # RELU_BIAS
        (36, at("W"), (12, "r")),  # GELU_BIAS
        (256, at("W"), (12, "w")),  # BGRADA: the bias gradient, a row of D each, written
        (512, at("W"), (24, "w")),  # BGRADB: a column of D each
    ],
)
def test_a_cublaslt_epilogue_binds_the_bias_vector_it_reads_or_writes(
    tmp_path, epilogue, bias, bound
):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _lt_epilogue(events, epilogue, bias)
    (gemm,) = _gemms(events.write(tmp_path / "c", layout=LAYOUT))
    assert "unbound" not in gemm.args
    found = {op.role: op for op in gemm_operands(gemm.args)}
    if bound is None:
        assert "bias" not in found
        return
    length, access = bound
    assert (found["bias"].pointer, found["bias"].access) == (bias, access)
    assert found["bias"].box == (1, length, length)


def test_a_bias_vector_running_past_its_tensor_fails_egf001_naming_it(tmp_path):
    """The bias (12 floats) starts 4 floats before the end of W: it reads 8 past it (as every
    operand of a program that is no SP14 trainer, it must lie in whole rows of its tensor)."""
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _lt_epilogue(events, 6, at("W", 12 * 16 - 4))
    verdict = _verdicts(events.write(tmp_path / "c", layout=LAYOUT))["EGF001"]
    assert verdict.status == FAIL, verdict.summary
    assert "operand bias reaches 8 elements past the end of W" in verdict.summary, verdict.summary


@pytest.mark.parametrize(
    ("epilogue", "bias", "aux", "words"),
    [
        (
            160,
            0,
            at("S"),
            "its epilogue 160 reads or writes an auxiliary matrix, which is not bound",
        ),  # GELU_AUX
        (
            136,
            0,
            at("S"),
            "its epilogue 136 reads or writes an auxiliary matrix, which is not bound",
        ),  # DRELU
        (3, 0, 0, "its epilogue 3 is none cuBLASLt documents, or could not be read"),
        (-1, 0, 0, "its epilogue -1 is none cuBLASLt documents, or could not be read"),
        (4, -1, 0, "its epilogue 4 uses a bias vector whose pointer could not be read"),
        (4, 0, 0, "its epilogue 4 uses a bias vector whose pointer could not be read"),
    ],
)
def test_an_epilogue_whose_pointers_cannot_be_bound_is_listed_never_passed(
    tmp_path, epilogue, bias, aux, words
):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _lt_epilogue(events, epilogue, bias, aux, 12 if aux else 0)
    folder = events.write(tmp_path / "c", layout=LAYOUT)
    (gemm,) = _gemms(folder)
    assert gemm.args["unbound"] == f"cublasLtMatmul: {words}"
    assert _verdicts(folder)["EGF001"].status == UNDECIDED


def test_a_descriptor_naming_a_bias_pointer_outside_the_process_is_refused(tmp_path):
    events = Events()
    _lt_epilogue(events, 4, 5)
    with pytest.raises(UsageError, match='"desc" names pointer 5, no address of the process'):
        read_capture(events.write(tmp_path / "c"))


def test_the_cublaslt_call_cublas_makes_inside_a_classic_call_is_that_call(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    strided_s(events)
    _lt_event(events)  # on the classic call's own operands, nothing recorded between them
    events.kernel("sm90_xmma_gemm", [], api="cuLaunchKernel")
    _lt_event(events)  # after a launch: the trainer's own cublasLtMatmul
    (proc,) = read_capture(events.write(tmp_path / "c"))
    names = [r.name for r in proc.records if r.kind in ("sgemm", "gemm")]
    assert names == ["cublasSgemmStridedBatched", "cublasLtMatmul"]
    assert proc.internal_lt == 1


def test_a_device_pointer_mode_gemm_keeps_the_scalars_read_from_the_device(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    events.gemm(
        "cublasSgemm_v2",
        [
            *_shape(),
            ("alpha", "float", _pointer(BASE + 4 * TOTAL - 8)),
            ("A", "float", _pointer(at("W"))),
            ("lda", "int", "16"),
            ("B", "float", _pointer(at("X"))),
            ("ldb", "int", "16"),
            ("beta", "float", _pointer(BASE + 4 * TOTAL - 4)),
            ("C", "float", _pointer(at("Y"))),
            ("ldc", "int", "12"),
        ],
        pointer_mode=1,
        scalar_bytes=4,
        alpha_bits=F32[1.0],
        beta_bits=struct.unpack("<I", struct.pack("<f", 1.0))[0],
    )
    (gemm,) = _gemms(events.write(tmp_path / "c"))
    assert (gemm.args["pointer_mode"], gemm.args["alpha"], gemm.args["beta"]) == (1, 1.0, 1.0)
    assert {op.role: op.access for op in gemm_operands(gemm.args)}["C"] == "rw"


def test_a_gemm_whose_log_gives_a_negative_batch_count_is_refused(tmp_path):
    events = Events()
    args = [*_shape(m=8, n=8, k=4), ("batchCount", "int", "-3")]
    events.gemm("cublasSgemmStridedBatched", args)
    with pytest.raises(UsageError, match=r"line 2: cublasSgemmStridedBatched call: batchCount -3"):
        read_capture(events.write(tmp_path / "c"))


@pytest.mark.parametrize("function", ["cublasSgemmStridedBatched", "cublasGemmStridedBatchedEx"])
@pytest.mark.parametrize("arg", ["A", "B", "C", "strideA", "strideB", "strideC", "batchCount"])
def test_a_strided_call_whose_log_lacks_an_operand_or_a_stride_is_refused(tmp_path, function, arg):
    """Every argument that places an operand's batches, refused when the log lost it: a pointer
    that was never there crashed the reader, and a stride or count taken as 0 or 1 would judge
    one batch of a call that ran many."""
    events = Events()
    strided_s(events, function)
    (gone,) = [i for i, e in enumerate(events.lines) if e.get("msg", "").startswith(f"i!  {arg}:")]
    del events.lines[gone]
    events.lines = [e | {"seq": i} for i, e in enumerate(events.lines)]
    with pytest.raises(UsageError, match=rf"line 2: {function} call: its log gives no {arg}$"):
        read_capture(events.write(tmp_path / "c"))


@pytest.mark.parametrize("arg", ["Aarray", "Carray", "batchCount"])
def test_a_pointer_array_call_whose_log_lacks_an_array_or_its_count_is_refused(tmp_path, arg):
    events = Events()
    args = [
        *_shape(m=8, n=8, k=4),
        *[(f"{r}array", "SOME TYPE", _pointer(0x5000 + 0x100 * i)) for i, r in enumerate("ABC")],
        *[(f"ld{r}", "int", "8") for r in "abc"],
        ("batchCount", "int", "3"),
    ]
    events.gemm("cublasSgemmBatched", [a for a in args if a[0] != arg])
    missing = arg.removesuffix("array")
    with pytest.raises(
        UsageError, match=rf"line 2: cublasSgemmBatched call: its log gives no {missing}$"
    ):
        read_capture(events.write(tmp_path / "c"))


# ---- a process that is no SP14 trainer ----
def test_generic_verdicts_pass_whole_rows_of_named_tensors_and_fail_a_column_block(tmp_path):
    clean, planted = Events(), Events()
    for events, k in ((clean, 16), (planted, 15)):
        events.alloc(BASE, 4 * TOTAL)
        sgemm_y(events, k=k)
        strided_s(events)
    ok = _verdicts(clean.write(tmp_path / "clean", layout=LAYOUT))
    assert ok["EGF001"].status == PASS
    assert ok["EGF001"].summary.startswith("2 GEMMs keep every operand of every batch inside")
    bad = _verdicts(planted.write(tmp_path / "planted", layout=LAYOUT))["EGF001"]
    assert bad.status == FAIL
    assert bad.summary == (
        "sgemm (launch 0): operand A spans 15 of 16 columns of W (1 GEMMs, 0 other launches offend)"
    )
    # EGF001 and EGF013 need no SP14 name; EGF013 needs a deep capture
    assert ok["EGF013"].summary.startswith("not a deep capture")
    assert all(
        v.summary.startswith("not applicable: ")
        for c, v in ok.items()
        if c not in ("EGF001", "EGF013")
    )


def test_generic_verdicts_without_a_layout_judge_each_operand_by_its_allocation(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    strided_s(events, ldc=9)  # each batch written at row stride T + 1: the last runs past
    verdict = _verdicts(events.write(tmp_path / "c"))["EGF001"]
    assert verdict.status == FAIL
    assert verdict.summary.startswith(
        "cublasSgemmStridedBatched (launch 0): operand C[2] reaches 28 bytes past the end of "
        "its allocation"
    )


def test_a_generic_gemm_in_no_recorded_allocation_is_undecided(tmp_path):
    events = Events()
    sgemm_y(events)
    verdict = _verdicts(events.write(tmp_path / "c"))["EGF001"]
    assert verdict.status == UNDECIDED
    assert "land in no named buffer and no recorded allocation" in verdict.summary


def test_the_gate_fails_a_capture_of_no_sp14_trainer_however_its_gemms_fare(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    sgemm_y(events)
    audit = audit_capture(events.write(tmp_path / "c", layout=LAYOUT))
    assert audit.failed_codes() == set() and not audit.ok
    assert audit.missing[0].startswith("no process is an SP14 trainer")


# ---- buffers named by their allocation ----
def test_a_layout_names_buffers_by_their_allocation_and_places_them_in_the_process(tmp_path):
    layout = {
        "format": "egf-audit-layout/1",
        "buffers": {
            "params": {
                "allocation": {"bytes": 4 * TOTAL, "index": 1},
                "tensors": LAYOUT["buffers"]["acts"]["tensors"],
            },
            "grads": {"allocation": {"bytes": 4 * TOTAL, "index": 2}},
        },
    }
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout))
    events = Events()
    for i in range(2):
        events.alloc(BASE + i * 0x100000, 4 * TOTAL)
    (proc,) = read_capture(events.write(tmp_path / "c"))
    placed, note = place(load_layout_file(path), proc)
    assert placed.buffers["params"].base == BASE + 0x100000
    assert "grads" not in placed.buffers
    assert note == f"not in this process: grads (allocation 2 of {4 * TOTAL} bytes)"
    path.write_text(
        json.dumps(
            {
                "format": "egf-audit-layout/1",
                "buffers": {"p": {"allocation": {"bytes": 4}, "address": 4}},
            }
        )
    )
    with pytest.raises(UsageError, match=r"buffers\.p has both an address and an allocation"):
        load_layout_file(path)


# ---- runtime-API launches ----
@pytest.mark.parametrize(
    ("symbol", "name"),
    [
        ("sp14_scale_wire_col", "sp14_scale_wire_col"),
        ("_Z19sp14_scale_wire_colPfPKfiiii", "sp14_scale_wire_col"),
        ("_ZN4sp1419sp14_scale_wire_colEPfPKfiiii", "sp14_scale_wire_col"),
        ("_ZL10polyak_emaPfPKffx", "polyak_ema"),
        ("_Z3fooIiEvv", "foo"),
        ("_Z0x", "_Z0x"),
        ("_Z99short", "_Z99short"),
    ],
)
def test_a_kernel_symbol_reads_as_its_source_name(symbol, name):
    assert source_name(symbol) == name


def test_an_abi_kernel_launched_under_its_mangled_name_is_decoded_by_the_kernel_table(tmp_path):
    events = Events()
    params = [[8, BASE], [8, BASE + 4096], [4, 64], [4, 49], [4, 48], [4, 393]]
    events.kernel("_Z19sp14_scale_wire_colPfPKfiiii", params)
    (proc,) = read_capture(events.write(tmp_path / "c"))
    (record,) = proc.kernels()
    assert record.name == "sp14_scale_wire_col" and record.decoded
    assert record.args["symbol"] == "_Z19sp14_scale_wire_colPfPKfiiii"
    assert (record.args["ld"], record.args["isv_index"]) == (49, 393)
    assert record.api == "cudaLaunchKernel_v7000"


def test_an_abi_kernel_launched_without_its_arguments_is_refused_by_name(tmp_path):
    events = Events()
    events.kernel("_Z19sp14_scale_wire_colPfPKfiiii", None)
    with pytest.raises(UsageError, match=r"line 2: sp14_scale_wire_col launch without its arg"):
        read_capture(events.write(tmp_path / "c"))


@pytest.mark.parametrize(
    "rc, why",
    [
        (400, "(cuFuncGetParamInfo answered CUresult 400)"),
        (-1, "(the recorder found no CUfunction for the launch)"),
        (-2, "(the driver has no cuFuncGetParamInfo)"),
    ],
)
def test_an_abi_kernel_recorded_with_no_parameters_is_refused_with_the_recorders_reason(
    tmp_path, rc, why
):
    events = Events()
    events.add(
        "kernel",
        api="cuLaunchKernel",
        name="sp14_scale_wire_col",
        grid=[1, 1, 1],
        block=[256, 1, 1],
        params=[],
        param_info_rc=rc,
    )
    with pytest.raises(UsageError, match="sp14_scale_wire_col launch with 0 parameters") as err:
        read_capture(events.write(tmp_path / "c"))
    assert str(err.value).endswith(why)


@pytest.mark.parametrize(
    "ev, fields, words",
    [
        (
            "init",
            {"pid": PID, "ppid": 1, "cupti_version": 1, "subscribe": 0, "param_info": True}
            | {"hash": "sha1"},
            "line 1: \"hash\" is 'sha1': must be one of fnv1a, mix64",
        ),
        ("graph", {}, 'line 2: "api" is missing (every graph event has it)'),
        (
            "free",
            {"api": "cudaFree_v3020", "dst": -1, "src": 0, "bytes": 0, "value": 0},
            'line 2: "dst" is -1: must be from 0 to 2**64 - 1',
        ),
        ("ltmatmul", {}, 'line 2: "a" is missing (every ltmatmul event has it)'),
    ],
    ids=["unknown-hash", "graph-without-api", "free-negative-pointer", "ltmatmul-empty"],
)
def test_malformed_new_event_fields_are_refused_with_one_line(tmp_path, ev, fields, words):
    events = Events()
    if ev == "init":
        events.lines.clear()
    events.add(ev, **fields)
    with pytest.raises(UsageError) as err:
        read_capture(events.write(tmp_path / "c"))
    assert str(err.value).endswith(words)


@pytest.mark.parametrize("graph_launches, captured", [(1, 0), (0, 1), (2, 1)])
def test_a_process_that_runs_cuda_graphs_makes_the_capture_incomplete(
    tmp_path, graph_launches, captured
):
    """A graph's kernels are recorded once, when a stream is captured into it, and run unseen
    at every launch of the graph: the capture says it cannot follow them, and the gate fails,
    whatever the recorded launches' own verdicts."""
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    sgemm_y(events)
    for _ in range(captured):
        events.add(
            "kernel",
            api="cuLaunchKernel",
            name="gelu_forward",
            grid=[1, 1, 1],
            block=[256, 1, 1],
            params=[[8, at("Y")], [4, 12]],
            captured=True,
        )
    for _ in range(graph_launches):
        events.add("graph", api="cuGraphLaunch")
    audit = audit_capture(events.write(tmp_path / "c", layout=LAYOUT))
    (words,) = [w for w in audit.incomplete if "CUDA graphs" in w]
    assert words.startswith(
        f"process 1: it runs CUDA graphs ({graph_launches} graph launches; {captured} kernel "
        "launches recorded while a stream was captured into a graph"
    )
    assert not audit.ok


def test_a_process_without_graphs_is_not_called_incomplete_for_them(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    sgemm_y(events)
    audit = audit_capture(events.write(tmp_path / "c", layout=LAYOUT))
    assert not [w for w in audit.incomplete if "CUDA graphs" in w]
    assert _verdicts(tmp_path / "c")["EGF001"].status == PASS


# ---- allocations over time: frees close them ----
def _free(events: Events, address: int, api: str = "cudaFree_v3020") -> None:
    events.add("free", api=api, dst=address, src=0, bytes=0, value=0)


@pytest.mark.parametrize(
    "again, words",
    [
        # the larger allocation is gone when the GEMM runs: its span is judged against the one
        # holding its pointers then, which ends inside Y
        (4 * (TENSORS["Y"][0] + 8), "bytes past the end of its allocation"),
        # nothing holds them then: a use after free
        (None, "points into an allocation freed before it ran (event 2)"),
    ],
    ids=["allocated-again-smaller", "freed"],
)
def test_a_gemm_is_judged_by_the_allocation_live_when_it_ran(tmp_path, again, words):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _free(events, BASE, api="cudaFree_v3020" if again else "cuMemFreeAsync")
    if again is not None:
        events.alloc(BASE, again)
    sgemm_y(events)
    verdict = _verdicts(events.write(tmp_path / "c"), use_layout=False)["EGF001"]
    assert verdict.status == FAIL
    assert words in verdict.summary


def test_a_free_after_the_gemm_or_of_another_address_changes_nothing(tmp_path):
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _free(events, BASE + 4 * TOTAL)  # nothing was allocated there: frees nothing
    sgemm_y(events)
    _free(events, BASE)
    assert _verdicts(events.write(tmp_path / "c"), use_layout=False)["EGF001"].status == PASS


# ---- the arguments cuBLAS refuses: logged, never run (EGF001, the rebuild's rule) ----
@pytest.mark.parametrize(
    ("record", "words"),
    [
        (lambda e: sgemm_y(e, ldb=15), "ldb = 15 is below max(1, 16), the rows it stores"),
        (lambda e: strided_s(e, ldc=7), "ldc = 7 is below max(1, 8), the rows it stores"),
        (lambda e: _lt_event(e, ld_d=7), "ldd = 7 is below max(1, 8), the rows it stores"),
    ],
    ids=["sgemm-ldb", "strided-ldc", "lt-ldd"],
)
def test_a_gemm_whose_arguments_cublas_refuses_fails_egf001_as_never_run(tmp_path, record, words):
    """cuBLAS's logger writes the call before cuBLAS checks it; CUBLAS_STATUS_INVALID_VALUE
    then leaves every operand untouched, so the step's product was never computed. The rebuild
    records the same refusal (trace/gemm_rules.py) and EGF001 fails it in both modes."""
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    record(events)
    folder = events.write(tmp_path / "c", layout=LAYOUT)
    verdict = _verdicts(folder)["EGF001"]
    assert verdict.status == FAIL, verdict.summary
    assert f"CUBLAS_STATUS_INVALID_VALUE: {words}" in verdict.summary, verdict.summary


@pytest.mark.parametrize(
    ("desc", "field", "value", "words"),
    [
        ("bdesc", 2, 5, "op(A) has 4 columns (k) and op(B) 5 rows"),
        ("bdesc", 3, 7, "op(B) has 7 columns and D 8"),
        ("adesc", 3, 7, "op(A) has 7 rows and D 8"),
        ("cdesc", 2, 7, "C's layout is 7 x 8 and D's 8 x 8"),
        ("cdesc", 3, 9, "C's layout is 8 x 9 and D's 8 x 8"),
    ],
    ids=["k-of-b", "n-of-b", "m-of-a", "rows-of-c", "cols-of-c"],
)
def test_a_cublaslt_call_whose_layouts_disagree_fails_egf001_as_never_run(
    tmp_path, desc, field, value, words
):
    """cuBLASLt reads m, n and k from four layouts; where they disagree it answers
    CUBLAS_STATUS_INVALID_VALUE and computes nothing. Read from A and D alone, such a call
    passed: each operand's box lay inside its tensor."""
    events = Events()
    events.alloc(BASE, 4 * TOTAL)
    _lt_event(events)
    events.lines[-1][desc][field] = value
    verdict = _verdicts(events.write(tmp_path / "c", layout=LAYOUT))["EGF001"]
    assert verdict.status == FAIL, verdict.summary
    assert f"its matrix layouts disagree: {words}" in verdict.summary, verdict.summary


def test_op_c_of_a_real_matrix_is_op_t_and_no_refusal(tmp_path):
    from egf_audit.capture.gemms import refusal

    shape = {"transa": "C", "transb": "N", "m": 12, "n": 24, "k": 16}
    assert refusal(shape | {"lda": 16, "ldb": 16, "ldc": 12}) is None
    assert refusal(shape | {"lda": 12, "ldb": 16, "ldc": 12}) == (
        "CUBLAS_STATUS_INVALID_VALUE: lda = 12 is below max(1, 16), the rows it stores"
    )
