"""The trainer's memory: named flat buffers, named tensors inside them, pointer resolution.

Parameters live in ONE flat fp32 buffer `params`; `grad_buf`, `adam_m`, `adam_v` and
`target_params` share its layout, so `goff_w_b0fc == poff_w_b0fc`. Each tensor is row-major
`[rows, cols]` with row stride `cols`. Every other allocation (activations, scratch, dX buffers,
ISV) is one buffer holding one tensor of the same name.

A raw device pointer resolves to (buffer, element offset); the layout then names the tensor.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import cached_property

from .config import BRANCHES, Dims

ELEMENT_BYTES = 4  # fp32 and int32 alike


@dataclass(frozen=True)
class Tensor:
    name: str
    offset: int  # element offset inside its buffer
    rows: int
    cols: int

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class BufferSpec:
    name: str
    dtype: str  # "f32" or "i32"
    tensors: tuple[Tensor, ...]

    @cached_property
    def size(self) -> int:
        return max(t.end for t in self.tensors)

    @cached_property
    def _by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> Tensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.name} has no tensor {name}") from None

    def tensor_at(self, offset: int) -> Tensor | None:
        for t in self.tensors:
            if t.offset <= offset < t.end:
                return t
        return None


def param_shapes(dims: Dims) -> list[tuple[str, int, int]]:
    """Every parameter tensor, in the order of the flat buffer: (name, rows, cols)."""
    shapes = [
        ("w_s1", dims.SH1, dims.OBS),
        ("b_s1", 1, dims.SH1),
        ("w_s2", dims.SH2, dims.SH1),
        ("b_s2", 1, dims.SH2),
        ("w_aux", dims.AUXK, dims.SH2),
        ("b_aux", 1, dims.AUXK),
    ]
    for d in range(len(BRANCHES)):
        shapes += [
            (f"w_b{d}fc", dims.ADV, dims.branch_in(d)),
            (f"b_b{d}fc", 1, dims.ADV),
            (f"w_b{d}out", dims.A[d], dims.ADV),
            (f"b_b{d}out", 1, dims.A[d]),
        ]
    shapes += [
        ("w_v0", dims.VALH, dims.SH2),
        ("b_v0", 1, dims.VALH),
        ("w_v1", 1, dims.VALH),
        ("b_v1", 1, 1),
    ]
    return shapes


def _packed(shapes: list[tuple[str, int, int]]) -> tuple[Tensor, ...]:
    tensors, offset = [], 0
    for name, rows, cols in shapes:
        tensors.append(Tensor(name, offset, rows, cols))
        offset += rows * cols
    return tuple(tensors)


@dataclass(frozen=True)
class Layout:
    """All buffers of one pipeline instance. `state_shapes` lets Adam m/v have their own table."""

    buffers: tuple[BufferSpec, ...]

    @cached_property
    def _by_name(self) -> dict[str, BufferSpec]:
        return {b.name: b for b in self.buffers}

    def buffer(self, name: str) -> BufferSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no buffer named {name}") from None

    def as_dict(self) -> dict:
        return {
            b.name: {
                "dtype": b.dtype,
                "size": b.size,
                "tensors": {t.name: [t.offset, t.rows, t.cols] for t in b.tensors},
            }
            for b in self.buffers
        }


def _single(name: str, rows: int, cols: int, dtype: str = "f32") -> BufferSpec:
    return BufferSpec(name, dtype, (Tensor(name, 0, rows, cols),))


def build_layout(
    dims: Dims,
    adam_state_shapes: list[tuple[str, int, int]] | None = None,
    sn_v_len: int | None = None,
) -> Layout:
    """The trainer's allocations. `adam_state_shapes` / `sn_v_len` default to the grown
    shapes; they exist so the state tables can be described separately from the params."""
    B, S2 = dims.B, dims.SH2
    params = _packed(param_shapes(dims))
    state = _packed(adam_state_shapes) if adam_state_shapes is not None else params
    sn_v = S2 + 1 if sn_v_len is None else sn_v_len
    bufs = [
        BufferSpec("params", "f32", params),
        BufferSpec("grad_buf", "f32", params),
        BufferSpec("adam_m", "f32", state),
        BufferSpec("adam_v", "f32", state),
        BufferSpec("target_params", "f32", params),
        # spectral-norm power-iteration vectors of w_b0fc: u [ADV], v [SH2 + 1]
        BufferSpec(
            "sn_state",
            "f32",
            (Tensor("u_b0fc", 0, 1, dims.ADV), Tensor("v_b0fc", dims.ADV, 1, sn_v)),
        ),
        _single("sn_scratch_u", 1, dims.ADV),
        _single("sn_scratch_v", 1, sn_v),
        # |W^T u|^2 and |W v|^2 from SGEMM dot products; sigma = sqrt(norm2_u)
        BufferSpec("sn_norms", "f32", (Tensor("norm2_v", 0, 1, 1), Tensor("norm2_u", 1, 1, 1))),
        _single("isv_signals", 1, dims.N_ISV),
        _single("ones_b", 1, B),  # the ones vector bias-gradient SGEMMs reduce with
        _single("aux_label_prob", 1, B),  # gate producer: p[b, label[b]]
        _single("gate_prob_sum", 1, 1),
        # the batch
        _single("obs", B, dims.OBS),
        _single("next_obs", B, dims.OBS),
        _single("actions", B, len(BRANCHES), "i32"),
        _single("reward", B, 1),
        _single("done", B, 1),
        _single("aux_label", B, 1, "i32"),
    ]
    for d in range(1, len(BRANCHES)):
        bufs += [_single(f"ctx_b{d}", B, dims.E[d]), _single(f"next_ctx_b{d}", B, dims.E[d])]
    # forward activations: online (save_*) and target (tgt_*)
    for net in ("save", "tgt"):
        bufs += [
            _single(f"{net}_h_s1", B, dims.SH1),
            _single(f"{net}_h_s2", B, S2),
            _single(f"{net}_aux_logits", B, dims.AUXK),
        ]
        bufs.append(
            _single("aux_nb_softmax_buf" if net == "save" else "tgt_aux_softmax", B, dims.AUXK)
        )
        for d in range(len(BRANCHES)):
            if d > 0:
                bufs.append(_single(f"{net}_b{d}_concat", B, dims.branch_in(d)))
            bufs += [
                _single(f"{net}_b{d}_hid", B, dims.ADV),
                _single(f"{net}_b{d}_adv", B, dims.A[d]),
                _single(f"{net}_q_b{d}", B, dims.A[d]),
            ]
        bufs += [_single(f"{net}_v_hid", B, dims.VALH), _single(f"{net}_value", B, 1)]
    # the dir concat scratch: online and target forward both write it, as the trainer does
    bufs.append(_single("sp14_dir_qaux_concat_scratch", B, S2 + 1))
    # losses
    bufs += [
        _single("td_target", B, len(BRANCHES)),
        _single("td_argmax", B, len(BRANCHES), "i32"),
    ]
    for d in range(len(BRANCHES)):
        bufs += [_single(f"dq_main_b{d}", B, dims.A[d]), _single(f"dq_cql_b{d}", B, dims.A[d])]
    # backward scratch and dX buffers
    bufs.append(_single("sp14_d_dir_qaux_concat", B, S2 + 1))
    for d in range(1, len(BRANCHES)):
        bufs.append(_single(f"sp14_d_b{d}_concat", B, dims.branch_in(d)))
    for d in range(len(BRANCHES)):
        bufs += [_single(f"d_b{d}_adv", B, dims.A[d]), _single(f"d_b{d}_hid", B, dims.ADV)]
    bufs += [
        _single("d_value", B, 1),
        _single("d_v_hid", B, dims.VALH),
        _single("d_aux_logits", B, dims.AUXK),
        _single("d_h_s2", B, S2),
        _single("d_h_s1", B, dims.SH1),
    ]
    return Layout(tuple(bufs))


@dataclass
class AddressMap:
    """Resolves raw pointers to (buffer, element offset) by address range."""

    layout: Layout
    bases: dict[str, int] = field(default_factory=dict)
    _sorted: list[tuple[int, str]] = field(default_factory=list)

    def register(self, name: str, base: int) -> None:
        self.bases[name] = base
        bisect.insort(self._sorted, (base, name))

    def ptr(self, buffer: str, tensor: str | None = None, element: int = 0) -> int:
        offset = self.layout.buffer(buffer).tensor(tensor).offset if tensor else 0
        return self.bases[buffer] + (offset + element) * ELEMENT_BYTES

    def resolve(self, pointer: int) -> tuple[str, int] | None:
        """(buffer, element offset) for a pointer into a buffer, else None (null or foreign)."""
        i = bisect.bisect_right(self._sorted, (pointer, "\uffff")) - 1
        if i < 0:
            return None
        base, name = self._sorted[i]
        byte_offset = pointer - base
        size = self.layout.buffer(name).size
        if byte_offset % ELEMENT_BYTES or byte_offset // ELEMENT_BYTES >= size:
            return None
        return name, byte_offset // ELEMENT_BYTES
