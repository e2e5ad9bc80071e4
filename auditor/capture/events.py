"""Read a capture folder: the recorder's event lines and snapshot bytes, one process at a time.

The recorder writes raw facts (a kernel's parameter bytes, cuBLAS's own log text, a
cublasLtMatmul's descriptors). Here they are decoded: a kernel whose name (its symbol, or the
identifier inside a C++-mangled symbol) is in egf-audit's kernel table gets its parameters by
name and C type; every cuBLAS GEMM call, of any entry point, becomes the GEMM's arguments in one
form (capture/gemms.py), with alpha and beta from the bits the recorder read while the call was
in progress. A cublasLtMatmul that cuBLAS itself made inside a classic call it was logging is
that call, not a second GEMM.

Fail closed: a capture is evidence, so a file that cannot be read whole and as the recorder
writes it is refused, never read in part. Every problem is one UsageError (exit 2) naming the
file by its name in the folder and, for events, the 1-based line: a path that is no regular file
(refused from its stat, never opened for reading), bytes that are not UTF-8, a line that is no
JSON object or is cut off, an event kind or key the recorder does not write, a key of the wrong
type or out of bounds, seqs that do not increase, a snapshot of no launch seen before it or
pointing past the end of the snapshots file, an ABI kernel launch or a cublasSgemm_v2 call whose
arguments were not decoded, a GEMM whose logged shape no GEMM can have. A file that ends between
two lines without the recorder's exit event (the process was killed, or crashed) reads, with
`ended` False, and the audit calls the capture incomplete; one that ends inside a line is cut
off, and refused.

Memory stays bounded: lines are read one at a time (each at most MAX_LINE_BYTES), a plain
snapshots file is mapped read-only and every region's values are a view into it, and records keep
the decoded arguments of a cuBLAS call, never its log text.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import mmap
import os
import re
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import numpy as np

from egf_audit.errors import UsageError, option_error
from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.runtime.capture_model import (
    HASH_FNV1A,
    HASH_KINDS,
    Contents,
    Effect,
    ProcessCapture,
    Record,
    SnapshotRegion,
)
from egf_audit.runtime.contract import (
    ACCUMULATE_KERNEL,
    CONCAT_KERNEL,
    POLYAK_KERNEL,
    SCALE_KERNEL,
)
from egf_audit.runtime.gemm_rules import GEMM_ARGS, GEMM_INTS, GEMM_OPS
from egf_audit.small_files import not_regular

from .gemms import classic_gemm, lt_gemm

EVENTS_GLOB = "events-*.jsonl*"  # .jsonl as written, .jsonl.gz as committed fixtures keep it
EVENTS_NAME = re.compile(r"events-(\d+)\.jsonl(\.gz)?")
ABI_KERNELS = (CONCAT_KERNEL, SCALE_KERNEL, ACCUMULATE_KERNEL, POLYAK_KERNEL)
MAX_LINE_BYTES = 1 << 20  # the recorder's longest line is a few KiB (64 parameters, a log line)
LIMIT = 1 << 40  # elements, counts, bytes and offsets: a TiB is more than any GPU holds
DEEP_ROUND = 256  # a deep recorder compares each allocation up to its 256-byte-rounded end
SNAPSHOT_WHEN = ("before", "after", "step_start")
SNAPSHOT_REGIONS = ("wire", "body", "alpha", "d_h_s2", "d_concat", "target", "online")

_CALL = re.compile(r"function\s+cublasStatus_t\s+(cublas\w+)\s*\(")
_ARG = re.compile(r"^\s*i!\s+(\w+):\s*type=[^;]*;\s*val=(.*)$")
_OP = re.compile(r"CUBLAS_OP_([NTC])")
_HEX = re.compile(r"HEX:(?:0x)?0x([0-9a-fA-F]+)")
_HASH = re.compile(r"[0-9a-f]{16}")
SGEMM_ARGS = (*GEMM_ARGS, "A", "B", "C")  # what a logged cublasSgemm_v2 call must give
_DECODER = json.JSONDecoder()
_NO_VALUES = np.empty(0, np.float32)
_NO_VALUES.flags.writeable = False


def _refuse(where: str, problem: str) -> NoReturn:
    raise UsageError(f"{where}: {problem}")


# ---- the keys each event kind carries, and what each may hold ----

Check = Callable[[Any], str | None]  # None, or what is wrong with the value


def _integer(low: int, high: int, high_words: str | None = None) -> Check:
    bounds = f"from {low} to {high_words or high}"

    def check(value: Any) -> str | None:
        if type(value) is not int:  # a JSON true is no integer
            return "must be an integer"
        if not low <= value <= high:
            return f"is {value}: must be {bounds}"
        return None

    return check


def _string(value: Any) -> str | None:
    return None if type(value) is str else "must be a string"


def _boolean(value: Any) -> str | None:
    return None if type(value) is bool else "must be true or false"


def _one_of(*allowed: str) -> Check:
    def check(value: Any) -> str | None:
        if type(value) is not str:
            return "must be a string"
        return None if value in allowed else f"is {value!r}: must be one of {', '.join(allowed)}"

    return check


def _hash(value: Any) -> str | None:
    if type(value) is str and _HASH.fullmatch(value):
        return None
    return "must be 16 lowercase hex digits"


_U32 = _integer(0, 2**32 - 1, "2**32 - 1")
_U64 = _integer(0, 2**64 - 1, "2**64 - 1")
_ANY64 = _integer(-(2**63), 2**63 - 1, "2**63 - 1")


def _dim3(value: Any) -> str | None:
    if type(value) is list and len(value) == 3:
        x, y, z = value
        integers = type(x) is int and type(y) is int and type(z) is int
        if integers and 0 <= x < 1 << 32 and 0 <= y < 1 << 32 and 0 <= z < 1 << 32:
            return None
    return "must be a list of 3 integers from 0 to 2**32 - 1"


MAX_PARAMS = 64  # the recorder's MAX_PARAMS
MAX_PARAM_BYTES = 1 << 16  # a kernel's whole parameter block is at most 32 KiB


def _params(value: Any) -> str | None:
    """null (a runtime-API launch), or [size, raw value] pairs: the value is the parameter's
    first min(size, 8) bytes as a little-endian integer, 0 for a larger parameter."""
    if value is None:
        return None
    if type(value) is not list or len(value) > MAX_PARAMS:
        return f"must be null or a list of at most {MAX_PARAMS} [size, value] pairs"
    for i, pair in enumerate(value):
        if type(pair) is not list or len(pair) != 2:
            return f"[{i}] must be a pair of integers [size, value]"
        size, raw = pair
        if type(size) is not int or type(raw) is not int:
            return f"[{i}] must be a pair of integers [size, value]"
        if not 0 <= size <= MAX_PARAM_BYTES:
            return f"[{i}]: size {size} must be from 0 to {MAX_PARAM_BYTES}"
        if not 0 <= raw < 1 << (8 * min(size, 8)):
            return f"[{i}]: value {raw} does not fit its {size} bytes"
    return None


def _pointers(value: Any) -> str | None:
    """A pointer-array GEMM's pointers, as the recorder read them from the device."""
    if type(value) is not list or len(value) > MAX_BATCH_POINTERS:
        return f"must be a list of at most {MAX_BATCH_POINTERS} pointers"
    if any(type(v) is not int or not 0 <= v < 2**64 for v in value):
        return "must hold integers from 0 to 2**64 - 1"
    return None


def _lt_layout(value: Any) -> str | None:
    """null, or [type, order, rows, cols, ld, batch count, batch stride] (-1: unreadable)."""
    if value is None:
        return None
    if type(value) is list and len(value) == 7 and all(_ANY64(v) is None for v in value):
        return None
    return "must be null or a list of 7 integers"


def _lt_desc(value: Any) -> str | None:
    if type(value) is list and len(value) == 5 and all(_ANY64(v) is None for v in value):
        return None
    return "must be a list of 5 integers"


MAX_BATCH_POINTERS = 4096  # the recorder's MAX_BATCH_POINTERS
MAX_RUNS = 1 << 22  # changed runs one effect event may list


def _blobs(value: Any) -> str | None:
    """A deep capture's struct parameters: [index, hex of its bytes] pairs."""
    if type(value) is not list or len(value) > MAX_PARAMS:
        return f"must be a list of at most {MAX_PARAMS} [index, hex] pairs"
    for i, pair in enumerate(value):
        if (
            type(pair) is not list
            or len(pair) != 2
            or type(pair[0]) is not int
            or not 0 <= pair[0] < MAX_PARAMS
            or type(pair[1]) is not str
            or len(pair[1]) % 2
            or len(pair[1]) > 2 * MAX_PARAM_BYTES
            or not _HEX_BYTES.fullmatch(pair[1])
        ):
            return f"[{i}] must be [parameter index, an even number of hex digits]"
    return None


_HEX_BYTES = re.compile(r"[0-9a-f]*")


def _runs(value: Any) -> str | None:
    """An effect's changed memory: [address, bytes] runs, ascending, none touching the next."""
    if type(value) is not list or len(value) > MAX_RUNS:
        return f"must be a list of at most {MAX_RUNS} [address, bytes] runs"
    end = -1
    for i, run in enumerate(value):
        if type(run) is not list or len(run) != 2 or type(run[0]) is not int:
            return f"[{i}] must be a pair of integers [address, bytes]"
        address, size = run
        if type(size) is not int or not 0 < size <= LIMIT or not 0 <= address < 2**64 - size:
            return f"[{i}] must be an address and a byte count from 1 to 2**40"
        if address <= end:
            return f"[{i}] starts at {address}, not after the run before it (ends at {end})"
        end = address + size
    return None


SEQ = _integer(0, 2**63 - 1, "2**63 - 1")
U64 = _integer(0, 2**64 - 1, "2**64 - 1")
PID = _integer(0, 2**31 - 1, "2**31 - 1")
I32 = _integer(-(2**31), 2**32 - 1, "2**32 - 1")
SIZE = _integer(0, LIMIT, "2**40")
COMMON: dict[str, Check] = {"seq": SEQ, "tid": U64}
MEMORY: dict[str, Check] = {
    "api": _string,
    "dst": U64,
    "src": U64,
    "bytes": SIZE,
    "value": _integer(-(2**63), 2**64 - 1, "2**64 - 1"),
}
FIELDS: dict[str, dict[str, Check]] = {
    "init": {
        "pid": PID,
        "ppid": PID,
        "cupti_version": I32,
        "subscribe": I32,
        "param_info": _boolean,
    },
    "note": {"msg": _string},
    "kernel": {"api": _string, "name": _string, "grid": _dim3, "block": _dim3, "params": _params},
    "memset": MEMORY,
    "copy": MEMORY,
    "alloc": MEMORY,
    "free": MEMORY,  # cuMemFree, cuMemFreeAsync, cudaFree, cudaFreeAsync: dst is the pointer
    "cublas": {"msg": _string},
    "graph": {"api": _string},  # cuGraphLaunch / cudaGraphLaunch: a replay of captured launches
    "ltmatmul": {
        "a": U64,
        "b": U64,
        "c": U64,
        "d": U64,
        "adesc": _lt_layout,
        "bdesc": _lt_layout,
        "cdesc": _lt_layout,
        "ddesc": _lt_layout,
        "desc": _lt_desc,
    },
    "snapshot": {
        "launch": SEQ,
        "when": _one_of(*SNAPSHOT_WHEN),
        "region": _one_of(*SNAPSHOT_REGIONS),
        "ptr": U64,
        "elements": SIZE,
        "rows": SIZE,
        "ld": SIZE,
        "skip_col": _integer(-1, LIMIT, "2**40"),
        "hash": _hash,
        "offset": SIZE,
        "count": SIZE,
    },
    "exit": {"pid": PID},
    # a deep capture: what the call of seq `launch` changed, every live allocation compared
    "effect": {"launch": SEQ, "allocations": SIZE, "bytes": SIZE, "changed": _runs},
    # a deep capture with values: the non-zero words of the allocation of seq `alloc` when it
    # was made (its 256-byte-rounded extent, never into the next allocation)
    "contents": {"alloc": SEQ, "changed": _runs},
}
OPTIONAL: dict[str, dict[str, Check]] = {
    # how the recorder hashed its snapshot regions (absent: fnv1a, recorders before mix64)
    # "deep": recorded with --deep (an effect event after every launch, memset and copy)
    # "values": --deep recorded the bytes of every change (values-<pid>.bin)
    "init": {"hash": _one_of(*HASH_KINDS), "deep": _boolean, "values": _boolean},
    # where the bytes of the runs start in values-<pid>.bin (absent: not recorded, memory from
    # this call on is unknown; the recorder's note says why)
    "effect": {"values": SIZE},
    "contents": {"values": SIZE},
    # on a launch whose parameters could not be read: -1 no CUfunction was found for it, -2 the
    # driver has no cuFuncGetParamInfo, else that call's CUresult for the first parameter
    # "via": the runtime call (cudaLaunchKernel, ...) inside which the runtime made this launch
    # "captured": made into a stream being captured into a CUDA graph (it runs when the graph
    # is launched, not now)
    # "by": the library that made the launch (from the call stack; "?" where it could not be
    # told); deep captures: "blobs", the bytes of its parameters larger than 8 bytes
    "kernel": {
        "param_info_rc": _integer(-2, 2**31 - 1, "2**31 - 1"),
        "via": _string,
        "captured": _boolean,
        "by": _string,
        "blobs": _blobs,
    },
    # a cublasLtMatmul's alpha and beta, where its log named their addresses and they were read
    "ltmatmul": {"alpha_bits": _U64, "beta_bits": _U64},
    # written on the log line that completes a GEMM's alpha and beta (pointer mode 0 host, 1
    # device; scalar_bytes their size, 4 where absent) and on a pointer-array call's batchCount
    # line (the pointers read from its arrays)
    "cublas": {
        "pointer_mode": _integer(0, 1),
        "scalar_bytes": _integer(2, 16),
        "alpha_bits": _U64,
        "beta_bits": _U64,
        "a_ptrs": _pointers,
        "b_ptrs": _pointers,
        "c_ptrs": _pointers,
    },
}


_SPECS = {ev: tuple({**COMMON, **fields}.items()) for ev, fields in FIELDS.items()}
_OPTIONAL_SPECS = {ev: tuple(OPTIONAL.get(ev, {}).items()) for ev in FIELDS}


def _event_problem(event: dict[str, Any]) -> str | None:
    """What is wrong with an event's keys, if anything: one its kind has is missing, or holds
    what it may not."""
    ev = event.get("ev")
    spec = _SPECS.get(ev) if type(ev) is str else None
    if spec is None or type(ev) is not str:
        if ev is None:
            return '"ev" is missing'
        return '"ev" must be a string' if type(ev) is not str else f"unknown event kind {ev!r}"
    for key, check in spec:
        if key not in event:
            return f'"{key}" is missing (every {ev} event has it)'
        if (problem := check(event[key])) is not None:
            return f'"{key}" {problem}'
    for key, check in _OPTIONAL_SPECS[ev]:
        if key in event and (problem := check(event[key])) is not None:
            return f'"{key}" {problem}'
    return None


# ---- kernels ----


def _param_size(ctype: str) -> int:
    """The bytes a parameter of this C type takes: 8 for pointers and long long, else 4."""
    return 8 if ctype.endswith("*") or ctype == "long long" else 4


_MANGLED_PART = re.compile(r"(\d+)")


def source_name(symbol: str) -> str:
    """A kernel's name as its source spells it: the symbol of an extern "C" kernel; the last
    identifier of an Itanium-mangled C++ symbol (`_Z19sp14_scale_wire_colPfPKfiiii`,
    `_ZN4sp1419sp14_scale_wire_colE...`), as the recorder reads it (source_name in its C)."""
    if not symbol.startswith("_Z"):
        return symbol
    i = 2 + (symbol[2:3] == "L")
    nested = symbol[i : i + 1] == "N"
    if nested:
        i += 1
        while symbol[i : i + 1] in ("K", "V", "r"):
            i += 1
    last = ""
    while (match := _MANGLED_PART.match(symbol, i)) is not None and symbol[i] != "0":
        length = int(match.group(1))
        start = match.end()
        if length <= 0 or start + length > len(symbol):
            return symbol
        last, i = symbol[start : start + length], start + length
        if not nested:
            break
        i += symbol[i : i + 1] == "L"
    return last or symbol


def _pointer_words(raw: list[list[int]] | None, blobs: list[list[Any]] | None) -> tuple[int, ...]:
    """Every non-zero 8-byte value a launch was handed: its 8-byte parameters, and each aligned
    8-byte word of its struct parameters (a CuPy CArray, cuBLAS's parameter blocks), where the
    pointers such a kernel writes through are."""
    words = {value for size, value in raw or () if size == 8}
    for _, hexed in blobs or ():
        data = bytes.fromhex(hexed)
        words.update(struct.unpack_from(f"<{len(data) // 8}Q", data))
    words.discard(0)
    return tuple(sorted(words))


def _decode_params(name: str, raw: list[list[int]] | None) -> tuple[dict[str, Any], bool]:
    """Parameters by name and C type for a kernel egf-audit knows (when their count and sizes
    are the table's), else `p0..pN` raw values."""
    if raw is None:
        return {}, False
    spec = KERNELS_BY_NAME.get(name)
    if spec is None or [s for s, _ in raw] != [_param_size(t) for _, t in spec.params]:
        return {f"p{i}": value for i, (_, value) in enumerate(raw)}, False
    args: dict[str, Any] = {}
    for (pname, ctype), (_, value) in zip(spec.params, raw, strict=True):
        if ctype == "float":
            args[pname] = struct.unpack("<f", struct.pack("<I", value))[0]
        elif ctype == "int":
            args[pname] = struct.unpack("<i", struct.pack("<I", value))[0]
        elif ctype == "long long":
            args[pname] = struct.unpack("<q", struct.pack("<Q", value))[0]
        else:
            args[pname] = value
    return args, True


def _abi_problem(name: str, raw: list[list[int]] | None, rc: int | None = None) -> str | None:
    """Why an ABI kernel's launch cannot be judged from its recorded arguments, if it cannot;
    rc: the recorder's param_info_rc, where it could read no parameter."""
    if name not in ABI_KERNELS:
        return None
    if raw is None:
        return (
            f'{name} launch without its arguments ("params" is null: a runtime-API launch '
            "the recorder could not decode)"
        )
    want = [_param_size(t) for _, t in KERNELS_BY_NAME[name].params]
    got = [size for size, _ in raw]
    if got != want:
        return (
            f"{name} launch with {len(got)} parameters of sizes {got}; the kernel table's "
            f"{name} has {len(want)} of sizes {want}" + _param_info_reason(rc)
        )
    return None


def _param_info_reason(rc: int | None) -> str:
    if rc is None:
        return ""
    if rc == -1:
        return " (the recorder found no CUfunction for the launch)"
    if rc == -2:
        return " (the driver has no cuFuncGetParamInfo)"
    return f" (cuFuncGetParamInfo answered CUresult {rc})"


# ---- cuBLAS ----


def _float_bits(bits: int | None) -> float | None:
    return None if bits is None else struct.unpack("<f", struct.pack("<I", bits))[0]


def _log_args(msg: str) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for line in msg.splitlines():
        arg = _ARG.match(line)
        if not arg:
            continue
        key, raw = sys.intern(arg.group(1)), arg.group(2).strip()
        if (op := _OP.search(raw)) is not None:
            args[key] = op.group(1)
        elif (ptr := _HEX.search(raw)) is not None:
            args[key] = int(ptr.group(1), 16)
        else:
            token = raw.split()[0] if raw else raw
            args[key] = int(token) if re.fullmatch(r"-?\d{1,20}", token) else token
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
    for k in GEMM_OPS:
        if k in args and args[k] not in ("N", "T", "C"):
            return f"{k} {args[k]!r} is no CUBLAS_OP_N, _T or _C"
    for k in GEMM_INTS:
        if k in args and (type(args[k]) is not int or not 0 <= args[k] < 2**31):
            return f"{k} {args[k]!r} is no int from 0 to 2**31 - 1"
    for k in ("A", "B", "C"):
        if k in args and (type(args[k]) is not int or not 0 <= args[k] < 2**64):
            return f"{k} {args[k]!r} is no device pointer"
    for k in ("batchCount", "strideA", "strideB", "strideC"):
        if k in args and (type(args[k]) is not int or abs(args[k]) >= 2**62):
            return f"{k} {args[k]!r} is no integer"
    if "batchCount" in args and args["batchCount"] < 0:
        return f"batchCount {args['batchCount']} is negative"
    return None


def _cublas_record(where: str, line: int, events: list[dict[str, Any]]) -> Record | None:
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
    bits = {k: v for e in events for k, v in e.items() if k in OPTIONAL["cublas"]}
    if (problem := _gemm_problem(function, args, bits)) is not None:
        _refuse(f"{where} line {line}", f"{function} call: {problem}")
    kind = "sgemm" if function == "cublasSgemm_v2" else "gemm"
    return Record(
        events[0]["seq"], kind, function, function, classic_gemm(function, args, bits), line=line
    )


def _operand_set(args: dict[str, Any]) -> set[int]:
    return {args[k] for k in ("A", "B", "C", "D") if isinstance(args.get(k), int)}


def _inside_classic_call(last: Record | None, lt: dict[str, Any]) -> bool:
    """A cublasLtMatmul cuBLAS made itself, inside the classic call it had just logged on the
    same thread (nothing else recorded between them), on that call's own operands."""
    if last is None or last.kind not in ("sgemm", "gemm") or last.api.startswith("cublasLt"):
        return False
    return _operand_set(lt) <= _operand_set(last.args)


# ---- files ----


def _not_regular(mode: int) -> str | None:
    kind = not_regular(mode)
    return None if kind is None else f"{kind}, not a regular file"


def _stat(path: Path) -> os.stat_result | None:
    """The file's stat, None when there is no such file; refused when it is no regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _refuse(path.name, f"cannot read it ({exc.strerror or exc})")
    if (problem := _not_regular(st.st_mode)) is not None:
        _refuse(path.name, problem)
    return st


@contextmanager
def open_capture_file(path: Path) -> Iterator[BinaryIO]:
    """A capture file opened for reading in binary, once its stat says it is a regular file (a
    FIFO is never opened: opening one for reading waits for a writer). Opened non-blocking and
    checked again from the open file, so a path swapped in between cannot block either."""
    if _stat(path) is None:
        _refuse(path.name, "no such file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        _refuse(path.name, f"cannot read it ({exc.strerror or exc})")
    try:
        problem = _not_regular(os.fstat(fd).st_mode)
        if problem is not None:
            _refuse(path.name, problem)
        f = os.fdopen(fd, "rb", buffering=1 << 20)
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


@contextmanager
def _text_lines(path: Path) -> Iterator[Iterator[tuple[int, bytes]]]:
    """(line number, raw line) of a plain or gzipped file, each line at most MAX_LINE_BYTES."""
    with open_capture_file(path) as raw:
        stream: gzip.GzipFile | BinaryIO = (
            gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw
        )

        def lines() -> Iterator[tuple[int, bytes]]:
            number = 0
            while True:
                try:
                    line = stream.readline(MAX_LINE_BYTES + 1)
                except EOFError:
                    _refuse(f"{path.name} line {number + 1}", "the gzip stream is cut off")
                except (OSError, zlib.error) as exc:
                    _refuse(f"{path.name} line {number + 1}", f"cannot read it ({exc})")
                if not line:
                    return
                number += 1
                if len(line) > MAX_LINE_BYTES:
                    _refuse(f"{path.name} line {number}", f"longer than {MAX_LINE_BYTES} bytes")
                yield number, line

        yield lines()


class _CutOff(Exception):
    """The file's last line ends without its newline and is no whole event: the process died
    while the recorder wrote it. What came before is a faithful record of a process that did
    not end: the audit calls it incomplete (a failed gate), never refuses it."""


def _parse_line(where: str, line: bytes) -> dict[str, Any]:
    """One event line as a JSON object. A line without its newline is the file's last (the
    process died mid-write) and is cut off unless it parses whole."""
    cut = not line.endswith(b"\n")
    try:
        text = line.decode("utf-8")
        event, end = _DECODER.raw_decode(text)
        if end != len(text) and not text[end:].isspace():
            raise json.JSONDecodeError("Extra data", text, end)
    except UnicodeDecodeError as exc:
        if cut:
            raise _CutOff(where) from None
        _refuse(where, f"not UTF-8 (byte {exc.start + 1} of the line)")
    except (ValueError, RecursionError) as exc:
        if cut:
            raise _CutOff(where) from None
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or "too deep"
        _refuse(where, f"not a JSON object ({reason})")
    if type(event) is not dict:
        if cut:
            raise _CutOff(where)
        _refuse(where, f"not a JSON object (a JSON {type(event).__name__})")
    return event


@dataclass
class _Snapshot:
    """A snapshot event read, its values not yet taken from the snapshots file."""

    line: int
    event: dict[str, Any]
    launch: int

    @property
    def end(self) -> int:
        return self.event["offset"] + 4 * self.event["count"]


def _snapshot_problem(e: dict[str, Any]) -> str | None:
    if e["count"] > e["elements"]:
        return f'"count" {e["count"]} is more than its "elements" {e["elements"]}'
    if e["offset"] % 4:
        return f'"offset" {e["offset"]} is not a multiple of 4 (float32 values)'
    return None


MAX_GUNZIPPED_BYTES = 1 << 30


def _gunzip(name: str, f: BinaryIO, need: int) -> bytearray:
    """The first `need` bytes of a gzipped snapshots file (a committed fixture; the recorder
    writes plain files, which are mapped instead), fewer when it is shorter."""
    if need > MAX_GUNZIPPED_BYTES:
        _refuse(
            name,
            f"its events read {need} bytes of it: more than a gzipped snapshots file is "
            f"decompressed into memory ({MAX_GUNZIPPED_BYTES}); gunzip it (a plain one is mapped)",
        )
    data = bytearray()
    try:
        with gzip.GzipFile(fileobj=f, mode="rb") as z:
            while len(data) < need and (chunk := z.read(min(1 << 24, need - len(data)))):
                data += chunk
    except EOFError:
        _refuse(name, "the gzip stream is cut off")
    except (OSError, zlib.error) as exc:
        _refuse(name, f"cannot read it ({exc})")
    return data


def _file_bytes(path: Path, need: int) -> Any:
    """A capture's binary file as bytes: a plain file mapped (never read whole), a gzipped one
    (a committed fixture) decompressed up to its first `need` bytes, fewer when it is shorter."""
    with open_capture_file(path) as f:
        if path.suffix == ".gz":
            return _gunzip(path.name, f, need)
        size = os.fstat(f.fileno()).st_size
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""


def _snapshot_bytes(events_name: str, snap_path: Path | None, snaps: list[_Snapshot]) -> np.ndarray:
    """The snapshots file as float32 values, read-only: a plain file mapped (never read whole),
    a gzipped one decompressed up to the last byte an event points at. Refused when an event
    points past its end."""
    need = max((s.end for s in snaps), default=0)
    if snap_path is None:
        if need:
            first = next(s for s in snaps if s.event["count"])
            _refuse(
                f"{events_name} line {first.line}",
                f"snapshot values at bytes {first.event['offset']} to {first.end}, but there "
                "is no snapshots file of this process",
            )
        return _NO_VALUES
    data = _file_bytes(snap_path, need)
    size = len(data)
    if need > size:
        short = next(s for s in snaps if s.end > size)
        _refuse(
            snap_path.name,
            f"{size} bytes, but {events_name} line {short.line} reads its bytes "
            f"{short.event['offset']} to {short.end} (the file is cut off)",
        )
    usable = size - size % 4
    if not usable:
        return _NO_VALUES
    values = np.frombuffer(data, dtype="<f4", count=usable // 4)
    values.flags.writeable = False  # every region is a view: none may change the capture
    return values


def _process_file(folder: Path, stem: str, pid: int) -> Path | None:
    """`<stem>-<pid>.bin` as the recorder writes it, or `.bin.gz` as a fixture keeps it."""
    found = [
        p
        for p in (folder / f"{stem}-{pid}.bin", folder / f"{stem}-{pid}.bin.gz")
        if _stat(p) is not None
    ]
    if len(found) > 1:
        _refuse(found[0].name, f"{found[1].name} beside it: two {stem} files of one process")
    return found[0] if found else None


def _snapshots_file(folder: Path, pid: int) -> Path | None:
    return _process_file(folder, "snapshots", pid)


def _values_reader(folder: Path, pid: int, need: int) -> Callable[[], np.ndarray]:
    """values-<pid>.bin, read when first asked for (only EGF010 reads it) and then kept: its
    first `need` bytes, fewer where it is shorter (the history then knows memory only up to the
    first change whose bytes are missing), as read-only bytes. A capture without the file
    reads as empty. Refused (exit 2) where it cannot be read at all."""
    path = _process_file(folder, "values", pid)
    kept: list[np.ndarray] = []

    def read() -> np.ndarray:
        if kept:
            return kept[0]
        data = _file_bytes(path, need) if path is not None and need else b""
        values = np.frombuffer(data, dtype=np.uint8, count=min(len(data), need))
        values.flags.writeable = False
        kept.append(values)
        return values

    return read


def read_process(events_path: Path) -> ProcessCapture:
    """One recorded process, from its events file and its snapshots file beside it."""
    events_path = Path(events_path)
    name = events_path.name
    match = EVENTS_NAME.fullmatch(name)
    if match is None:
        _refuse(name, "not a capture file name (events-<pid>.jsonl)")
    pid = int(match.group(1))
    proc = ProcessCapture(pid, {}, events_file=name)
    open_calls: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # tid -> (line, messages)
    kernel_seqs: set[int] = set()
    snaps: list[_Snapshot] = []
    # step_start snapshots of a recorder before it named their launch: (tid -> waiting)
    waiting_launch: dict[int, list[_Snapshot]] = {}
    last_seq, last_ev = -1, ""

    last_record: dict[int, Record] = {}  # tid -> the last call recorded on that thread
    # tid -> the seq of the GEMM record of the last cuBLAS call on that thread, -1 for a call
    # that is no GEMM: a launch cuBLAS made (deep captures say so) belongs to that call
    cublas_call: dict[int, int] = {}
    observed_seqs: set[int] = set()  # kernel launches, memsets and copies: what effects follow
    allocated: dict[int, tuple[int, int]] = {}  # alloc seq -> (address, bytes): contents follow
    values_end = 0  # the bytes of values-<pid>.bin the events so far have named

    def values_at(where: str, event: dict[str, Any]) -> int | None:
        """An effect's or contents' offset into values-<pid>.bin, in a capture whose init says
        it records values: at or after where the previous event's bytes end (a gap is the
        bytes of an event missing from the file)."""
        nonlocal values_end
        offset = event.get("values")
        if offset is None:
            return None
        if not proc.values:
            _refuse(where, '"values", and the init event does not say the capture records them')
        if offset < values_end:
            _refuse(
                where,
                f'"values" {offset}: the values before it end at byte {values_end} of the values '
                "file (each event's bytes follow the previous event's, never overlap them)",
            )
        values_end = offset + sum(n for _, n in event["changed"])
        return offset

    def close(tid: int) -> None:
        if tid in open_calls:
            line, messages = open_calls.pop(tid)
            record = _cublas_record(name, line, messages)
            cublas_call[tid] = -1 if record is None else record.seq
            if record is not None:
                proc.records.append(record)
                last_record[tid] = record

    with _text_lines(events_path) as lines:
        for number, line in lines:
            where = f"{name} line {number}"
            try:
                event = _parse_line(where, line)
            except _CutOff:
                proc.cut_off = where  # the last line: nothing follows it
                break
            if (problem := _event_problem(event)) is not None:
                _refuse(where, problem)
            ev, seq, tid = event["ev"], event["seq"], event["tid"]
            if seq <= last_seq:
                _refuse(
                    where,
                    f'"seq" {seq} is not above {last_seq}, the seq of line {number - 1}: seqs '
                    "increase strictly within a file",
                )
            last_seq, last_ev = seq, ev
            if ev == "cublas":
                if "I! " in event["msg"] or tid not in open_calls:
                    close(tid)
                    open_calls[tid] = (number, [])
                open_calls[tid][1].append(event)
                continue
            close(tid)
            if ev in ("init", "exit") and event["pid"] != pid:
                _refuse(where, f'"pid" {event["pid"]} is not the pid {pid} the file is named by')
            if ev == "init":
                proc.init = event
                proc.deep = event.get("deep") is True
                proc.values = proc.deep and event.get("values") is True
            elif ev == "note":
                proc.notes.append(event["msg"])
            elif ev == "kernel":
                symbol = event["name"]
                kname = source_name(symbol)
                if kname not in KERNELS_BY_NAME:
                    kname = symbol  # a kernel egf-audit does not know keeps its symbol
                rc = event.get("param_info_rc")
                if (problem := _abi_problem(kname, event["params"], rc)) is not None:
                    _refuse(where, problem)
                args, decoded = _decode_params(kname, event["params"])
                args |= {"grid": event["grid"], "block": event["block"]}
                if event.get("captured"):
                    args["captured"] = True
                if kname != symbol:
                    args["symbol"] = symbol
                # one string per kernel name, not one per launch; the API the trainer called
                # (a runtime launch reaches the driver's cuLaunchKernel "via" it)
                kernel, api = sys.intern(kname), sys.intern(event.get("via") or event["api"])
                by = event.get("by", "")
                within = cublas_call.get(tid, -1) if by.startswith("libcublas") else None
                pointers = () if decoded else _pointer_words(event["params"], event.get("blobs"))
                record = Record(seq, ev, kernel, api, args, decoded, number, within, pointers)
                observed_seqs.add(seq)
                proc.records.append(record)
                last_record[tid] = record
                kernel_seqs.add(seq)
                for snap in waiting_launch.pop(tid, []):
                    snap.launch = seq
            elif ev == "graph":
                proc.graph_launches += 1
            elif ev in ("memset", "copy", "alloc", "free"):
                args = {k: event[k] for k in ("dst", "src", "bytes", "value")}
                api = sys.intern(event["api"])
                proc.records.append(Record(seq, ev, ev, api, args, True, number))
                last_record[tid] = proc.records[-1]
                if ev in ("memset", "copy"):
                    observed_seqs.add(seq)
                elif ev == "alloc":
                    allocated[seq] = (event["dst"], event["bytes"])
            elif ev == "contents":
                made = allocated.pop(event["alloc"], None)
                if made is None:
                    _refuse(
                        where,
                        f"contents of allocation {event['alloc']}: no allocation of that seq "
                        "without its contents comes before it",
                    )
                address, size = made
                end = address + -(-size // DEEP_ROUND) * DEEP_ROUND
                if event["changed"] and not (
                    address <= event["changed"][0][0] and sum(event["changed"][-1]) <= end
                ):
                    _refuse(
                        where,
                        f"contents of allocation {event['alloc']} outside its {end - address} "
                        "bytes",
                    )
                proc.contents[event["alloc"]] = Contents(
                    event["alloc"],
                    tuple((a, n) for a, n in event["changed"]),
                    values_at(where, event),
                )
            elif ev == "effect":
                launch = event["launch"]
                if launch not in observed_seqs:
                    _refuse(
                        where,
                        f"an effect of call {launch}: no kernel launch, memset or copy of that "
                        "seq comes before it",
                    )
                if launch in proc.effects:
                    _refuse(where, f"a second effect of call {launch}")
                proc.effects[launch] = Effect(
                    launch,
                    event["allocations"],
                    event["bytes"],
                    tuple((a, n) for a, n in event["changed"]),
                    values_at(where, event),
                )
            elif ev == "ltmatmul":
                args = lt_gemm(event)
                if _inside_classic_call(last_record.get(tid), args):
                    proc.internal_lt += 1
                    continue
                record = Record(seq, "gemm", "cublasLtMatmul", "cublasLtMatmul", args, True, number)
                proc.records.append(record)
                last_record[tid] = record
                cublas_call[tid] = seq
            elif ev == "snapshot":
                if (problem := _snapshot_problem(event)) is not None:
                    _refuse(where, problem)
                snap = _Snapshot(number, event, event["launch"])
                if event["when"] == "step_start" and event["launch"] == seq:
                    # written by a recorder that took the step's start before its first
                    # launch and named it by its own seq: the launch is the next one
                    waiting_launch.setdefault(tid, []).append(snap)
                elif event["launch"] not in kernel_seqs:
                    _refuse(
                        where,
                        f"a snapshot of launch {event['launch']}: no kernel launch of that seq "
                        "comes before it",
                    )
                snaps.append(snap)
    for tid in list(open_calls):
        if last_ev == "exit":
            close(tid)  # a process that ended: every call it logged is whole, or refused
            continue
        # the process died while cuBLAS logged this call: the rest of its log was never
        # written; the capture is incomplete (no exit event) and the audit says so
        with contextlib.suppress(UsageError):
            close(tid)
    if waiting_launch:
        first = min(s.line for waiting in waiting_launch.values() for s in waiting)
        _refuse(f"{name} line {first}", "a step_start snapshot that no kernel launch follows")
    values = _snapshot_bytes(name, _snapshots_file(events_path.parent, pid), snaps)
    hash_kind = proc.init.get("hash", HASH_FNV1A)
    for s in snaps:
        e = s.event
        start = e["offset"] // 4
        proc.snapshots.append(
            SnapshotRegion(
                s.launch,
                e["when"],
                e["region"],
                e["ptr"],
                e["elements"],
                e["hash"],
                values[start : start + e["count"]] if e["count"] else _NO_VALUES,
                e["rows"],
                e["ld"],
                e["skip_col"],
                hash_kind,
            )
        )
    if proc.effects and not proc.deep:
        first = min(proc.effects)
        _refuse(
            name, f"an effect of call {first}, and the init event does not say the capture is deep"
        )
    if proc.values:
        proc.values_bytes = values_end
        proc.read_values = _values_reader(events_path.parent, pid, values_end)
    proc.ended = last_ev == "exit"
    proc.records.sort(key=lambda r: r.seq)
    return proc


def read_capture(folder: Path) -> list[ProcessCapture]:
    """Every recorded process of a capture folder, in pid order."""
    folder = Path(folder)
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "no such folder"
        raise option_error(UsageError, "capture", folder, problem)
    try:
        paths = sorted(folder.glob(EVENTS_GLOB))
    except OSError as exc:
        problem = f"cannot list it ({exc.strerror or exc})"
        raise option_error(UsageError, "capture", folder, problem) from None
    by_pid: dict[int, Path] = {}
    for path in paths:
        match = EVENTS_NAME.fullmatch(path.name)
        if match is None:
            _refuse(path.name, "not a capture file name (events-<pid>.jsonl or .jsonl.gz)")
        pid = int(match.group(1))
        if pid in by_pid:
            _refuse(path.name, f"{by_pid[pid].name} beside it: two events files of one process")
        by_pid[pid] = path
    return [read_process(by_pid[pid]) for pid in sorted(by_pid)]
