"""How the pipeline is wired: every choice the seed's change made, as data.

`PRODUCTION` is the wiring the seed describes. A fault (auditor/scenarios/faults.py) is a `Wiring` with
one historical bug put back; the pipeline code reads these fields where it picks pointers,
widths and launches, so a fault changes the real launches, never the trace.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wiring:
    # d = 0 forward SGEMM reads K = SH2 + 1 columns of w_b0fc ("sh2": the pre-B.9 K = SH2)
    fwd_dir_k: str = "full"
    # d = 0 dW SGEMM takes x from the dir concat ("h_s2": the pre-B.10 (save_h_s2, SH2))
    dw_dir_x: str = "concat"
    # d = 0 dX SGEMM writes K = SH2 + 1 columns of d_dir_qaux_concat ("sh2": K = SH2)
    dx_dir_k: str = "full"
    # what sp14_scale_wire_col scales: "d_concat" (the dX buffer), "x_concat", "dw_wire_col",
    # or "none" (the launch is missing)
    scale_target: str = "d_concat"
    # the call sites that run the scale
    scale_sites: tuple[str, ...] = ("cql", "main")
    # the column scaled, relative to the wire column SH2
    scale_col_offset: int = 0
    # step 1 of each site: rebuild the ONLINE concat before backward_full
    rebuild_online_concat: bool = True
    # step 2 of each site: memset d_h_s2 = 0 before backward_full
    zero_d_h_s2: bool = True
    # row stride the accumulate reads the dir concat dX with ("sh2": SH2, which walks into the
    # wire column)
    accumulate_dir_ld: str = "concat"
    # the value-head dW SGEMM writes through the goff table but on target_params' base
    value_dw_base: str = "grad_buf"
    # Polyak's blend factor: "tau" or the swapped "one_minus_tau"
    polyak_tau: str = "tau"
    # the main site calls backward_full ("full") or the legacy wrapper with 0 pointers
    main_site_backward: str = "full"
    # the spectral-norm vector v of w_b0fc spans SH2 + 1 ("sh2": SH2, the pre-B.8 size)
    sn_v_len: str = "full"
    # Adam m/v slices of w_b0fc span [ADV, SH2 + 1] ("sh2": [ADV, SH2])
    adam_state_w_b0fc: str = "full"


PRODUCTION = Wiring()
