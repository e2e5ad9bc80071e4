"""Launch operands written as buffer + tensor, never as raw pointer values.

A pointer differs between runs and backends; the buffer, the tensor it resolves to and the box
it covers do not. `grad_buf+goff_w_b0fc [32, 49]` is the whole dW of w_b0fc;
`sp14_d_dir_qaux_concat [64, 49] [:, 48]` is its wire column.
"""

from __future__ import annotations

from typing import Any

from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.trace.gemm_rules import GEMM_ARGS
from egf_audit.trace.model import Binding, Launch

# How the trainer names offsets into its flat buffers (poff_w_b0fc, goff_w_b0fc, ...).
OFFSET_PREFIX = {"params": "poff", "target_params": "poff", "grad_buf": "goff"}
SGEMM_ARGS = (*GEMM_ARGS, "alpha", "beta")  # an SGEMM's arguments other than its pointers


def number(value: Any) -> str:
    """Arguments as text: ints as ints, floats by repr (exact and the same on every machine)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        return repr(float(value))
    return str(value)


def tensor_name(buffer: str, tensor: str) -> str:
    if tensor == buffer:
        return buffer
    return f"{buffer}+{OFFSET_PREFIX.get(buffer, 'off')}_{tensor}"


def _span(start: int, count: int, full: int) -> str:
    if start == 0 and count == full:
        return ":"
    if count == 1:
        return str(start)
    return f"{start}:{start + count}"


def operand(binding: Binding, layout: dict[str, Any]) -> str:
    """One operand as `buffer+tensor [rows, cols]`, with the box when it is not the whole
    tensor, and a loud note when the recorder found it out of bounds."""
    region = binding.region
    if region is None:
        return "null (0)" if binding.pointer == 0 else "pointer into no buffer"
    text = _describe(binding, layout)
    return text if binding.in_bounds else f"{text} OUT OF BOUNDS"


def _describe(binding: Binding, layout: dict[str, Any]) -> str:
    region = binding.region
    assert region is not None
    size = layout.get(region.buffer, {}).get("size")
    contiguous = region.rows <= 1 or region.ld == region.width
    count = region.rows * region.width if contiguous else None
    if region.offset == 0 and count == size and len(layout[region.buffer]["tensors"]) > 1:
        return f"{region.buffer} (whole buffer, {size} elements)"
    if binding.tensor is None or binding.tensor_shape is None:
        return f"{region.buffer} (elements {region.offset}..{region.last})"
    t_offset, t_rows, t_cols = binding.tensor_shape
    name = f"{tensor_name(region.buffer, binding.tensor)} [{t_rows}, {t_cols}]"
    delta = region.offset - t_offset
    t_size = t_rows * t_cols
    if count is not None and delta == 0 and count == t_size:
        return name
    if region.rows <= 1 and delta + region.width <= t_size:
        if t_rows == 1:
            return f"{name} [0, {_span(delta, region.width, t_cols)}]"
        return f"{name} [flat {_span(delta, region.width, t_size)}]"
    elif region.ld == t_cols:
        row, col = divmod(delta, t_cols)
        if col + region.width <= t_cols and row + region.rows <= t_rows:
            rows = _span(row, region.rows, t_rows)
            cols = _span(col, region.width, t_cols)
            return f"{name} [{rows}, {cols}]"
    return f"{name} (+{delta}: {region.rows} rows x {region.width}, ld {region.ld})"


def operands(launch: Launch, layout: dict[str, Any], access: str) -> list[str]:
    """`role=operand` for every binding that reads ("r") or writes ("w")."""
    picked = [b for b in launch.bindings if (b.writes if access == "w" else b.reads)]
    return [f"{b.role}={operand(b, layout)}" for b in picked]


def scalar_args(launch: Launch) -> str:
    """The non-pointer arguments of a launch, e.g. `rows=64 sh2=48`."""
    if launch.kind == "sgemm":
        return " ".join(f"{k}={number(launch.args[k])}" for k in SGEMM_ARGS)
    if launch.kind == "kernel" and launch.name in KERNELS_BY_NAME:
        spec = KERNELS_BY_NAME[launch.name]
        pointers = set(spec.pointer_params)
        names = [n for n, _ in spec.params if n not in pointers]
        return " ".join(f"{n}={number(launch.args[n])}" for n in names if n in launch.args)
    if "count" in launch.args:
        return f"count={launch.args['count']}"
    return ""
