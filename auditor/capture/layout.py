"""Which pointer is which buffer: a layout file the trainer writes, or inference from the capture.

The layout file (schema `egf-audit-layout/1`, docs/capture.md):

    {"format": "egf-audit-layout/1",
     "dims": {"B": 64, "SH2": 48, ...},
     "param_offsets": {"w_b0fc": [offset, rows, cols], ...},   # poff_* == goff_* == ...
     "buffers": {
        "params": {"address": 139..., "bytes": 61234, "params": true},
        "sp14_d_dir_qaux_concat": {"address": ..., "bytes": ..., "shape": [64, 49]},
        "sn_state": {"address": ..., "bytes": ..., "tensors": {"v_b0fc": [32, 1, 49]}}}}

Without one, the four ABI kernels name their pointer arguments (kernels/CONTRACT.md, section 3) and
GEMM operand identity carries names on: the weight the forward GEMM on the concat scratch reads is
`w_b0fc`; the GEMM that reads the scratch contracting over its rows writes `w_b0fc`'s gradient; the
GEMM that reads `w_b0fc` and writes a [B, SH2+1] box writes `sp14_d_dir_qaux_concat`.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

from egf_audit.errors import UsageError
from egf_audit.runtime.capture_model import Buffer, CaptureLayout, ProcessCapture, Record
from egf_audit.runtime.contract import (
    ACCUMULATE_KERNEL,
    CONCAT_KERNEL,
    DIR_CONCAT,
    DIR_DX,
    ISV,
    POLYAK_KERNEL,
    SCALE_KERNEL,
    TARGET,
)
from egf_audit.runtime.memory import ELEMENT_BYTES
from egf_audit.runtime.recorder import contraction

FORMAT = "egf-audit-layout/1"
LAYOUT_FILE = "layout.json"


def layout_in(folder: Path) -> Path | None:
    """The layout file of a capture folder (committed fixtures keep it gzipped), or None."""
    for name in (LAYOUT_FILE, f"{LAYOUT_FILE}.gz"):
        if (Path(folder) / name).exists():
            return Path(folder) / name
    return None


# ---- the layout file ----
def _triple(value: Any, where: str) -> tuple[int, int, int]:
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value)):
        raise UsageError(f"layout file: {where} must be [offset, rows, cols] integers")
    return value[0], value[1], value[2]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dims(raw: Any, path: Path) -> dict[str, Any]:
    """The trainer's dims: positive integers (lists of them for A and E), and `tau` (Polyak's
    blend, a float in (0, 1)) where the trainer states it."""
    if not isinstance(raw, dict):
        raise UsageError(f'layout file {path}: "dims" must be an object')
    for key, value in raw.items():
        if key == "tau":
            ok = isinstance(value, float | int) and not isinstance(value, bool)
            ok = ok and 0.0 < float(value) < 1.0
        elif isinstance(value, list):
            ok = all(_count(v) and v > 0 for v in value)
        else:
            ok = _count(value) and value > 0
        if not ok:
            raise UsageError(f"layout file {path}: dims.{key} = {value!r} is not a valid size")
    return dict(raw)


def load_layout_file(path: Path) -> CaptureLayout:
    """Read and check a layout file; every problem is one UsageError line naming the key."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read layout file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"layout file {path} is not JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f'layout file {path}: "format" must be "{FORMAT}"')
    raw_offsets = doc.get("param_offsets", {})
    if not isinstance(raw_offsets, dict):
        raise UsageError(f'layout file {path}: "param_offsets" must be an object')
    offsets = {k: _triple(v, f"param_offsets.{k}") for k, v in raw_offsets.items()}
    layout = CaptureLayout(dims=_dims(doc.get("dims", {}), path), from_file=True)
    buffers = doc.get("buffers")
    if not isinstance(buffers, dict) or not buffers:
        raise UsageError(f'layout file {path}: "buffers" must name at least one buffer')
    for name, spec in buffers.items():
        allocation = _allocation(spec, name, path)
        if allocation is not None:
            spec = {"address": 0, "bytes": allocation[0], **spec}
        if not isinstance(spec, dict) or not all(_count(spec.get(k)) for k in ("address", "bytes")):
            raise UsageError(f"layout file {path}: buffers.{name} needs integer address and bytes")
        size = spec["bytes"] // ELEMENT_BYTES
        shaped = True
        if spec.get("params"):
            tensors = dict(offsets)
        elif "tensors" in spec:
            if not isinstance(spec["tensors"], dict):
                raise UsageError(f"layout file {path}: buffers.{name}.tensors must be an object")
            tensors = {
                k: _triple(v, f"buffers.{name}.tensors.{k}") for k, v in spec["tensors"].items()
            }
        elif "shape" in spec:
            shape = spec["shape"]
            if not (isinstance(shape, list) and len(shape) == 2 and all(_count(v) for v in shape)):
                raise UsageError(f"layout file {path}: buffers.{name}.shape must be [rows, cols]")
            tensors = {name: (0, shape[0], shape[1])}
        else:
            # address and bytes only: one flat allocation, judged by its span, never as a
            # row of `size` columns
            tensors, shaped = {name: (0, 1, size)}, False
        for tensor, (offset, rows, cols) in tensors.items():
            if offset < 0 or rows < 0 or cols < 0 or offset + rows * cols > size:
                raise UsageError(
                    f"layout file {path}: tensor {tensor} of buffers.{name} does not fit its "
                    f"{size} elements"
                )
        source = "layout file" if allocation is None else "layout file, by its allocation"
        layout.add(
            Buffer(name, spec["address"], size, tensors, source, shaped, allocation=allocation)
        )
    if not any(b.allocation for b in layout.buffers.values()):
        _refuse_partial_overlaps(layout, path)
    return layout


def _allocation(spec: Any, name: str, path: Path) -> tuple[int, int] | None:
    """A buffer named by its allocation, `"allocation": {"bytes": N, "index": K}`: the K-th
    (from 0) allocation of exactly N bytes the process made, for a trainer that cannot write
    its addresses (its allocations' sizes and order are its code's)."""
    if not isinstance(spec, dict) or "allocation" not in spec:
        return None
    raw = spec["allocation"]
    if "address" in spec:
        raise UsageError(
            f"layout file {path}: buffers.{name} has both an address and an allocation"
        )
    if not (isinstance(raw, dict) and _count(raw.get("bytes")) and _count(raw.get("index"))):
        raise UsageError(
            f"layout file {path}: buffers.{name}.allocation must be "
            '{"bytes": N, "index": K} with integers N, K >= 0'
        )
    if "bytes" in spec and spec["bytes"] > raw["bytes"]:
        raise UsageError(f"layout file {path}: buffers.{name} is larger than its allocation")
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


# ---- inference ----
def _single(name: str, base: int, rows: int, cols: int, source: str) -> Buffer:
    return Buffer(name, base, rows * cols, {name: (0, rows, cols)}, source)


def _reads_scratch(r: Record, scratch: int) -> str | None:
    """How a GEMM reads the concat scratch ("columns" or "rows"), or None."""
    a = r.args
    role = next((role for role in ("A", "B") if a.get(role) == scratch), None)
    return None if role is None else contraction(role, a["transa"], a["transb"])


def infer_layout(proc: ProcessCapture) -> CaptureLayout:
    """Name what the capture itself proves (module docstring); the rest stays unresolved."""
    layout = CaptureLayout()
    concat = proc.kernels(CONCAT_KERNEL)
    decoded = [r for r in concat if "concat" in r.args]
    if decoded:
        first = decoded[0].args
        B, S2, auxk = first["rows"], first["sh2"], first["auxk"]
        layout.dims.update(B=B, SH2=S2, AUXK=auxk)
        how = f"{CONCAT_KERNEL}(concat)"
        layout.add(_single(DIR_CONCAT, first["concat"], B, S2 + 1, how))
        layout.add(_single("save_h_s2", first["h_s2"], B, S2, f"first {CONCAT_KERNEL}(h_s2)"))
        layout.add(
            _single("aux_nb_softmax_buf", first["aux_softmax"], B, auxk, f"first {CONCAT_KERNEL}")
        )
        for r in decoded[1:]:
            if r.args["h_s2"] != first["h_s2"]:
                layout.add(
                    _single("tgt_h_s2", r.args["h_s2"], B, S2, f"second {CONCAT_KERNEL}(h_s2)")
                )
                break
    for r in proc.kernels(ACCUMULATE_KERNEL):
        a = r.args
        if "d_h_s2" in a:
            layout.add(
                _single("d_h_s2", a["d_h_s2"], a["rows"], a["sh2"], f"{ACCUMULATE_KERNEL}(d_h_s2)")
            )
    for r in proc.kernels(POLYAK_KERNEL):
        a = r.args
        if "target" in a:
            n = a["n"]
            layout.add(
                Buffer(
                    TARGET, a["target"], n, {TARGET: (0, 1, n)}, f"{POLYAK_KERNEL}(target)", False
                )
            )
            layout.add(
                Buffer(
                    "params",
                    a["online"],
                    n,
                    {"params": (0, 1, n)},
                    f"{POLYAK_KERNEL}(online)",
                    False,
                )
            )
    for r in proc.kernels(SCALE_KERNEL):
        a = r.args
        if "isv" in a:
            n = a["isv_index"] + 1
            layout.add(
                Buffer(
                    ISV,
                    a["isv"],
                    n,
                    {ISV: (0, 1, n)},
                    f"{SCALE_KERNEL}(isv), up to isv_index",
                    shaped=False,
                    bounded=False,
                )
            )
    if decoded:
        _infer_from_gemms(proc, layout)
    # the scale's own target, when no GEMM named the dX buffer (the scale then names it)
    for r in proc.kernels(SCALE_KERNEL):
        a = r.args
        if "dx_concat" in a and layout.resolve(a["dx_concat"]) is None:
            layout.add(
                _single(DIR_DX, a["dx_concat"], a["rows"], a["ld"], f"{SCALE_KERNEL}(dx_concat)")
            )
    return layout


def _infer_from_gemms(proc: ProcessCapture, layout: CaptureLayout) -> None:
    scratch = layout.buffers[DIR_CONCAT]
    B, width = layout.dims["B"], layout.dims["SH2"] + 1
    gemms = [r for r in proc.records if r.kind in ("sgemm", "gemm") and "unbound" not in r.args]
    w_b0fc = None
    for r in gemms:
        if _reads_scratch(r, scratch.base) == "columns":
            w_b0fc, adv = r.args["A"], r.args["m"]  # y = x . W^T: W is cuBLAS's A
            layout.dims["ADV"] = adv
            how = "A operand of the forward GEMM on the concat scratch"
            _add_param(layout, "w_b0fc", w_b0fc, adv, width, how)
            break
    for r in gemms:
        if _reads_scratch(r, scratch.base) == "rows" and w_b0fc is not None:
            how = "C operand of the GEMM contracting the concat scratch over its rows"
            layout.add(_single("goff_w_b0fc", r.args["C"], layout.dims["ADV"], width, how))
            break
    for r in gemms:
        dx = r.args.get("A") == w_b0fc and r.args["n"] == B and r.args["transa"] == "N"
        if w_b0fc is not None and dx and layout.resolve(r.args["C"]) is None:
            how = "C operand of the GEMM reading w_b0fc into a batch-row box (dX)"
            layout.add(_single(DIR_DX, r.args["C"], B, width, how))
            break


def _add_param(layout: CaptureLayout, name: str, ptr: int, rows: int, cols: int, how: str) -> None:
    """A parameter tensor: inside `params` (as its tensor) when the Polyak launch named the
    flat buffer, else a buffer of its own."""
    params = layout.buffers.get("params")
    if params is not None and params.contains(ptr):
        offset = (ptr - params.base) // ELEMENT_BYTES
        params.tensors = {name: (offset, rows, cols), **params.tensors}
        params.source += f"; {name} at element {offset}: {how}"
    else:
        layout.add(_single(name, ptr, rows, cols, how))
