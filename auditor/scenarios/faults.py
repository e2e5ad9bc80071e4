"""The fault catalogue: each entry puts one real wiring bug back into the pipeline code.

A fault is either a change of `Wiring` (the pipeline then picks the wrong pointer, width, stride
or launch, exactly as the buggy trainer did) or a source patch of one kernel (the kernel then
computes the wrong thing). Nothing here touches a trace. `egf-audit mutants` runs the audit once
per fault and proves that some invariant fails for each one.
"""

from __future__ import annotations

from dataclasses import dataclass

from egf_audit.pipeline.wiring import (
    PRODUCTION,
    BackwardEntry,
    DwInput,
    GradBase,
    PolyakBlend,
    ScaleTarget,
    Width,
    Wiring,
)
from egf_audit.runtime.kernel_sources import KernelSet


@dataclass(frozen=True)
class KernelPatch:
    file: str
    old: str  # text of the correct kernel that the fault replaces
    new: str


@dataclass(frozen=True)
class Fault:
    """One catalogue entry, as PyTorch's OpInfo entries are: what it breaks and what must catch
    it. `expected` lists every invariant that fails on it (the kill matrix's row); the tests and
    `egf-audit mutants` read it from here."""

    name: str
    summary: str  # the historical bug, one line
    wiring: Wiring = PRODUCTION
    patch: KernelPatch | None = None
    expected: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.wiring == PRODUCTION) == (self.patch is None):
            raise ValueError(f"fault {self.name} must change the wiring or patch a kernel")
        if not self.expected:
            raise ValueError(f"fault {self.name} names no invariant that catches it")

    def apply_kernels(self, kernels: KernelSet) -> KernelSet:
        if self.patch is None:
            return kernels
        return kernels.with_patch(self.patch.file, self.patch.old, self.patch.new, self.name)


FAULTS: tuple[Fault, ...] = (
    Fault(
        "fwd-k-sh2",
        "forward d = 0 SGEMM keeps K = SH2 against w_b0fc's LDA = SH2 + 1 (pre-B.9)",
        wiring=PRODUCTION.but(fwd_dir_k=Width.SH2),
        expected=("EGF001", "EGF010", "EGF011"),
    ),
    Fault(
        "dw-k-sh2",
        "backward d = 0 dW SGEMM reads (save_h_s2, SH2): the wire column of dW is "
        "never written (pre-B.10)",
        wiring=PRODUCTION.but(dw_dir_x=DwInput.H_S2),
        expected=("EGF001", "EGF002", "EGF006", "EGF010", "EGF011"),
    ),
    Fault(
        "dx-k-sh2",
        "backward d = 0 dX SGEMM keeps K = SH2: the wire column of "
        "d_dir_qaux_concat is never written (pre-B.10)",
        wiring=PRODUCTION.but(dx_dir_k=Width.SH2),
        expected=("EGF001", "EGF010", "EGF011"),
    ),
    Fault(
        "scale-x-concat",
        "the wire scale is pointed at the x concat scratch instead of the dX buffer",
        wiring=PRODUCTION.but(scale_target=ScaleTarget.X_CONCAT),
        expected=("EGF003", "EGF004", "EGF008", "EGF010"),
    ),
    Fault(
        "scale-dw-wire-col",
        "the wire scale is pointed at dW's wire column (grad_buf[goff_w_b0fc..]) instead of dX",
        wiring=PRODUCTION.but(scale_target=ScaleTarget.DW_WIRE_COL),
        expected=("EGF002", "EGF003", "EGF004", "EGF008", "EGF010"),
    ),
    Fault(
        "no-nan-branch",
        "sp14_scale_wire_col multiplies without the alpha == 0 => 0 branch: "
        "NaN * 0 stays NaN, -g * 0 is -0.0",
        patch=KernelPatch(
            "sp14_scale_wire_col_kernel.cu", "*g = (a == 0.0f) ? 0.0f : (*g) * a;", "*g = (*g) * a;"
        ),
        expected=("EGF003",),
    ),
    Fault(
        "skip-scale",
        "the sp14_scale_wire_col launch is missing at both call sites",
        wiring=PRODUCTION.but(scale_target=ScaleTarget.NONE),
        expected=("EGF003", "EGF004", "EGF008", "EGF010"),
    ),
    Fault(
        "cql-site-ungated",
        "only the main online call site runs the wire scale; the CQL aux site is left ungated",
        wiring=PRODUCTION.but(scale_sites=("main",)),
        expected=("EGF003", "EGF004", "EGF008", "EGF010"),
    ),
    Fault(
        "scale-wrong-col",
        "the wire scale is given column SH2 - 1 (an off-by-one on the new width)",
        wiring=PRODUCTION.but(scale_col_offset=-1),
        expected=("EGF003", "EGF004", "EGF008", "EGF010"),
    ),
    Fault(
        "skip-rebuild",
        "the online concat is not rebuilt before backward_full: dW reads the "
        "target concat the target forward left in the scratch",
        wiring=PRODUCTION.but(rebuild_online_concat=False),
        expected=("EGF006", "EGF010"),
    ),
    Fault(
        "no-zero-d-h-s2",
        "d_h_s2 is not zeroed before backward_full: the value-FC dX accumulates onto stale data",
        wiring=PRODUCTION.but(zero_d_h_s2=False),
        expected=("EGF007", "EGF010"),
    ),
    Fault(
        "accumulate-wire-col",
        "the dir accumulate reads d_dir_qaux_concat with row stride SH2, "
        "walking into the wire column",
        wiring=PRODUCTION.but(accumulate_dir_ld=Width.SH2),
        expected=("EGF007", "EGF010"),
    ),
    Fault(
        "target-grad-leak",
        "the value-head dW SGEMM adds goff_w_v1 to target_params' base instead of grad_buf's",
        wiring=PRODUCTION.but(value_dw_base=GradBase.TARGET_PARAMS),
        expected=("EGF005", "EGF010"),
    ),
    Fault(
        "polyak-tau-swap",
        "Polyak blends with 1 - tau: target <- (1 - tau) params + tau target",
        wiring=PRODUCTION.but(polyak_tau=PolyakBlend.ONE_MINUS_TAU),
        expected=("EGF005", "EGF010"),
    ),
    Fault(
        "wrapper-on-main",
        "the main online call site calls the legacy wrapper (0, 0) and takes the K = SH2 path",
        wiring=PRODUCTION.but(main_site_backward=BackwardEntry.WRAPPER),
        expected=("EGF001", "EGF006", "EGF007", "EGF008", "EGF010", "EGF011"),
    ),
    Fault(
        "sn-vector-sh2",
        "the spectral-norm vector v of w_b0fc keeps its pre-B.8 length SH2",
        wiring=PRODUCTION.but(sn_v_len=Width.SH2),
        expected=("EGF001", "EGF009", "EGF010", "EGF011"),
    ),
    Fault(
        "adam-state-sh2",
        "Adam m/v slices of w_b0fc keep their pre-B.8 shape [ADV, SH2]",
        wiring=PRODUCTION.but(adam_state_w_b0fc=Width.SH2),
        expected=("EGF009", "EGF010"),
    ),
    Fault(
        "gate-no-clamp",
        "alpha_grad_compute forgets the clamp to [0, 1]: a below-chance aux "
        "head drives the gate negative",
        patch=KernelPatch(
            "alpha_grad_compute_kernel.cu", "  raw = fminf(fmaxf(raw, 0.0f), 1.0f);\n", ""
        ),
        expected=("EGF012",),
    ),
    # ---- kernels that write where they do not declare: only EGF013 sees them, every result
    # the other invariants check stays right ----
    Fault(
        "scale-writes-past-region",
        "sp14_scale_wire_col stashes the gate it applied one element past the ISV slot it may "
        "only read (isv[isv_index + 1], another signal of the trainer)",
        patch=KernelPatch(
            "sp14_scale_wire_col_kernel.cu",
            "  float a = isv[isv_index];\n",
            "  float a = isv[isv_index];\n  ((float*)isv)[isv_index + 1] = a;\n",
        ),
        expected=("EGF013",),
    ),
    Fault(
        "sn-normalize-writes-neighbour",
        "sn_normalize also writes the element in front of its vector: normalising v_b0fc "
        "overwrites the last element of its neighbour u_b0fc in sn_state",
        patch=KernelPatch(
            "sn_normalize_kernel.cu",
            "  out[i] = in[i] / sqrtf(fmaxf(norm2[0], 1e-30f));\n",
            "  out[i] = in[i] / sqrtf(fmaxf(norm2[0], 1e-30f));\n  if (i == 0) out[-1] = in[0];\n",
        ),
        expected=("EGF013",),
    ),
)

FAULTS_BY_NAME = {f.name: f for f in FAULTS}
