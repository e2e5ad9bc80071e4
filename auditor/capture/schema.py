"""The recorder's event lines, as one table: every kind of event, each key it carries and what the
key may hold (SCHEMA), the way ruff keeps its rule codes in one table. A kind's required keys are
on every event of that kind (egf_capture_recorder.c writes them); its optional keys only where
they apply, and the comment above each says when. `event_problem` is the one check of a line
against the table: a kind the recorder does not write, a key missing, or a value of the wrong
JSON type or outside its domain is named in a few words, and the reader refuses the line.

What a key's domain is: integers as the recorder prints them (a JSON true is no integer), counts
and sizes up to LIMIT, strings up to MAX_STRING characters, every address inside the process's user
address space: 0 (none), or from LOWEST_ADDRESS up to ADDRESS_LIMIT, with the bytes it names ending
there too. ADDRESS_LIMIT is 2**48: the user space of x86-64 ends below 2**47 and that of aarch64
with 48-bit virtual addresses below 2**48, so one bound holds both; LOWEST_ADDRESS is 2**15,
because no Linux maps the lowest pages (`vm.mmap_min_addr` is 64 KiB on x86-64 and 32 KiB on arm64
by default) and the CUDA driver places device memory far above them. `WHOLE`: cross-key checks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from egf_audit.trace.process import HASH_KINDS

Check = Callable[[Any], str | None]  # None, or what is wrong with the value

LIMIT = 1 << 40  # elements, counts, bytes and offsets: a TiB is more than any GPU holds
ADDRESS_LIMIT = 1 << 48  # every address and the end of what it names lies below (docstring)
LOWEST_ADDRESS = 1 << 15  # and, but for 0 (none), at or above this
MAX_STRING = 1 << 16  # a kernel symbol, a cuBLAS log line, a note: KiB at most
MAX_ROWS = 2**31 - 1  # a kernel's rows argument, which a wire region's elements are, is an int
MAX_PARAMS = 64  # the recorder's MAX_PARAMS
MAX_PARAM_BYTES = 1 << 16  # a kernel's whole parameter block is at most 32 KiB
MAX_BATCH_POINTERS = 4096  # the recorder's MAX_BATCH_POINTERS
MAX_RUNS = 1 << 22  # changed runs one effect event may list
SNAPSHOT_WHEN = ("before", "after", "step_start")
SNAPSHOT_REGIONS = ("wire", "body", "alpha", "d_h_s2", "d_concat", "target", "online")

_HASH = re.compile(r"[0-9a-f]{16}")
_HEX_BYTES = re.compile(r"[0-9a-f]*")


# ---- the checks a key's value is held to ----
def integer(low: int, high: int, high_words: str | None = None) -> Check:
    bounds = f"from {low} to {high_words or high}"

    def check(value: Any) -> str | None:
        if type(value) is not int:  # a JSON true is no integer
            return "must be an integer"
        if not low <= value <= high:
            return f"is {value}: must be {bounds}"
        return None

    return check


def string(value: Any) -> str | None:
    if type(value) is not str:
        return "must be a string"
    return None if len(value) <= MAX_STRING else f"is longer than {MAX_STRING} characters"


def address(value: Any) -> str | None:
    """A device or host address the recorder read: 0 (none), or one the process can map."""
    if type(value) is not int:
        return "must be an integer"
    if value and not LOWEST_ADDRESS <= value < ADDRESS_LIMIT:
        return f"is {value}: no address of the process (0, or from 2**15 to below 2**48)"
    return None


def _leaves(start: int, size: int) -> bool:
    return start + size > ADDRESS_LIMIT


def boolean(value: Any) -> str | None:
    return None if type(value) is bool else "must be true or false"


def one_of(*allowed: str) -> Check:
    def check(value: Any) -> str | None:
        if type(value) is not str:
            return "must be a string"
        return None if value in allowed else f"is {value!r}: must be one of {', '.join(allowed)}"

    return check


def region_hash(value: Any) -> str | None:
    if type(value) is str and _HASH.fullmatch(value):
        return None
    return "must be 16 lowercase hex digits"


_ANY64 = integer(-(2**63), 2**63 - 1, "2**63 - 1")
SEQ = integer(0, 2**63 - 1, "2**63 - 1")
U64 = integer(0, 2**64 - 1, "2**64 - 1")
PID = integer(0, 2**31 - 1, "2**31 - 1")
I32 = integer(-(2**31), 2**32 - 1, "2**32 - 1")
SIZE = integer(0, LIMIT, "2**40")


def dim3(value: Any) -> str | None:
    if type(value) is list and len(value) == 3:
        x, y, z = value
        integers = type(x) is int and type(y) is int and type(z) is int
        if integers and 0 <= x < 1 << 32 and 0 <= y < 1 << 32 and 0 <= z < 1 << 32:
            return None
    return "must be a list of 3 integers from 0 to 2**32 - 1"


def params(value: Any) -> str | None:
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


def pointers(value: Any) -> str | None:
    """A pointer-array GEMM's pointers, as the recorder read them from the device."""
    if type(value) is not list or len(value) > MAX_BATCH_POINTERS:
        return f"must be a list of at most {MAX_BATCH_POINTERS} pointers"
    for i, v in enumerate(value):
        if (problem := address(v)) is not None:
            return f"[{i}] {problem}"
    return None


_LT_AT_LEAST = (-(2**63), -(2**63), -1, -1, -1, -1, -(2**63))  # -1: unreadable
_LT_AT_MOST = (2**63 - 1, 2**63 - 1, 2**63 - 1, 2**63 - 1, 2**63 - 1, 2**31 - 1, 2**63 - 1)


def lt_layout(value: Any) -> str | None:
    """null, or [type, order, rows, cols, ld, batch count, batch stride] (-1: unreadable): sizes
    and the leading dimension not negative, the batch count an int32, as cuBLASLt keeps them."""
    if value is None:
        return None
    if not (type(value) is list and len(value) == 7 and all(_ANY64(v) is None for v in value)):
        return "must be null or a list of 7 integers"
    for v, low, high, what in zip(value, _LT_AT_LEAST, _LT_AT_MOST, LT_FIELDS, strict=True):
        if not low <= v <= high:
            return f"has {what} {v}: must be from {low} to {high}"
    return None


LT_FIELDS = ("type", "order", "rows", "cols", "ld", "batch count", "batch stride")


def lt_desc(value: Any) -> str | None:
    """[compute, scale type, pointer mode, transa, transb] (+ epilogue, bias, aux, aux ld)."""
    if not (type(value) is list and len(value) in (5, 9) and all(_ANY64(v) is None for v in value)):
        return "must be a list of 5 or 9 integers"
    bad = next((v for v in value[6:8] if v != -1 and address(v) is not None), None)
    return None if bad is None else f"names pointer {bad}, no address of the process"


def blobs(value: Any) -> str | None:
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


def runs(value: Any) -> str | None:
    """An effect's changed memory: [address, bytes] runs, ascending, none touching the next."""
    if type(value) is not list or len(value) > MAX_RUNS:
        return f"must be a list of at most {MAX_RUNS} [address, bytes] runs"
    end = -1
    for i, run in enumerate(value):
        if type(run) is not list or len(run) != 2 or type(run[0]) is not int:
            return f"[{i}] must be a pair of integers [address, bytes]"
        start, size = run
        if type(size) is not int or not 0 < size <= LIMIT or address(start) or not start:
            return f"[{i}] must be an address and a byte count from 1 to 2**40"
        if _leaves(start, size):
            return f"[{i}] ends at {start + size}, past the process's address space (2**48)"
        if start <= end:
            return f"[{i}] starts at {start}, not after the run before it (ends at {end})"
        end = start + size
    return None


# ---- the table ----
@dataclass(frozen=True)
class Key:
    """One key of an event kind and the check of its value. A required key is on every event of
    its kind; an optional one only where it applies (its comment in SCHEMA says when)."""

    name: str
    check: Check
    optional: bool = False


def memory(pointer: Check = address) -> tuple[Key, ...]:
    """memset, copy, alloc, free: one form (dst is the pointer a free gives back, which the
    driver checks: a free of no allocation frees nothing, whatever it names)."""
    return (
        Key("api", string),
        Key("dst", pointer),
        Key("src", pointer),
        Key("bytes", SIZE),
        Key("value", integer(-(2**63), 2**64 - 1, "2**64 - 1")),
    )


COMMON = (Key("seq", SEQ), Key("tid", U64))  # on every event, after "ev"
SCHEMA: dict[str, tuple[Key, ...]] = {
    "init": (
        Key("pid", PID),
        Key("ppid", PID),
        Key("cupti_version", I32),
        Key("subscribe", I32),
        Key("param_info", boolean),
        # how the recorder hashed its snapshot regions (absent: fnv1a, recorders before mix64)
        Key("hash", one_of(*HASH_KINDS), optional=True),
        # recorded with --deep: an effect event after every launch, memset and copy
        Key("deep", boolean, optional=True),
        # --deep recorded the bytes of every change (values-<pid>.bin)
        Key("values", boolean, optional=True),
        # not deep: a guard event after each launch of a kernel egf-audit does not know
        Key("guard", boolean, optional=True),
    ),
    "note": (Key("msg", string),),
    "kernel": (
        Key("api", string),
        Key("name", string),
        Key("grid", dim3),
        Key("block", dim3),
        Key("params", params),
        # on a launch whose parameters could not be read: -1 no CUfunction was found for it, -2
        # the driver has no cuFuncGetParamInfo, else that call's CUresult for the first one
        Key("param_info_rc", integer(-2, 2**31 - 1, "2**31 - 1"), optional=True),
        # the runtime call (cudaLaunchKernel, ...) inside which the runtime made this launch
        Key("via", string, optional=True),
        # made into a stream being captured into a CUDA graph (it runs when the graph is
        # launched, not now)
        Key("captured", boolean, optional=True),
        # the library that made the launch (from the call stack; "?" where it could not be told)
        Key("by", string, optional=True),
        # deep captures: the bytes of its parameters larger than 8 bytes
        Key("blobs", blobs, optional=True),
    ),
    "memset": memory(),
    "copy": memory(),
    "alloc": memory(),
    "free": memory(U64),  # cuMemFree, cuMemFreeAsync, cudaFree, cudaFreeAsync
    "cublas": (
        Key("msg", string),
        # on the log line that completes a GEMM's alpha and beta: pointer mode 0 host, 1
        # device; scalar_bytes their size, 4 where absent
        Key("pointer_mode", integer(0, 1), optional=True),
        Key("scalar_bytes", integer(2, 16), optional=True),
        Key("alpha_bits", U64, optional=True),
        Key("beta_bits", U64, optional=True),
        # on a pointer-array call's batchCount line: the pointers read from its arrays
        Key("a_ptrs", pointers, optional=True),
        Key("b_ptrs", pointers, optional=True),
        Key("c_ptrs", pointers, optional=True),
    ),
    "graph": (Key("api", string),),  # cuGraphLaunch / cudaGraphLaunch: a replay it cannot follow
    "ltmatmul": (
        Key("a", address),
        Key("b", address),
        Key("c", address),
        Key("d", address),
        Key("adesc", lt_layout),
        Key("bdesc", lt_layout),
        Key("cdesc", lt_layout),
        Key("ddesc", lt_layout),
        Key("desc", lt_desc),
        # alpha and beta, where its log named their addresses and they were read
        Key("alpha_bits", U64, optional=True),
        Key("beta_bits", U64, optional=True),
    ),
    "snapshot": (
        Key("launch", SEQ),
        Key("when", one_of(*SNAPSHOT_WHEN)),
        Key("region", one_of(*SNAPSHOT_REGIONS)),
        Key("ptr", address),
        Key("elements", SIZE),
        Key("rows", SIZE),
        Key("ld", SIZE),
        Key("skip_col", integer(-1, LIMIT, "2**40")),
        Key("hash", region_hash),
        Key("offset", SIZE),
        Key("count", SIZE),
    ),
    "exit": (Key("pid", PID),),
    # a deep capture: what the call of seq `launch` changed, every live allocation compared
    "effect": (
        Key("launch", SEQ),
        Key("allocations", SIZE),
        Key("bytes", SIZE),
        Key("changed", runs),
        # where the bytes of the runs start in values-<pid>.bin (absent: not recorded, memory
        # from this call on is unknown; the recorder's note says why)
        Key("values", SIZE, optional=True),
    ),
    # not deep: what the launch of seq `launch` (a kernel egf-audit does not know) changed in
    # the allocations it was handed, each compared whole ([base, bytes] in `compared`)
    "guard": (Key("launch", SEQ), Key("compared", runs), Key("changed", runs)),
    # a deep capture with values: the non-zero words of the allocation of seq `alloc` when it
    # was made (its 256-byte-rounded extent, never into the next allocation)
    "contents": (Key("alloc", SEQ), Key("changed", runs), Key("values", SIZE, optional=True)),
}
OPTIONAL_KEYS = {kind: {k.name for k in keys if k.optional} for kind, keys in SCHEMA.items()}


# ---- the checks across the keys of one event ----
def _extent(event: dict[str, Any]) -> str | None:
    """A memory call's or an allocation's pointers, and the bytes from each, in the address
    space; no allocation of any size at address 0."""
    size = event["bytes"]
    for key in ("dst", "src"):
        if event[key] and _leaves(event[key], size):
            return f'"{key}" {event[key]} and {size} bytes from it leave the address space (2**48)'
    if event["ev"] == "alloc" and size and not event["dst"]:
        return f"an allocation of {size} bytes at address 0"
    return None


def _snapshot(event: dict[str, Any]) -> str | None:
    """A region's kept values within its elements, as float32 values; its elements from a
    pointer the process maps, a wire column no longer than a kernel's rows can be."""
    if event["count"] > event["elements"]:
        return f'"count" {event["count"]} is more than its "elements" {event["elements"]}'
    if event["rows"] * event["ld"] != event["elements"]:
        # the recorder hashes a region as rows of ld elements (a whole one: one row of them)
        rows, ld, elements = event["rows"], event["ld"], event["elements"]
        return f'"rows" {rows} times "ld" {ld} is not its "elements" {elements}'
    if event["skip_col"] >= max(event["ld"], 1):
        return f'"skip_col" {event["skip_col"]} is no column of rows of {event["ld"]} elements'
    if event["offset"] % 4:
        return f'"offset" {event["offset"]} is not a multiple of 4 (float32 values)'
    if not event["ptr"]:
        return '"ptr" 0: a region of no memory'
    if _leaves(event["ptr"], 4 * event["elements"]):
        ptr, elements = event["ptr"], event["elements"]
        return f'"ptr" {ptr} and {elements} elements from it leave the address space (2**48)'
    if event["region"] == "wire" and event["elements"] > MAX_ROWS:
        return f"a wire region of {event['elements']} elements: more rows than an int holds"
    return None


WHOLE: dict[str, Check] = {
    "memset": _extent,
    "copy": _extent,
    "alloc": _extent,
    "snapshot": _snapshot,
}

_REQUIRED = {kind: (*COMMON, *(k for k in keys if not k.optional)) for kind, keys in SCHEMA.items()}
_OPTIONAL = {kind: tuple(k for k in keys if k.optional) for kind, keys in SCHEMA.items()}


def event_problem(event: dict[str, Any]) -> str | None:
    """What is wrong with an event's keys, if anything: a kind the table does not hold, a key its
    kind has that is missing, or one that holds what it may not."""
    ev = event.get("ev")
    required = _REQUIRED.get(ev) if type(ev) is str else None
    if required is None or type(ev) is not str:
        if ev is None:
            return '"ev" is missing'
        return '"ev" must be a string' if type(ev) is not str else f"unknown event kind {ev!r}"
    for key in required:
        if key.name not in event:
            return f'"{key.name}" is missing (every {ev} event has it)'
        if (problem := key.check(event[key.name])) is not None:
            return f'"{key.name}" {problem}'
    for key in _OPTIONAL[ev]:
        if key.name in event and (problem := key.check(event[key.name])) is not None:
            return f'"{key.name}" {problem}'
    whole = WHOLE.get(ev)
    return None if whole is None else whole(event)
