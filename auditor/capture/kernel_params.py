"""A kernel launch's recorded parameters, decoded. The recorder writes each parameter as its size
and its first (up to 8) bytes; a kernel whose name (its symbol, or the identifier inside a
C++-mangled symbol) is in egf-audit's kernel table, with the table's parameter count and sizes,
gets its parameters by name and C type. Any other kernel keeps them raw (`p0..pN`), with the
8-byte values it was handed (its pointers, struct parameters included) for a deep capture's
containment check. An ABI kernel launched without decodable arguments cannot be judged: the
reader refuses it, saying why.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.trace.contract import (
    ACCUMULATE_KERNEL,
    CONCAT_KERNEL,
    POLYAK_KERNEL,
    SCALE_KERNEL,
)

ABI_KERNELS = (CONCAT_KERNEL, SCALE_KERNEL, ACCUMULATE_KERNEL, POLYAK_KERNEL)
_MANGLED_PART = re.compile(r"(\d+)")


def param_size(ctype: str) -> int:
    """The bytes a parameter of this C type takes: 8 for pointers and long long, else 4."""
    return 8 if ctype.endswith("*") or ctype == "long long" else 4


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


def pointer_words(raw: list[list[int]] | None, blobs: list[list[Any]] | None) -> tuple[int, ...]:
    """Every non-zero 8-byte value a launch was handed: its 8-byte parameters, and each aligned
    8-byte word of its struct parameters (a CuPy CArray, cuBLAS's parameter blocks), where the
    pointers such a kernel writes through are."""
    words = {value for size, value in raw or () if size == 8}
    for _, hexed in blobs or ():
        data = bytes.fromhex(hexed)
        words.update(struct.unpack_from(f"<{len(data) // 8}Q", data))
    words.discard(0)
    return tuple(sorted(words))


def decode_params(name: str, raw: list[list[int]] | None) -> tuple[dict[str, Any], bool]:
    """Parameters by name and C type for a kernel egf-audit knows (when their count and sizes
    are the table's), else `p0..pN` raw values."""
    if raw is None:
        return {}, False
    spec = KERNELS_BY_NAME.get(name)
    if spec is None or [s for s, _ in raw] != [param_size(t) for _, t in spec.params]:
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


def abi_problem(name: str, raw: list[list[int]] | None, rc: int | None = None) -> str | None:
    """Why an ABI kernel's launch cannot be judged from its recorded arguments, if it cannot;
    rc: the recorder's param_info_rc, where it could read no parameter."""
    if name not in ABI_KERNELS:
        return None
    if raw is None:
        return (
            f'{name} launch without its arguments ("params" is null: a runtime-API launch '
            "the recorder could not decode)"
        )
    want = [param_size(t) for _, t in KERNELS_BY_NAME[name].params]
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
