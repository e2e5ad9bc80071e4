"""The verdict of a capture check and the trace facts the checks share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from egf_audit.runtime.capture_model import CaptureTrace, Site
from egf_audit.runtime.contract import DIR_DX
from egf_audit.runtime.trace import Launch

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
POLYAK_ULPS = 2


@dataclass(frozen=True)
class CaptureVerdict:
    code: str
    status: str  # PASS, FAIL or UNDECIDED
    summary: str  # one line
    evidence: dict[str, Any] = field(default_factory=dict)


def failed(code: str, problems: list[str], evidence: dict[str, Any]) -> CaptureVerdict:
    """FAIL, naming the first problem found and how many there are."""
    return CaptureVerdict(code, FAIL, f"{problems[0]} ({len(problems)} findings)", evidence)


def bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def sh2_of(ct: CaptureTrace) -> int | None:
    return ct.layout.dims.get("SH2")


def writes(x: Launch, buffer: str) -> bool:
    return any(b.writes and b.region is not None and b.region.buffer == buffer for b in x.bindings)


def zeroes(x: Launch, elements: int | None) -> bool:
    """A memset to 0 of at least `elements` elements."""
    if x.kind == "memset":
        return (
            x.args.get("value") == 0
            and elements is not None
            and x.args.get("bytes", 0) >= 4 * elements
        )
    return False


def on_dir_dx(b) -> bool:
    return b is not None and b.region is not None and b.region.buffer == DIR_DX


def window(ct: CaptureTrace, site: Site) -> list[Launch]:
    return ct.trace.launches[site.begin : site.first_accumulate]
