"""Which tensor each GEMM of the SP14 step reads and writes: one entry per contract GEMM, in the
order the contract runs them within a step (kernels/CONTRACT.md, section 2), the way OpInfo
keeps one entry per op.

An entry names its two read operands and its written one as (buffer, tensor): a tensor of the
named-offset table lives in `params` (the online net), `target_params` (the target net) or
`grad_buf`; every other buffer holds one tensor of its own name. The rebuild's pipeline
(egf_audit.pipeline) records each GEMM under the entry's label (`@site` added at a call site),
and tests/test_capture_tensors.py holds every recorded SGEMM of the rebuild to its entry. A
capture is matched by role, not by position (invariants/capture_roles.py): the written tensor
picks the entries a GEMM may be, its two reads must be that entry's, in either operand.
"""

from __future__ import annotations

from dataclasses import dataclass

from egf_audit.trace.contract import BRANCHES, DIR_CONCAT, DIR_DX, TARGET

ONLINE, GRADS = "params", "grad_buf"


@dataclass(frozen=True)
class TensorRef:
    """One tensor of the contract: a buffer, and the tensor of it (its own name, or one of the
    named-offset table's in the parameter buffers)."""

    buffer: str
    tensor: str

    def __str__(self) -> str:
        return self.buffer if self.buffer == self.tensor else f"{self.buffer}.{self.tensor}"


@dataclass(frozen=True)
class ContractGemm:
    """One GEMM of the step: its label stem, the two tensors it reads (cuBLAS's A and B as the
    rebuild passes them) and the one it writes (C)."""

    label: str
    a: TensorRef
    b: TensorRef
    c: TensorRef

    @property
    def reads(self) -> tuple[TensorRef, TensorRef]:
        return (self.a, self.b)


def _own(name: str) -> TensorRef:
    return TensorRef(name, name)


def _forward(net: str) -> list[ContractGemm]:
    """The forward of one net: the online one on obs into save_*, the target on next_obs into
    tgt_*; both nets' d = 0 branch reads the shared concat scratch."""
    online = net == ONLINE
    weights, prefix = (ONLINE, "save_") if online else (TARGET, "tgt_")

    def w(t: str) -> TensorRef:
        return TensorRef(weights, t)

    def act(t: str) -> TensorRef:
        return _own(f"{prefix}{t}")

    tag = "@online" if online else "@target"
    h_s1, h_s2 = act("h_s1"), act("h_s2")
    rows = [
        ContractGemm(f"forward_s1{tag}", w("w_s1"), _own("obs" if online else "next_obs"), h_s1),
        ContractGemm(f"forward_s2{tag}", w("w_s2"), h_s1, h_s2),
        ContractGemm(f"forward_aux{tag}", w("w_aux"), h_s2, act("aux_logits")),
    ]
    for d in range(len(BRANCHES)):
        concat = _own(DIR_CONCAT) if d == 0 else act(f"b{d}_concat")
        hid = act(f"b{d}_hid")
        rows += [
            ContractGemm(f"forward_branch_fc[d={d}]{tag}", w(f"w_b{d}fc"), concat, hid),
            ContractGemm(f"forward_branch_out[d={d}]{tag}", w(f"w_b{d}out"), hid, act(f"b{d}_adv")),
        ]
    v_hid = act("v_hid")
    rows += [
        ContractGemm(f"forward_value_fc{tag}", w("w_v0"), h_s2, v_hid),
        ContractGemm(f"forward_value_out{tag}", w("w_v1"), v_hid, act("value")),
    ]
    return rows


def _layer_backward(
    stem: str,
    x: TensorRef,
    dy: TensorRef,
    layer: tuple[str, str],
    dx: TensorRef | None,
    tag: str = "",
) -> list[ContractGemm]:
    """One linear layer's backward: db = 1^T . dY, dW = dY^T . x, and dX = dY . W (the online
    W), labelled `{stem}_db{tag}` and so on; `layer` is (weight, bias)."""
    weight, bias = layer
    ones = _own("ones_b")

    def grad(t: str) -> TensorRef:
        return TensorRef(GRADS, t)

    rows = [
        ContractGemm(f"{stem}_db{tag}", dy, ones, grad(bias)),
        ContractGemm(f"{stem}_dw{tag}", x, dy, grad(weight)),
    ]
    if dx is not None:
        rows.append(ContractGemm(f"{stem}_dx{tag}", TensorRef(ONLINE, weight), dy, dx))
    return rows


def _site_backward() -> list[ContractGemm]:
    """One call site of backward_full, then the aux head and the trunk (labels without `@site`:
    the same entries serve both sites)."""
    rows: list[ContractGemm] = []
    for d in range(len(BRANCHES)):
        adv, hid, tag = _own(f"d_b{d}_adv"), _own(f"d_b{d}_hid"), f"[d={d}]"
        x = _own(DIR_CONCAT) if d == 0 else _own(f"save_b{d}_concat")
        dx = _own(DIR_DX) if d == 0 else _own(f"sp14_d_b{d}_concat")
        out_layer, fc_layer = (f"w_b{d}out", f"b_b{d}out"), (f"w_b{d}fc", f"b_b{d}fc")
        rows += _layer_backward(
            "backward_branch_out", _own(f"save_b{d}_hid"), adv, out_layer, hid, tag
        )
        rows += _layer_backward("backward_branch", x, hid, fc_layer, dx, tag)
    d_value, d_v_hid, d_h_s2, d_h_s1 = (_own(n) for n in ("d_value", "d_v_hid", "d_h_s2", "d_h_s1"))
    h_s2 = _own("save_h_s2")
    rows += _layer_backward(
        "backward_value_out", _own("save_v_hid"), d_value, ("w_v1", "b_v1"), d_v_hid
    )
    rows += _layer_backward("backward_value_fc", h_s2, d_v_hid, ("w_v0", "b_v0"), d_h_s2)
    rows += _layer_backward("backward_aux", h_s2, _own("d_aux_logits"), ("w_aux", "b_aux"), d_h_s2)
    rows += _layer_backward("backward_s2", _own("save_h_s1"), d_h_s2, ("w_s2", "b_s2"), d_h_s1)
    rows += _layer_backward("backward_s1", _own("obs"), d_h_s1, ("w_s1", "b_s1"), None)
    return rows


def _update() -> list[ContractGemm]:
    """The gate producer's sum (live mode) and the spectral norm's power iteration on w_b0fc."""
    w, sv, su = TensorRef(ONLINE, "w_b0fc"), _own("sn_scratch_v"), _own("sn_scratch_u")
    return [
        ContractGemm(
            "gate:prob_sum", _own("aux_label_prob"), _own("ones_b"), _own("gate_prob_sum")
        ),
        ContractGemm("spectral_norm:wt_u", w, TensorRef("sn_state", "u_b0fc"), sv),
        ContractGemm("spectral_norm:norm2_v", sv, sv, TensorRef("sn_norms", "norm2_v")),
        ContractGemm("spectral_norm:w_v", w, TensorRef("sn_state", "v_b0fc"), su),
        ContractGemm("spectral_norm:norm2_u", su, su, TensorRef("sn_norms", "norm2_u")),
    ]


CONTRACT_GEMMS: tuple[ContractGemm, ...] = (
    *_forward(ONLINE),
    *_forward(TARGET),
    *_site_backward(),
    *_update(),
)
BY_LABEL = {g.label: g for g in CONTRACT_GEMMS}


def entry_of(label: str) -> ContractGemm | None:
    """The entry a rebuild launch label records (`backward_branch_dx[d=0]@cql`), or None."""
    found = BY_LABEL.get(label)
    if found is None and "@" in label:
        found = BY_LABEL.get(label.rpartition("@")[0])
    return found
