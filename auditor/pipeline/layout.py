"""The trainer's allocations at given dims (a `Dims` of pipeline/config.py, read as data: the
config validates its total size through this module, so this one imports no config).

Parameters live in ONE flat fp32 buffer `params`; `grad_buf`, `adam_m`, `adam_v` and
`target_params` share its layout, so `goff_w_b0fc == poff_w_b0fc`. Each tensor is row-major
`[rows, cols]` with row stride `cols`. Every other allocation (activations, scratch, dX buffers,
ISV) is one buffer holding one tensor of the same name.
"""

from __future__ import annotations

from egf_audit.runtime.memory import BufferSpec, Layout, Tensor
from egf_audit.trace.contract import BRANCHES, INT32_BUFFERS, param_shapes


def _packed(shapes: list[tuple[str, int, int]]) -> tuple[Tensor, ...]:
    tensors, offset = [], 0
    for name, rows, cols in shapes:
        tensors.append(Tensor(name, offset, rows, cols))
        offset += rows * cols
    return tuple(tensors)


def _single(name: str, rows: int, cols: int) -> BufferSpec:
    dtype = "i32" if name in INT32_BUFFERS else "f32"
    return BufferSpec(name, dtype, (Tensor(name, 0, rows, cols),))


def build_layout(
    dims,
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
        _single("actions", B, len(BRANCHES)),
        _single("reward", B, 1),
        _single("done", B, 1),
        _single("aux_label", B, 1),
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
        _single("td_argmax", B, len(BRANCHES)),
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
