"""The fault catalogue: each entry puts one real wiring bug back into the pipeline code.

A fault is either a change of `Wiring` (the pipeline then picks the wrong pointer, width, stride
or launch, exactly as the buggy trainer did) or a source patch of one kernel (the kernel then
computes the wrong thing). Nothing here touches a trace. `egf-audit mutants` runs the audit once
per fault and proves that some invariant fails for each one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from egf_audit.pipeline.wiring import PRODUCTION, Wiring
from egf_audit.runtime.kernel_sources import KernelSet


@dataclass(frozen=True)
class KernelPatch:
    file: str
    old: str  # text of the correct kernel that the fault replaces
    new: str


@dataclass(frozen=True)
class Fault:
    name: str
    summary: str  # the historical bug, one line
    wiring: dict[str, Any] = field(default_factory=dict)
    patch: KernelPatch | None = None

    def apply_wiring(self, base: Wiring = PRODUCTION) -> Wiring:
        return dataclasses.replace(base, **self.wiring)

    def apply_kernels(self, kernels: KernelSet) -> KernelSet:
        if self.patch is None:
            return kernels
        return kernels.with_patch(self.patch.file, self.patch.old, self.patch.new, self.name)


FAULTS: tuple[Fault, ...] = (
    Fault(
        "fwd-k-sh2",
        "forward d = 0 SGEMM keeps K = SH2 against w_b0fc's LDA = SH2 + 1 (pre-B.9)",
        {"fwd_dir_k": "sh2"},
    ),
    Fault(
        "dw-k-sh2",
        "backward d = 0 dW SGEMM reads (save_h_s2, SH2): the wire column of dW is "
        "never written (pre-B.10)",
        {"dw_dir_x": "h_s2"},
    ),
    Fault(
        "dx-k-sh2",
        "backward d = 0 dX SGEMM keeps K = SH2: the wire column of "
        "d_dir_qaux_concat is never written (pre-B.10)",
        {"dx_dir_k": "sh2"},
    ),
    Fault(
        "scale-x-concat",
        "the wire scale is pointed at the x concat scratch instead of the dX buffer",
        {"scale_target": "x_concat"},
    ),
    Fault(
        "scale-dw-wire-col",
        "the wire scale is pointed at dW's wire column (grad_buf[goff_w_b0fc..]) instead of dX",
        {"scale_target": "dw_wire_col"},
    ),
    Fault(
        "no-nan-branch",
        "sp14_scale_wire_col multiplies without the alpha == 0 => 0 branch: "
        "NaN * 0 stays NaN, -g * 0 is -0.0",
        patch=KernelPatch(
            "sp14_scale_wire_col_kernel.cu", "*g = (a == 0.0f) ? 0.0f : (*g) * a;", "*g = (*g) * a;"
        ),
    ),
    Fault(
        "skip-scale",
        "the sp14_scale_wire_col launch is missing at both call sites",
        {"scale_target": "none"},
    ),
    Fault(
        "cql-site-ungated",
        "only the main online call site runs the wire scale; the CQL aux site is left ungated",
        {"scale_sites": ("main",)},
    ),
    Fault(
        "scale-wrong-col",
        "the wire scale is given column SH2 - 1 (an off-by-one on the new width)",
        {"scale_col_offset": -1},
    ),
    Fault(
        "skip-rebuild",
        "the online concat is not rebuilt before backward_full: dW reads the "
        "target concat the target forward left in the scratch",
        {"rebuild_online_concat": False},
    ),
    Fault(
        "no-zero-d-h-s2",
        "d_h_s2 is not zeroed before backward_full: the value-FC dX accumulates onto stale data",
        {"zero_d_h_s2": False},
    ),
    Fault(
        "accumulate-wire-col",
        "the dir accumulate reads d_dir_qaux_concat with row stride SH2, "
        "walking into the wire column",
        {"accumulate_dir_ld": "sh2"},
    ),
    Fault(
        "target-grad-leak",
        "the value-head dW SGEMM adds goff_w_v1 to target_params' base instead of grad_buf's",
        {"value_dw_base": "target_params"},
    ),
    Fault(
        "polyak-tau-swap",
        "Polyak blends with 1 - tau: target <- (1 - tau) params + tau target",
        {"polyak_tau": "one_minus_tau"},
    ),
    Fault(
        "wrapper-on-main",
        "the main online call site calls the legacy wrapper (0, 0) and takes the K = SH2 path",
        {"main_site_backward": "wrapper"},
    ),
    Fault(
        "sn-vector-sh2",
        "the spectral-norm vector v of w_b0fc keeps its pre-B.8 length SH2",
        {"sn_v_len": "sh2"},
    ),
    Fault(
        "adam-state-sh2",
        "Adam m/v slices of w_b0fc keep their pre-B.8 shape [ADV, SH2]",
        {"adam_state_w_b0fc": "sh2"},
    ),
    Fault(
        "gate-no-clamp",
        "alpha_grad_compute forgets the clamp to [0, 1]: a below-chance aux "
        "head drives the gate negative",
        patch=KernelPatch(
            "alpha_grad_compute_kernel.cu", "  raw = fminf(fmaxf(raw, 0.0f), 1.0f);\n", ""
        ),
    ),
)

FAULTS_BY_NAME = {f.name: f for f in FAULTS}
