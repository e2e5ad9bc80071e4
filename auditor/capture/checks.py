"""What a capture of the trainer's own process can decide, invariant by invariant.

Each check reads only the converted trace (launches, bindings, steps, call sites), the layout
and the recorder's snapshots. It never learns what process ran or which fault, if any, it has.
An invariant a capture cannot decide says why (UNDECIDED) instead of passing.
"""

from __future__ import annotations

from collections.abc import Callable

from .check_flow import check_egf005, check_egf006, check_egf007, check_egf008
from .check_gate import check_egf003, check_egf004, check_egf012
from .check_gemms import check_egf001, check_egf011
from .convert import CaptureTrace
from .verdict import FAIL, PASS, UNDECIDED, CaptureVerdict

__all__ = ["CHECKS", "FAIL", "PASS", "UNDECIDED", "CaptureVerdict", "decide"]

CHECKS: dict[str, Callable[[CaptureTrace], CaptureVerdict]] = {
    "EGF001": check_egf001,
    "EGF003": check_egf003,
    "EGF004": check_egf004,
    "EGF005": check_egf005,
    "EGF006": check_egf006,
    "EGF007": check_egf007,
    "EGF008": check_egf008,
    "EGF011": check_egf011,
    "EGF012": check_egf012,
}

# why a capture of one process cannot decide the others
UNDECIDABLE = {
    "EGF002": "needs the same step replayed with alpha in {0, 0.37, 1} and with the scale skipped; "
    "a capture records the trainer's one run and changes nothing",
    "EGF009": "Adam's m/v slices and the spectral-norm vectors are indexed inside the trainer's "
    "optimizer code; no launch argument the capture sees carries their shapes",
    "EGF010": "needs the trainer's weights, batch and gradients in full for an independent fp64 "
    "model; the capture keeps chosen regions only",
    "EGF013": "needs every buffer snapshotted around every launch; the capture snapshots the "
    "ABI kernels' regions only",
}


def decide(ct: CaptureTrace, codes: list[str]) -> list[CaptureVerdict]:
    out = []
    for code in codes:
        if code in CHECKS:
            out.append(CHECKS[code](ct))
        else:
            reason = UNDECIDABLE.get(code, "no capture-side check exists for it")
            out.append(CaptureVerdict(code, UNDECIDED, reason))
    return out
