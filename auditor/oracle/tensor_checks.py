"""EGF010's comparison of tensors: one float64 reference against the pipeline's tensor, within
ABS_TOL + REL_TOL * max|ref| per tensor (kernels/CONTRACT.md's EGF010 note), one by one
(`compare`) or many at once on the oracle's device with one read-back (`Measured`,
`compare_many`). The step's decisions and gradients (`oracle/compare.py`) and its update
(`oracle/update_checks.py`) are compared through it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ABS_TOL = 1e-6
REL_TOL = 1e-4


def tolerance(max_ref: float, kind: str = "grad") -> float:
    """ABS_TOL + REL_TOL * max|ref|. Adam's v holds squared gradients, so its absolute floor is
    ABS_TOL squared: the same tolerance in v's units (1e-6 would exceed every v entry and make
    the comparison empty)."""
    floor = ABS_TOL**2 if kind == "adam_v" else ABS_TOL
    return floor + REL_TOL * max_ref


@dataclass(frozen=True)
class TensorCheck:
    name: str  # the parameter tensor ("w_b0fc"), or "u_b0fc" / "v_b0fc"
    kind: str  # "grad", "param", "adam_m", "adam_v", "sn", "target"
    max_err: float
    tol: float
    max_ref: float
    ok: bool
    note: str = ""  # why a comparison could not be made in full (shape, missing)


def compare(
    name: str, kind: str, ref: torch.Tensor, got: torch.Tensor | None, note: str = ""
) -> TensorCheck:
    """One tensor against its float64 reference, where both are. A missing or differently
    shaped pipeline tensor fails, with what exists (the common flat prefix) still measured."""
    ref = ref.detach()
    max_ref = float(ref.abs().max()) if ref.numel() else 0.0
    tol = tolerance(max_ref, kind)
    if got is None:
        return TensorCheck(name, kind, float("nan"), tol, max_ref, False, note or "missing")
    if tuple(got.shape) != tuple(ref.shape):
        note = note or f"shape {list(got.shape)}, reference {list(ref.shape)}"
        n = min(got.numel(), ref.numel())
        ref, got = ref.reshape(-1)[:n], got.reshape(-1)[:n]
    max_err = 0.0
    if got.numel():
        err = (got.to(ref.device, torch.float64) - ref).abs()
        nan, largest = torch.stack([err.isnan().any().to(err.dtype), err.max()]).tolist()
        max_err = float("nan") if nan else largest
    ok = not note and bool(max_err <= tol)  # NaN compares False: it fails
    return TensorCheck(name, kind, max_err, tol, max_ref, ok, note)


Compared = tuple[str, str, torch.Tensor, torch.Tensor | None]  # name, kind, ref, got


@dataclass(frozen=True)
class Joined:
    """Tensors of one kind compared as compare() compares each: `ref` their float64 references
    laid end to end (`sizes` elements each, in the order of `names`), `got` the pipeline's
    laid likewise (any dtype; the whole parameter table of a snapshot, say)."""

    kind: str
    names: list[str]
    sizes: list[int]
    ref: torch.Tensor
    got: torch.Tensor


@functools.lru_cache(maxsize=8)
def _segments(sizes: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    """Each element's item number, items of `sizes` elements laid end to end: built on the
    host and copied to `dev` once per layout, not once per step."""
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return ids.to(dev)


class Measured:
    """compare() of many items (Compared or Joined), measured on the device: `values` holds
    every whole item's max|ref| and max|err| ([2, items], NaN where one is NaN, as numpy's max),
    to be read back with whatever else the caller reads; `checks(values)` then gives the rows
    compare() gives, in order. Items that are missing, reshaped or empty are compared one by
    one by compare() itself. The maxima are the same numbers compare() takes (a maximum does
    not depend on the order)."""

    def __init__(self, items: Sequence[Compared | Joined]):
        self._rows: list[TensorCheck | tuple[str, str]] = []  # a check, or (name, kind) measured
        refs: list[torch.Tensor] = []
        gots: list[torch.Tensor] = []
        sizes: list[int] = []
        for item in items:
            if isinstance(item, Joined):
                refs.append(item.ref.detach())
                gots.append(item.got)
                sizes += item.sizes
                self._rows += [(name, item.kind) for name in item.names]
                continue
            name, kind, ref, got = item
            if got is not None and ref.numel() and tuple(got.shape) == tuple(ref.shape):
                refs.append(ref.detach().reshape(-1))
                gots.append(got.reshape(-1))
                sizes.append(ref.numel())
                self._rows.append((name, kind))
            else:
                self._rows.append(compare(name, kind, ref, got))
        self.values: torch.Tensor | None = None
        if sizes:
            ref_all = torch.cat(refs) if len(refs) > 1 else refs[0]
            got_all = torch.cat([g.to(ref_all.device, torch.float64) for g in gots])
            parts = torch.stack([ref_all.abs(), (got_all - ref_all).abs()])
            nan = parts.isnan()
            segment = _segments(tuple(sizes), ref_all.device).expand(4, -1)
            found = torch.zeros(4, len(sizes), dtype=torch.float64, device=ref_all.device)
            found.scatter_reduce_(
                1, segment, torch.cat([parts.masked_fill(nan, 0.0), nan.double()]), "amax"
            )
            self.values = found[:2].masked_fill(found[2:] > 0, torch.nan)

    def checks(self, values: list[list[float]] | None) -> list[TensorCheck]:
        """The rows, from `values` read back (self.values as a list)."""
        out: list[TensorCheck] = []
        j = 0
        for row in self._rows:
            if isinstance(row, TensorCheck):
                out.append(row)
                continue
            assert values is not None
            name, kind = row
            max_ref, max_err = values[0][j], values[1][j]
            j += 1
            tol = tolerance(max_ref, kind)
            ok = bool(max_err <= tol)  # NaN compares False: it fails
            out.append(TensorCheck(name, kind, max_err, tol, max_ref, ok))
        return out


def compare_many(items: Sequence[Compared | Joined]) -> list[TensorCheck]:
    """compare() of each item, in order: the whole ones in one pass over them all and one
    read-back, the others (missing, reshaped, empty) one by one."""
    measured = Measured(items)
    return measured.checks(None if measured.values is None else measured.values.tolist())


def joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([x.reshape(-1) for x in tensors])


def split(flat: torch.Tensor, shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """`flat` cut back into tensors of `shapes`, in order (views)."""
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    return [part.reshape(s) for part, s in zip(flat.split(sizes), shapes, strict=True)]
