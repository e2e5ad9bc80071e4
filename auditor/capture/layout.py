"""Which pointer is which buffer: the layout file a trainer writes, its reader and its writer
(`layout_document`); where a capture names none, capture/inference.py names what it can.

The layout file (schema `egf-audit-layout/1`, docs/capture.md):

    {"format": "egf-audit-layout/1",
     "dims": {"B": 64, "SH2": 48, ...},
     "param_offsets": {"w_b0fc": [offset, rows, cols], ...},   # poff_* == goff_* == ...
     "buffers": {
        "params": {"address": 139..., "bytes": 61234, "params": true},
        "sp14_d_dir_qaux_concat": {"address": ..., "bytes": ..., "shape": [64, 49]},
        "sn_state": {"address": ..., "bytes": ..., "tensors": {"v_b0fc": [32, 1, 49]}}}}

A tensor may declare the leading axes the program slices, `[offset, L, B*T, C]` (or `"shape":
[L, B*T, C]`, at most MAX_RANK axes): it is held as `[offset, L*B*T, C]` with its declared shape
beside it (`Buffer.shapes`), and EGF001 holds an operand on it to whole slices.

The file is untrusted: it is read as `--config` is, and every value held to its domain before it
is used: addresses and sizes inside the process's address space (capture/schema.py), tensors
inside their buffers and apart from each other (a buffer's `"views"` name the same elements a
second time, and may overlap), dims positive ints, `tau` a finite number in (0, 1).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any, NoReturn

from egf_audit.errors import UsageError
from egf_audit.small_files import read_small_bytes
from egf_audit.trace.buffers import ELEMENT_BYTES, Buffer, CaptureLayout
from egf_audit.trace.process import ProcessCapture

from .files import gunzip_small, parse_json
from .schema import ADDRESS_LIMIT, LIMIT, LOWEST_ADDRESS

FORMAT = "egf-audit-layout/1"
LAYOUT_FILE = "layout.json"


def layout_in(folder: Path) -> Path | None:
    """The layout file of a capture folder (committed fixtures keep it gzipped), or None."""
    for name in (LAYOUT_FILE, f"{LAYOUT_FILE}.gz"):
        if (Path(folder) / name).exists():
            return Path(folder) / name
    return None


# ---- the layout file ----
MAX_LAYOUT_BYTES = 16 << 20  # a layout file names buffers and tensors: kilobytes
MAX_NAME = 256  # characters of a buffer's or a tensor's name
MAX_DIM = 2**31 - 1  # every dim is an ABI kernel's int argument, or a count of them
MAX_DIM_LIST = 64  # A and E hold one entry per branch
MAX_RANK = 8  # axes of one tensor (llm.c's qkvr, [L, 3, B, NH, T, HS], has 6)


def _refuse(path: Path, problem: str) -> NoReturn:
    raise UsageError(f"layout file {path}: {problem}")


def _count(value: Any, high: int = LIMIT) -> bool:
    return type(value) is int and 0 <= value <= high


def _name(name: str, where: str, path: Path) -> str:
    if not 0 < len(name) <= MAX_NAME:
        _refuse(path, f"{where} has a name of {len(name)} characters (1 to {MAX_NAME})")
    return name


def _product(values: list[int]) -> int:
    """The product of sizes, stopping once it passes LIMIT (no number past 2**80 is made)."""
    out = 1
    for v in values:
        out *= v
        if out > LIMIT:
            return LIMIT + 1
    return out


def _tensor(value: Any, where: str, path: Path) -> tuple[int, ...]:
    """A tensor as declared: [offset, rows, cols], or [offset, *leading axes, rows, cols] for a
    tensor the program slices (`[offset, L, B*T, C]`), every entry an integer from 0 to 2**40,
    at most MAX_RANK axes, at most 2**40 elements."""
    if not (
        type(value) is list and 3 <= len(value) <= MAX_RANK + 1 and all(_count(v) for v in value)
    ):
        _refuse(
            path,
            f"{where} must be [offset, rows, cols] or [offset, leading axes..., rows, cols] (at "
            f"most {MAX_RANK} axes), integers from 0 to 2**40",
        )
    if _product(value[1:]) > LIMIT:
        _refuse(path, f"{where} holds more than 2**40 elements")
    return tuple(value)


def _flat(declared: tuple[int, ...]) -> tuple[int, int, int]:
    """A declared tensor as (offset, rows, cols): its leading axes folded into its rows."""
    return declared[0], _product(list(declared[1:-1])), declared[-1]


def _table(raw: Any, where: str, path: Path) -> dict[str, tuple[int, ...]]:
    if type(raw) is not dict:
        _refuse(path, f"{where} must be an object")
    return {
        _name(k, f"{where}.{k}", path): _tensor(v, f"{where}.{k}", path) for k, v in raw.items()
    }


def _dims(raw: Any, path: Path) -> dict[str, Any]:
    """The trainer's dims: positive integers below 2**31 (lists of them for A and E), and `tau`
    (Polyak's blend, a finite number in (0, 1)) where the trainer states it."""
    if type(raw) is not dict:
        _refuse(path, '"dims" must be an object')
    for key, value in raw.items():
        if key == "tau":
            ok = type(value) in (int, float) and 0.0 < value < 1.0
        elif type(value) is list:
            ok = len(value) <= MAX_DIM_LIST and all(_count(v, MAX_DIM) and v > 0 for v in value)
        else:
            ok = _count(value, MAX_DIM) and value > 0
        if not ok:
            _refuse(path, f"dims.{_name(key, 'dims', path)} = {value!r:.80} is not a valid size")
    return dict(raw)


def _read(data: bytes, path: Path) -> Any:
    """The layout file's JSON: a gzipped one expanded to at most MAX_LAYOUT_BYTES, parsed with
    its nesting and numbers bounded (capture/files.py)."""
    try:
        if path.suffix == ".gz":
            data = gunzip_small(data, MAX_LAYOUT_BYTES)
        return parse_json(data)
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read layout file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"layout file {path} is not JSON: {exc.msg} (line {exc.lineno})") from None
    except ValueError as exc:
        raise UsageError(f"layout file {path} is not JSON: {exc}") from None


def load_layout_file(path: Path) -> CaptureLayout:
    """Read and check a layout file, read as `--config` is (a regular file of at most
    MAX_LAYOUT_BYTES, opened without blocking); every problem is one UsageError line naming
    the key."""
    path = Path(path)
    return parse_layout(read_small_bytes(path, "layout file", limit=MAX_LAYOUT_BYTES), path)


def parse_layout(data: bytes, path: Path) -> CaptureLayout:
    """A layout file's bytes, checked (`path` names it in messages)."""
    doc = _read(data, path)
    if type(doc) is not dict or doc.get("format") != FORMAT:
        _refuse(path, f'"format" must be "{FORMAT}"')
    if type(doc.get("param_offsets", {})) is not dict:
        _refuse(path, '"param_offsets" must be an object')
    offsets = _table(doc.get("param_offsets", {}), "param_offsets", path)
    # the tensors of `params`
    _refuse_overlapping_tensors({k: _flat(v) for k, v in offsets.items()}, "param_offsets", path)
    layout = CaptureLayout(dims=_dims(doc.get("dims", {}), path), from_file=True)
    buffers = doc.get("buffers")
    if type(buffers) is not dict or not buffers:
        _refuse(path, '"buffers" must name at least one buffer')
    for name, spec in buffers.items():
        layout.add(_buffer(_name(name, f"buffers.{name}", path), spec, offsets, path))
    if not any(b.allocation for b in layout.buffers.values()):
        _refuse_partial_overlaps(layout, path)
    return layout


def _buffer(name: str, spec: Any, offsets: dict, path: Path) -> Buffer:
    """One buffer of the file: where it lies, how big it is, its tensors (and views)."""
    where = f"buffers.{name}"
    allocation = _allocation(spec, name, path)
    if allocation is not None:
        spec = {"address": 0, "bytes": allocation[0], **spec}
    if (
        type(spec) is not dict
        or type(spec.get("address")) is not int
        or not _count(spec.get("bytes"))
    ):
        _refuse(path, f"{where} needs integer address and bytes (bytes at most 2**40)")
    address, nbytes = spec["address"], spec["bytes"]
    if allocation is None and not LOWEST_ADDRESS <= address < ADDRESS_LIMIT - nbytes:
        _refuse(
            path,
            f"{where} lies at {address} with {nbytes} bytes: outside the process's address "
            "space (from 2**15 to 2**48)",
        )
    size = nbytes // ELEMENT_BYTES
    shaped = True
    declared: dict[str, tuple[int, ...]]
    if spec.get("params"):
        declared = dict(offsets)
    elif "tensors" in spec:
        declared = _table(spec["tensors"], f"{where}.tensors", path)
    elif "shape" in spec:
        shape = spec["shape"]
        if not (
            type(shape) is list and 2 <= len(shape) <= MAX_RANK and all(_count(v) for v in shape)
        ):
            _refuse(
                path,
                f"{where}.shape must be [rows, cols] or [leading axes..., rows, cols] (at most "
                f"{MAX_RANK} axes), integers from 0 to 2**40",
            )
        declared = {name: _tensor([0, *shape], f"{where}.shape", path)}
    else:
        # address and bytes only: one flat allocation, judged by its span, never as a row of
        # `size` columns
        declared, shaped = {name: (0, 1, size)}, False
    declared_views = _table(spec.get("views", {}), f"{where}.views", path)
    tensors = {k: _flat(v) for k, v in declared.items()}
    views = {k: _flat(v) for k, v in declared_views.items()}
    shapes = {k: v[1:] for k, v in (declared | declared_views).items() if len(v) > 3}
    for tensor, (offset, rows, cols) in (tensors | views).items():
        if offset + rows * cols > size:
            _refuse(path, f"tensor {tensor} of {where} does not fit its {size} elements")
    _refuse_overlapping_tensors(tensors, where, path)
    if both := sorted(set(views) & set(tensors)):
        _refuse(path, f"{where} names {both[0]} both as a tensor and as a view")
    source = "layout file" if allocation is None else "layout file, by its allocation"
    return Buffer(
        name, address, size, tensors | views, source, shaped, allocation=allocation, shapes=shapes
    )


def _refuse_overlapping_tensors(tensors: dict, where: str, path: Path) -> None:
    """A buffer's tensors lie apart: a pointer into two of them would be judged against
    whichever is asked first. A second name for the same memory is a view (`"views"`)."""
    spans = sorted((o, o + r * c, t) for t, (o, r, c) in tensors.items() if r * c)
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            _refuse(
                path,
                f"tensors {first} and {second} of {where} overlap (a second name for the same "
                'elements is declared under "views")',
            )


def _allocation(spec: Any, name: str, path: Path) -> tuple[int, int] | None:
    """A buffer named by its allocation, `"allocation": {"bytes": N, "index": K}`: the K-th
    (from 0) allocation of exactly N bytes the process made, for a trainer that cannot write
    its addresses (its allocations' sizes and order are its code's)."""
    if type(spec) is not dict or "allocation" not in spec:
        return None
    raw = spec["allocation"]
    if "address" in spec:
        _refuse(path, f"buffers.{name} has both an address and an allocation")
    if not (type(raw) is dict and _count(raw.get("bytes")) and _count(raw.get("index"), MAX_DIM)):
        _refuse(
            path,
            f'buffers.{name}.allocation must be {{"bytes": N, "index": K}} with integers N, K >= 0',
        )
    if "bytes" in spec and (not _count(spec["bytes"]) or spec["bytes"] > raw["bytes"]):
        _refuse(path, f"buffers.{name} is larger than its allocation")
    return raw["bytes"], raw["index"]


def place(layout: CaptureLayout, proc: ProcessCapture) -> tuple[CaptureLayout, str]:
    """The layout with every buffer named by its allocation at that allocation's address in this
    process (`alloc` records, in program order), and a note naming those it does not hold (left
    out: nothing is named at a guessed address). Buffers named by address stay."""
    if not any(b.allocation for b in layout.buffers.values()):
        return layout, ""
    seen: dict[int, list[int]] = {}
    for r in proc.records:
        if r.kind == "alloc":
            seen.setdefault(r.args["bytes"], []).append(r.args["dst"])
    placed = CaptureLayout(dims=dict(layout.dims), from_file=layout.from_file)
    missing = []
    for b in layout.buffers.values():
        if b.allocation is None:
            placed.add(b)
            continue
        nbytes, index = b.allocation
        found = seen.get(nbytes, [])
        if index >= len(found):
            missing.append(f"{b.name} (allocation {index} of {nbytes} bytes)")
            continue
        placed.add(dataclasses.replace(b, base=found[index]))
    note = f"not in this process: {', '.join(missing)}" if missing else ""
    return placed, note


def _refuse_partial_overlaps(layout: CaptureLayout, path: Path) -> None:
    """Buffers may nest (a tensor's own name inside a flat buffer) or lie apart; two that
    partly overlap would make a pointer's buffer depend on which one is asked first."""
    spans = sorted(
        (b.base, b.base + b.size * ELEMENT_BYTES, b.name) for b in layout.buffers.values()
    )
    open_: list[tuple[int, int, str]] = []  # enclosing buffers still open, innermost last
    for start, end, name in spans:
        while open_ and open_[-1][1] <= start:
            open_.pop()
        if open_ and end > open_[-1][1]:
            raise UsageError(
                f"layout file {path}: buffers {open_[-1][2]} and {name} partly overlap (a buffer "
                "must lie inside another or apart from it)"
            )
        open_.append((start, end, name))


def layout_document(buffers: dict[str, tuple[int, int, dict]], dims: dict, offsets: dict) -> str:
    """A layout file's text: buffers as name -> (address, elements, tensors)."""
    doc = {
        "format": FORMAT,
        "dims": dims,
        "param_offsets": {k: list(v) for k, v in offsets.items()},
        "buffers": {
            name: {
                "address": address,
                "bytes": size * ELEMENT_BYTES,
                "tensors": {k: list(v) for k, v in tensors.items()},
            }
            for name, (address, size, tensors) in buffers.items()
        },
    }
    return json.dumps(doc, sort_keys=True) + "\n"
