"""cuBLAS's own API log, read back into GEMM records. The recorder routes cuBLAS's logger into the
events stream: one `cublas` event per message, a call's header (`I! ... function
cublasStatus_t cublasSgemm_v2(...) called:`) followed by one `i!` line per argument, named as in
cublas_api.h, with the bits of alpha and beta (and a pointer-array call's pointers) the recorder
read while the call was in progress. A GEMM call becomes one record in the one form of
capture/gemms.py; a call that is no GEMM is dropped; a GEMM whose log misses what its function
always logs, or gives what no GEMM takes, is refused, naming the line of its header.

A cublasLtMatmul that cuBLAS itself made inside the classic call it had just logged is that call,
not a second GEMM (`inside_classic_call`).
"""

from __future__ import annotations

import re
import sys
from typing import Any, NoReturn

from egf_audit.errors import UsageError
from egf_audit.trace.gemm_rules import GEMM_ARGS, GEMM_INTS, GEMM_OPS
from egf_audit.trace.process import Record

from .gemms import classic_gemm, operands_problem
from .schema import OPTIONAL_KEYS, address

_CALL = re.compile(r"function\s+cublasStatus_t\s+(cublas\w+)\s*\(")
_ARG = re.compile(r"^\s*i!\s+(\w+):\s*type=[^;]*;\s*val=(.*)$")
# what the log prints for an operation, a pointer (`%p` after "0x": "0x0x7f..."; "(nil)" for
# NULL) and an integer, each the whole value; anything else stays text, which no GEMM argument
# may be (`_gemm_problem` refuses it)
_OP = re.compile(r"CUBLAS_OP_([NTC])(?:\(\d+\))?")
_POINTER = re.compile(r"POINTER \(IN HEX:0x(?:0x([0-9a-fA-F]{1,16})|\(nil\))\)")
_INT = re.compile(r"-?\d{1,20}")
SGEMM_ARGS = (*GEMM_ARGS, "A", "B", "C")  # what a logged cublasSgemm_v2 call must give
RECORDER_KEYS = OPTIONAL_KEYS["cublas"]  # what the recorder adds to a log line


def _refuse(where: str, problem: str) -> NoReturn:
    raise UsageError(f"{where}: {problem}")


def _log_args(msg: str) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for line in msg.splitlines():
        arg = _ARG.match(line)
        if not arg:
            continue
        key, raw = sys.intern(arg.group(1)), arg.group(2).strip()
        if (op := _OP.fullmatch(raw)) is not None:
            args[key] = op.group(1)
        elif (ptr := _POINTER.fullmatch(raw)) is not None:
            args[key] = int(ptr.group(1) or "0", 16)
        else:
            args[key] = int(raw) if _INT.fullmatch(raw) else raw
    return args


def parse_cublas(msg: str) -> tuple[str, dict[str, Any]] | None:
    """(function, arguments) of one cuBLAS log message, or None when it logs no call."""
    call = _CALL.search(msg)
    if not call:
        return None
    return call.group(1), _log_args(msg)


def _gemm_problem(function: str, args: dict[str, Any], bits: dict[str, Any]) -> str | None:
    """What a logged GEMM call left out that its function always logs, or gave in a form no
    GEMM takes (a cublasSgemm_v2 must give every argument and, in host pointer mode, the bits
    of alpha and beta the recorder read)."""
    if function == "cublasSgemm_v2":
        missing = [k for k in SGEMM_ARGS if k not in args]
        if bits.get("pointer_mode") != 1:  # device mode: read from the device where it could be
            missing += [f"{k} bits" for k in ("alpha", "beta") if f"{k}_bits" not in bits]
        if missing:
            return f"its log gives no {', '.join(missing)}"
    # a call of the SGEMM's shape: its operands will be placed, so all that places them is asked
    elif all(k in args for k in GEMM_ARGS) and (missing := _batched_args_missing(function, args)):
        return f"its log gives no {', '.join(missing)}"
    for k in GEMM_OPS:
        if k in args and args[k] not in ("N", "T", "C"):
            return f"{k} {args[k]!r} is no CUBLAS_OP_N, _T or _C"
    for k in GEMM_INTS:
        if k in args and (type(args[k]) is not int or not 0 <= args[k] < 2**31):
            return f"{k} {args[k]!r} is no int from 0 to 2**31 - 1"
    for k in ("A", "B", "C"):
        if k in args and (type(args[k]) is not int or address(args[k]) is not None):
            return f"{k} {args[k]!r} is no device pointer of the process"
    for k in ("batchCount", "strideA", "strideB", "strideC"):
        if k in args and (type(args[k]) is not int or abs(args[k]) >= 2**62):
            return f"{k} {args[k]!r} is no integer"
    if "batchCount" in args and not 0 <= args["batchCount"] < 2**31:
        return f"batchCount {args['batchCount']} is no int from 0 to 2**31 - 1"
    return None


def _batched_args_missing(function: str, args: dict[str, Any]) -> list[str]:
    """What a call of the SGEMM's shape left out that its function always logs: each operand's
    pointer (or pointer array), and a batched call's count and a strided one's strides. A lost
    stride or count would judge one batch where the call ran many, so it is never defaulted."""
    missing = [r for r in ("A", "B", "C") if r not in args and f"{r}array" not in args]
    if "Batched" in function and "batchCount" not in args:
        missing.append("batchCount")
    if "StridedBatched" in function:
        missing += [f"stride{r}" for r in ("A", "B", "C") if f"stride{r}" not in args]
    return missing


def cublas_record(where: str, line: int, events: list[dict[str, Any]]) -> Record | None:
    """One cuBLAS call from the log messages it came in (a header, then argument lines); None
    for calls other than GEMMs. `line` is the line of its first message."""
    msg = "\n".join(e["msg"] for e in events)
    call = _CALL.search(msg)
    args = _log_args(msg)
    if call is None:
        if args:  # argument lines of a call whose header is gone: which call, nobody knows
            _refuse(
                f"{where} line {line}",
                'cuBLAS log arguments without the "I! ... function ... called:" line of '
                "their call before them",
            )
        return None  # trailing lines of a call begun before the logger was attached
    function = sys.intern(call.group(1))
    if "gemm" not in function.lower():
        return None
    bits = {k: v for e in events for k, v in e.items() if k in RECORDER_KEYS}
    if (problem := _gemm_problem(function, args, bits)) is not None:
        _refuse(f"{where} line {line}", f"{function} call: {problem}")
    gemm = classic_gemm(function, args, bits)
    if (problem := operands_problem(gemm)) is not None:
        _refuse(f"{where} line {line}", f"{function} call: {problem}")
    kind = "sgemm" if function == "cublasSgemm_v2" else "gemm"
    return Record(events[0]["seq"], kind, function, function, gemm, line=line)


def _operand_set(args: dict[str, Any]) -> set[int]:
    return {args[k] for k in ("A", "B", "C", "D") if isinstance(args.get(k), int)}


def inside_classic_call(last: Record | None, lt: dict[str, Any]) -> bool:
    """A cublasLtMatmul cuBLAS made itself, inside the classic call it had just logged on the
    same thread (nothing else recorded between them), on that call's own operands."""
    if last is None or last.kind not in ("sgemm", "gemm") or last.api.startswith("cublasLt"):
        return False
    return _operand_set(lt) <= _operand_set(last.args)
