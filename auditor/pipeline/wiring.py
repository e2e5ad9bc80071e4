"""How the pipeline is wired: every choice the seed's change made, as typed data.

`PRODUCTION` is the wiring the seed describes. A fault (auditor/scenarios/faults.py) is a
`Wiring` with one historical bug put back; the pipeline code reads these fields where it picks
pointers, widths and launches, so a fault changes the real launches, never the trace. Each
choice is an enum and a `Wiring` checks its fields when it is built, so a misspelt choice is an
error at import time, never a silent fall-back to the production path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from egf_audit.trace.contract import SITES


class Width(StrEnum):
    """How wide an operation on w_b0fc or its concat is: SH2 + 1 (grown, B.8-B.10) or the
    legacy SH2 that drops the wire column."""

    FULL = "full"
    SH2 = "sh2"


class DwInput(StrEnum):
    """The x operand of the d = 0 dW SGEMM."""

    CONCAT = "concat"  # (dir_qaux_concat_ptr, SH2 + 1): B.10
    H_S2 = "h_s2"  # (save_h_s2, SH2): before B.10


class ScaleTarget(StrEnum):
    """The buffer `sp14_scale_wire_col` is pointed at, or NONE when the launch is missing."""

    D_CONCAT = "d_concat"  # sp14_d_dir_qaux_concat, the dX buffer
    X_CONCAT = "x_concat"  # the forward concat scratch
    DW_WIRE_COL = "dw_wire_col"  # grad_buf + goff_w_b0fc
    NONE = "none"


class GradBase(StrEnum):
    """The base pointer the value-head dW SGEMM adds goff_w_v1 to."""

    GRAD_BUF = "grad_buf"
    TARGET_PARAMS = "target_params"


class PolyakBlend(StrEnum):
    """The factor Polyak gives the online params."""

    TAU = "tau"
    ONE_MINUS_TAU = "one_minus_tau"


class BackwardEntry(StrEnum):
    """What a call site calls: backward_full with its two new pointers, or the legacy wrapper
    with 0, 0 (the K = SH2 path)."""

    FULL = "full"
    WRAPPER = "wrapper"


@dataclass(frozen=True)
class Wiring:
    # d = 0 forward SGEMM reads K = SH2 + 1 columns of w_b0fc (SH2: the pre-B.9 K = SH2)
    fwd_dir_k: Width = Width.FULL
    # d = 0 dW SGEMM's x operand
    dw_dir_x: DwInput = DwInput.CONCAT
    # d = 0 dX SGEMM writes K = SH2 + 1 columns of d_dir_qaux_concat (SH2: K = SH2)
    dx_dir_k: Width = Width.FULL
    # what sp14_scale_wire_col scales
    scale_target: ScaleTarget = ScaleTarget.D_CONCAT
    # the call sites that run the scale
    scale_sites: tuple[str, ...] = SITES
    # the column scaled, relative to the wire column SH2
    scale_col_offset: int = 0
    # step 1 of each site: rebuild the ONLINE concat before backward_full
    rebuild_online_concat: bool = True
    # step 2 of each site: memset d_h_s2 = 0 before backward_full
    zero_d_h_s2: bool = True
    # row stride the accumulate reads the dir concat dX with (SH2 walks into the wire column)
    accumulate_dir_ld: Width = Width.FULL
    # the value-head dW SGEMM writes through the goff table onto this base
    value_dw_base: GradBase = GradBase.GRAD_BUF
    # Polyak's blend factor
    polyak_tau: PolyakBlend = PolyakBlend.TAU
    # what the main online call site calls
    main_site_backward: BackwardEntry = BackwardEntry.FULL
    # the spectral-norm vector v of w_b0fc spans SH2 + 1 (SH2: the pre-B.8 size)
    sn_v_len: Width = Width.FULL
    # Adam m/v slices of w_b0fc span [ADV, SH2 + 1] (SH2: [ADV, SH2])
    adam_state_w_b0fc: Width = Width.FULL

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), _TYPES[f.name]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TypeError(f"Wiring.{f.name} must be a {kind.__name__}, got {value!r}")
        unknown = set(self.scale_sites) - set(SITES)
        if unknown or len(set(self.scale_sites)) != len(self.scale_sites):
            raise ValueError(f"Wiring.scale_sites must be distinct sites of {SITES}")

    def but(self, **changes: Any) -> Wiring:
        """This wiring with some choices changed (checked like any other: a field named at run
        time has no static type, so `__post_init__` checks each value's)."""
        return dataclasses.replace(self, **changes)


# the type each field must have (annotations are strings under `from __future__ import annotations`)
_TYPES: dict[str, type] = {
    "fwd_dir_k": Width,
    "dw_dir_x": DwInput,
    "dx_dir_k": Width,
    "scale_target": ScaleTarget,
    "scale_sites": tuple,
    "scale_col_offset": int,
    "rebuild_online_concat": bool,
    "zero_d_h_s2": bool,
    "accumulate_dir_ld": Width,
    "value_dw_base": GradBase,
    "polyak_tau": PolyakBlend,
    "main_site_backward": BackwardEntry,
    "sn_v_len": Width,
    "adam_state_w_b0fc": Width,
}

PRODUCTION = Wiring()
